"""The forward proxy's guarded HTTP/1 server: mitmproxy's, with limits on what a client sends
(item 2 of :mod:`scoperouter.proxy.forward.mitm`, whose contract test checks it).

mitmproxy's HTTP/1 server reads a request head of any size, at any speed, answers malformed
heads with its own text, waits for a body forever, and raises ``NotImplementedError`` on a
chunked body's trailer fields. :class:`GuardedHttp1Server` enforces the router's
:class:`~scoperouter.catalog.Limits` with the HTTP layer's messages
(:mod:`scoperouter.http.heads`), drops trailer fields, answers a body that stops arriving with
408, refuses a protocol ``Upgrade`` as the frontends do (400: ``Upgrade`` with ``Connection:
upgrade``), and reports every refused head to the refusal handler (the pipeline's log and
metrics).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from mitmproxy import http
from mitmproxy.connection import Client
from mitmproxy.net.http import http1, validate
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import RequestHeaders, RequestProtocolError

from scoperouter.catalog import Limits
from scoperouter.errors import error_body, status_title
from scoperouter.http import heads
from scoperouter.proxy.forward.compat import request_error_code

logger = logging.getLogger("scoperouter")


def error_page(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 error response (head and JSON body) that closes the connection."""
    response = http.Response.make(
        status,
        error_body(status, message),
        http.Headers(Content_Type="application/json", Connection="close"),
    )
    response.reason = status_title(status)  # mitmproxy's table lacks some (508 Loop Detected)
    return bytes(http1.assemble_response(response))


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A request the guarded server answered itself (for the access log and metrics)."""

    client: Client
    status: int
    message: str
    method: str  # "-" when the request line could not be read
    path: str
    started: float  # time.monotonic() of the head's first byte

    @property
    def client_address(self) -> str | None:
        peer = self.client.peername
        return f"{peer[0]}:{peer[1]}" if peer else None


RefusalHandler = Callable[[Refusal], None]


def _no_handler(refusal: Refusal) -> None:
    logger.info("refused %s %s: %s", refusal.method, refusal.path, refusal.status)


_refusal_handler: RefusalHandler = _no_handler

_CONTROL = heads.CONTROL
LINGER_SECONDS = heads.LINGER_SECONDS


class GuardedHttp1Server(_http1.Http1Server):
    """mitmproxy's HTTP/1 server with limits on the request head and connection timeouts."""

    limits: ClassVar[Limits] = Limits()

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._idle_since = time.monotonic()
        self._head_started: float | None = None
        self._line_done = False
        self._timers: list[float] = []  # when the wakeups requested so far fire (monotonic)
        self._body_last = time.monotonic()  # when the body being read last got a byte
        self.state = self.start

    # -- timers: a check runs when a wakeup fires and re-arms what is still needed, so a new
    # wakeup is requested only when none is due before the new deadline.

    def _arm(self, delay: float) -> layer.CommandGenerator[None]:
        deadline = time.monotonic() + max(delay, 0.01)
        if any(when <= deadline + 0.05 for when in self._timers):
            return
        self._timers.append(deadline)
        yield commands.RequestWakeup(deadline - time.monotonic())

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Wakeup):
            if self._timers:
                self._timers.remove(min(self._timers))
            yield from self._on_wakeup()
        elif self.state == self._linger:
            yield from self._linger(event)
        else:
            yield from super()._handle_event(event)

    def start(self, _: events.Event) -> layer.CommandGenerator[None]:
        self.state = self.read_headers
        yield from self._arm(self.limits.idle_timeout)

    def _on_wakeup(self) -> layer.CommandGenerator[None]:
        now = time.monotonic()
        limits = self.limits
        if self.state == self.read_headers:
            if self.buf:  # a request head has begun
                started = self._head_started if self._head_started is not None else now
                left = started + limits.header_timeout - now
                if left <= 0:
                    yield from self._refuse(408, heads.too_slow(limits), self._first_line())
                else:
                    yield from self._arm(left)
            else:
                left = self._idle_since + limits.idle_timeout - now
                if left <= 0:
                    yield commands.CloseConnection(self.conn)
                    self.state = self.done
                else:
                    yield from self._arm(left)
        elif self.state == self._linger:
            yield commands.CloseConnection(self.conn)
            self.state = self.done
        elif self.state == self.read_body:
            left = self._body_last + limits.body_timeout - now
            if left <= 0:
                yield from self._fail_body(408, heads.body_too_slow(limits))
            else:
                yield from self._arm(left)
        elif self.state not in (self.done, self.passthrough):
            yield from self._arm(limits.idle_timeout)  # a request in progress: look again later

    def mark_done(
        self, *, request: bool = False, response: bool = False
    ) -> layer.CommandGenerator[None]:
        yield from super().mark_done(request=request, response=response)
        if self.state == self.read_headers and not self.buf:
            self._idle_since = time.monotonic()
            yield from self._arm(self.limits.idle_timeout)

    # -- the head

    def read_headers(self, event: events.ConnectionEvent) -> layer.CommandGenerator[None]:
        if not isinstance(event, events.DataReceived):
            yield from super().read_headers(event)  # connection closed before a complete head
            return
        limits = self.limits
        while True:
            if self.buf and self._head_started is None:
                self._head_started = time.monotonic()
            if not self._line_done:
                # Only the new bytes are searched (or the buffer, once, for pipelined data).
                data = event.data if event.data else bytes(self.buf)[: limits.max_request_line + 2]
                self._line_done = b"\n" in data
            size = len(self.buf)
            lines = self.buf.maybe_extract_lines()
            if lines is None:  # incomplete head
                if size > limits.max_header_bytes:
                    yield from self._refuse(431, self._too_large(limits), self._first_line())
                elif not self._line_done and size > limits.max_request_line:
                    yield from self._refuse(414, self._line_too_long(limits), ("-", "-"))
                elif size:
                    yield from self._arm(limits.header_timeout)
                return
            if lines:
                break
            # An empty line before a request (RFC 9112 2.2: ignore it), then maybe a request.
            self._head_started = None
            if not self.buf:
                return
            event = events.DataReceived(self.conn, b"")
        head_size = size - len(self.buf)
        self._line_done = False
        started = self._head_started if self._head_started is not None else time.monotonic()
        self._head_started = None
        problem = self._check_head(lines, head_size, limits)
        if problem is not None:
            status, message = problem
            yield from self._refuse(status, message, _split_request_line(lines[0]), started)
            return
        try:
            self.request = http1.read_request_head([bytes(x) for x in lines])
            scheme = self.request.data.scheme.lower()  # RFC 9110 4.2.3: any case
            if scheme not in (b"", b"http", b"https"):
                line = _split_request_line(lines[0])
                yield from self._refuse(400, SCHEME_MESSAGE, line, started)
                return
            self.request.data.scheme = scheme
            validate.validate_headers(self.request)
            expected_body_size = http1.expected_http_body_size(self.request)
        except ValueError as exc:
            message = f"malformed request: {exc}"
            yield from self._refuse(400, message, _split_request_line(lines[0]), started)
            return
        yield ReceiveHttp(RequestHeaders(self.stream_id, self.request, expected_body_size == 0))
        self.body_reader = _http1.make_body_reader(expected_body_size)
        self.state = self.read_body
        yield from self.state(event)

    def read_body(self, event: events.Event) -> layer.CommandGenerator[None]:
        """mitmproxy's, with trailer fields dropped and what is not body bounded; the body's
        idle time is watched (:meth:`_on_wakeup`)."""
        if isinstance(event, events.DataReceived):
            self._body_last = time.monotonic()
            yield from self._arm(self.limits.body_timeout)
        if not isinstance(self.body_reader, _TrailerDropping):
            self.body_reader = _TrailerDropping(self.body_reader)  # type: ignore[assignment]
        yield from super().read_body(event)
        if self.state == self.read_body and len(self.buf) > self.limits.max_header_bytes:
            # A chunk header or the trailer fields still incomplete past the head's limit.
            yield from self._fail_body(431, heads.trailers_too_large(self.limits))

    def _fail_body(self, status: int, message: str) -> layer.CommandGenerator[None]:
        """The client's body failed: answered (unless an answer has begun), the stream ends
        as the client's error (its upstream connection is closed), and the connection
        lingers and closes as after a refused head."""
        if self.response is None:
            yield commands.SendData(self.conn, error_page(status, message))
        self.buf = type(self.buf)()
        error = f"{BODY_FAILED}{status}: {message}"
        yield ReceiveHttp(RequestProtocolError(self.stream_id, error, request_error_code(status)))
        yield commands.CloseTcpConnection(self.conn, half_close=True)
        self.state = self._linger
        yield from self._arm(LINGER_SECONDS)

    @staticmethod
    def _check_head(
        lines: list[bytearray], head_size: int, limits: Limits
    ) -> tuple[int, str] | None:
        if len(lines[0]) > limits.max_request_line:
            return 414, heads.line_too_long(limits)
        if len(lines) - 1 > limits.max_headers:
            return 431, heads.too_many_fields(len(lines) - 1, limits)
        if head_size > limits.max_header_bytes:
            return 431, heads.too_large(limits)
        if head_size < sum(len(line) for line in lines) + 2 * (len(lines) + 1):
            return 400, heads.BARE_LF_MESSAGE  # a line ended with LF alone (the parser's lines
            # lost their endings: a head shorter than all of them with CRLF had a bare one)
        for number, line in enumerate(lines[1:], 1):
            if line and line[0] in (0x20, 0x09):  # SP or HTAB
                return 400, heads.obs_fold(number)
        if _CONTROL.search(b"\n".join(lines)):
            return 400, heads.CONTROL_MESSAGE
        hosts: list[bytes] = []
        upgrade = False
        connection: list[bytes] = []
        for line in lines[1:]:
            name, _, value = bytes(line).partition(b":")
            name = name.lower()
            if name == b"host":
                hosts.append(value)
            elif name == b"upgrade":
                upgrade = True
            elif name == b"connection":
                connection.append(value)
        if upgrade and any(b"upgrade" in _options(value) for value in connection):
            return 400, heads.UPGRADE_MESSAGE  # as the frontends (llhttp's upgrade: both fields)
        if len(hosts) > 1:
            return 400, heads.MANY_HOSTS_MESSAGE
        if hosts and not heads.valid_host(hosts[0].strip(b" \t")):
            return 400, heads.BAD_HOST_MESSAGE
        parts = bytes(lines[0]).split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return None  # not a request line: mitmproxy's parser says what is wrong
        return heads.check_target(parts[0], parts[1])

    @staticmethod
    def _too_large(limits: Limits) -> str:
        return heads.too_large(limits)

    @staticmethod
    def _line_too_long(limits: Limits) -> str:
        return heads.line_too_long(limits)

    def _first_line(self) -> tuple[str, str]:
        """Method and path of a head still being read, when its first line is complete."""
        data = bytes(self.buf)[: self.limits.max_request_line + 2]
        line, sep, _ = data.partition(b"\n")
        return _split_request_line(line.rstrip(b"\r")) if sep else ("-", "-")

    def _refuse(
        self,
        status: int,
        message: str,
        request_line: tuple[str, str],
        started: float | None = None,
    ) -> layer.CommandGenerator[None]:
        """Answer the client ourselves and stop reading requests on this connection."""
        yield commands.SendData(self.conn, error_page(status, message))
        self.buf = type(self.buf)()
        # Half-close and drop what the client still sends for a moment: closing at once with
        # unread data would reset the connection and lose the answer on its way.
        yield commands.CloseTcpConnection(self.conn, half_close=True)
        self.state = self._linger
        yield from self._arm(LINGER_SECONDS)
        method, path = request_line
        if started is None:
            started = self._head_started if self._head_started is not None else time.monotonic()
        report(self.context.client, status, message, method, path, started)

    def _linger(self, event: events.Event) -> layer.CommandGenerator[None]:
        self.buf = type(self.buf)()  # drop what arrived
        if isinstance(event, events.ConnectionClosed):
            yield commands.CloseConnection(self.conn)
            self.state = self.done


