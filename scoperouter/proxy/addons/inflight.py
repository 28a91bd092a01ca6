"""InFlight: the request in progress on each client connection.

HTTP/1.1 carries one request at a time per connection. Hooks that only know a connection
(``server_connect``) find the request through this table, and a draining router knows which
connections it may close at once (no request in progress) and which to let finish.
"""

from __future__ import annotations

from mitmproxy import http
from mitmproxy.connection import Client

from scoperouter.proxy.flowstate import FlowState, state_of


class InFlight:
    def __init__(self) -> None:
        self._current: dict[str, FlowState] = {}

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is not None:
            self._current[flow.client_conn.id] = state

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def client_disconnected(self, client: Client) -> None:
        self._current.pop(client.id, None)

    def _finish(self, flow: http.HTTPFlow) -> None:
        if self._current.get(flow.client_conn.id) is state_of(flow):
            del self._current[flow.client_conn.id]

    def get(self, client_id: str) -> FlowState | None:
        """The request in progress on this client connection, if any."""
        return self._current.get(client_id)

    def states(self) -> list[FlowState]:
        """The requests in progress now (a copy: hooks may change the table meanwhile)."""
        return list(self._current.values())

    def busy(self) -> set[str]:
        """Client connections with a request in progress."""
        return set(self._current)

    def __len__(self) -> int:
        return len(self._current)
