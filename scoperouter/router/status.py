"""The data of a router's status page (``/status`` and ``/status.json``), pure: no I/O.

The supervisor samples its workers' metrics, added up, every :data:`SAMPLE_EVERY` seconds
(:func:`sample_of`) into a :class:`Ring` of bounded length; :func:`status_document` makes the
page's document from the router's facts (:class:`~.facts.RouterFacts`), its workers and the
ring: rates, the error ratio and the latency quantiles are differences between the newest
sample and the one a window earlier (the counters only grow), never per-request state. Its
cost is linear in the config's upstreams and the services and clouds that had requests.

Errors are answers with a 5xx status (the router's own 502/503/504 included); the router's
other refusals (4xx) are counted by reason (:mod:`.refusals`).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scoperouter.router.facts import RouterFacts, Workers

SAMPLE_EVERY = 5.0  # seconds between two samples (more when a sample is slow: statusserver)
WINDOW = 300.0  # the error ratio, p50 and p99: over the last 5 minutes
RATE_WINDOW = 60.0  # requests per second: over the last minute
RING_SIZE = int(WINDOW / SAMPLE_EVERY) + 2

Labels = Mapping[str, str]
Families = Mapping[str, Sequence[tuple[Labels, float]]]
"""Sample name (``scoperouter_requests_total``) -> its (labels, value) pairs."""


def families_of(metrics: Iterable[Any]) -> dict[str, list[tuple[Labels, float]]]:
    """prometheus-client's collected metrics (objects with ``samples``) as :data:`Families`."""
    found: dict[str, list[tuple[Labels, float]]] = {}
    for metric in metrics:
        for sample in metric.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


@dataclass(frozen=True, slots=True)
class Sample:
    """The workers' metrics added up at one time."""

    at: float  # unix time
    routes: dict[tuple[str, str], tuple[float, float]]  # (service, cloud) -> (answers, 5xx)
    buckets: dict[str, dict[float, float]]  # service -> le -> cumulative count (all decisions)
    up: dict[str, float]  # upstream -> 1 up, 0 down (any service, any worker)
    breaker: dict[str, float]  # upstream -> 1 open
    connections: dict[str, tuple[float, float]]  # upstream -> (open, idle)
    handshakes: dict[tuple[str, str], float]  # (upstream, reason) -> connections opened
    refusals: dict[str, float]  # reason -> count
    minted: float = 0.0
    cache: float = 0.0
    open_connections: float = 0.0


def sample_of(families: Families, at: float) -> Sample:
    """A :class:`Sample` of the metrics in `families`, taken at `at`."""
    routes: dict[tuple[str, str], tuple[float, float]] = {}
    for labels, value in families.get("scoperouter_requests_total", ()):
        key = (labels.get("service", "-"), labels.get("cloud", "-"))
        total, errors = routes.get(key, (0.0, 0.0))
        error = labels.get("status", "-").startswith("5")
        routes[key] = (total + value, errors + (value if error else 0.0))
    buckets: dict[str, dict[float, float]] = {}
    for labels, value in families.get("scoperouter_request_duration_seconds_bucket", ()):
        per = buckets.setdefault(labels.get("service", "-"), {})
        le = float(labels.get("le", "+Inf"))
        per[le] = per.get(le, 0.0) + value
    up: dict[str, float] = {}
    for labels, value in families.get("scoperouter_upstream_up", ()):
        upstream = labels.get("upstream", "")
        up[upstream] = min(up.get(upstream, 1.0), value)
    breaker = {
        labels.get("upstream", ""): value
        for labels, value in families.get("scoperouter_breaker_open", ())
    }
    opened: dict[str, float] = {}
    idle: dict[str, float] = {}
    for labels, value in families.get("scoperouter_upstream_connections", ()):
        target = opened if labels.get("state") == "open" else idle
        target[labels.get("upstream", "")] = value
    handshakes = {
        (labels.get("upstream", ""), labels.get("reason", "")): value
        for labels, value in families.get("scoperouter_peer_connections_opened_total", ())
    }
    refusals = {
        labels.get("reason", "other"): value
        for labels, value in families.get("scoperouter_refusals_total", ())
    }
    return Sample(
        at=at,
        routes=routes,
        buckets=buckets,
        up=up,
        breaker=breaker,
        connections={u: (opened.get(u, 0.0), idle.get(u, 0.0)) for u in {*opened, *idle}},
        handshakes=handshakes,
        refusals=refusals,
        minted=_single(families, "scoperouter_interception_certificates_minted_total"),
        cache=_single(families, "scoperouter_interception_cache_size"),
        open_connections=_single(families, "scoperouter_open_connections"),
    )


