"""The harness's own stalls, watched and kept short.

The harness's clients and its recording backends (threads, :mod:`tests.integration.backends`)
share one Python process. The backends keep every request they receive (the invariants are
checked on them at the end): after a few hundred thousand inputs that heap is large, and a full
collection of Python's cyclic GC over it stops every thread of the process for a second or more.
A client stopped that long in the middle of a TLS handshake is, for the router, a client that
did not finish its handshake within ``header_timeout`` (1 s here): the router closes the tunnel
as it should, and the harness would count its own pause as the router's fault (the long run of
stop 30: 10 "handshake reset" inputs in four bursts, each a 408 logged exactly 1.0 s after the
CONNECT).

So the harness (1) settles the heap between batches of inputs, with nothing in flight:
``gc.collect()`` then ``gc.freeze()``, after which a full collection only walks what came since;
and (2) watches its event loop: every stall of at least :data:`STALL` seconds is kept, reported
in the run's figures, and an input whose exchange overlapped a stall as long as the router's
deadline is sent again once (counted as ``retried_after_harness_stall``), never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

STALL = 0.25  # seconds late past its sleep: a stall of the harness's loop
SETTLE_EVERY = 20_000  # inputs between two settles of the heap (nothing in flight)
_TICK = 0.05


class StallWatch:
    """The harness loop's stalls (start, end) in ``time.monotonic()``; a task of its own."""

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []
        self.settles = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(_TICK)
            after = time.monotonic()
            if after - before - _TICK >= STALL:
                self.stalls.append((before + _TICK, after))

    def longest_during(self, start: float, end: float) -> float:
        """The longest stall that overlapped [start, end] (0.0: none)."""
        return max(
            (min(e, end) - max(s, start) for s, e in self.stalls if s < end and e > start),
            default=0.0,
        )

    def settle(self) -> None:
        """Collect, then freeze what survived: call it with no input in flight."""
        gc.collect()
        gc.freeze()
        self.settles += 1

    def figures(self) -> dict[str, object]:
        longest = max((e - s for s, e in self.stalls), default=0.0)
        return {
            f"harness_stalls_over_{STALL:g}s": len(self.stalls),
            "longest_harness_stall_s": round(longest, 2),
            "heap_settles": self.settles,
        }
