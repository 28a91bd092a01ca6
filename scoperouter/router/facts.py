"""What a router's supervisor knows about its router, and exports as metrics of its own.

The workers' metrics (:mod:`.metrics`) count requests; these are the router's facts, kept by
the supervisor (one process: no multiprocess files) and added to ``/metrics`` by
:class:`FactsCollector`:

* ``scoperouter_build_info{version, build, event_loop}`` = 1;
* ``scoperouter_config_generation`` (1 at start, +1 at every accepted reload),
  ``scoperouter_config_loaded_timestamp_seconds`` and ``scoperouter_config_info{digest}`` = 1,
  the digest being the first 12 hex digits of the SHA-256 of the config's normalised document
  (:func:`config_digest`: the same config on two routers, whatever its layout, comments or key
  order, has the same digest; routers of one federation with different digests run different
  configs);
* ``scoperouter_workers{state="running"|"wanted"}``, ``scoperouter_worker_restarts_total``;
* ``scoperouter_certificate_expiry_timestamp_seconds{role, subject}`` for every certificate the
  router holds or checks (:mod:`.certificates`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import scoperouter
from scoperouter.catalog import Catalog
from scoperouter.config import parse_document
from scoperouter.router.certificates import Certificate, held_certificates
from scoperouter.router.upstreams import UpstreamSpec, config_upstreams


def config_digest(text: str) -> str:
    """The first 12 hex digits of the SHA-256 of the config document `text` holds, written
    canonically (JSON, keys sorted): layout, comments and key order do not change it."""
    document = parse_document(text)
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


@dataclass(slots=True)
class Workers:
    running: int = 0
    wanted: int = 0
    restarts: int = 0


@dataclass(slots=True)
class RouterFacts:
    cloud: str
    event_loop: str
    version: str = scoperouter.__version__
    build: str = field(default_factory=scoperouter.build)  # compiled or pure
    generation: int = 0
    loaded_at: float = 0.0  # unix time
    digest: str = ""
    certificates: list[Certificate] = field(default_factory=list)
    upstreams: list[UpstreamSpec] = field(default_factory=list)
    forward_proxy: bool = False  # the cloud's router has a forward proxy
    intercepts: bool = False  # ... that intercepts TLS (proxy.ca)

    def loaded(self, catalog: Catalog, text: str, now: float | None = None) -> None:
        """A config was accepted (at start, at a reload): its generation, time, digest,
        certificates and upstreams."""
        self.generation += 1
        self.loaded_at = time.time() if now is None else now
        self.digest = config_digest(text)
        self.certificates = held_certificates(catalog, self.cloud)
        self.upstreams = config_upstreams(catalog, self.cloud)
        spec = catalog.clouds[self.cloud]
        self.forward_proxy = spec.proxy_listen is not None
        self.intercepts = spec.proxy_ca is not None


class FactsCollector:
    """A prometheus-client collector of the router's facts (register it in a registry of the
    supervisor's own; `workers` is read at each scrape)."""

    def __init__(self, facts: RouterFacts, workers: Callable[[], Workers]) -> None:
        self.facts = facts
        self.workers = workers

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        facts = self.facts
        info = GaugeMetricFamily(
            "scoperouter_build_info",
            "The router's version, build (pure or compiled) and workers' event loop.",
            labels=["version", "build", "event_loop"],
        )
        info.add_metric([facts.version, facts.build, facts.event_loop], 1)
        yield info
        yield GaugeMetricFamily(
            "scoperouter_config_generation",
            "Configs accepted since the router started (1 at start, +1 per accepted reload).",
            value=facts.generation,
        )
        yield GaugeMetricFamily(
            "scoperouter_config_loaded_timestamp_seconds",
            "When the config in use was accepted (unix time).",
            value=facts.loaded_at,
        )
        config = GaugeMetricFamily(
            "scoperouter_config_info",
            "The config in use: the first 12 hex digits of the SHA-256 of its normalised "
            "document (routers running the same config have the same digest).",
            labels=["digest"],
        )
        config.add_metric([facts.digest], 1)
        yield config
        workers = self.workers()
        gauge = GaugeMetricFamily(
            "scoperouter_workers",
            "Worker processes: running (ready to serve) and wanted (--workers).",
            labels=["state"],
        )
        gauge.add_metric(["running"], workers.running)
        gauge.add_metric(["wanted"], workers.wanted)
        yield gauge
        yield CounterMetricFamily(
            "scoperouter_worker_restarts",
            "Workers started again after dying.",
            value=workers.restarts,
        )
        expiry = GaugeMetricFamily(
            "scoperouter_certificate_expiry_timestamp_seconds",
            "When each certificate the router holds or checks expires (notAfter, unix time), "
            "by role (peer_cert, frontend_cert, peer_ca, interception_ca, backend_ca) and "
            "subject (its common name, at most 64 characters).",
            labels=["role", "subject"],
        )
        for cert in facts.certificates:
            expiry.add_metric([cert.role, cert.subject], cert.not_after)
        yield expiry
