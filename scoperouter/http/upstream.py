"""The upstream side of HTTP/1.1: one connection to a backend or a peer router, one exchange at
a time (keep-alive), its answers parsed by llhttp.

An answer's heads (informational ones, then the final one) are queued for the exchange
(:mod:`scoperouter.http.client`), which waits with :meth:`UpstreamConnection.wait`. Its body is
kept (:attr:`UpstreamConnection.pending`) until the exchange starts relaying it to a sink (the
client connection; reading pauses past :data:`HIGH_WATER`), or kept whole when asked
(``keep_whole``: at most :data:`WHOLE_MAX`). What an upstream sends is bounded as a client's
is: a head, or what a body carries besides its bytes (chunk headers, trailer fields), larger
than :data:`HEAD_MAX` fails the exchange; trailer fields are dropped. A response deadline
(``deadline``) is checked by the pool's sweep.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Final, Literal, NamedTuple, Protocol

import httptools

from scoperouter.http.flow import READ_BUFFER, FlowControl, stream_transport
from scoperouter.http.wire import Fields, chunk

HIGH_WATER: Final = 256 * 1024  # answer bytes kept before reading from the upstream pauses
WHOLE_MAX: Final = 32 * 1024 * 1024  # an answer read whole (catalog region, A & B / A | B) at most
HEAD_MAX: Final = 256 * 1024  # an answer's head, or its chunk headers and trailers, at most
TOO_LARGE: Final = f"its answer is larger than {WHOLE_MAX // (1024 * 1024)} MiB"
OVER_BUDGET: Final = "the router's buffer for combined requests is full"  # a `reserve` said no
HEAD_TOO_LARGE: Final = (
    f"invalid answer: its head or trailers are larger than {HEAD_MAX // 1024} KiB"
)
RESPONSE_TIMEOUT: Final = "response timeout"

Framing = Literal["length", "chunked", "raw"]
Head = tuple[int, bytes, Fields]
"""An answer's head: status, reason phrase, fields."""


class Origin(NamedTuple):
    """Where a connection goes (the pool's key)."""

    scheme: str
    host: str  # without IPv6 brackets
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


class Sink(Protocol):
    """Where an answer's body goes (the client connection)."""

    def write(self, data: bytes) -> None: ...


class _StopBody(Exception):
    """Raised in a parser callback: a HEAD answer has no body, whatever it says."""


