"""The broker's Prometheus metrics (prometheus-client), their listener, and the summary that
``scoperouter broker status`` prints (docs/broker/operator-commands.md, "Metrics").

Two kinds of values:

* what happens in a ``serve`` process, counted where it happens: operations finished (by
  service, kind, state) and their durations (the worker, :mod:`scoperouter.broker.worker`),
  passes and retries of the worker threads, API requests by route template, method and status
  (the middleware). With ``metrics.enabled``, ``serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a
  fresh directory before this module is imported, so its processes write their values to files
  there and the listener adds them up, as the router's supervisor does;
* what the shared database holds, read when Prometheus scrapes (:class:`StoreCollector`):
  operations in progress, those stuck (past their deadline, or with a lease that expired and
  that no worker took over), whether the database answers and how fast. One indexed query on
  the in-progress rows, at most one at a time, within :data:`PROBE_TIMEOUT`. Every replica
  reports the same database: aggregate these with ``max``, the counters with ``sum``.

Label values are bounded: service names and kinds come from the config and the code, an API
request's endpoint is its route template (:func:`endpoint`), never the path the client sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from scoperouter import __version__

if TYPE_CHECKING:
    from scoperouter.broker.store import Store

log = logging.getLogger("scoperouter.broker.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
KINDS = ("provision", "deprovision", "update", "bind", "unbind")
STATES = ("succeeded", "failed")
PROBE_TIMEOUT = 5.0  # seconds a scrape waits for the database before reporting it down
BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)

OPERATIONS = Counter(
    "scoperouter_broker_operations",
    "Operations finished, by service, kind (provision, deprovision, update, bind, unbind) and "
    "state (succeeded, failed).",
    ["service", "kind", "state"],
)
DURATION = Histogram(
    "scoperouter_broker_operation_duration_seconds",
    "Time from an operation's request to its end (all its passes), by service and kind.",
    ["service", "kind"],
    buckets=BUCKETS,
)
PASSES = Counter(
    "scoperouter_broker_worker_passes",
    "Passes of operations run (a call of the service for one step of an operation).",
)
RETRIES = Counter(
    "scoperouter_broker_worker_retries",
    "Passes that raised an error: the operation is retried after a backoff.",
)
API_REQUESTS = Counter(
    "scoperouter_broker_api_requests",
    "API requests answered, by endpoint (the route template), method and HTTP status.",
    ["endpoint", "method", "status"],
)

# ------------------------------------------------------------------------- counting


def prepare(services: Iterable[str]) -> None:
    """Every series of the operations of these services, at 0: a rule on a series that only
    appears after the first failure could not be checked before one."""
    for service in services:
        for kind in KINDS:
            DURATION.labels(service, kind)
            for state in STATES:
                OPERATIONS.labels(service, kind, state)


def finished(service: str, kind: str, state: str, seconds: float) -> None:
    """An operation ended (`state`: succeeded or failed) `seconds` after it was requested."""
    OPERATIONS.labels(service, kind, state).inc()
    DURATION.labels(service, kind).observe(max(seconds, 0.0))


def passed() -> None:
    PASSES.inc()


def retried() -> None:
    RETRIES.inc()


INSTANCE = "/v2/service_instances/{instance_id}"
BINDING = INSTANCE + "/service_bindings/{binding_id}"
ENDPOINTS = (
    "/v2/catalog",
    INSTANCE,
    INSTANCE + "/last_operation",
    BINDING,
    BINDING + "/last_operation",
    "/healthz",
    "other",
)
METHODS = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE", "POST", "OPTIONS"})


def endpoint(path: str) -> str:
    """The route template of a request path (one of :data:`ENDPOINTS`): ids are not labels."""
    if path in ("/v2/catalog", "/healthz"):
        return path
    parts = path.split("/", 8)  # at most 9 parts: the cost does not grow with the path
    if len(parts) < 4 or parts[:3] != ["", "v2", "service_instances"] or not parts[3]:
        return "other"
    rest = parts[4:]
    if not rest:
        return INSTANCE
    if rest == ["last_operation"]:
        return INSTANCE + "/last_operation"
    if len(rest) >= 2 and rest[0] == "service_bindings" and rest[1]:
        if len(rest) == 2:
            return BINDING
        if rest[2:] == ["last_operation"]:
            return BINDING + "/last_operation"
    return "other"


_api_children: dict[tuple[str, str, int], Counter] = {}  # the labelled children


def api_request(method: str, path: str, status: int) -> None:
    """One API request answered (status 0: the client left before an answer)."""
    key = (endpoint(path), method if method in METHODS else "other", status)
    child = _api_children.get(key)
    if child is None:  # labels() takes a lock and builds a key: once per label set
        child = _api_children[key] = API_REQUESTS.labels(key[0], key[1], str(status))
    child.inc()


# --------------------------------------------------------------- the database's side


@dataclass(frozen=True)
class Summary:
    """What the database says about the operations, and how it answered."""

    database_up: bool
    database_latency: float  # seconds (the probe's timeout when it did not answer)
    in_progress: dict[tuple[str, str], int] = field(default_factory=dict)  # (service, kind)
    stuck: int = 0
    # every operation kept, by (service, kind, state): `broker status` only (a full scan)
    totals: dict[tuple[str, str, str], int] = field(default_factory=dict)
    error: str = ""


def summarise(store: Store, *, totals: bool = False) -> Summary:
    """Ask the database (raises nothing: a database that fails is `database_up=False`)."""
    from scoperouter.broker.logs import short_error
    from scoperouter.broker.tables import utcnow

    started = time.perf_counter()
    try:
        store.ping()
        latency = time.perf_counter() - started
        rows = store.in_progress(utcnow())
        counted = store.operation_totals() if totals else {}
    except Exception as exc:
        return Summary(False, time.perf_counter() - started, error=short_error(exc))
    in_progress = {(service, kind): count for service, kind, count, _ in rows}
    return Summary(True, latency, in_progress, sum(stuck for *_, stuck in rows), counted)


class StoreCollector:
    """The gauges read from the database at each scrape (and the build info).

    The probe blocks, so it runs in a thread of its own, one at a time: scrapes that arrive
    while one runs share it, and a database that hangs ties up that thread, not one per
    scrape; a probe slower than `timeout` reports the database down."""

    def __init__(
        self, store: Store, services: Iterable[str], timeout: float = PROBE_TIMEOUT
    ) -> None:
        self._store = store
        self._services = tuple(services)
        self._timeout = timeout
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="broker-metrics-probe")
        self._lock = threading.Lock()
        self._running: Future[Summary] | None = None
        self._down = False  # the last probe failed (logged once until one succeeds)

    def probe(self) -> Summary:
        with self._lock:
            if self._running is None or self._running.done():
                self._running = self._pool.submit(summarise, self._store)
            running = self._running
        try:
            summary = running.result(self._timeout)
        except TimeoutError:
            summary = Summary(False, self._timeout, error=f"no answer in {self._timeout:g} s")
        if not summary.database_up and not self._down:
            log.warning("metrics: the database does not answer: %s", summary.error)
        elif summary.database_up and self._down:
            log.warning("metrics: the database answers again")
        self._down = not summary.database_up
        return summary

    def collect(self) -> Iterator[Metric]:
        summary = self.probe()
        up = GaugeMetricFamily(
            "scoperouter_broker_database_up", "1 when the database answers a trivial query."
        )
        up.add_metric([], 1 if summary.database_up else 0)
        latency = GaugeMetricFamily(
            "scoperouter_broker_database_latency_seconds",
            "How long the database took to answer the trivial query (the probe's timeout when "
            "it did not).",
        )
        latency.add_metric([], summary.database_latency)
        running = GaugeMetricFamily(
            "scoperouter_broker_operations_in_progress",
            "Operations in progress in the database, by service and kind (every replica reports "
            "the same: aggregate with max).",
            labels=["service", "kind"],
        )
        for service in sorted({*self._services, *(s for s, _ in summary.in_progress)}):
            for kind in KINDS:
                running.add_metric([service, kind], summary.in_progress.get((service, kind), 0))
        stuck = GaugeMetricFamily(
            "scoperouter_broker_operations_stuck",
            "Operations in progress past their deadline, or whose lease expired and no worker "
            "took over (NaN while the database does not answer).",
        )
        stuck.add_metric([], summary.stuck if summary.database_up else float("nan"))
        build = GaugeMetricFamily(
            "scoperouter_broker_build_info", "The broker's version (always 1).", labels=["version"]
        )
        build.add_metric([__version__], 1)
        yield from (up, latency, running, stuck, build)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# -------------------------------------------------------------------------- listener


class _Forward:
    """A registry's collectors as one (this process's own values, when not multiprocess)."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds are not worth a log line each."""


