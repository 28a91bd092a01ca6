"""The lean data path: the router's own HTTP/1.1 server and client for reverse mode.

``settings.data_path: lean`` puts every frontend (client requests, router-to-router hops) on
this asyncio server instead of mitmproxy; the forward proxy listener stays on mitmproxy, in the
same worker process and event loop (:mod:`scoperouter.proxy.engine`). Why: mitmproxy's own
machinery costs ~2.6M instructions per request, this path ~0.2M (docs/design.md, "Data path and
its cost").

What a request goes through is the router's one implementation, shared with the mitmproxy
addons (they are thin adapters of the same calls): :func:`~.addons.routing.route` on
:func:`~.addons.routing.reverse_facts`, the breaker (:class:`~.addons.health.UpstreamHealth`
``admit``/``succeeded``/``failed``), :func:`~.addons.identity.swap_tokens`, the timeouts per
destination kind (``settings.timeouts``), :func:`~.addons.errors.upstream_failure` for the
status and message of a failed upstream, :func:`~.addons.region.regioned`, the access log
(:class:`~.addons.accesslog.AccessLog`) and the metrics (:class:`~.addons.metrics.Metrics`),
the head limits and their messages (:mod:`scoperouter.proxy.heads`). This module only speaks
HTTP/1.1:

* **Parsing** by llhttp (``httptools``), strict: ``Transfer-Encoding`` with ``Content-Length``,
  bad chunk sizes, invalid tokens and bare LF are refused (400); the head limits (431, 414,
  408) and control characters (400) as :mod:`~scoperouter.proxy.heads` says. Each refusal is
  answered with OpenStack JSON and ``Connection: close``, logged and counted once.
* **Keep-alive and pipelining**: requests of a connection are answered one at a time, in
  order; what a client pipelines waits in a short queue (reading pauses when it is full).
* **Bodies stream** both ways with back-pressure: reading from one side pauses while the other
  side's write buffer is full (bounded memory whatever the size). ``Content-Length`` is kept;
  other bodies travel chunked. ``Expect: 100-continue`` is answered by the router once the
  request is routed (a refused request gets its refusal instead, and the connection closes).
  1xx answers are passed on; ``HEAD``, 204 and 304 have no body.
* **Upstream connections** come from a per-process pool per destination (``scheme://host:port``;
  at most :data:`POOL_IDLE_MAX` idle ones, closed after :data:`POOL_IDLE_SECONDS`). A request
  without a body that fails on a *reused* connection before any answer (the peer had closed
  it) is retried once on a new one if its method is idempotent. HTTPS upstreams are verified
  (``settings.verify``, ``settings.ca_bundle``); TLS frontends serve their certificate.
  Issue 11's pooled router-to-router links and fan-out build on :class:`Pool`.
* **Timeouts**: the connect timeout per destination kind bounds each new connection; the
  response timeout runs from the end of the request (restarted by every chunk of a streamed
  upload) to the answer's head; idle keep-alive connections close after ``idle_timeout``. One
  sweep per worker every :data:`TICK` seconds checks the deadlines (no timer per request).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httptools

from scoperouter.catalog import Catalog, Frontend, Settings
from scoperouter.errors import Reject, error_body, status_title
from scoperouter.proxy import fanout, heads
from scoperouter.proxy.addons.accesslog import AccessLog
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.errors import CLIENT_GONE_STATUS, upstream_failure
from scoperouter.proxy.addons.guard import HeadGuard
from scoperouter.proxy.addons.health import UpstreamHealth
from scoperouter.proxy.addons.identity import TokenSwap, swap_tokens
from scoperouter.proxy.addons.metrics import Metrics
from scoperouter.proxy.addons.region import regioned
from scoperouter.proxy.addons.routing import (
    LOOP_MESSAGE,
    reverse_facts,
    route,
    split_url,
    wrong_scheme,
)
from scoperouter.proxy.combined import BODY_TOO_LARGE, Combiner, bodiless
from scoperouter.proxy.flowstate import REQUEST_ID_HEADER, FlowState, new_state
from scoperouter.proxy.listeners import Listener
from scoperouter.routing import FRONTEND_HEADER, Combined, Failover, FanOut, Forward, header_title

logger = logging.getLogger("scoperouter")

TICK = 0.1  # seconds between two sweeps of the deadlines
HIGH_WATER = 256 * 1024  # request body bytes buffered before reading from the client pauses
PIPELINE_MAX = 8  # requests queued on one connection before reading from it pauses
POOL_IDLE_MAX = 64  # idle upstream connections kept per destination
POOL_IDLE_SECONDS = 15.0  # an idle upstream connection older than this is closed
REGION_MAX = 1024 * 1024  # a token validation's body is rewritten up to this size
WHOLE_MAX = 32 * 1024 * 1024  # an answer read whole (catalog region, A & B / A | B) at most
TOO_LARGE = f"its answer is larger than {WHOLE_MAX // (1024 * 1024)} MiB"
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
HOP_BY_HOP = heads.HOP_BY_HOP
_FRONTEND_FIELD = FRONTEND_HEADER.encode()
_CONTROL = heads.CONTROL


class _Refused(Exception):
    """Raised in a parser callback to stop parsing: the head is refused (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _StopBody(Exception):
    """Raised in a response parser callback: a HEAD answer has no body, whatever it says."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A head the lean server refused (the sinks of :class:`HeadGuard` log and count it)."""

    status: int
    message: str
    method: str
    path: str
    started: float
    client_address: str | None


def render(
    status: int,
    reason: str,
    fields: Iterable[tuple[bytes, bytes]],
    body: bytes = b"",
) -> bytes:
    """An HTTP/1.1 response head (and `body`, whose framing `fields` must say)."""
    parts = [f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")]
    parts += [b"%s: %s\r\n" % field for field in fields]
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


def error_response(status: int, message: str, request_id: str | None, close: bool) -> bytes:
    """The router's own answer: OpenStack JSON with the standard reason phrase."""
    body = error_body(status, message)
    fields = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body))]
    if request_id is not None:
        fields.append((b"X-Scope-Request-Id", request_id.encode()))
    if close:
        fields.append((b"Connection", b"close"))
    return render(status, status_title(status), fields, body)