class UpstreamConnection(asyncio.BufferedProtocol):
    """One connection to an upstream, one exchange at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl | None = None
        # Its event loop, from connection_made on: asyncio.get_running_loop() makes a getpid()
        # system call at every call (CPython's check for a fork); wait() runs per exchange.
        self.loop: asyncio.AbstractEventLoop | None = None
        # Its callbacks are this connection's methods: a reference cycle, dropped when the
        # connection is lost (else every closed one waits for the cycle collector, which runs
        # rarely in a worker: the pool's idle connections closed after a crowd stayed in memory).
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.open = False
        self.idle_since = 0.0
        self.on_lost: Callable[[UpstreamConnection], None] | None = None  # the lending pool
        # the exchange in progress
        self.skip_body = False  # the answer to a HEAD request
        self.received = False  # a byte of the answer came
        self.status = 0  # the final answer's, once its head is in
        self.heads: collections.deque[Head] = collections.deque()
        self.sink: Sink | None = None  # where body bytes go
        self.framing: Framing = "length"  # how the body is written to the sink
        self.until_close = False  # the answer's body ends with the connection
        self.pending: list[bytes] = []  # body bytes not relayed yet
        self.pending_size = 0
        self.keep_whole = False  # the whole body is wanted (bounded by WHOLE_MAX)
        # While kept whole: asked for each piece's size first; False fails it (a budget)
        self.reserve: Callable[[int], bool] | None = None
        self.complete = False
        self.keep_alive = False
        self.error: str | None = None
        self.deadline: float | None = None  # time.monotonic(): the response timeout
        self.progress_timeout: float | None = None  # while a body streams: each piece restarts
        self.timed_out = False
        self._waiter: asyncio.Future[None] | None = None
        self._reason = b""
        self._fields: Fields = []
        self._in_head = False
        self._progress = False  # the last read carried body bytes
        self._overhead = 0  # raw bytes of a head, or of a body's non-body parts, being read

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = stream_transport(transport)
        self.loop = loop = asyncio.get_running_loop()
        self.flow = FlowControl(transport, loop)
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.parser = None  # nothing more is read: the cycle through its callbacks goes
        if self.flow is not None:
            self.flow.lost()
        if self.on_lost is not None:
            self.on_lost(self)
        if not self.complete and self.status >= 200 and self.until_close and self.error is None:
            self.complete = True  # a body delimited by the end of the connection
            self.keep_alive = False
        elif not self.complete and self.error is None:
            self.error = str(exc) if exc else "the connection was closed before the answer"
        self._wake()

    def pause_writing(self) -> None:
        assert self.flow is not None
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        assert self.flow is not None
        self.flow.resume_writing()

    def pause_reading(self) -> None:
        if self.flow is not None:
            self.flow.pause_reading()

    def resume_reading(self) -> None:
        flow = self.flow
        if flow is not None and flow.read_paused:
            flow.resume_reading()

    async def drain(self) -> None:
        flow = self.flow
        if flow is not None and flow.write_paused_since is not None:  # (no coroutine else)
            await flow.drain()
        if not self.open:
            raise ConnectionError(self.error or "the upstream closed the connection")

    def get_buffer(self, sizehint: int) -> memoryview:
        return READ_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(READ_BUFFER[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        parser = self.parser
        if parser is None:
            return  # lost (a transport delivers nothing after connection_lost)
        self.received = True
        self._progress = False
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _StopBody):
                self.parser = httptools.HttpResponseParser(self)  # the next answer's
                return
            self.fail(f"invalid answer: {exc.__context__ or exc}")
            return
        except httptools.HttpParserError as exc:
            self.fail(f"invalid answer: {exc}")
            return
        if self._in_head or (self.status >= 200 and not self.complete and not self._progress):
            # A head still incomplete, or bytes of a body that carried none of it (chunk
            # headers, trailer fields): bounded (HEAD_MAX reached with the head still
            # incomplete fails; one that ends in the read past it may be up to a read larger),
            # so their cost stays linear.
            self._overhead += len(data)
            if self._overhead >= HEAD_MAX:
                self.fail(HEAD_TOO_LARGE)

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.open:
            self.transport.write(data)

    def discard(self) -> None:
        """Close it (gracefully) unless it is closing already: not to be reused."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def fail(self, error: str) -> None:
        """Give up the exchange: the connection is aborted and its waiter woken."""
        if self.error is None:
            self.error = error
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def expire(self) -> None:
        """The response deadline has passed (the pool's sweep calls this)."""
        self.deadline = None
        self.timed_out = True
        self.fail(RESPONSE_TIMEOUT)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- llhttp callbacks

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            self._fields.append((name, value))
        # else a trailer field: dropped (its bytes are bounded in data_received)

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None  # (a callback of its feed_data)
        status = parser.get_status_code()
        self._in_head = status < 200  # an informational answer: the final head follows
        self._overhead = 0
        self.heads.append((status, self._reason, self._fields))
        self._reason, self._fields = b"", []
        if status >= 200:
            self.status = status
            self._wake()
            if self.skip_body:
                self.complete, self.keep_alive = True, parser.should_keep_alive()
                raise _StopBody()
        else:
            self._wake()

    def on_body(self, body: bytes) -> None:
        if self.status < 200:
            return
        self._progress = True
        self._overhead = 0
        if self.progress_timeout is not None:
            self.deadline = time.monotonic() + self.progress_timeout
        if self.sink is None:
            # Before the exchange has written the answer's head (the whole answer may come in
            # one read): kept until then, reading paused if it grows.
            if self.reserve is not None and not self.reserve(len(body)):
                self.fail(OVER_BUDGET)
                return
            self.pending.append(body)
            self.pending_size += len(body)
            if self.pending_size > WHOLE_MAX:
                self.fail(TOO_LARGE)
            elif self.pending_size > HIGH_WATER and not self.keep_whole:
                self.pause_reading()
            return
        self.sink.write(self._framed(body))

    def on_message_complete(self) -> None:
        if self.status < 200:
            return  # an informational answer; the final one follows
        parser = self.parser
        assert parser is not None  # (a callback of its feed_data)
        self.keep_alive = parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- an exchange

    def _framed(self, body: bytes) -> bytes:
        return chunk(body) if self.framing == "chunked" else body

    def start_relay(self, sink: Sink, head: bytes = b"") -> None:
        """From now on the body goes to `sink`; `head` (the answer's head) and what came
        before go first, in one write: a small answer that came whole leaves in one segment
        (one TLS record on a peer link), not two."""
        self.sink = sink
        pending, self.pending, self.pending_size = self.pending, [], 0
        parts = [head]  # (a list, not a generator: compiled, 100 against 190 ns)
        for body in pending:
            parts.append(self._framed(body))
        data = b"".join(parts)
        if data:
            sink.write(data)
        self.resume_reading()

    def take_body(self) -> bytes:
        """The body kept so far (all of it once ``complete``)."""
        body = b"".join(self.pending)
        self.pending, self.pending_size = [], 0
        self.reserve = None
        return body

    def reset(self, skip_body: bool) -> None:
        """Ready for a new exchange."""
        self.skip_body = skip_body
        self.received = False
        self.status = 0
        self.heads.clear()
        self.sink = None
        self.pending, self.pending_size = [], 0
        self.keep_whole = False
        self.reserve = None
        self.framing = "length"
        self.until_close = False
        self.complete = False
        self.error = None
        self.deadline = None
        self.progress_timeout = None
        self.timed_out = False
        self._in_head = True  # the answer's head is what comes first (no callback for it)
        self._overhead = 0

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop (asked of asyncio once, not per exchange)."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return loop

    async def wait(self) -> None:
        """Until something happens (a head, the end, an error)."""
        if self.error is not None or self.complete or self.heads:
            return
        self._waiter = self.event_loop().create_future()
        await self._waiter
