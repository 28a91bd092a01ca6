"""The worker's budget of bytes buffered for combined requests (``A & B``, ``A | B``).

A combined request reads each cloud's answer whole (up to 32 MiB each) and keeps its own body
to send again; without a bound, concurrent merges hold as much as clients ask for. One
:class:`Budget` per worker process counts what every combined request holds; each request
takes a :class:`Lease` on it (:meth:`Budget.lease`), reserves the bytes as they arrive
(:meth:`Lease.reserve`: the upstream connection asks before it keeps each piece) and gives
them all back when its answer is made, whatever happened (:meth:`Lease.release` in a
``finally``: errors, a client gone, cancellation). A lease refused once stays refused: the
request is answered 503 (:mod:`scoperouter.router.combined`).

Bookkeeping, no I/O: a worker runs one event loop, so no lock is needed. After a large
combined request (and when the worker's pool closes a crowd's idle upstream connections:
:meth:`scoperouter.proxy.worker.Worker.tidy`), :func:`trim_soon` hands the freed memory back
to the system: glibc keeps large freed buffers in its heap once its mmap threshold has grown
(it does after the first multi-MiB buffer is freed), and small blocks freed between blocks
still in use, so without ``malloc_trim`` a worker's RSS stays at its peak.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Callable

MIB = 1024 * 1024
TRIM_AFTER = 8 * MIB  # a request that held this much: its memory is handed back soon after
TRIM_DELAY = 1.0  # seconds: after the answer has gone (the merged body is freed by then)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS: nothing to do)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
        return trim
    return None


_TRIM = _malloc_trim()
# The loop a trim is scheduled on (at most one at a time; a worker runs one loop)
_pending: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}


def trim_soon() -> None:
    """Hand the worker's free heap memory back to the system in TRIM_DELAY seconds (once,
    however many large requests end meanwhile)."""
    loop = asyncio.get_running_loop()
    if _TRIM is None or loop in _pending:
        return
    _pending.clear()  # one scheduled on another loop, closed since, would never run
    _pending[loop] = loop.call_later(TRIM_DELAY, _trim)


def _trim() -> None:
    _pending.clear()
    gc.collect(1)  # aborted connections in reference cycles: their buffers go with them
    if _TRIM is not None:
        _TRIM(0)


class Budget:
    """Bytes held now by the combined requests of one worker process."""

    __slots__ = ("used",)

    def __init__(self) -> None:
        self.used = 0

    def lease(self, limit: int) -> Lease:
        """A lease for one request, against `limit` bytes for the whole worker (read from
        the current config at each request: a reload applies to the next one)."""
        return Lease(self, limit)


class Lease:
    """What one request holds of a :class:`Budget`."""

    __slots__ = ("budget", "closed", "crowded", "held", "limit", "refused")

    def __init__(self, budget: Budget, limit: int) -> None:
        self.budget = budget
        self.limit = limit
        self.held = 0
        self.refused = False  # a reservation failed: the request gets the 503
        self.crowded = False  # ... while other requests held part of the budget
        self.closed = False

    def reserve(self, size: int) -> bool:
        """Count `size` more bytes, or False (and the lease refused from now on) when the
        worker's limit would be passed, or the lease is released already."""
        if self.closed or self.refused:
            return False
        budget = self.budget
        if budget.used + size > self.limit:
            self.refused = True
            self.crowded = budget.used > self.held
            return False
        budget.used += size
        self.held += size
        return True

    def release(self) -> None:
        """Give back everything held; later reservations fail (a late piece of an answer
        still arriving for a request already answered is not counted, nor kept)."""
        self.budget.used -= self.held
        self.held = 0
        self.closed = True
