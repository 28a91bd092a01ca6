"""Timeouts: connect and response timeouts, per destination kind.

A backend of this cloud gets ``connect_timeout`` and ``response_timeout``; another cloud's
router gets ``peer_connect_timeout`` and ``peer_response_timeout``. When one fires, the upstream
connection is given up (see :mod:`scoperouter.proxy.mitm`, items 3) and the flow's state says
which timeout it was, so the error answer is a 504 naming the cloud.

* **Connect**: from ``server_connect`` until the TCP (and TLS) handshake is done.
* **Response**: from the end of the request (``request`` hook) to the response headers; while a
  large body streams upstream it restarts on every chunk, so an upstream that stops reading is
  caught as well, while a long upload that keeps moving is not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mitmproxy import http
from mitmproxy.connection import Client, Server
from mitmproxy.proxy import server_hooks

from scoperouter.proxy import mitm
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.inflight import InFlight
from scoperouter.proxy.flowstate import FlowState, is_chunked, state_of
from scoperouter.routing import Forward


class ConnectWatch:
    """Give up on an upstream connection not set up within `timeout` seconds.

    Made in the ``server_connect`` hook, where the current task is the one opening the
    connection. While the TCP handshake is pending that task is cancelled; when TCP is up but
    the TLS handshake is not done in time, the transport is aborted.
    """

    __slots__ = ("_handle", "_loop", "_task", "client", "server", "state", "timeout")

    def __init__(self, client: Client, server: Server, timeout: float, state: FlowState) -> None:
        self.client = client
        self.server = server
        self.timeout = timeout
        self.state = state
        self._task = mitm.connecting_task()
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
            self.state.timed_out = "connect"
            mitm.cancel_connect(task)
        elif server.tls and not server.tls_established:
            self.state.timed_out = "connect"
            mitm.abort_upstream(self.client, server)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class ResponseWatch:
    """Abort a flow's upstream connection when it makes no progress for `timeout` seconds.

    `upstream` returns the flow's server connection: ``flow.server_conn`` is only updated once
    the connection is fully set up (TLS included), so the router tracks the one being opened.
    """

    __slots__ = ("_handle", "_last", "_loop", "flow", "state", "timeout", "upstream")

    def __init__(
        self,
        flow: http.HTTPFlow,
        state: FlowState,
        timeout: float,
        upstream: Callable[[], Server],
    ) -> None:
        self.flow = flow
        self.state = state
        self.timeout = timeout
        self.upstream = upstream
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
        self.state.timed_out = "response"
        if not mitm.abort_upstream(flow.client_conn, self.upstream()):
            # Between two steps of opening the connection (a hook is running): retry shortly.
            self._handle = self._loop.call_later(0.05, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _Watches:
    __slots__ = ("connect", "response")

    def __init__(self) -> None:
        self.connect: ConnectWatch | None = None
        self.response: ResponseWatch | None = None

    def stop(self) -> None:
        if self.connect is not None:
            self.connect.cancel()
        if self.response is not None:
            self.response.cancel()


class Timeouts:
    def __init__(self, config: RouterConfig, inflight: InFlight) -> None:
        self.config = config
        self.inflight = inflight

    def _timeouts(self, decision: Forward) -> tuple[float, float]:
        return self.config.current().settings.timeouts(decision.remote)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is None or flow.response is not None or not isinstance(state.decision, Forward):
            return
        request = flow.request
        if request.stream or is_chunked(request):
            # The body streams upstream (chunked bodies from the first byte, rather than after
            # buffering 1 MiB): the response timeout watches its progress from now on.
            watch = self._response_watch(flow, state, state.decision)
            request.stream = watch.passthrough

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.error:
            return
        state = self.inflight.get(data.client.id)
        if state is None or not isinstance(state.decision, Forward):
            return
        state.server = server
        watches = _watches(state)
        watches.connect = ConnectWatch(
            data.client, server, self._timeouts(state.decision)[0], state
        )

    def request(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is None or not isinstance(state.decision, Forward) or flow.response is not None:
            return
        watches = _watches(state)
        if watches.response is not None:
            watches.response.touch()  # the whole body is sent: from now on, the response
        else:
            self._response_watch(flow, state, state.decision)

    def _response_watch(
        self, flow: http.HTTPFlow, state: FlowState, decision: Forward
    ) -> ResponseWatch:
        watch = ResponseWatch(
            flow, state, self._timeouts(decision)[1], lambda: state.server or flow.server_conn
        )
        _watches(state).response = watch
        return watch

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    @staticmethod
    def _stop(flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is not None and isinstance(state.watches, _Watches):
            state.watches.stop()


def _watches(state: FlowState) -> _Watches:
    if not isinstance(state.watches, _Watches):
        state.watches = _Watches()
    return state.watches
