"""The router's Prometheus metrics (prometheus-client), and :class:`Metrics`, which keeps them.

Each worker process updates them; with several workers the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before they start, so values go to files there and the supervisor's
``/metrics`` endpoint adds them up (gauges as documented per metric). Label values are bounded:
service types and cloud names come from the config, statuses from HTTP.

Nothing per request touches prometheus-client: a request adds to plain per-worker tallies (a
count and a duration histogram per label set, open connections as a difference), and
:meth:`Metrics.flush`, called once per tick of the worker's sweep and when it stops, hands them
over in one update per label set and bucket. ``/metrics`` is exact to within one tick. (In
multiprocess mode every prometheus-client update takes its lock, checks the process id with a
``getpid()`` system call and writes the value to its file: three times per request before.)
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any, Final

from prometheus_client import Counter, Gauge, Histogram

from scoperouter.catalog import Catalog
from scoperouter.router.config import RouterConfig
from scoperouter.router.failures import CLIENT_GONE_STATUS
from scoperouter.router.health import Upstream, UpstreamHealth
from scoperouter.router.refusals import REASONS, refusal_reason
from scoperouter.router.state import HeadRefusal, RequestState
from scoperouter.router.upstreams import config_upstreams
from scoperouter.routing import Failover, FanOut, Forward

BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
_BOUNDS: Final = (*(float(b) for b in BUCKETS), float("inf"))  # the histogram's, +Inf last

logger = logging.getLogger("scoperouter")

REQUESTS = Counter(
    "scoperouter_requests",
    "Requests answered, by service type, target cloud, decision (local, remote, refused) and "
    "HTTP status ('-': no service or cloud).",
    ["service", "cloud", "decision", "status"],
)
DURATION = Histogram(
    "scoperouter_request_duration_seconds",
    "Time from the request head to the answer, by service type and decision.",
    ["service", "decision"],
    buckets=BUCKETS,
)
OPEN_CONNECTIONS = Gauge(
    "scoperouter_open_connections",
    "Client connections open now (all workers).",
    multiprocess_mode="livesum",
)
UPSTREAM_UP = Gauge(
    "scoperouter_upstream_up",
    "1 when an upstream (another cloud's router: kind=peer; a service of this cloud: "
    "kind=backend) takes requests, 0 while it is marked down (any worker).",
    ["cloud", "kind", "service", "upstream"],
    multiprocess_mode="livemin",
)
PEER_CONNECTIONS = Counter(
    "scoperouter_peer_connections_opened",
    "TCP+TLS connections opened to another cloud's router (its peer link, upstream), by reason: "
    "request (a request found none idle and waited for the handshake) or ahead (opened in the "
    "background: the warm set, and twice the most in use at once).",
    ["upstream", "reason"],
)
IDENTITY_STRIPPED = Counter(
    "scoperouter_identity_fields_stripped",
    "Requests whose head carried identity fields only keystonemiddleware sets (X-Roles, "
    "X-User-Id, X-Identity-Status...): dropped before routing (CVE-2026-22797).",
)
RELOADS = Counter(
    "scoperouter_config_reloads",
    "Config reloads by result (ok, refused).",
    ["result"],
)
BREAKER_OPEN = Gauge(
    "scoperouter_breaker_open",
    "1 while any worker holds the upstream's breaker open (marked down: requests for it fail "
    "fast), else 0; every upstream of the config.",
    ["upstream"],
    multiprocess_mode="livemax",
)
UPSTREAM_CONNECTIONS = Gauge(
    "scoperouter_upstream_connections",
    "Connections to an upstream, all workers: state=open (every open one, in use or idle), "
    "state=idle (those waiting for a request). Updated once a second.",
    ["upstream", "state"],
    multiprocess_mode="livesum",
)
REFUSALS = Counter(
    "scoperouter_refusals",
    "Requests the router answered itself (refused or failed), by a reason from a fixed set "
    "(bad_scope, unknown_cloud, unknown_service, not_in_catalog, too_large, timeout, "
    "upstream_down, ...).",
    ["reason"],
)
INTERCEPTION_MINTED = Counter(
    "scoperouter_interception_certificates_minted",
    "Certificates the forward proxy made for the hosts it intercepts (all workers).",
)
INTERCEPTION_CACHE = Gauge(
    "scoperouter_interception_cache_size",
    "Interception certificates kept (all workers' caches added up).",
    multiprocess_mode="livesum",
)

SLOW_EVERY: Final = 10  # flushes (worker ticks: 1 s) between two readings of the connection counts

ConnectionCounts = Callable[[], Mapping[str, tuple[int, int]]]
"""Upstream (scheme://host:port) -> (open, idle) connections of this worker now."""
Minted = Callable[[], tuple[int, int]]
"""(certificates made so far, certificates kept) by this worker's forward proxy."""


Key = tuple[str, str, str, int]  # service, cloud, decision, status (0: none)


class Metrics:
    """Counted once per request the router answers (responses, error answers, refused heads),
    with the time from the request head to the answer; open client connections; and the
    health of every upstream this router uses (each other cloud's router, each backend of
    this cloud: 1 up, 0 down, as :class:`~scoperouter.router.health.UpstreamHealth` decides).

    Requests, connections, peer connections, stripped heads and refusals (by a reason of
    :data:`~scoperouter.router.refusals.REASONS`) are tallied here and reach prometheus-client
    at :meth:`flush` (the worker's tick); the health of upstreams and their breakers (rare) at
    once; the connections per upstream and the interception certificates (:meth:`watch`)
    once a second. Every upstream's series and every refusal reason exist from the config
    load."""

    def __init__(self, config: RouterConfig, health: UpstreamHealth) -> None:
        self.config = config
        self._requests: dict[Key, Any] = {}  # prometheus-client's children, by label set
        self._durations: dict[tuple[str, str], Any] = {}
        self._linked: dict[str, list[str]] = {}  # peer link -> the services behind it
        self._peer_connections: dict[tuple[str, str], Any] = {}
        # Since the last flush: per label set [seconds summed, then a count per bucket of
        # _BOUNDS]; client connections opened less closed; peer connections; stripped heads.
        self._tallies: dict[Key, list[float]] = {}
        self._open = 0
        self._peer_opened: dict[tuple[str, str], int] = {}
        self._stripped = 0
        self._refusals: dict[str, int] = {}
        self._failing = False  # the last flush failed (logged once until one succeeds)
        # Read once a second (SLOW_EVERY flushes): connections per upstream, interception.
        self._flushes = 0
        self._connection_counts: ConnectionCounts | None = None
        self._connections: dict[str, tuple[int, int]] = {}  # as last set, per upstream
        self._minted: Minted | None = None
        self._minted_seen = 0
        self._cache_size = 0
        self._health_state = health
        for reason in REASONS:  # every series from the start (a rule can rely on it)
            REFUSALS.labels(reason)
        config.subscribe(self._upstreams)
        health.on_change(self._health)

    def watch(
        self, connections: ConnectionCounts | None = None, minted: Minted | None = None
    ) -> None:
        """Where the once-a-second gauges come from: the worker's upstream connections, its
        forward proxy's interception certificates."""
        if connections is not None:
            self._connection_counts = connections
        if minted is not None:
            self._minted = minted

    def _upstreams(self, catalog: Catalog) -> None:
        """Every upstream of the new config, with every series it has: up unless this worker
        holds it down, its breaker closed unless so, no connection yet (the counts follow
        within a second). A peer router with a peer link is one upstream (the link) for all
        its services."""
        down = {u.address for u in self._health_state.down()}
        self._linked = {}
        for spec in config_upstreams(catalog, self.config.cloud):
            if spec.kind == "peer":
                self._linked[spec.upstream] = list(spec.services)
            is_down = spec.upstream in down
            for service in spec.services:
                labels = (spec.cloud, spec.kind, service, spec.upstream)
                UPSTREAM_UP.labels(*labels).set(0 if is_down else 1)
            BREAKER_OPEN.labels(spec.upstream).set(1 if is_down else 0)
            if spec.upstream not in self._connections:
                self._connections[spec.upstream] = (0, 0)
                UPSTREAM_CONNECTIONS.labels(spec.upstream, "open").set(0)
                UPSTREAM_CONNECTIONS.labels(spec.upstream, "idle").set(0)

    def _health(self, upstream: Upstream, up: bool) -> None:
        services = self._linked.get(upstream.address, [upstream.service])
        for service in services:
            UPSTREAM_UP.labels(upstream.cloud, upstream.kind, service, upstream.address).set(
                1 if up else 0
            )
        BREAKER_OPEN.labels(upstream.address).set(0 if up else 1)

    def peer_connection(self, upstream: object, reason: str) -> None:
        """A connection to a peer router opened (`upstream`: its peer link's origin)."""
        key = (str(upstream), reason)
        self._peer_opened[key] = self._peer_opened.get(key, 0) + 1

    def stripped(self) -> None:
        """A request's forged identity fields were dropped."""
        self._stripped += 1

    def opened(self) -> None:
        """A client connection opened."""
        self._open += 1

    def closed(self) -> None:
        self._open -= 1

    def count(self, state: RequestState, status: int) -> None:
        if state.counted:
            return
        state.counted = True
        decision = state.decision
        if isinstance(decision, Forward):
            key = (
                decision.service_type,
                decision.cloud,
                "remote" if decision.remote else "local",
                status,
            )
        elif isinstance(decision, FanOut):
            key = (decision.service_type, "-", "fanout", status)
        elif isinstance(decision, Failover):  # the cloud that answered (bounded label values)
            key = (decision.service_type, state.answered or "-", "failover", status)
        else:
            key = ("-", "-", "refused", status)
        if state.status == status and status >= 400 and status != CLIENT_GONE_STATUS:
            # the router answered itself (a client gone got no answer)
            self._refused(refusal_reason(status, state.message))
        self._observe(key, time.monotonic() - state.started)

    def refused(self, refusal: HeadRefusal) -> None:
        self._refused(refusal_reason(refusal.status, refusal.message))
        self._observe(("-", "-", "refused", refusal.status), time.monotonic() - refusal.started)

    def _refused(self, reason: str) -> None:
        self._refusals[reason] = self._refusals.get(reason, 0) + 1

    def _observe(self, key: Key, seconds: float) -> None:
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = [0.0] * (len(_BOUNDS) + 1)
        tally[0] += seconds
        # the first bucket whose bound is >= seconds, as Histogram.observe picks it
        tally[bisect_left(_BOUNDS, seconds) + 1] += 1

    def flush(self) -> None:
        """Hand what was tallied since the last flush to prometheus-client: one update per
        label set (and per histogram bucket used). The worker calls this once per tick and
        when it stops; it never raises (the tick checks every deadline too)."""
        try:
            self._flush()
        except Exception:  # e.g. a full disk under PROMETHEUS_MULTIPROC_DIR
            if not self._failing:
                logger.exception("updating the metrics failed (the counts of a tick are lost)")
            self._failing = True
        else:
            self._failing = False

    def _flush(self) -> None:
        if self._tallies:
            tallies, self._tallies = self._tallies, {}
            for key, tally in tallies.items():
                self._add(key, tally)
        if self._open:
            opened, self._open = self._open, 0
            OPEN_CONNECTIONS.inc(opened)
        if self._peer_opened:
            peer_opened, self._peer_opened = self._peer_opened, {}
            for labels, n in peer_opened.items():
                counter = self._peer_connections.get(labels)
                if counter is None:
                    counter = self._peer_connections[labels] = PEER_CONNECTIONS.labels(*labels)
                counter.inc(n)
        if self._stripped:
            stripped, self._stripped = self._stripped, 0
            IDENTITY_STRIPPED.inc(stripped)
        if self._refusals:
            refusals, self._refusals = self._refusals, {}
            for reason, n in refusals.items():
                REFUSALS.labels(reason).inc(n)
        self._flushes += 1
        if self._flushes % SLOW_EVERY == 0:
            self._slow()

    def _slow(self) -> None:
        """The gauges read once a second: only those that changed are written."""
        if self._connection_counts is not None:
            counts = self._connection_counts()
            for upstream, last in self._connections.items():
                now = counts.get(upstream, (0, 0))
                if now != last:  # only the config's upstreams: a bounded label set
                    self._connections[upstream] = now
                    UPSTREAM_CONNECTIONS.labels(upstream, "open").set(now[0])
                    UPSTREAM_CONNECTIONS.labels(upstream, "idle").set(now[1])
        if self._minted is not None:
            made, kept = self._minted()
            if made > self._minted_seen:
                INTERCEPTION_MINTED.inc(made - self._minted_seen)
                self._minted_seen = made
            if kept != self._cache_size:
                self._cache_size = kept
                INTERCEPTION_CACHE.set(kept)

    def _add(self, key: Key, tally: list[float]) -> None:
        counter = self._requests.get(key)
        if counter is None:  # labels() takes a lock and builds a key: once per label set
            service, cloud, decision, status = key
            counter = REQUESTS.labels(service, cloud, decision, str(status or "-"))
            self._requests[key] = counter
        counts = tally[1:]
        counter.inc(sum(counts))
        short = (key[0], key[2])
        histogram = self._durations.get(short)
        if histogram is None:
            histogram = self._durations[short] = DURATION.labels(*short)
        observe_many(histogram, tally[0], counts)


def observe_many(histogram: Any, seconds: float, counts: list[float]) -> None:
    """What ``histogram.observe`` of each of many durations adds (their sum, `seconds`, and
    `counts`: how many fell in each bucket, as :data:`_BOUNDS`), in one update per bucket.

    prometheus-client has no batch API: this adds to the child's own values (``_sum``, and
    ``_buckets``, one per bound, +Inf last: the layout of every release since 0.4;
    tests/unit/test_metrics.py holds the result to observe()'s)."""
    histogram._sum.inc(seconds)
    for bucket, n in zip(histogram._buckets, counts, strict=True):
        if n:
            bucket.inc(n)
