"""Upstream failures: OpenStack JSON error bodies, connect and response timeouts.

Everything here that reaches into mitmproxy internals is in this one module, pinned to
mitmproxy 11.0.2 and covered by tests/integration/test_errors.py.

**Error bodies.** mitmproxy answers a failed upstream (refused connection, reset, invalid
response) with an HTML page built by ``mitmproxy.proxy.layers.http._http1.make_error_response
(status, message)``; an addon cannot change it (setting ``flow.response`` in the ``error`` hook
is ignored on that path). :func:`install` replaces that module-level function with
:func:`render_error`, which always answers ``application/json`` in keystone's error format. The
router's ``error`` hook gives the per-flow status and message (naming the cloud and service)
with :func:`set_error_response`. That hook and the renderer run in the *same asyncio task*:
``HttpStream.handle_protocol_error`` yields the blocking ``HttpErrorHook``; the connection
handler runs it in a hook task that, once the hook returns, feeds ``HookCompleted`` back to the
layers in that same task, and the layers then send the ``ResponseProtocolError`` to
``Http1Server``, which calls the renderer. So the hand-over is a :class:`contextvars.ContextVar`
(each task has its own context: concurrent flows cannot see each other's value), and the value
is used at most once and only for the message of the flow it was made for.

**Connect timeout.** mitmproxy has no connect timeout (mitmproxy issue #1095). The router's
``server_connect`` hook is awaited inline by ``ConnectionHandler.open_connection``, i.e. inside
the task that is about to call ``asyncio.open_connection``. :class:`ConnectWatch` keeps that
task and cancels it once ``timestamp_start`` (set just before ``asyncio.open_connection``) is
older than the timeout while ``timestamp_tcp_setup`` (set just after) is still unset: exactly
when the task waits for the TCP handshake, where mitmproxy catches the cancellation, records the
message as the connection error and reports the failed connection to the HTTP layer (so the
client gets an error response; nothing hangs).

**Response timeout.** :class:`ResponseWatch` runs from the end of the request (``request``
hook) to the response headers; while a large body streams upstream it restarts on every chunk,
so an upstream that stops reading is caught as well. When it fires it aborts the flow's server
connection (the transport is found through the ``proxyserver`` addon's connection table); the
HTTP layer sees the server close before a response and runs the error path above, where the
router answers 504.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from mitmproxy import ctx, http
from mitmproxy.connection import Client, Server
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import _http1

from scoperouter.errors import error_body

logger = logging.getLogger("scoperouter")

CONNECT_TIMEOUT_MESSAGE = "scoperouter: connect timeout"
"""The connection error of a connect attempt cancelled by :class:`ConnectWatch`."""

_original_renderer = _http1.make_error_response


@dataclass(slots=True)
class _Pending:
    message: str  # the mitmproxy error message the renderer will be called with
    status: int | None  # None: keep mitmproxy's status
    text: str  # our message for the JSON body
    used: bool = False


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar(
    "scoperouter_pending_error", default=None
)


def set_error_response(flow: http.HTTPFlow, status: int | None, message: str) -> None:
    """Answer this flow's upstream error with `status` (None: mitmproxy's) and `message`.

    Call from the ``error`` hook only; it applies to the error response mitmproxy is about to
    render for this flow, if any.
    """
    if flow.error is not None:
        _pending.set(_Pending(flow.error.msg, status, message))


def render_error(status_code: int, message: str = "") -> bytes:
    """Drop-in replacement for ``_http1.make_error_response``: an OpenStack JSON error."""
    try:
        status, text = status_code, message
        pending = _pending.get()
        if pending is not None and not pending.used and pending.message == message:
            pending.used = True
            status = pending.status or status_code
            text = pending.text
        body = error_body(status, text or "the router could not complete the request")
        response = http.Response.make(
            status,
            body,
            http.Headers(Content_Type="application/json", Connection="close"),
        )
        return http1.assemble_response(response)
    except Exception:  # pragma: no cover - an error page must always come out
        logger.exception("rendering an error response failed")
        return _original_renderer(status_code, message)


def install() -> None:
    """Route mitmproxy's HTTP/1 error pages through :func:`render_error` (idempotent)."""
    _http1.make_error_response = render_error


def uninstall() -> None:
    _http1.make_error_response = _original_renderer