# ------------------------------------------------------------------------------- bodies


class Body:
    """A request body on its way from the client: chunks queued, reading paused while more
    than :data:`HIGH_WATER` bytes wait (the connection resumes it as they are taken)."""

    __slots__ = ("chunks", "conn", "done", "error", "size", "waiter")

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.done = False
        self.error: str | None = None  # the client's framing error, if any
        self.waiter: asyncio.Future[None] | None = None

    def put(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER:
            self.conn.pause_reading()
        self._wake()

    def finish(self, error: str | None = None) -> None:
        self.done, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self) -> bytes | None:
        """The next chunk; None at the end (ConnectionError if the client broke it)."""
        while not self.chunks:
            if self.done:
                if self.error is not None:
                    raise _ClientBodyError(self.error)
                return None
            if self.conn.closed:
                raise _ClientGone()
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        data = self.chunks.popleft()
        self.size -= len(data)
        if self.size <= HIGH_WATER // 2:
            self.conn.resume_reading()
        return data


class _ClientGone(Exception):
    pass


class _ClientBodyError(Exception):
    pass


@dataclass(slots=True, kw_only=True)
class Request:
    method: str
    target: bytes
    version: str
    fields: list[tuple[bytes, bytes]]
    headers: dict[str, str]
    keep_alive: bool
    chunked: bool
    length: int | None  # Content-Length, if given
    body: Body
    started: float


# ------------------------------------------------------------------------- client side


class ClientConnection(asyncio.Protocol):
    """One client connection: parses requests, queues them, answers them in order."""

    def __init__(self, server: LeanServer, listener: Listener, tls: bool = False) -> None:
        self.server = server
        self.listener = listener
        self.tls = tls  # the client speaks TLS (an https frontend also hears plain HTTP)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        self.queue: collections.deque[Request | Refusal] = collections.deque()
        self.wakeup: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.busy = False  # a request is being answered
        self.refused = False  # a refusal is queued: nothing more is read
        self.draining = False
        self.head_started: float | None = None
        self.idle_since = time.monotonic()
        self._read_paused = False
        self._write_ready: asyncio.Future[None] | None = None
        self.relay: UpstreamConnection | None = None  # upstream paused with our writes
        # the head being parsed
        self._url = bytearray()
        self._fields: list[tuple[bytes, bytes]] = []
        self._count = 0
        self._head_bytes = 0
        self._raw_head = 0
        self._current: Request | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # asyncio sets it only on sockets whose proto says TCP (the supervisor's may not):
            # without it a head and body written apart wait ~40 ms for a delayed ACK.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        self.server.metrics.opened()
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.connections.discard(self)
        self.server.metrics.closed()
        if self._current is not None and not self._current.body.done:
            self._current.body._wake()
        for item in self.queue:
            if isinstance(item, Request):
                item.body._wake()
        self._wake()
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        if self.relay is not None:
            self.relay.fail("the client went away")
        if self.task is not None and not self.busy:
            self.task.cancel()

    def pause_writing(self) -> None:
        self._write_ready = asyncio.get_running_loop().create_future()
        if self.relay is not None:
            self.relay.pause_reading()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None
        if self.relay is not None:
            self.relay.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # lingering after a refusal: what still comes is dropped
        in_head = self._current is None or self.head_started is not None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            if isinstance(refusal, _Refused):
                self._refuse(refusal.status, refusal.message)
            else:
                logger.error("lean server: a parser callback failed: %r", refusal)
                self._refuse(400, "malformed request")
            return
        except httptools.HttpParserError as exc:
            self._parse_error(exc)
            return
        if in_head and self.head_started is not None:
            # A head is still incomplete: its raw size counts (a field value may be huge).
            self._raw_head += len(data)
            limits = self.server.settings.limits
            if self._raw_head > limits.max_header_bytes:
                self._refuse(431, heads.too_large(limits))

    # -- llhttp callbacks (a head)

    def on_message_begin(self) -> None:
        self.head_started = time.monotonic()
        self._url.clear()
        self._fields = []
        self._count = 0
        self._head_bytes = 0
        self._raw_head = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        limits = self.server.settings.limits
        if len(self._url) + 16 > limits.max_request_line:
            raise _Refused(414, heads.line_too_long(limits))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count += 1
        self._head_bytes += len(name) + len(value) + 4
        limits = self.server.settings.limits
        if self._head_bytes + len(self._url) > limits.max_header_bytes:
            raise _Refused(431, heads.too_large(limits))
        if _CONTROL.search(value) is not None:
            raise _Refused(400, heads.CONTROL_MESSAGE)
        if self._count <= limits.max_headers:
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        limits = self.server.settings.limits
        if self._count > limits.max_headers:
            raise _Refused(431, heads.too_many_fields(self._count, limits))
        headers: dict[str, str] = {}
        for raw_name, raw_value in self._fields:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("utf-8", "surrogateescape")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        parser = self.parser
        length = headers.get("content-length")
        request = Request(
            method=parser.get_method().decode("ascii"),
            target=bytes(self._url),
            version=parser.get_http_version(),
            fields=self._fields,
            headers=headers,
            keep_alive=parser.should_keep_alive(),
            chunked="chunked" in headers.get("transfer-encoding", "").lower(),
            length=int(length) if length is not None and length.isdigit() else None,
            body=Body(self),
            started=self.head_started or time.monotonic(),
        )
        self.head_started = None
        self._current = request
        self.queue.append(request)
        if len(self.queue) >= PIPELINE_MAX:
            self.pause_reading()
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._current is not None:
            self._current.body.put(body)

    def on_message_complete(self) -> None:
        if self._current is not None:
            self._current.body.finish()
            self._current = None

    # -- refusals

    def _parse_error(self, exc: Exception) -> None:
        current = self._current
        if current is not None and not current.body.done:
            # The head was fine, the body is not: the client's fault, answered as such.
            current.body.finish(f"malformed request body: {exc}")
            self._current = None
            self.refused = True
            self.pause_reading()
            return
        self._refuse(400, _malformed(exc))

    def _refuse(self, status: int, message: str) -> None:
        """Refuse the head being read: answered after what is queued before it, then the
        connection closes. Logged and counted as every refusal of a head."""
        if self._current is not None and not self._current.body.done:
            self._current.body.finish("the connection's next request was refused")
        method, path = heads.split_request_line(bytes(self._url_line()))
        started = self.head_started or time.monotonic()
        self.head_started = None
        self.queue.append(
            Refusal(
                status=status,
                message=message,
                method=method,
                path=path,
                started=started,
                client_address=self.peer,
            )
        )
        self.refused = True
        self._wake()

    def _url_line(self) -> bytes:
        try:
            method = self.parser.get_method()
        except Exception:
            method = b"-"
        return method + b" " + bytes(self._url[:256]) if self._url else b"-"

    # -- flow control

    def pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if (
            self._read_paused
            and self.transport is not None
            and not self.closed
            and not self.refused
            and len(self.queue) < PIPELINE_MAX
        ):
            self._read_paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        if self._write_ready is not None:
            await self._write_ready
        if self.closed:
            raise _ClientGone()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    # -- the requests, in order

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.closed:
                if not self.queue:
                    if self.draining:
                        break
                    self.idle_since = time.monotonic()
                    self.wakeup = loop.create_future()
                    await self.wakeup
                    continue
                item = self.queue.popleft()
                self.resume_reading()
                if isinstance(item, Refusal):
                    await self._answer_refusal(item)
                    return
                self.busy = True
                try:
                    keep = await self.server.handle(self, item)
                finally:
                    self.busy = False
                if not keep or self.draining:
                    break
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("lean server: a connection failed")
        self.close()

    async def _answer_refusal(self, refusal: Refusal) -> None:
        self.write(error_response(refusal.status, refusal.message, None, close=True))
        self.server.guard.refused(refusal)
        # Half-close and drop what the client still sends for a moment: closing at once with
        # unread data would reset the connection and lose the answer on its way.
        transport = self.transport
        if transport is not None and not self.closed and transport.can_write_eof():
            with contextlib.suppress(OSError):
                transport.write_eof()
            with contextlib.suppress(Exception):
                transport.resume_reading()
            self._read_paused = False
            deadline = time.monotonic() + heads.LINGER_SECONDS
            while not self.closed and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def check(self, now: float, settings: Settings) -> None:
        """Deadlines of the connection (the sweep calls this): head and idle timeouts."""
        limits = settings.limits
        if self.refused or self.closed:
            return
        if self.head_started is not None:
            if now - self.head_started > limits.header_timeout:
                self._refuse(408, heads.too_slow(limits))
        elif not self.busy and not self.queue and now - self.idle_since > limits.idle_timeout:
            self.close()


