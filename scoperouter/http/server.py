"""The client side of HTTP/1.1: one connection, its requests parsed by llhttp, bounded, checked,
queued and handed in order to the application.

* **Parsing** by llhttp (``httptools``), strict: ``Transfer-Encoding`` with ``Content-Length``,
  bad chunk sizes, invalid tokens, obs-fold and bare LF are refused (400).
* **Bounds** (``settings.limits``; messages in :mod:`~scoperouter.http.heads`): the request
  line (414), the head's fields, their count and bytes (431), control characters (400); the
  raw bytes of a head still incomplete count, so a field value cannot grow without bound. In a
  body, what is not body (chunk headers, chunk extensions, trailer fields) is bounded by
  ``max_header_bytes`` too (431): the cost of a request is linear in what the client sends.
* **Checks** of a head before anyone sees it (RFC 9110/9112): ``CONNECT`` is refused (405, the
  router is not a tunnel), so is a protocol ``Upgrade`` (400) and a target in asterisk- or
  authority-form (400); an HTTP/1.1 request needs exactly one valid ``Host`` (400); the only
  transfer coding is ``chunked`` (501 for others, 400 in HTTP/1.0); ``Connection`` lists
  tokens (400); a path with a dot-segment, ``%2F`` or a backslash is refused (400). The
  identity fields only keystonemiddleware sets (``X-Roles``, ``X-User-Id``...) are dropped
  from the head, the request saying which (:attr:`Request.stripped`). An absolute-form target
  is split into its authority and its origin-form path (400 when malformed): the application
  decides on the authority (the router reduces a target naming its own frontend to its path
  and refuses the others: never the client's authority).
* **Trailer fields never reach the head**: a chunked request's trailer fields are counted
  against the limits and dropped; the fields the application reads are the head's, complete
  before it is called (RFC 9110 6.5.1).
* **Timeouts**, checked by the sweep (:meth:`ClientConnection.check`): a head not complete
  after ``header_timeout`` (408); a request body with no byte for ``body_timeout`` while the
  router reads (its body fails with 408: the application answers it, or closes); an answer the
  client does not read for ``body_timeout`` (the connection is aborted); an idle keep-alive
  connection after ``idle_timeout`` (closed).
* **Keep-alive and pipelining**: answers go out one at a time, in order; what a client
  pipelines waits in a short queue (reading pauses when it is full).
* **Bodies** stream to the application with back-pressure (:class:`Body`: reading pauses while
  :data:`HIGH_WATER` bytes wait).

Each refusal is answered with OpenStack JSON and ``Connection: close``, handed to the
application once (its access log and metrics), then the connection lingers a moment and closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import httptools

from scoperouter.catalog import Limits
from scoperouter.errors import ClientGone
from scoperouter.http import heads
from scoperouter.http.flow import READ_BUFFER, FlowControl, stream_transport
from scoperouter.http.request import Body, BodyError, Refusal, Request
from scoperouter.http.wire import ALLOW_FIELD, Fields, error_response
from scoperouter.semantics import header_map

logger = logging.getLogger("scoperouter")

PIPELINE_MAX: Final = 8  # requests queued on one connection before reading from it pauses

_IDENTITY: Final = heads.IDENTITY_NAMES.keys()
_NO_OPTIONS: Final[frozenset[bytes]] = frozenset()  # no Connection field (one set for all)


class _Refused(Exception):
    """Raised in a parser callback to stop parsing: the head is refused."""

    def __init__(self, status: int, message: str, extra: Fields | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra or []


class _BodyRefused(Exception):
    """Raised in a parser callback during a body: the body fails (see :class:`BodyError`)."""

    def __init__(self, error: BodyError) -> None:
        super().__init__(error.message)
        self.error = error


class Application(Protocol):
    """What a connection needs of the one who answers its requests."""

    def handle(self, conn: ClientConnection, request: Request) -> Awaitable[None]:
        """Answer `request` on `conn`; ``request.keep_alive`` False when the connection may not
        carry another request."""

    def refused(self, conn: ClientConnection, refusal: Refusal) -> None:
        """A head was refused (answered already): log and count it."""


class Relay(Protocol):
    """An upstream connection carrying the exchange of the request being answered: it stops
    reading while the client does not read, and gives up when the client goes away."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def fail(self, error: str) -> None: ...


