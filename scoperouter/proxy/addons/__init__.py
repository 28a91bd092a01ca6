"""The router's mitmproxy addons, one concern each, in mitmproxy's style: options in ``load``,
validated in ``configure``, applied in a hook. :func:`router_addons` lists them in the order
their hooks must run; :class:`~scoperouter.proxy.addons.chain.Chain` dispatches to them.

Hook order (``router_addons``) and concern:

* ``RouterConfig`` - the federation config and this router's cloud; reload.
* ``HeadGuard`` - limits on request heads and connection timeouts (``mitm.GuardedHttp1Server``);
  every refusal goes to the access log and the metrics.
* ``Routing`` - the decision applied to the flow; refusals; no CONNECT; never connect to itself.
* ``InFlight`` - the request in progress on each client connection.
* ``UpstreamHealth`` - a circuit breaker per upstream: fail fast while one is down.
* ``TokenSwap`` - cross-cloud identity: local service tokens carried to other clouds.
* ``Combining`` - ``A & B`` / ``A | B`` answered with the worker's ``Combiner`` (mitmproxy
  paths; the lean data path calls the same Combiner).
* ``Timeouts`` - connect and response timeouts per destination kind (backend, peer router).
* ``ErrorAnswers`` - upstream failures and client faults: status and JSON message.
* ``CatalogRegion`` - token validations answered by another cloud: region twins.
* ``AccessLog`` - one structured line per answered request, with its request id.
* ``Metrics`` - Prometheus counters, histograms and gauges.
"""

from __future__ import annotations

from typing import Any

from scoperouter.proxy.addons.accesslog import AccessLog
from scoperouter.proxy.addons.combining import Combining
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.errors import ErrorAnswers
from scoperouter.proxy.addons.guard import HeadGuard
from scoperouter.proxy.addons.health import UpstreamHealth
from scoperouter.proxy.addons.identity import TokenSwap
from scoperouter.proxy.addons.inflight import InFlight
from scoperouter.proxy.addons.metrics import Metrics
from scoperouter.proxy.addons.region import CatalogRegion
from scoperouter.proxy.addons.routing import Routing
from scoperouter.proxy.addons.timeouts import Timeouts


def router_addons(config: RouterConfig) -> list[Any]:
    """Every addon of a router, in hook order, sharing `config` (and each other where needed)."""
    inflight = InFlight()
    health = UpstreamHealth(config)
    log = AccessLog(config)
    metrics = Metrics(config, health)
    swap = TokenSwap(config)
    return [
        config,
        HeadGuard(config, sinks=(log, metrics)),
        Routing(config),
        inflight,
        health,
        swap,
        Combining(config, health, swap),
        Timeouts(config, inflight),
        ErrorAnswers(config),
        CatalogRegion(),
        log,
        metrics,
    ]


__all__ = [
    "AccessLog",
    "CatalogRegion",
    "Combining",
    "ErrorAnswers",
    "HeadGuard",
    "InFlight",
    "Metrics",
    "RouterConfig",
    "Routing",
    "Timeouts",
    "TokenSwap",
    "UpstreamHealth",
    "router_addons",
]
