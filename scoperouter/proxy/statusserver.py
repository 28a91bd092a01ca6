"""The router's status listener (``clouds.<name>.metrics.listen``), in threads of its supervisor.

* ``/metrics``: Prometheus text format, every worker's metrics added up, then the router's
  facts (:mod:`scoperouter.router.facts`);
* ``/healthz``: JSON; 200 while at least one worker serves, else 503.

Off unless the config gives ``metrics.listen`` (loopback or a management address); it answers
GET and HEAD only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from scoperouter.router.facts import RouterFacts, Workers


class Router(Protocol):
    """What the listener asks its supervisor."""

    facts: RouterFacts

    def health(self) -> tuple[int, dict[str, Any]]: ...
    def metrics_text(self) -> bytes: ...
    def registry(self) -> Any: ...
    def workers(self) -> Workers: ...


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not worth a log line each."""


class StatusServer:
    """The listener at `address` (OSError when it cannot listen)."""

    def __init__(self, address: tuple[str, int], router: Router) -> None:
        self.router = router
        host, port = address
        self.server = make_server(
            host, port, self.app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.address = f"{host}:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()

    def app(self, environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _reply(start, 405, b'{"error": "GET only"}', "application/json")
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            return _reply(start, 200, self.router.metrics_text(), CONTENT_TYPE_LATEST)
        if path == "/healthz":
            status, body = self.router.health()
            return _reply(start, status, json.dumps(body).encode(), "application/json")
        return _reply(
            start,
            404,
            b'{"error": "try /metrics or /healthz"}',
            "application/json",
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _reply(
    start: Callable[..., Any],
    status: int,
    body: bytes,
    kind: str,
    extra: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    from http import HTTPStatus

    start(
        f"{status} {HTTPStatus(status).phrase}",
        [("Content-Type", kind), ("Content-Length", str(len(body))), *(extra or [])],
    )
    return [body]