class ConnectWatch:
    """Give up on an upstream connection not set up within `timeout` seconds.

    Create it from the ``server_connect`` hook: it keeps the current task, the one that opens
    the connection. While the TCP handshake is pending that task is cancelled (mitmproxy turns
    the cancellation into a failed connection); when TCP is up but the TLS handshake is not done
    in time, the transport is aborted. `fired` tells the error hook it was a timeout.
    """

    __slots__ = ("_handle", "_loop", "_task", "client", "fired", "server", "timeout")

    def __init__(self, client: Client, server: Server, timeout: float) -> None:
        self.client = client
        self.server = server
        self.timeout = timeout
        self.fired = False
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        if self._task is not None:
            self._arm(timeout)

    def _arm(self, delay: float) -> None:
        self._handle = self._loop.call_later(max(delay, 0.01), self._check)

    def _check(self) -> None:
        self._handle = None
        server, task = self.server, self._task
        assert task is not None
        if task.done() or server.error or server.timestamp_end is not None:
            return
        if server.timestamp_start is None:  # not connecting yet (e.g. waiting for a slot)
            self._arm(self.timeout)
            return
        remaining = server.timestamp_start + self.timeout - time.time()
        if remaining > 0:
            self._arm(remaining)
            return
        if server.timestamp_tcp_setup is None:
            # Inside asyncio.open_connection: mitmproxy catches this cancellation.
            self.fired = True
            task.cancel(CONNECT_TIMEOUT_MESSAGE)
        elif server.tls and not server.tls_established:
            self.fired = True
            abort_connection(self.client, server)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class ResponseWatch:
    """Abort a flow's upstream connection when it makes no progress for `timeout` seconds.

    Started when the request has been read (``request`` hook), or, for a streamed body, at the
    request headers: then every chunk passing through :meth:`passthrough` (used as
    ``flow.request.stream``) restarts the clock, so an upstream that stops reading the body
    is caught too, while a long upload that keeps moving is not. Stopped by the response
    headers. `upstream` returns the flow's server connection: ``flow.server_conn`` is only
    updated once the connection is fully set up (TLS included), so the router tracks the one
    being opened.
    """

    __slots__ = ("_handle", "_last", "_loop", "fired", "flow", "timeout", "upstream")

    def __init__(self, flow: http.HTTPFlow, timeout: float, upstream: Callable[[], Server]) -> None:
        self.flow = flow
        self.timeout = timeout
        self.upstream = upstream
        self.fired = False
        self._last = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout, self._fire)

    def touch(self) -> None:
        """Progress: the clock starts again."""
        self._last = time.monotonic()

    def passthrough(self, data: bytes) -> bytes:
        """A ``flow.request.stream`` callable that forwards chunks unchanged and notes progress."""
        self._last = time.monotonic()
        return data

    def _fire(self) -> None:
        self._handle = None
        flow = self.flow
        if flow.response is not None or flow.error is not None or not flow.live:
            return
        idle = time.monotonic() - self._last
        if idle < self.timeout:
            self._handle = self._loop.call_later(self.timeout - idle, self._fire)
            return
        self.fired = True
        if not abort_connection(flow.client_conn, self.upstream()):
            # Between two steps of opening the connection (a hook is running): retry shortly.
            self._handle = self._loop.call_later(0.05, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def abort_connection(client: Client, server: Server) -> bool:
    """Abort an upstream connection of `client`'s handler; False when not possible right now.

    Uses the ``proxyserver`` addon's table of connection handlers and the handler's transports
    (mitmproxy internals, 11.0.2). An established transport is aborted (the reader sees EOF and
    mitmproxy reports the closed connection to the HTTP layer); a connection still waiting for
    its TCP handshake has its task cancelled, which mitmproxy handles as a failed connect.
    """
    proxyserver = ctx.master.addons.get("proxyserver")
    handler = proxyserver.connections.get(client.id) if proxyserver else None
    if handler is None:  # the client is gone: nothing left to answer
        return True
    io = handler.transports.get(server)
    if io is None:
        return True  # already closed
    if io.writer is not None:
        transport = getattr(io.writer, "transport", None)
        if transport is not None:
            transport.abort()
        else:  # pragma: no cover - non-asyncio streams (UDP/WireGuard), not used by the router
            io.writer.close()
        return True
    connecting = server.timestamp_start is not None and server.timestamp_tcp_setup is None
    if connecting and io.handler is not None and not io.handler.done():
        io.handler.cancel(CONNECT_TIMEOUT_MESSAGE)
        return True
    return False
