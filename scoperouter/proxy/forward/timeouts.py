"""The forward proxy's connect and response timeouts, per destination kind.

A backend of this cloud gets ``connect_timeout`` and ``response_timeout``; another cloud's
router gets ``peer_connect_timeout`` and ``peer_response_timeout``. When one fires, the upstream
connection is given up (:mod:`~scoperouter.proxy.forward.mitm`, item 3) and the request's state
says which timeout it was, so the error answer is a 504 naming the cloud.

* **Connect**: from ``server_connect`` until the TCP (and TLS) handshake is done.
* **Response**: from the end of the request to the response headers; while a large body streams
  upstream every chunk restarts it, so an upstream that stops reading is caught as well, while
  a long upload that keeps moving is not.

Requests only note their deadlines; the worker's one sweep (every tick) looks at the requests in
flight (no timer is made and cancelled per request), so a timeout fires at most a tick late.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mitmproxy.connection import Client, Server

from scoperouter.proxy.forward import mitm
from scoperouter.router.state import RequestState


class Deadlines:
    """The timeouts of one request: what to give up, and when."""

    __slots__ = ("client", "connect_at", "response_at", "response_timeout", "server", "task")

    def __init__(self, client: Client) -> None:
        self.client = client
        self.server: Server | None = None
        self.task: asyncio.Task[Any] | None = None  # the task opening the connection
        self.connect_at: float | None = None  # time.time(), as mitmproxy's timestamps
        self.response_at: float | None = None  # time.monotonic()
        self.response_timeout = 0.0

    def start_response(self, timeout: float) -> None:
        """The response timeout runs from now."""
        self.response_timeout = timeout
        self.response_at = time.monotonic() + timeout

    def progress(self, data: bytes) -> bytes:
        """A ``flow.request.stream`` callable: forwards chunks unchanged, restarts the clock."""
        if self.response_at is not None:
            self.response_at = time.monotonic() + self.response_timeout
        return data

    def connecting(self, server: Server, timeout: float) -> None:
        """``server_connect``: the connection is being opened, within `timeout`."""
        self.server = server
        self.task = mitm.connecting_task()
        self.connect_at = time.time() + timeout

    def stop(self) -> None:
        self.connect_at = self.response_at = None

    def check(self, state: RequestState, now_wall: float, now: float) -> None:
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
