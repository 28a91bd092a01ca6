"""A worker's busy polling (``settings.busy_poll_us``): after it reads a request or writes an
answer, its event loop keeps polling its sockets for that long instead of sleeping, while the
machine has a core to spare.

Why: at low concurrency a worker sleeps between a request's steps (its head sent to the
backend, its answer written to the client) and wakes when the other side answers a few tens of
microseconds later. On a virtual machine a sleep and a wake-up cost more than polling until
then: an idle virtual CPU halts, and waking it takes an interrupt through the hypervisor. HAProxy
has the same lever (``busy-polling``), off by default there because it polls always; here the
loop polls only within a short window after its own I/O (an idle router never polls), and only
while no other process waits for a core: under load the loop has work of its own, and wrk,
nginx or a neighbour need their share of the cores more than it needs to poll.

"A core to spare" is the kernel's count of running tasks (``/proc/loadavg``, this worker
included) at most the number of cores: read when polling would start (a refusal is kept for
:data:`REFUSAL_SECONDS`: not read at every request of a busy worker) and at every turn of the
loop while it polls (one pread: checked only every 32 turns, a worker at 1,000 connections
polled on while the processes its writes had woken waited for a core, and lost req/s).
Polling is a callback that schedules itself again: while one is ready, the loop asks the
kernel for events without waiting. Where ``/proc/loadavg`` cannot be read (not Linux), there
is no busy polling. The figures: docs/benchmarks.md ("Busy polling at low concurrency").
"""

from __future__ import annotations

import asyncio
import os
import time

LOADAVG = "/proc/loadavg"
REFUSAL_SECONDS = 0.001  # a "no core to spare" is kept this long (not read at every request)


class BusyPoll:
    """The busy polling of one worker's loop (:meth:`open` it on that loop)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, cores: int, window: float = 0.0
    ) -> None:
        self.loop = loop
        self.fd = fd  # /proc/loadavg, kept open (a pread per check)
        self.cores = cores
        self.window = window  # seconds of polling after I/O
        self.until = 0.0  # polling goes on until then (time.monotonic())
        self.polling = False  # a poll callback is scheduled
        self.refused_until = 0.0  # no core to spare: not asked again before then
        self.turns = 0  # of the loop while polling

    @classmethod
    def open(
        cls, loop: asyncio.AbstractEventLoop, path: str = LOADAVG, cores: int | None = None
    ) -> BusyPoll | None:
        """Busy polling for `loop`, or None where the running count cannot be read."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        poll = cls(loop, fd, cores or os.cpu_count() or 1)
        if poll.running() is None:
            poll.close()
            return None
        return poll

    def running(self) -> int | None:
        """Tasks running or ready to run on the machine (None: unreadable)."""
        try:
            fields = os.pread(self.fd, 128, 0).split()
            return int(fields[3].partition(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None

    def spare(self) -> bool:
        """Whether a core is free for polling (no other task waits for one)."""
        running = self.running()
        return running is not None and running <= self.cores

    def poke(self) -> None:
        """I/O happened (a request read, an answer written): poll for the window from now."""
        now = time.monotonic()
        self.until = now + self.window
        if self.polling or now < self.refused_until:
            return
        if not self.spare():
            self.refused_until = now + REFUSAL_SECONDS
            return
        self.polling = True
        self.turns = 0
        self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        self.turns += 1
        if time.monotonic() < self.until and self.spare():
            self.loop.call_soon(self._poll)
        else:
            self.polling = False

    def close(self) -> None:
        self.until = 0.0
        os.close(self.fd)