def _single(families: Families, name: str) -> float:
    return sum(value for _, value in families.get(name, ()))


@dataclass
class Ring:
    """The last samples (at most `size`), shared by the sampling thread and the page's."""

    size: int = RING_SIZE
    _samples: deque[Sample] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.size)

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)


def _base(samples: Sequence[Sample], seconds: float) -> Sample | None:
    """The sample `seconds` before the newest (else the oldest); None with fewer than two."""
    if len(samples) < 2:
        return None
    since = samples[-1].at - seconds
    base = samples[0]
    for sample in samples[:-1]:
        if sample.at <= since:
            base = sample
        else:
            break
    return base


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """The `q` quantile of a histogram's cumulative bucket counts (le -> count), interpolated
    within its bucket as Prometheus' ``histogram_quantile`` does; None without observations."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    low, below = 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                return low  # past the highest finite bound: that bound
            if count == below:
                return le
            return low + (le - low) * (rank - below) / (count - below)
        low, below = le, count
    return low


def _delta(new: Mapping[Any, float], old: Mapping[Any, float]) -> dict[Any, float]:
    """What each counter added (never negative: a series new since then counts from 0)."""
    return {key: max(0.0, value - old.get(key, 0.0)) for key, value in new.items()}


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def status_document(
    facts: RouterFacts,
    workers: Workers,
    processes: Sequence[Mapping[str, Any]],
    health: str,
    samples: Sequence[Sample],
    now: float,
) -> dict[str, Any]:
    """The status page's data (``/status.json``; the HTML page shows the same)."""
    newest = samples[-1] if samples else None
    rate_base = _base(samples, RATE_WINDOW)
    base = _base(samples, WINDOW)
    traffic: dict[str, Any] = {"window_seconds": 0.0, "rate_window_seconds": 0.0}
    routes: list[dict[str, Any]] = []
    latency: list[dict[str, Any]] = []
    refusals: list[dict[str, Any]] = []
    if newest is not None:
        traffic["open_connections"] = newest.open_connections
    if newest is not None and base is not None and rate_base is not None:
        span, rate_span = newest.at - base.at, newest.at - rate_base.at
        traffic["window_seconds"] = round(span, 1)
        traffic["rate_window_seconds"] = round(rate_span, 1)
        recent = {k: v[0] for k, v in newest.routes.items()}
        rate = _delta(recent, {k: v[0] for k, v in rate_base.routes.items()})
        answers = _delta(recent, {k: v[0] for k, v in base.routes.items()})
        errors = _delta(
            {k: v[1] for k, v in newest.routes.items()}, {k: v[1] for k, v in base.routes.items()}
        )
        for service, cloud in sorted(set(rate) | set(answers)):
            key = (service, cloud)
            if not (rate.get(key) or answers.get(key)):
                continue
            routes.append(
                {
                    "service": service,
                    "cloud": cloud,
                    "requests_per_second": round(rate.get(key, 0.0) / rate_span, 3),
                    "requests": answers.get(key, 0.0),
                    "errors": errors.get(key, 0.0),
                    "error_ratio": _ratio(errors.get(key, 0.0), answers.get(key, 0.0)),
                }
            )
        total = sum(answers.values())
        traffic["requests_per_second"] = round(sum(rate.values()) / rate_span, 3)
        traffic["requests"] = total
        traffic["error_ratio"] = _ratio(sum(errors.values()), total)
        overall: dict[float, float] = {}
        for service in sorted(newest.buckets):
            added = _delta(newest.buckets[service], base.buckets.get(service, {}))
            for le, count in added.items():
                overall[le] = overall.get(le, 0.0) + count
            if max(added.values(), default=0.0) > 0:
                latency.append(
                    {
                        "service": service,
                        "p50_seconds": _rounded(quantile(0.5, added)),
                        "p99_seconds": _rounded(quantile(0.99, added)),
                    }
                )
        traffic["p50_seconds"] = _rounded(quantile(0.5, overall))
        traffic["p99_seconds"] = _rounded(quantile(0.99, overall))
        refused = _delta(newest.refusals, base.refusals)
        refusals = [
            {"reason": reason, "count": count, "total": newest.refusals[reason]}
            for reason, count in sorted(refused.items(), key=lambda item: (-item[1], item[0]))
            if count > 0
        ]
    else:
        for name in ("requests_per_second", "error_ratio", "p50_seconds", "p99_seconds"):
            traffic[name] = None  # not computed yet: fewer than two samples
    upstreams = _upstreams(facts, newest, base)
    peers = [u for u in upstreams if u["kind"] == "peer"]
    return {
        "cloud": facts.cloud,
        "status": health,
        "version": facts.version,
        "build": facts.build,
        "event_loop": facts.event_loop,
        "generated_at": round(now, 3),
        "sampled_at": None if newest is None else round(newest.at, 3),
        "sample_every_seconds": SAMPLE_EVERY,
        "workers": {
            "running": workers.running,
            "wanted": workers.wanted,
            "restarts": workers.restarts,
            "processes": [dict(p) for p in processes],
        },
        "config": {
            "generation": facts.generation,
            "loaded_at": round(facts.loaded_at, 3),
            "digest": facts.digest,
        },
        "traffic": traffic,
        "routes": routes,
        "latency": latency,
        "upstreams": upstreams,
        "peer_links": {"up": sum(1 for u in peers if u["up"]), "total": len(peers)},
        "breakers_open": sum(1 for u in upstreams if u["breaker_open"]),
        "forward_proxy": {
            "enabled": facts.forward_proxy,
            "intercepts": facts.intercepts,
            "certificates_minted": 0.0 if newest is None else newest.minted,
            "cache_size": 0.0 if newest is None else newest.cache,
        },
        "certificates": [
            {
                "role": c.role,
                "subject": c.subject,
                "not_after": c.not_after,
                "days_left": round((c.not_after - now) / 86400, 1),
            }
            for c in facts.certificates
        ],
        "refusals": refusals,
    }


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def _upstreams(
    facts: RouterFacts, newest: Sample | None, base: Sample | None
) -> list[dict[str, Any]]:
    """Every upstream of the config, as the newest sample has it (problems first)."""
    rows = []
    for spec in facts.upstreams:
        name = spec.upstream
        up = newest is None or newest.up.get(name, 1.0) >= 1
        opened, idle = (0.0, 0.0) if newest is None else newest.connections.get(name, (0.0, 0.0))
        row: dict[str, Any] = {
            "upstream": name,
            "cloud": spec.cloud,
            "kind": spec.kind,
            "services": list(spec.services),
            "up": up,
            "breaker_open": newest is not None and newest.breaker.get(name, 0.0) >= 1,
            "open_connections": opened,
            "idle_connections": idle,
        }
        if spec.kind == "peer" and newest is not None:
            request = newest.handshakes.get((name, "request"), 0.0)
            row["handshakes_on_request_path"] = request
            row["handshakes_ahead"] = newest.handshakes.get((name, "ahead"), 0.0)
            if base is not None:
                row["handshakes_on_request_path_recent"] = max(
                    0.0, request - base.handshakes.get((name, "request"), 0.0)
                )
        rows.append(row)
    rows.sort(key=lambda r: (r["up"] and not r["breaker_open"], r["kind"] != "peer"))
    return rows