# ----------------------------------------------------------------------- upstream side


class UpstreamConnection(asyncio.Protocol):
    """One connection to an upstream, one exchange at a time (HTTP/1.1 keep-alive)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.open = False
        self.idle_since = 0.0
        self.skip_body = False  # the answer to a HEAD request
        self.received = False  # a byte of the answer came
        self.status = 0
        self.reason = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.heads: collections.deque[tuple[int, bytes, list[tuple[bytes, bytes]]]] = (
            collections.deque()
        )
        self.sink: ClientConnection | None = None  # where body bytes go
        self.framing: str = "length"  # how the body is written to the client
        self.until_close = False  # the answer's body ends with the connection
        self.pending: list[bytes] = []  # body bytes that came before the relay began
        self.pending_size = 0
        self.keep_whole = False  # the whole body is wanted (catalog region; length-bounded)
        self.complete = False
        self.keep_alive = False
        self.error: str | None = None
        self.waiter: asyncio.Future[None] | None = None
        self._write_ready: asyncio.Future[None] | None = None
        self._read_paused = False
        self.lender: Pool | None = None  # the pool that lent it to an exchange, until returned

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.lender is not None:
            self.lender.returned(self)
        if not self.complete and self.status >= 200 and self.until_close:
            self.complete = True  # a body delimited by the end of the connection
            self.keep_alive = False
        elif not self.complete and self.error is None:
            self.error = str(exc) if exc else "the connection was closed before the answer"
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        self._write_ready = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None

    def pause_reading(self) -> None:
        if self.transport is not None and self.open and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self.open and self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        if self._write_ready is not None:
            await self._write_ready
        if not self.open:
            raise ConnectionError(self.error or "the upstream closed the connection")

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _StopBody):
                self.parser = httptools.HttpResponseParser(self)  # the next answer's
                return
            self.fail(f"invalid answer: {exc}")
        except httptools.HttpParserError as exc:
            self.fail(f"invalid answer: {exc}")

    def discard(self) -> None:
        """Close it (gracefully) unless it is closing already: not to be reused."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # llhttp callbacks

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.heads.append((status, self.reason, self.fields))
        self.reason, self.fields = b"", []
        if status >= 200:
            self.status = status
            self._wake()
            if self.skip_body:
                self.complete, self.keep_alive = True, self.parser.should_keep_alive()
                raise _StopBody()
        else:
            self._wake()

    def on_body(self, body: bytes) -> None:
        if self.status < 200:
            return
        if self.sink is None:
            # Before the router has written the answer's head (the whole answer may come in
            # one read): kept until then, reading paused if it grows.
            self.pending.append(body)
            self.pending_size += len(body)
            if self.pending_size > HIGH_WATER and not self.keep_whole:
                self.pause_reading()
            elif self.pending_size > WHOLE_MAX:
                self.fail(TOO_LARGE)
            return
        self.deliver(body)

    def deliver(self, body: bytes) -> None:
        sink = self.sink
        assert sink is not None
        sink.write(self._framed(body))

    def _framed(self, body: bytes) -> bytes:
        if self.framing == "chunked":
            return b"%x\r\n%s\r\n" % (len(body), body)
        return body

    def start_relay(self, sink: ClientConnection, head: bytes = b"") -> None:
        """From now on the body goes to `sink`; `head` (the answer's head) and what came
        before go first, in one write: a small answer that came whole leaves in one segment
        (one TLS record on a peer link), not two."""
        self.sink = sink
        pending, self.pending, self.pending_size = self.pending, [], 0
        data = head + b"".join(self._framed(body) for body in pending)
        if data:
            sink.write(data)
        self.resume_reading()

    def on_message_complete(self) -> None:
        if self.status < 200:
            return  # an informational answer; the final one follows
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        self._wake()

    # an exchange

    def reset(self, skip_body: bool) -> None:
        self.skip_body = skip_body
        self.received = False
        self.status = 0
        self.heads.clear()
        self.sink = None
        self.pending, self.pending_size = [], 0
        self.keep_whole = False
        self.framing = "length"
        self.until_close = False
        self.complete = False
        self.error = None

    async def wait(self) -> None:
        """Until something happens (a head, the end, an error)."""
        if self.error is not None or self.complete or self.heads:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter


