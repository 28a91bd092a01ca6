"""Metrics: the Prometheus metrics of :mod:`scoperouter.proxy.metrics`, kept up to date.

Counted once per request the router answers (responses, error answers, refused heads), with the
time from the request head to the answer; open client connections; and the health of every
upstream this router uses (each other cloud's router, each backend of this cloud: 1 up, 0 down,
as :class:`UpstreamHealth` decides).
"""

from __future__ import annotations

import time
from typing import Any

from mitmproxy import http
from mitmproxy.connection import Client

from scoperouter.catalog import Catalog
from scoperouter.proxy import metrics
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.health import Upstream, UpstreamHealth
from scoperouter.proxy.flowstate import FlowState, HeadRefusal, state_of
from scoperouter.routing import Failover, FanOut, Forward


class Metrics:
    def __init__(self, config: RouterConfig, health: UpstreamHealth) -> None:
        self.config = config
        self._requests: dict[tuple[str, str, str, int], Any] = {}
        self._durations: dict[tuple[str, str], Any] = {}
        self._linked: dict[str, list[str]] = {}  # peer link -> the services behind it
        config.subscribe(self._upstreams)
        health.on_change(self._health)

    def _upstreams(self, catalog: Catalog) -> None:
        """Every upstream of the new config starts as up (those marked down say so later). A
        peer router with a peer link is one upstream (the link) for all its services."""
        cloud = self.config.cloud
        self._linked = {}
        for other in catalog.clouds.values():
            for ep in other.endpoints:
                if other.name == cloud:
                    labels = (cloud, "backend", ep.service_type, ep.backend.base)
                elif other.peer is not None:
                    labels = (other.name, "peer", ep.service_type, other.peer.url.base)
                    self._linked.setdefault(other.peer.url.base, []).append(ep.service_type)
                else:
                    labels = (other.name, "peer", ep.service_type, ep.url.base)
                metrics.UPSTREAM_UP.labels(*labels).set(1)

    def _health(self, upstream: Upstream, up: bool) -> None:
        services = self._linked.get(upstream.address, [upstream.service])
        for service in services:
            metrics.UPSTREAM_UP.labels(
                upstream.cloud, upstream.kind, service, upstream.address
            ).set(1 if up else 0)

    def client_connected(self, client: Client) -> None:
        self.opened()

    def client_disconnected(self, client: Client) -> None:
        self.closed()

    @staticmethod
    def opened() -> None:
        """A client connection opened (both data paths)."""
        metrics.OPEN_CONNECTIONS.inc()

    @staticmethod
    def closed() -> None:
        metrics.OPEN_CONNECTIONS.dec()

    def response(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is not None:
            self.count(state, flow.response.status_code if flow.response is not None else 0)

    def error(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is not None:
            self.count(state, state.status or 0)

    def count(self, state: FlowState, status: int) -> None:
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
        self._observe(key, time.monotonic() - state.started)

    def refused(self, refusal: HeadRefusal) -> None:
        self._observe(("-", "-", "refused", refusal.status), time.monotonic() - refusal.started)

    def _observe(self, key: tuple[str, str, str, int], seconds: float) -> None:
        counter = self._requests.get(key)
        if counter is None:  # labels() takes a lock and builds a key: once per label set
            service, cloud, decision, status = key
            counter = metrics.REQUESTS.labels(service, cloud, decision, str(status or "-"))
            self._requests[key] = counter
        counter.inc()
        short = (key[0], key[2])
        histogram = self._durations.get(short)
        if histogram is None:
            histogram = self._durations[short] = metrics.DURATION.labels(*short)
        histogram.observe(seconds)