class ServerState:
    """What the connections of one worker share: the limits (a reload replaces them) and the
    set of open connections (for the sweep, draining, and the open-connections gauge)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections: set[ClientConnection] = set()
        self.on_open: Callable[[], None] | None = None
        self.on_close: Callable[[], None] | None = None
        # a request's bytes read, an answer's written (the worker's busy polling: proxy/busypoll)
        self.on_io: Callable[[], None] | None = None


class ClientConnection(asyncio.BufferedProtocol):
    """One client connection: parses requests, queues them, answers them in order."""

    def __init__(self, state: ServerState, app: Application, tls: bool = False) -> None:
        self.state = state
        self.app = app
        self.tls = tls  # the client speaks TLS
        # Its callbacks are this connection's methods: a reference cycle, dropped when the
        # connection is lost (else every closed connection waits for the cycle collector).
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl | None = None
        # Its event loop, from connection_made on (asyncio.get_running_loop() makes a getpid()
        # system call at every call: once per connection, not per request or body).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.peer: str | None = None
        self.queue: collections.deque[Request | Refusal] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.busy = False  # a request is being answered
        self.refused = False  # nothing more is read (a refusal is queued, or a body failed)
        self.draining = False
        self.head_started: float | None = None
        self.idle_since = time.monotonic()
        self.last_read = self.idle_since  # when a byte last came (or reading resumed)
        self.relay: Relay | None = None  # the upstream of the exchange under way
        # the head being parsed
        self._url = bytearray()
        self._fields: Fields = []
        self._count = 0
        self._head_bytes = 0
        self._raw_head = 0
        # the request whose body is being read, and what of it was not body
        self._current: Request | None = None
        self._progress = False
        self._overhead = 0
        self._trailers = 0
        self._trailer_bytes = 0

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = stream_transport(transport)
        self.loop = loop = asyncio.get_running_loop()
        self.flow = FlowControl(transport, loop)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # asyncio sets it only on sockets whose proto says TCP (the supervisor's may not):
            # without it a head and body written apart wait ~40 ms for a delayed ACK.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.state.connections.add(self)
        if self.state.on_open is not None:
            self.state.on_open()
        self.task = loop.create_task(self._serve(loop))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.state.connections.discard(self)
        if self.state.on_close is not None:
            self.state.on_close()
        if self.flow is not None:
            self.flow.lost()
        if self._current is not None:
            self._current.body.wake()
        for item in self.queue:
            if isinstance(item, Request):
                item.body.wake()
        self._wake()
        if self.relay is not None:
            self.relay.fail("the client went away")
        if self.task is not None and not self.busy:
            self.task.cancel()
        self.parser = None  # nothing more is read: the cycle through its callbacks goes

    def pause_writing(self) -> None:
        assert self.flow is not None
        self.flow.pause_writing()
        if self.relay is not None:
            self.relay.pause_reading()

    def resume_writing(self) -> None:
        assert self.flow is not None
        self.flow.resume_writing()
        if self.relay is not None:
            self.relay.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return READ_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(READ_BUFFER[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        if self.refused:
            return  # lingering after a refusal: what still comes is dropped
        on_io = self.state.on_io
        if on_io is not None:
            on_io()
        parser = self.parser
        if parser is None:
            return  # lost (a transport delivers nothing after connection_lost)
        current = self._current
        self._progress = False
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            reason = exc.__context__
            if isinstance(reason, _Refused):
                self._refuse(reason.status, reason.message, reason.extra)
            elif isinstance(reason, _BodyRefused):
                self._fail_body(reason.error)
            else:
                logger.error("HTTP server: a parser callback failed: %r", reason)
                self._refuse(400, "malformed request")
            return
        except httptools.HttpParserUpgrade:
            # on_headers_complete refuses CONNECT and upgrades first; this is a safety net.
            self._refuse(400, heads.UPGRADE_MESSAGE)
            return
        except httptools.HttpParserError as exc:
            self._parse_error(exc)
            return
        limits = self.state.limits
        if self._current is not None:  # a body is being read: its silence counts from now
            self.last_read = time.monotonic()
        if self.head_started is not None:
            # A head is still incomplete: its raw size counts (a field value may be huge).
            self._raw_head += len(data)
            if self._raw_head > limits.max_header_bytes:
                self._refuse(431, heads.too_large(limits))
        elif current is not None and current is self._current and not self._progress:
            # Bytes of a body that carried none of it: chunk headers, extensions, trailers.
            self._overhead += len(data)
            if self._overhead > limits.max_header_bytes:
                self._fail_body(BodyError(431, heads.trailers_too_large(limits)))

    # -- llhttp callbacks (a head)

    def on_message_begin(self) -> None:
        self.head_started = time.monotonic()
        self._url.clear()
        self._fields = []
        self._count = self._head_bytes = self._raw_head = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        limits = self.state.limits
        if len(self._url) + 16 > limits.max_request_line:
            raise _Refused(414, heads.line_too_long(limits))

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.state.limits
        if self._current is not None:
            # A trailer field (the head is complete): counted against the head's limits, then
            # dropped. A value still arriving counts in data_received (raw bytes of a body
            # that carried no body), before llhttp has joined its pieces.
            self._trailers += 1
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > limits.max_header_bytes or self._trailers > limits.max_headers:
                raise _BodyRefused(BodyError(431, heads.trailers_too_large(limits)))
            return
        self._count += 1
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes + len(self._url) > limits.max_header_bytes:
            raise _Refused(431, heads.too_large(limits))
        if self._count <= limits.max_headers:
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        limits = self.state.limits
        if self._count > limits.max_headers:
            raise _Refused(431, heads.too_many_fields(self._count, limits))
        parser = self.parser
        assert parser is not None  # a callback of feed_data, which runs while it is set
        method = parser.get_method()
        if method == b"CONNECT":
            raise _Refused(405, heads.CONNECT_MESSAGE, [ALLOW_FIELD])
        if parser.should_upgrade():
            raise _Refused(400, heads.UPGRADE_MESSAGE)
        target = bytes(self._url)
        authority = None
        if target[:1] != b"/" or b"#" in target:  # not plain origin-form: look closer
            refused = heads.check_target(method, target)
            if refused is not None:
                raise _Refused(*refused)
            if heads.target_form(method, target) == "absolute":
                absolute = heads.split_absolute(target)
                if absolute is None:
                    raise _Refused(400, heads.BAD_ABSOLUTE_MESSAGE)
                target, authority = absolute.origin_form, absolute.authority
        hazard = heads.check_path(target)
        if hazard is not None:
            raise _Refused(400, hazard)
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _Refused(505, heads.unknown_version(version))
        headers = header_map(self._fields)
        stripped: tuple[str, ...] = ()
        if not _IDENTITY.isdisjoint(headers):  # forged: only keystonemiddleware sets them
            self._fields, stripped = heads.strip_identity(self._fields, headers)
        host = headers.get("host")
        if host is None:
            if version != "1.0":
                raise _Refused(400, heads.NO_HOST_MESSAGE)
        elif not _valid_host(host):
            # Repeated fields are joined with ", ", which no valid Host contains.
            if sum(1 for name, _ in self._fields if name.lower() == b"host") > 1:
                raise _Refused(400, heads.MANY_HOSTS_MESSAGE)
            raise _Refused(400, heads.BAD_HOST_MESSAGE)
        coding = headers.get("transfer-encoding")
        if coding is not None:
            if version == "1.0":
                raise _Refused(400, heads.TE_HTTP10_MESSAGE)
            if coding.strip(" \t").lower() != "chunked":
                raise _Refused(501, heads.unknown_coding(_raw(coding)))
        connection = _NO_OPTIONS
        if "connection" in headers:  # compared as the bytes that came
            tokens = heads.connection_tokens(_raw(headers["connection"]))
            if tokens is None:
                raise _Refused(400, heads.BAD_CONNECTION_MESSAGE)
            connection = tokens
        length = headers.get("content-length")
        content_length = int(length) if length is not None and length.isdigit() else None
        request = Request(
            method=method.decode("ascii"),
            target=target,
            authority=authority,
            version=version,
            fields=self._fields,
            headers=headers,
            connection=connection,
            keep_alive=parser.should_keep_alive(),
            chunked=coding is not None,
            length=content_length,
            has_body=coding is not None or bool(content_length),
            body=Body(self, self.loop),
            started=self.head_started or time.monotonic(),
            stripped=stripped,
        )
        self.head_started = None
        self._current = request
        self._overhead = self._trailers = self._trailer_bytes = 0
        self.queue.append(request)
        if len(self.queue) >= PIPELINE_MAX:
            self.pause_reading()
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._current is not None:
            self._progress = True
            self._current.body.put(body)

    def on_message_complete(self) -> None:
        if self._current is not None:
            self._current.body.finish()
            self._current = None

    # -- refusals

    def _parse_error(self, exc: Exception) -> None:
        if self._current is not None:
            # The head was fine, the body is not: the client's fault, answered as such.
            self._fail_body(BodyError(400, f"malformed request body: {exc}"))
            return
        self._refuse(400, _malformed(exc))

    def _fail_body(self, error: BodyError) -> None:
        """The body being read fails: its request is answered with `error` (or closed), and
        nothing more is read from this connection."""
        current = self._current
        if current is not None:
            current.body.finish(error)
            self._current = None
        self.refused = True
        self.pause_reading()

    def _refuse(self, status: int, message: str, extra: Fields | None = None) -> None:
        """Refuse the head being read: answered after what is queued before it, then the
        connection closes."""
        if self._current is not None:
            self._fail_body(BodyError(400, "the connection's next request was refused"))
        method, path = heads.split_request_line(self._url_line())
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
                extra=extra or [],
            )
        )
        self.refused = True
        self._wake()

    def _url_line(self) -> bytes:
        try:
            method = self.parser.get_method() if self.parser is not None else b"-"
        except httptools.HttpParserError:
            method = b"-"
        return method + b" " + bytes(self._url[:256]) if self._url else b"-"

    # -- flow control

    def pause_reading(self) -> None:
        if self.flow is not None:
            self.flow.pause_reading()

    def resume_reading(self) -> None:
        flow = self.flow
        if (
            flow is not None
            and flow.read_paused
            and not self.refused
            and len(self.queue) < PIPELINE_MAX
        ):
            self.last_read = time.monotonic()  # a body's silence counts from now
            flow.resume_reading()

    async def drain(self) -> None:
        flow = self.flow
        if flow is not None and flow.write_paused_since is not None:  # (no coroutine else)
            await flow.drain()
        if self.closed:
            raise ClientGone()

    def must_drain(self) -> bool:
        """Whether :meth:`drain` would wait or raise (asked first: no coroutine made else)."""
        flow = self.flow
        return self.closed or (flow is not None and flow.write_paused_since is not None)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)
            on_io = self.state.on_io
            if on_io is not None:
                on_io()

    def writelines(self, parts: list[bytes]) -> None:
        """`parts` written in order, as one write where the loop can (uvloop: one writev),
        without joining them: a large body is kept by reference while it waits, not copied."""
        if self.transport is not None and not self.closed:
            self.transport.writelines(parts)
            on_io = self.state.on_io
            if on_io is not None:
                on_io()

    # -- the requests, in order

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while not self.closed:
                if not self.queue:
                    if self.draining:
                        break
                    self.idle_since = time.monotonic()
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                item = self.queue.popleft()
                self.resume_reading()
                if isinstance(item, Refusal):
                    await self._answer_refusal(item)
                    return
                self.busy = True
                try:
                    await self.app.handle(self, item)
                    keep = item.keep_alive
                finally:
                    self.busy = False
                if not keep or self.draining or self.refused:
                    break  # (refused: reading stopped, a body failed; no other request)
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("HTTP server: a connection failed; closing it")
        self.close()

    async def _answer_refusal(self, refusal: Refusal) -> None:
        self.write(error_response(refusal.status, refusal.message, True, refusal.extra))
        try:
            self.app.refused(self, refusal)
        except Exception:  # logging must never keep the answer from going out
            logger.exception("HTTP server: reporting a refused request failed")
        await self.linger()

    async def linger(self) -> None:
        """Half-close, drop what the client still sends for a moment, then close: closing at
        once with unread data would reset the connection and lose the answer on its way."""
        self.refused = True
        transport = self.transport
        if transport is not None and not self.closed and transport.can_write_eof():
            with contextlib.suppress(OSError):
                transport.write_eof()
            if self.flow is not None and self.flow.read_paused:
                self.flow.read_paused = False
                with contextlib.suppress(Exception):
                    transport.resume_reading()
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

    def check(self, now: float) -> None:
        """The connection's deadlines (the sweep calls this): head, body, unread answer and
        idle timeouts."""
        if self.closed:
            return
        limits = self.state.limits
        flow = self.flow
        if flow is not None and flow.write_paused_since is not None:
            if now - flow.write_paused_since > limits.body_timeout:
                logger.info(
                    "closing the connection of %s: it read nothing of its answer for %gs",
                    self.peer,
                    limits.body_timeout,
                )
                self.abort()
            return
        if self.refused:
            return
        if self.head_started is not None:
            if now - self.head_started > limits.header_timeout:
                self._refuse(408, heads.too_slow(limits))
        elif self._current is not None:
            if (
                flow is not None
                and not flow.read_paused
                and now - self.last_read > limits.body_timeout
            ):
                self._fail_body(BodyError(408, heads.body_too_slow(limits)))
        elif not self.busy and not self.queue and now - self.idle_since > limits.idle_timeout:
            self.close()


_LLHTTP_MESSAGES: Final = {
    "Invalid header value char": heads.CONTROL_MESSAGE,
    "Invalid header token": "malformed request: invalid header name (RFC 9110 5.1: a token)",
}


_HOSTS: Final[dict[str, bool]] = {}


def _valid_host(host: str) -> bool:
    """heads.valid_host, memoised (a frontend's clients send a few Host values, again and
    again; bounded: cleared when full)."""
    valid = _HOSTS.get(host)
    if valid is None:
        if len(_HOSTS) >= 1024:
            _HOSTS.clear()
        valid = _HOSTS[host] = heads.valid_host(_raw(host))
    return valid


def _raw(value: str) -> bytes:
    """A field value as it came (header_map decodes with surrogateescape: exactly reversible)."""
    return value.encode("utf-8", "surrogateescape")


def _malformed(exc: Exception) -> str:
    """The client's message for what llhttp refused (its own words unless we have better)."""
    text = str(exc)
    return _LLHTTP_MESSAGES.get(text) or f"malformed request: {text}"