@dataclass(slots=True)
class Warm:
    """A destination the pool keeps connections open to ahead of need (a peer router)."""

    scheme: str
    host: str
    port: int
    count: int  # connections opened ahead at least (settings.peers.warm)
    timeout: float  # connect timeout
    opening: int = 0  # connects ahead under way
    connecting: int = 0  # connects under way for requests that found none idle
    retry_at: float = 0.0  # after a failed connect: not before (time.monotonic())
    backoff: float = 0.0  # seconds to the next try while connects fail (doubling), else 0
    target: int = 0  # connections wanted in all (lent, idle, opening): `count`, grown by load

    def missed(self, lent: int) -> None:
        """A request found no idle connection (`lent` in use, its own included): keep twice
        as many from now on, so a burst up to that size again finds them open."""
        if self.count:
            self.target = max(self.target, 2 * lent)

    def expired(self, unused: int) -> None:
        """`unused` idle connections reached their idle time: the load no longer needs them."""
        self.target = max(self.count, self.target - unused)


class Pool:
    """Upstream connections of this process, per destination (``scheme://host:port``): idle
    keep-alive connections are reused (at most :data:`POOL_IDLE_MAX` per destination, closed
    after :data:`POOL_IDLE_SECONDS` idle, or after the idle time of a peer router's link).
    A backend's are taken most recently used first (the pool shrinks to what the load needs).

    Peer routers (the other clouds' routers, on their peer links) are *warm* destinations: the
    pool opens ``settings.peers.warm`` connections to each at start and keeps that many open
    (another is opened in the background when the peer closed one), so a request finds the TCP
    and TLS handshakes across the WAN done. When a request finds none idle, the target doubles
    to twice the connections then in use (:meth:`Warm.missed`), opened in the background; it
    shrinks by those that reach their idle time unused (:meth:`Warm.expired`). Why a target in
    all and not a number kept idle: each worker process has its own pool, and the kernel
    spreads a burst of client connections over the workers unevenly (``SO_REUSEPORT``: each
    worker gets a random share), so a worker must be ready for more than its usual share, but
    topping up a number of idle ones in the middle of every burst above the usual share would
    open WAN connections for nothing, as long as the largest share kept growing. Warm
    connections are taken least recently used first, so all of them carry traffic and none
    expires (to be opened again) while the load lasts. A failed connect is tried again after
    :data:`WARM_RETRY_SECONDS`, doubling up to :data:`WARM_RETRY_MAX` while it fails (logged
    once, and once when it works again). Their idle time is ``Peers.idle_seconds``: shorter
    than the peer's own idle timeout, so the pool never sends on a connection the peer is
    closing."""

    def __init__(self) -> None:
        self.idle: dict[str, collections.deque[UpstreamConnection]] = {}
        self.lent: dict[str, int] = {}  # connections carrying an exchange, per destination
        self.ssl: ssl.SSLContext | None = None
        self.peer_ssl: ssl.SSLContext | None = None
        self.warm: dict[str, Warm] = {}
        self.idle_seconds: dict[str, float] = {}  # per destination, else POOL_IDLE_SECONDS
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def configure(self, settings: Settings, peers: Iterable[str] = ()) -> None:
        """TLS contexts from `settings`; `peers`: the peer links' base URLs
        (``https://host:port``) this router sends to, kept warm."""
        self.ssl = _client_context(settings.ca_bundle, settings.verify)
        self.peer_ssl = _client_context(settings.peers.ca or settings.ca_bundle, settings.verify)
        idle = settings.peers.idle_seconds(settings.limits.idle_timeout)
        warm: dict[str, Warm] = {}
        for url in peers:
            scheme, host, port, _ = split_url(url)
            key = f"{scheme}://{host}:{port}"
            kept = self.warm.get(key)  # a reload: its connects under way count on
            if kept is None:
                kept = Warm(scheme, host, port, settings.peers.warm, settings.peer_connect_timeout)
            kept.count, kept.timeout = settings.peers.warm, settings.peer_connect_timeout
            kept.target = max(kept.target, kept.count) if kept.count else 0
            warm[key] = kept
        self.warm = warm
        self.idle_seconds = {key: idle for key in warm}

    def take(self, key: str) -> UpstreamConnection | None:
        """An idle connection to `key`, lent to the caller (who gives it back or closes it);
        None when there is none (then :meth:`connect`)."""
        idle = self.idle.get(key)
        warm = self.warm.get(key)
        found = None
        if idle:
            limit = self.idle_seconds.get(key, POOL_IDLE_SECONDS)
            now = time.monotonic()
            while idle:
                conn = idle.popleft() if warm is not None else idle.pop()
                if conn.open and now - conn.idle_since <= limit:
                    found = conn
                    break
                if conn.open and warm is not None:
                    warm.expired(1)
                if conn.transport is not None:
                    conn.transport.close()
        if found is not None:
            self._lend(found)
        if warm is not None:
            self.refill(key)
        return found

    def _lend(self, conn: UpstreamConnection) -> None:
        conn.lender = self
        self.lent[conn.key] = self.lent.get(conn.key, 0) + 1

    def returned(self, conn: UpstreamConnection) -> None:
        """`conn`'s exchange is over (given back, or its connection is gone)."""
        if conn.lender is self:
            conn.lender = None
            self.lent[conn.key] -= 1

    async def _open(
        self, key: str, scheme: str, host: str, port: int, timeout: float
    ) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            tls = self.peer_ssl if key in self.warm else self.ssl
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: UpstreamConnection(key),
                host,
                port,
                ssl=tls,
                server_hostname=host if tls else None,
            ),
            timeout,
        )
        return conn

    async def connect(
        self, key: str, scheme: str, host: str, port: int, timeout: float
    ) -> UpstreamConnection:
        """A new connection to `key`, lent to the caller as :meth:`take`'s (none was idle)."""
        warm = self.warm.get(key)
        if warm is None:
            conn = await self._open(key, scheme, host, port, timeout)
        else:
            warm.connecting += 1
            warm.missed(self.lent.get(key, 0) + warm.connecting)
            self.refill(key)
            try:
                conn = await self._open(key, scheme, host, port, timeout)
            finally:
                warm.connecting -= 1
        self._lend(conn)
        return conn

    def refill(self, key: str) -> None:
        """Open connections to a warm destination until its target is lent, idle or opening
        (at most :data:`POOL_IDLE_MAX` idle)."""
        warm = self.warm.get(key)
        if warm is None or self._closed or time.monotonic() < warm.retry_at:
            return
        idle = self.idle_count(key)
        missing = warm.target - self.lent.get(key, 0) - warm.connecting - idle - warm.opening
        for _ in range(min(missing, POOL_IDLE_MAX - idle - warm.opening)):
            warm.opening += 1
            task = asyncio.get_running_loop().create_task(self._open_ahead(key, warm))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _open_ahead(self, key: str, warm: Warm) -> None:
        try:
            conn = await self._open(key, warm.scheme, warm.host, warm.port, warm.timeout)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            if not warm.backoff:  # said once, not at every try
                logger.warning(
                    "cannot open connections ahead to the peer router at %s (trying again "
                    "every %g-%gs): %s",
                    key,
                    WARM_RETRY_SECONDS,
                    WARM_RETRY_MAX,
                    describe_error(exc),
                )
            warm.backoff = min(WARM_RETRY_MAX, (warm.backoff * 2) or WARM_RETRY_SECONDS)
            warm.retry_at = time.monotonic() + warm.backoff
            return
        finally:
            warm.opening -= 1
        if warm.backoff:
            warm.backoff = 0.0
            logger.warning("connections ahead to the peer router at %s open again", key)
        if self._closed or self.warm.get(key) is not warm:
            if conn.transport is not None:
                conn.transport.close()
            return
        self.give_back(conn)

    def give_back(self, conn: UpstreamConnection) -> None:
        self.returned(conn)
        if not conn.open:
            return
        idle = self.idle.setdefault(conn.key, collections.deque())
        if len(idle) >= POOL_IDLE_MAX or self._closed:
            if conn.transport is not None:
                conn.transport.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def sweep(self, now: float) -> None:
        for key, idle in self.idle.items():
            limit = self.idle_seconds.get(key, POOL_IDLE_SECONDS)
            gone = [c for c in idle if now - c.idle_since > limit or not c.open]
            warm = self.warm.get(key)
            if warm is not None:
                warm.expired(sum(1 for c in gone if c.open))  # not those the peer closed
            for conn in gone:
                idle.remove(conn)
                if conn.transport is not None:
                    conn.transport.close()
        for key in self.warm:
            self.refill(key)

    def idle_count(self, key: str) -> int:
        """Idle connections to `key` that are still open."""
        return sum(1 for conn in self.idle.get(key, ()) if conn.open)

    def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for idle in self.idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self.idle.clear()