_split_request_line = heads.split_request_line


def _options(value: bytes) -> frozenset[bytes]:
    """A Connection field's options (none when it is not a list of tokens)."""
    return heads.connection_tokens(value.strip(b" \t")) or frozenset()


SCHEME_MESSAGE = "the forward proxy carries http:// and https:// URLs only"
BODY_FAILED = "scoperouter: request body "
"""The start of a flow error the guarded server raised for a failed body ("...408: why")."""


class _TrailerDropping:
    """h11's body reader, without the trailer fields of a chunked body: mitmproxy cannot pass
    them on (``NotImplementedError``), and they must never join the head (RFC 9110 6.5.1)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __call__(self, buf: Any) -> Any:
        event = self.reader(buf)
        if isinstance(event, h11.EndOfMessage) and event.headers:
            return h11.EndOfMessage()
        return event

    def read_eof(self) -> Any:
        return self.reader.read_eof()


def report(
    client: Client,
    status: int,
    message: str,
    method: str,
    path: str,
    started: float | None = None,
) -> None:
    """Tell the refusal handler of a refusal (the guarded server's, and a tunnel's bytes that
    are not TLS: :func:`~.mitm.refuse_layer`); `started`: time.monotonic() of its first
    byte, else now."""
    try:
        _refusal_handler(
            Refusal(
                client=client,
                status=status,
                message=message,
                method=method,
                path=path,
                started=time.monotonic() if started is None else started,
            )
        )
    except Exception:  # logging must never break the connection handling
        logger.exception("reporting a refused request failed")


def set_head_limits(limits: Limits) -> None:
    """Limits for connections accepted from now on and for heads read from now on."""
    GuardedHttp1Server.limits = limits


def set_refusal_handler(handler: RefusalHandler | None) -> None:
    """Who hears of each refusal (the router's access log and metrics)."""
    global _refusal_handler
    _refusal_handler = handler or _no_handler