class MetricsServer:
    """``GET /metrics`` (prometheus-client's WSGI app) in a thread; anything else is 404.

    It shows the values of the processes that write to `directory` (``serve``'s
    ``PROMETHEUS_MULTIPROC_DIR``; None: this process's own) and the database's. OSError when
    `address` cannot be bound."""

    def __init__(
        self,
        address: tuple[str, int],
        store: Store,
        services: Iterable[str],
        directory: str | None,
    ) -> None:
        from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app, multiprocess

        self.registry = CollectorRegistry()
        if directory is None:
            self.registry.register(_Forward(REGISTRY.collect))
        else:
            multiprocess.MultiProcessCollector(self.registry, path=directory)
        self.collector = StoreCollector(store, services)
        self.registry.register(self.collector)
        self._metrics = make_wsgi_app(self.registry)
        host, port = address
        self.server = make_server(
            host, port, self.app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.address = f"{host}:{port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.1,), name="broker-metrics", daemon=True
        )
        self.thread.start()

    def app(self, environ: WSGIEnvironment, start: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _reply(start, "405 Method Not Allowed", b'{"error": "GET only"}')
        if environ.get("PATH_INFO") != "/metrics":
            return _reply(start, "404 Not Found", b'{"error": "try /metrics"}')
        answer: Iterable[bytes] = self._metrics(environ, start)
        return answer

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.collector.close()


def _reply(start: StartResponse, status: str, body: bytes) -> list[bytes]:
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