WARM_RETRY_SECONDS = 5.0  # a failed connect ahead to a peer router is tried again after this,
WARM_RETRY_MAX = 60.0  # doubling up to this while it keeps failing


def _client_context(cafile: str | None, verify: bool) -> ssl.SSLContext:
    """A TLS client context: verified against `cafile` (else the system's CAs), the host name
    checked, unless `verify` is off."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def describe_error(exc: BaseException) -> str:
    """A connection error in words for the client and the log: a failed certificate check says
    so (and why) rather than OpenSSL's bracketed code."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        return f"TLS certificate verification failed: {why}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    return str(exc) or type(exc).__name__


# ------------------------------------------------------------------------------ server


@dataclass(slots=True, eq=False)
class Exchange:
    """A request on its way upstream: what the sweep watches."""

    state: FlowState
    upstream: UpstreamConnection | None = None
    response_at: float | None = None  # time.monotonic()
    response_timeout: float = 0.0

    def progress(self) -> None:
        if self.response_at is not None:
            self.response_at = time.monotonic() + self.response_timeout


def peer_links(catalog: Catalog, cloud: str) -> list[str]:
    """The other clouds' peer links (base URLs): a pool's warm destinations, verified with
    the federation's CA (``settings.peers.ca``)."""
    return [
        other.peer.url.base
        for name, other in catalog.clouds.items()
        if name != cloud and other.peer is not None
    ]


