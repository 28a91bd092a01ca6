"""Timeouts: connect and response timeouts, per destination kind.

A backend of this cloud gets ``connect_timeout`` and ``response_timeout``; another cloud's
router gets ``peer_connect_timeout`` and ``peer_response_timeout``. When one fires, the upstream
connection is given up (see :mod:`scoperouter.proxy.mitm`, item 3) and the flow's state says
which timeout it was, so the error answer is a 504 naming the cloud.

* **Connect**: from ``server_connect`` until the TCP (and TLS) handshake is done.
* **Response**: from the end of the request (``request`` hook) to the response headers; while a
  large body streams upstream every chunk restarts it, so an upstream that stops reading is
  caught as well, while a long upload that keeps moving is not.

Requests only note their deadlines; one sweep per worker, every :data:`TICK` seconds, looks
at the requests in flight (no timer is made and cancelled per request), so a timeout fires at
most a tick late.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from mitmproxy import http
from mitmproxy.connection import Client, Server
from mitmproxy.proxy import server_hooks

from scoperouter.proxy import mitm
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.inflight import InFlight
from scoperouter.proxy.flowstate import FlowState, is_chunked, state_of
from scoperouter.routing import Forward

TICK = 0.1


class Deadlines:
    """The timeouts of one request (in its FlowState): what to give up, and when."""

    __slots__ = ("client", "connect_at", "response_at", "response_timeout", "server", "task")

    def __init__(self, client: Client) -> None:
        self.client = client
        self.server: Server | None = None
        self.task: asyncio.Task[Any] | None = None  # the task opening the connection
        self.connect_at: float | None = None  # time.time(), as mitmproxy's timestamps
        self.response_at: float | None = None  # time.monotonic()
        self.response_timeout = 0.0

    def progress(self, data: bytes) -> bytes:
        """A ``flow.request.stream`` callable: forwards chunks unchanged, restarts the clock."""
        if self.response_at is not None:
            self.response_at = time.monotonic() + self.response_timeout
        return data

    def check(self, state: FlowState, now_wall: float, now: float) -> None:
        """Give up on the upstream if a deadline has passed."""
        server = self.server
        if self.connect_at is not None and server is not None and now_wall >= self.connect_at:
            if server.error or server.timestamp_end is not None:
                self.connect_at = None
            elif server.timestamp_tcp_setup is None:
                if server.timestamp_start is not None and self.task is not None:
                    state.timed_out = "connect"
                    self.connect_at = None
                    mitm.cancel_connect(self.task)
            elif not server.tls or server.tls_established:
                self.connect_at = None  # connected in time
            else:  # TCP is up, the TLS handshake is not done
                state.timed_out = "connect"
                self.connect_at = None
                mitm.abort_upstream(self.client, server)
        if self.response_at is not None and now >= self.response_at:
            upstream = self.server
            if upstream is None:
                return  # not connecting yet: a connect timeout will come first
            state.timed_out = "response"
            if mitm.abort_upstream(self.client, upstream):
                self.response_at = None
            # else: between two steps of opening the connection; the next tick retries


class Timeouts:
    def __init__(self, config: RouterConfig, inflight: InFlight) -> None:
        self.config = config
        self.inflight = inflight
        self._sweeper: asyncio.Task[None] | None = None

    def running(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def done(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self.sweep()

    def sweep(self) -> None:
        """Look at every request in flight once (the periodic task calls this)."""
        now_wall, now = time.time(), time.monotonic()
        for state in self.inflight.states():
            deadlines = state.watches
            if isinstance(deadlines, Deadlines):
                with contextlib.suppress(Exception):  # one request must not stop the sweep
                    deadlines.check(state, now_wall, now)

    def _deadlines(self, flow: http.HTTPFlow, state: FlowState) -> Deadlines:
        if not isinstance(state.watches, Deadlines):
            state.watches = Deadlines(flow.client_conn)
        return state.watches

    def _timeouts(self, decision: Forward) -> tuple[float, float]:
        return self.config.current().settings.timeouts(decision.remote)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is None or flow.response is not None or not isinstance(state.decision, Forward):
            return
        request = flow.request
        if request.stream or is_chunked(state):
            # The body streams upstream (chunked bodies from the first byte, rather than after
            # buffering 1 MiB): the response timeout watches its progress from now on.
            deadlines = self._deadlines(flow, state)
            deadlines.response_timeout = self._timeouts(state.decision)[1]
            deadlines.response_at = time.monotonic() + deadlines.response_timeout
            request.stream = deadlines.progress

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.error:
            return
        state = self.inflight.get(data.client.id)
        if state is None or not isinstance(state.decision, Forward):
            return
        state.server = server
        deadlines = state.watches if isinstance(state.watches, Deadlines) else None
        if deadlines is None:
            deadlines = state.watches = Deadlines(data.client)
        deadlines.server = server
        deadlines.task = mitm.connecting_task()
        deadlines.connect_at = time.time() + self._timeouts(state.decision)[0]

    def request(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is None or not isinstance(state.decision, Forward) or flow.response is not None:
            return
        deadlines = self._deadlines(flow, state)
        # The whole body is sent: from now on, the response.
        deadlines.response_timeout = self._timeouts(state.decision)[1]
        deadlines.response_at = time.monotonic() + deadlines.response_timeout
        if deadlines.server is None:
            deadlines.server = flow.server_conn

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    @staticmethod
    def _stop(flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is not None and isinstance(state.watches, Deadlines):
            state.watches.connect_at = state.watches.response_at = None
