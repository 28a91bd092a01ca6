"""deploy/prometheus/rules.yml against a real Prometheus (tests/integration/prometheus.py)
scraping real routers and a real broker:

    CloudOne router  127.0.0.93  image frontend :P, peer link https :L, metrics :M
    CloudTwo router  127.0.0.94  image frontend :P, peer link https :L, metrics :M
    backends         127.0.1.93, 127.0.1.94 (echo servers)
    broker           127.0.0.1 (SQLite, the tests' fake service), metrics on
    Prometheus       127.0.0.1, scraping every second, rules evaluated every second

Every ``scoperouter_*`` metric a rule uses exists there with the labels the rule uses, and
ScoperouterRouterDown fires when a router stops and clears when it is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from scoperouter.broker.osbclient import OSBClient
from tests.broker import fakes
from tests.broker.conftest import PASSWORD
from tests.broker.pg import free_port as free_local_port
from tests.broker.procs import BrokerProcess
from tests.broker.procs import write_config as broker_config

from .backends import EchoBackend
from .certs import federation_ca
from .prometheus import (
    BROKER_JOB,
    ROUTER_JOB,
    Prometheus,
    rule_requirements,
    rules_doc,
    wait_for_requirements,
)
from .routers import Router, cloud_entry, free_port, request, start_all, stop_all, write_config

pytestmark = pytest.mark.integration

HOSTS = {"CloudOne": "127.0.0.93", "CloudTwo": "127.0.0.94"}
BACKENDS = {"CloudOne": "127.0.1.93", "CloudTwo": "127.0.1.94"}
SCOPE = {"X-Auth-Token": 'tok!SCOPE!{"image": "CloudTwo"}'}


@dataclass
class Scraped:
    prometheus: Prometheus
    routers: dict[str, Router]
    frontends: dict[str, str]
    metrics: dict[str, str]  # cloud -> host:port of its router's metrics listener


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    tmp = tmp_path_factory.mktemp("prometheus")
    ca, certs = federation_ca(tmp, {name: host for name, host in HOSTS.items()})
    backends = {c: EchoBackend(h, name=f"{c}-image").start() for c, h in BACKENDS.items()}
    clouds: dict[str, Any] = {}
    routers: dict[str, Router] = {}
    frontends: dict[str, str] = {}
    metrics: dict[str, str] = {}
    for cloud, host in HOSTS.items():
        port, peer_port, metrics_port = (free_port(host) for _ in range(3))
        entry = cloud_entry(host, {"image": (port, "", backends[cloud].url)})
        cert = certs[cloud]
        entry["peer"] = {
            "url": f"https://{host}:{peer_port}",
            "tls": {"cert": str(cert), "key": str(cert.with_suffix(".key"))},
        }
        entry["metrics"] = {"listen": f"{host}:{metrics_port}"}
        clouds[cloud] = entry
        frontends[cloud] = f"http://{host}:{port}"
        metrics[cloud] = f"{host}:{metrics_port}"
    config = write_config(
        tmp / "federation.yaml", clouds, peers={"ca": str(ca)}, connect_timeout=2.0
    )
    for cloud, host in HOSTS.items():
        port = int(frontends[cloud].rsplit(":", 1)[1])
        routers[cloud] = Router(cloud, config, tmp / f"{cloud}.log", [(host, port)])

    state = tmp / "broker-cloud"
    broker_yaml = broker_config(tmp / "broker.yaml", f"sqlite:///{tmp / 'broker.db'}", state)
    data = yaml.safe_load(broker_yaml.read_text())
    broker_metrics = f"127.0.0.1:{free_local_port()}"
    data["metrics"] = {"enabled": True, "listen": broker_metrics}
    broker_yaml.write_text(yaml.safe_dump(data))
    broker = BrokerProcess(broker_yaml, tmp / "broker.log")

    start_all(routers.values())
    prometheus: Prometheus | None = None
    try:
        broker.start()
        jobs = {
            ROUTER_JOB: [(metrics[c], {"source_cloud": c}) for c in HOSTS],
            BROKER_JOB: [(broker_metrics, {})],
        }
        prometheus = Prometheus(tmp, jobs, free_local_port()).start()
        # traffic: local and remote requests, a reload each, an operation at the broker
        for _ in range(3):
            assert request("GET", frontends["CloudOne"] + "/v2/images").status == 200
            assert request("GET", frontends["CloudOne"] + "/v2/images", SCOPE).status == 200
        for router in routers.values():
            router.signal(1)  # SIGHUP: a reload (ok)
        with OSBClient(broker.url, "broker", PASSWORD) as osb:
            op = osb.provision("prom-1", fakes.SERVICE_ID, fakes.PLAN_ID, {}).operation
            assert osb.wait("prom-1", op, timeout=30).body["state"] == "succeeded"
        yield Scraped(prometheus, routers, frontends, metrics)
    finally:
        if prometheus is not None:
            prometheus.stop()
        broker.stop()
        codes = stop_all(routers.values())
        for backend in backends.values():
            backend.stop()
    assert set(codes.values()) <= {0}, {c: r.log_text()[-2000:] for c, r in routers.items()}


def _all_up(p: Prometheus) -> bool:
    ups = p.query('up{job=~"scoperouter|scoperouter-broker"}')
    return len(ups) == 3 and all(r["value"][1] == "1" for r in ups)


def test_every_metric_a_rule_uses_exists_with_its_labels(scraped: Scraped) -> None:
    p = scraped.prometheus
    p.wait_for(lambda: _all_up(p), 30, "scraping the two routers and the broker")
    needs = rule_requirements(rules_doc())
    # the rules use the router's, the broker's and the status page's metrics: all of them
    assert {"scoperouter_requests_total", "scoperouter_broker_operations_total",
            "scoperouter_config_info"} <= needs.keys()  # fmt: skip
    wait_for_requirements(p, needs, 20)


def _router_down(p: Prometheus, instance: str) -> list[dict[str, Any]]:
    return [a for a in p.alerts("ScoperouterRouterDown") if a["labels"]["instance"] == instance]


def test_router_down_fires_when_a_router_stops_and_clears_when_it_is_back(
    scraped: Scraped,
) -> None:
    p = scraped.prometheus
    p.wait_for(lambda: _all_up(p), 30, "scraping the two routers and the broker")
    two = scraped.routers["CloudTwo"]
    instance = scraped.metrics["CloudTwo"]
    assert not _router_down(p, instance)
    assert two.stop() == 0
    try:
        fired = p.wait_for(lambda: _router_down(p, instance), 20, "firing RouterDown")
        labels = fired[0]["labels"]
        assert labels["severity"] == "critical" and labels["source_cloud"] == "CloudTwo"
        assert fired[0]["annotations"]["runbook_url"].endswith("#scoperouterrouterdown")
        # the other router is up: no alert for it
        assert not _router_down(p, scraped.metrics["CloudOne"])
    finally:
        two.start()
        two.wait_ready()
    p.wait_for(lambda: not _router_down(p, instance), 20, "clearing RouterDown")


def test_the_rules_loaded_are_the_shipped_ones_with_for_removed(scraped: Scraped) -> None:
    loaded = {
        rule["name"]: rule
        for group in scraped.prometheus.api("rules")["groups"]
        for rule in group["rules"]
    }
    shipped = {
        rule.get("alert") or rule["record"]: rule
        for group in rules_doc()["groups"]
        for rule in group["rules"]
    }
    assert loaded.keys() == shipped.keys()
    assert all(r.get("duration", 0) == 0 for r in loaded.values() if r["type"] == "alerting")
