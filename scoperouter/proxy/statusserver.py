"""The router's status listener (``clouds.<name>.metrics.listen``), in threads of its supervisor.

* ``/metrics``: Prometheus text format, every worker's metrics added up, then the router's
  facts (:mod:`scoperouter.router.facts`);
* ``/healthz``: JSON; 200 while at least one worker serves, else 503;
* ``/status`` (HTML) and ``/status.json``: the status page (:mod:`scoperouter.router.status`,
  :mod:`scoperouter.router.status_page`), made from a ring of samples a thread of this module
  takes every :data:`~scoperouter.router.status.SAMPLE_EVERY` seconds (less often when a
  sample takes long: a sample never costs more than a tenth of the time).

Off unless the config gives ``metrics.listen`` (loopback or a management address); it answers
GET and HEAD only, and never shows a secret (no token, key or key path is in its data).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from scoperouter.router.facts import RouterFacts, Workers
from scoperouter.router.status import (
    SAMPLE_EVERY,
    Ring,
    families_of,
    sample_of,
    status_document,
)
from scoperouter.router.status_page import render

logger = logging.getLogger("scoperouter")

SLOW_SAMPLE_SHARE = 0.1  # a sample may take this share of the time at most


class Router(Protocol):
    """What the listener asks its supervisor."""

    facts: RouterFacts

    def health(self) -> tuple[int, dict[str, Any]]: ...
    def state(self) -> tuple[str, list[dict[str, Any]]]: ...
    def metrics_text(self) -> bytes: ...
    def registry(self) -> Any: ...
    def workers(self) -> Workers: ...


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not worth a log line each."""


PAGE_HEADERS = [
    # the page has no script, loads nothing, and is not framed
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
]


class StatusServer:
    """The listener at `address` (OSError when it cannot listen) and its sampling thread."""

    def __init__(self, address: tuple[str, int], router: Router) -> None:
        self.router = router
        self.ring = Ring()
        host, port = address
        self.server = make_server(
            host, port, self.app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.address = f"{host}:{port}"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()
        self.sampler = threading.Thread(target=self._sample_forever, daemon=True)
        self.sampler.start()

    def sample(self) -> float:
        """One sample into the ring; the seconds it took."""
        started = time.monotonic()
        families = families_of(self.router.registry().collect())
        self.ring.add(sample_of(families, time.time()))
        return time.monotonic() - started

    def _sample_forever(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                took = self.sample()
            except Exception:  # e.g. a worker's file half-written: the next one will do
                if not failing:
                    logger.exception("sampling the metrics for the status page failed")
                failing, took = True, 0.0
            else:
                failing = False
            self._stop.wait(max(SAMPLE_EVERY, took / SLOW_SAMPLE_SHARE))

    def document(self) -> dict[str, Any]:
        """The status page's data: the router's state and facts, and the ring (nothing is
        collected from the workers here)."""
        status, processes = self.router.state()
        return status_document(
            self.router.facts,
            self.router.workers(),
            processes,
            status,
            self.ring.samples(),
            time.time(),
        )

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
        if path == "/status.json":
            data = json.dumps(self.document()).encode()
            return _reply(start, 200, data, "application/json", [("Cache-Control", "no-store")])
        if path in ("/status", "/status/"):
            page = render(self.document()).encode()
            return _reply(start, 200, page, "text/html; charset=utf-8", PAGE_HEADERS)
        return _reply(
            start,
            404,
            b'{"error": "try /status, /status.json, /metrics or /healthz"}',
            "application/json",
        )

    def close(self) -> None:
        self._stop.set()
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