class LeanServer:
    """The reverse-mode listeners of one worker, sharing the router's addons' logic."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        guard: HeadGuard,
        health: UpstreamHealth,
        swap: TokenSwap,
        log: AccessLog,
        metrics: Metrics,
        combiner: Combiner,
    ) -> None:
        self.config = config
        self.combiner = combiner
        self.guard, self.health, self.swap, self.log, self.metrics = (
            guard,
            health,
            swap,
            log,
            metrics,
        )
        self.pool = Pool()
        combiner.use_pool(self.pool)  # A & B, A | B share this worker's upstream connections
        self.connections: set[ClientConnection] = set()
        self.exchanges: set[Exchange] = set()
        self.servers: list[asyncio.AbstractServer] = []
        self.acceptors: list[asyncio.Task[None]] = []  # https frontends' accept loops
        self.sniffing: set[asyncio.Task[None]] = set()  # connections not yet told apart
        self._sweeper: asyncio.Task[None] | None = None
        self.settings = config.current().settings
        self.frontends: dict[str, Frontend] = {}  # this cloud's, by base URL (the peer link)
        config.subscribe(self._configure)

    def _configure(self, catalog: Catalog) -> None:
        self.settings = catalog.settings
        cloud = self.config.cloud
        self.frontends = (
            {f.url.base: f for f in catalog.clouds[cloud].frontends}
            if cloud in catalog.clouds
            else {}
        )
        self.pool.configure(catalog.settings, peer_links(catalog, cloud))

    async def start(
        self, listeners: Iterable[Listener], sockets: Mapping[tuple[str, int], socket.socket]
    ) -> None:
        """Serve `listeners` on the supervisor's `sockets` (bound here when there is none)."""
        loop = asyncio.get_running_loop()
        for listener in listeners:
            frontend = listener.frontend
            assert frontend is not None
            sock = sockets.get((listener.host.lower(), listener.port))
            if sock is None:
                sock = socket.create_server(
                    (listener.host, listener.port), backlog=1024, reuse_port=True
                )
            context = frontend_context(frontend)
            if context is None:

                def factory(listener: Listener = listener) -> ClientConnection:
                    return ClientConnection(self, listener)

                self.servers.append(await loop.create_server(factory, sock=sock, backlog=1024))
            else:
                self.acceptors.append(loop.create_task(self._accept(sock, listener, context)))
        self._sweeper = loop.create_task(self._sweep())
        for key in self.pool.warm:  # the peer routers: connections opened ahead
            self.pool.refill(key)

    async def _accept(
        self, sock: socket.socket, listener: Listener, context: ssl.SSLContext
    ) -> None:
        """An https frontend: each connection's first byte says whether the client speaks TLS
        (a handshake record) or plain HTTP, which is answered 400 as the mitmproxy path does."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                logger.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._sniff(conn, listener, context))
            self.sniffing.add(task)
            task.add_done_callback(self.sniffing.discard)

    async def _sniff(
        self, conn: socket.socket, listener: Listener, context: ssl.SSLContext
    ) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        readable: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await asyncio.wait_for(readable, self.settings.limits.header_timeout)
            first = conn.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            conn.close()
            return
        finally:
            loop.remove_reader(fd)
        if not first:
            conn.close()
            return
        tls = first[0] == 0x16  # a TLS handshake record
        try:
            await loop.connect_accepted_socket(
                lambda: ClientConnection(self, listener, tls=tls),
                conn,
                ssl=context if tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            logger.info("TLS handshake with a client failed: %s", exc)
            conn.close()

    async def _sweep(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(TICK)
            ticks += 1
            now = time.monotonic()
            for exchange in list(self.exchanges):
                if exchange.response_at is not None and now >= exchange.response_at:
                    exchange.response_at = None
                    exchange.state.timed_out = "response"
                    if exchange.upstream is not None:
                        exchange.upstream.fail("response timeout")
            if ticks % 5 == 0:
                settings = self.settings
                for conn in list(self.connections):
                    with contextlib.suppress(Exception):
                        conn.check(now, settings)
                self.pool.sweep(now)

    def stop_listening(self) -> None:
        for server in self.servers:
            server.close()
        for task in self.acceptors:
            task.cancel()
        self.servers, self.acceptors = [], []

    def busy(self) -> bool:
        return any(conn.busy or conn.queue for conn in self.connections)

    def drain_step(self, late: bool) -> None:
        """Close idle connections (all of them once `late`); busy ones close after their
        answer."""
        for conn in list(self.connections):
            conn.draining = True
            if late:
                conn.abort()
            elif not conn.busy and not conn.queue:
                conn.close()
                conn._wake()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.pool.close()

    # -- one request

    async def handle(self, conn: ClientConnection, request: Request) -> bool:
        """Answer `request`; whether the connection may carry another one."""
        target = request.target.decode("latin-1")
        path = target.partition("?")[0]
        state = new_state(request.method, path, request.headers, request.started)
        frontend = conn.listener.frontend
        assert frontend is not None
        status, error = 0, None
        keep = request.keep_alive
        try:
            refused = wrong_scheme(self.config, frontend, conn.tls)
            if conn.listener.peer and refused is None:
                # The peer link: another router's hop, for the frontend it names.
                named = request.headers.get(FRONTEND_HEADER, "")
                addressed = self.frontends.get(named.lower())
                if addressed is None:
                    refused = Reject(400, self._unknown_frontend(named))
                else:
                    frontend = addressed
            decision: Forward | Reject | Combined = refused or route(
                self.config, reverse_facts(frontend, request.method, target, request.headers), state
            )
            edits: Mapping[str, str] = {}
            if isinstance(decision, FanOut | Failover):  # A & B, A | B: proxy/combined.py
                state.decision = decision
                status, error, keep = await self.combined(conn, request, state, decision)
                return keep and not conn.closed
            if isinstance(decision, Forward):
                refusal = self.health.admit(decision)
                if refusal is not None:
                    decision = refusal
                elif decision.swap_tokens and self.swap.identity is not None:
                    swapped = await swap_tokens(self.swap.identity, state, decision)
                    if isinstance(swapped, Reject):
                        decision = swapped
                    else:
                        edits = swapped
            state.decision = decision
            if isinstance(decision, Reject):
                close = not keep or not request.body.done
                conn.write(
                    error_response(decision.status, decision.message, state.request_id, close)
                )
                status, keep = decision.status, not close
            else:
                status, error, keep = await self.forward(conn, request, state, decision, edits)
        except _ClientGone:
            status, error, keep = CLIENT_GONE_STATUS, "the client went away", False
            state.status, state.message = status, error
        finally:
            self.log.write(state, status, error)
            self.metrics.count(state, status)
        return keep and not conn.closed

    async def combined(
        self, conn: ClientConnection, request: Request, state: FlowState, decision: Combined
    ) -> tuple[int, str | None, bool]:
        """Answer a combined decision: the body read whole (bounded), the clouds asked by the
        worker's :class:`~scoperouter.proxy.combined.Combiner`, one answer written."""
        if request.headers.get("expect", "").lower() == "100-continue":
            conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = bytearray()
        message: str | None = None  # the router's own refusal
        try:
            while (chunk := await request.body.get()) is not None:
                body += chunk
                if len(body) > WHOLE_MAX:
                    message = BODY_TOO_LARGE
                    reply = fanout.error_reply(413, message)
                    break
            else:
                reply = await self.combiner.answer(
                    decision,
                    state,
                    request.method,
                    request.headers,
                    bytes(body),
                    conn.listener.frontend.url.base if conn.listener.frontend else "",
                )
        except _ClientBodyError as exc:
            message = str(exc)
            reply = fanout.error_reply(400, message)
        if message is not None:
            state.status, state.message = reply.status, message
        keep = request.keep_alive and not conn.draining and request.body.done
        status = reply.status
        fields = [
            (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
            for name, value in reply.headers.items()
            if name != "content-length"
        ]
        payload = reply.body
        if bodiless(request.method, status):
            payload = b""
            length = reply.headers.get("content-length")
            if length is not None and request.method == "HEAD":
                fields.append((b"Content-Length", length.encode("latin-1")))
        else:
            fields.append((b"Content-Length", b"%d" % len(payload)))
        fields.append((b"X-Scope-Request-Id", state.request_id.encode()))
        if not keep:
            fields.append((b"Connection", b"close"))
        conn.write(render(status, status_title(status), fields, payload))
        await conn.drain()
        return status, state.message if status >= 400 else None, keep

    def _unknown_frontend(self, named: str) -> str:
        cloud = self.config.cloud
        if not named:
            return (
                f"the peer link of {cloud} carries other routers' hops: the request must name "
                f"one of {cloud}'s frontends in {header_title(FRONTEND_HEADER)}"
            )
        return f"{named[:200]!r} is not a frontend of {cloud} ({', '.join(sorted(self.frontends))})"

    async def forward(
        self,
        conn: ClientConnection,
        request: Request,
        state: FlowState,
        decision: Forward,
        edits: Mapping[str, str],
    ) -> tuple[int, str | None, bool]:
        """Send the request upstream and its answer back: (status, error, keep-alive)."""
        scheme, host, port, path = split_url(decision.url)
        settings = self.settings
        connect_timeout, response_timeout = settings.timeouts(decision.remote)
        if (host, port) in self.config.own_addresses:
            return self._failed(conn, request, state, decision, LOOP_MESSAGE, connected=False)
        if request.headers.get("expect", "").lower() == "100-continue":
            conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        head = self._request_head(request, state, decision, path, edits, host, port)
        key = f"{scheme}://{host}:{port}"
        has_body = request.chunked or bool(request.length)
        exchange = Exchange(state, response_timeout=response_timeout)
        self.exchanges.add(exchange)
        upstream: UpstreamConnection | None = None
        try:
            for attempt in (1, 2):
                upstream = self.pool.take(key)
                reused = upstream is not None
                if upstream is None:
                    try:
                        upstream = await self.pool.connect(key, scheme, host, port, connect_timeout)
                    except TimeoutError:
                        state.timed_out = "connect"
                        return self._failed(
                            conn, request, state, decision, "connect timeout", connected=False
                        )
                    except (OSError, ssl.SSLError) as exc:
                        reason = describe_error(exc)
                        return self._failed(conn, request, state, decision, reason, False)
                exchange.upstream = upstream
                conn.relay = upstream
                upstream.reset(skip_body=request.method == "HEAD")
                assert upstream.transport is not None
                upstream.transport.write(head)
                if has_body:
                    await self._send_body(request, upstream, exchange)
                exchange.response_at = time.monotonic() + response_timeout
                status = await self._final_head(conn, request, upstream)
                if status:
                    break
                retry = (
                    reused
                    and attempt == 1
                    and not has_body
                    and not upstream.received
                    and request.method in IDEMPOTENT
                    and state.timed_out is None
                )
                if not retry:
                    return self._failed(
                        conn, request, state, decision, upstream.error or "no answer", True
                    )
                upstream.discard()
            assert upstream is not None
            exchange.response_at = None
            self.health.succeeded(decision)
            return await self._relay(conn, request, state, decision, upstream)
        except _ClientBodyError as exc:
            message = str(exc)
            state.status, state.message = 400, message
            conn.write(error_response(400, message, state.request_id, close=True))
            if upstream is not None:
                upstream.fail(message)
            return 400, message, False
        except _ClientGone:
            if upstream is not None:
                upstream.fail("the client went away")
            raise
        finally:
            conn.relay = None
            self.exchanges.discard(exchange)
            if upstream is not None and upstream.lender is not None:
                upstream.discard()  # the exchange failed: the connection is not reused

    def _request_head(
        self,
        request: Request,
        state: FlowState,
        decision: Forward,
        path: str,
        edits: Mapping[str, str],
        host: str,
        port: int,
    ) -> bytes:
        replaced = {name.encode("latin-1") for name in decision.set_headers}
        replaced |= {name.encode("latin-1") for name in edits}
        replaced.add(REQUEST_ID_HEADER.encode())
        replaced.add(_FRONTEND_FIELD)  # a peer link's, for this router only
        drop = HOP_BY_HOP | replaced | _connection_tokens(request.headers)
        lines = [f"{request.method} {path} HTTP/1.1\r\n".encode("latin-1")]
        lines += [b"%s: %s\r\n" % f for f in request.fields if f[0].lower() not in drop]
        if "host" not in request.headers:
            lines.append(f"Host: {host}:{port}\r\n".encode("latin-1"))
        for name, value in {
            **decision.set_headers,
            **edits,
            REQUEST_ID_HEADER: state.request_id,
        }.items():
            lines.append(
                name.encode("latin-1") + b": " + value.encode("utf-8", "surrogateescape") + b"\r\n"
            )
        if request.chunked:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        elif request.length is not None:
            lines.append(b"Content-Length: %d\r\n" % request.length)
        lines.append(b"\r\n")
        return b"".join(lines)

    @staticmethod
    async def _send_body(
        request: Request, upstream: UpstreamConnection, exchange: Exchange
    ) -> None:
        transport = upstream.transport
        assert transport is not None
        exchange.progress()
        exchange.response_at = time.monotonic() + exchange.response_timeout
        while True:
            data = await request.body.get()
            if data is None:
                if request.chunked:
                    transport.write(b"0\r\n\r\n")
                return
            if request.chunked:
                transport.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                transport.write(data)
            exchange.progress()
            try:
                await upstream.drain()
            except ConnectionError:
                # The upstream stopped reading (it may have answered early): the rest of the
                # body is dropped and its answer, if any, is relayed.
                while await request.body.get() is not None:
                    pass
                return

    async def _final_head(
        self, conn: ClientConnection, request: Request, upstream: UpstreamConnection
    ) -> int:
        """Wait for the final answer's head, passing informational ones on; 0 on failure."""
        while True:
            await upstream.wait()
            while upstream.heads:
                status, reason, fields = upstream.heads[0]
                if status >= 200:
                    return status
                upstream.heads.popleft()
                if status != 100 and request.version == "1.1":
                    conn.write(render(status, reason.decode("latin-1"), fields))
            if conn.closed:
                raise _ClientGone()
            if upstream.error is not None or (upstream.complete and not upstream.heads):
                return 0

    async def _relay(
        self,
        conn: ClientConnection,
        request: Request,
        state: FlowState,
        decision: Forward,
        upstream: UpstreamConnection,
    ) -> tuple[int, str | None, bool]:
        status, reason, fields = upstream.heads.popleft()
        no_body = request.method == "HEAD" or status in (204, 304)
        headers = {name.lower(): value for name, value in fields}
        length = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        keep = request.keep_alive and not conn.draining
        drop = HOP_BY_HOP | _connection_tokens_raw(headers) | {REQUEST_ID_HEADER.encode()}
        out = [f for f in fields if f[0].lower() not in drop]
        if no_body and length is not None:
            out.append((b"Content-Length", length))
        out.append((b"X-Scope-Request-Id", state.request_id.encode()))
        region = decision.catalog_region
        body: bytes | None = None
        if (
            not no_body
            and region
            and status == 200
            and length is not None
            and length.isdigit()
            and int(length) <= REGION_MAX
        ):
            upstream.keep_whole = True
            upstream.resume_reading()
            while not upstream.complete and upstream.error is None:
                await upstream.wait()
            if upstream.error is not None:
                return self._broken(conn, state, upstream, status)
            body = b"".join(upstream.pending)
            upstream.pending, upstream.pending_size = [], 0
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            body = regioned(body, region, status, content_type) or body
            out.append((b"Content-Length", b"%d" % len(body)))
        elif no_body:
            pass
        elif length is not None and not chunked:
            out.append((b"Content-Length", length))
            upstream.framing = "length"
        elif request.version == "1.1":
            out.append((b"Transfer-Encoding", b"chunked"))
            upstream.framing = "chunked"
        else:
            upstream.framing = "raw"
            keep = False
        upstream.until_close = not (length is not None or chunked or no_body or body is not None)
        if not keep:
            out.append((b"Connection", b"close"))
        answer = render(status, reason.decode("latin-1"), out, body or b"")
        if body is None and not no_body:
            upstream.start_relay(conn, answer)
            try:
                while not upstream.complete and upstream.error is None:
                    await upstream.wait()
            finally:
                upstream.sink = None
                upstream.resume_reading()
            if conn.closed:
                raise _ClientGone()
            if upstream.error is not None and not upstream.complete:
                return self._broken(conn, state, upstream, status)
            if upstream.framing == "chunked":
                conn.write(b"0\r\n\r\n")
        else:
            conn.write(answer)
        if upstream.keep_alive and upstream.complete and upstream.open:
            self.pool.give_back(upstream)
        elif upstream.transport is not None:
            upstream.transport.close()
        await conn.drain()
        return status, None, keep

    def _broken(
        self, conn: ClientConnection, state: FlowState, upstream: UpstreamConnection, status: int
    ) -> tuple[int, str | None, bool]:
        """The upstream failed in the middle of an answer: the client's connection is cut
        (it must not take a truncated body for a whole one)."""
        conn.abort()
        return status, upstream.error, False

    def _failed(
        self,
        conn: ClientConnection,
        request: Request,
        state: FlowState,
        decision: Forward,
        reason: str,
        connected: bool,
    ) -> tuple[int, str | None, bool]:
        """The upstream failed before its answer: the router answers, as mitmproxy's path."""
        host = split_url(decision.url)[1]
        if LOOP_MESSAGE not in reason:
            self.health.failed(decision, state.timed_out, reason)
        status, message = upstream_failure(
            self.config, decision, state.timed_out, reason, connected=connected, host=host
        )
        state.status, state.message = status, message
        close = not request.keep_alive or not request.body.done
        conn.write(error_response(status, message, state.request_id, close))
        return status, reason, not close


_LLHTTP_MESSAGES = {
    "Invalid header value char": heads.CONTROL_MESSAGE,
    "Invalid header token": "malformed request: invalid header name (RFC 9110 5.1: a token)",
}


def _malformed(exc: Exception) -> str:
    """The client's message for what llhttp refused (its own words unless we have better)."""
    text = str(exc)
    return _LLHTTP_MESSAGES.get(text) or f"malformed request: {text}"


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[bytes]:
    """Fields the Connection header names (hop-by-hop, not forwarded)."""
    value = headers.get("connection")
    if not value:
        return frozenset()
    return frozenset(t.strip().lower().encode("latin-1") for t in value.split(",") if t.strip())


def _connection_tokens_raw(headers: Mapping[bytes, bytes]) -> frozenset[bytes]:
    value = headers.get(b"connection")
    if not value:
        return frozenset()
    return frozenset(t.strip().lower() for t in value.split(b",") if t.strip())


def frontend_context(frontend: Frontend) -> ssl.SSLContext | None:
    """The TLS context of an https frontend (its certificate and key), else None."""
    if frontend.url.scheme != "https" or frontend.cert is None or frontend.key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(frontend.cert, frontend.key)
    context.set_alpn_protocols(["http/1.1"])
    return context
