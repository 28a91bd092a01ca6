"""Flow control for one connection, shared by the server and the upstream side (as uvicorn's
``flow_control.py`` is shared by its protocols), and the read buffer both sides read into.

Reading is paused while what was read waits for the other side (a request body the upstream
has not taken, answers queued behind a slow client), and a writer waits while the transport's
write buffer is above asyncio's high-water mark. ``write_paused_since`` lets a sweep find a
peer that stopped reading.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

READ_SIZE = 256 * 1024  # at most this much is read from a socket at once (asyncio's own size)
READ_BUFFER = memoryview(bytearray(READ_SIZE))
"""What every connection of a process reads into (``asyncio.BufferedProtocol``), then parses
at once: a read is consumed before the next one starts (one thread; llhttp's callbacks copy
what they keep). asyncio's plain protocols get a new 256 KiB ``bytes`` per read, shrunk to
what came: an allocation per read, and memory the allocator kept as it fragmented (a worker
grew ~1 MB a minute under a steady load in bench.soak)."""


def stream_transport(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """The transport ``connection_made`` gives a stream protocol, typed as such. Not checked
    with ``isinstance``: uvloop's transports have asyncio's interface without deriving from
    its classes. An ``assert isinstance(transport, asyncio.Transport)`` failed in every
    ``connection_made`` on uvloop, so no connection was served: its request was never read
    and the client's connection was reset (seen in test_combined; a router run with
    ``python -O``, whose asserts are stripped, worked)."""
    return cast(asyncio.Transport, transport)


class FlowControl:
    __slots__ = (
        "_loop",
        "_transport",
        "_write_ready",
        "closed",
        "read_paused",
        "write_paused_since",
    )

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop  # the connection's (asking asyncio makes a getpid() system call)
        self._write_ready: asyncio.Future[None] | None = None
        self.read_paused = False
        self.write_paused_since: float | None = None  # time.monotonic()
        self.closed = False

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.closed:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        """asyncio's ``Protocol.pause_writing``: the write buffer is full."""
        if self._write_ready is None:
            self._write_ready = self._loop.create_future()
            self.write_paused_since = time.monotonic()

    def resume_writing(self) -> None:
        """asyncio's ``Protocol.resume_writing``."""
        ready, self._write_ready, self.write_paused_since = self._write_ready, None, None
        if ready is not None and not ready.done():
            ready.set_result(None)

    async def drain(self) -> None:
        """Until the write buffer is below the high-water mark (or the connection is lost)."""
        ready = self._write_ready
        if ready is not None:
            await asyncio.shield(ready)

    def lost(self) -> None:
        """The connection is gone: writers stop waiting (they find it closed)."""
        self.closed = True
        self.resume_writing()
