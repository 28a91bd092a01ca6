"""deploy/prometheus/rules.yml on the lab: a real Prometheus on loopback
(tests/integration/prometheus.py) scrapes the metrics listener of every lab router
(`clouds.<name>.metrics.listen` of the lab's federation.yaml) and a broker's (a `broker serve`
of the tests' fake service on SQLite, `metrics.enabled`: the lab runs no broker of its own);
every ``scoperouter_*`` metric a rule uses exists there with the labels the rule uses, and
ScoperouterRouterDown fires when CloudTwo's router is stopped, and clears when it is started
again as `lab up` starts it (the lab whole again: `lab status` exit 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from scoperouter.broker.osbclient import OSBClient
from tests.broker import fakes
from tests.broker.conftest import PASSWORD
from tests.broker.pg import free_port
from tests.broker.procs import BrokerProcess
from tests.broker.procs import write_config as broker_config
from tests.ci import missing
from tests.e2e.conftest import Lab
from tests.e2e.labservices import router_record, wait_until
from tests.integration.prometheus import (
    BROKER_JOB,
    ROUTER_JOB,
    Prometheus,
    rule_requirements,
    rules_doc,
    wait_for_requirements,
)

pytestmark = pytest.mark.e2e


class Scraped:
    def __init__(self, lab: Lab, prometheus: Prometheus, listeners: dict[str, str]) -> None:
        self.lab = lab
        self.prometheus = prometheus
        self.listeners = listeners  # cloud name -> host:port of its router's metrics


def _listeners(lab: Lab) -> dict[str, str]:
    fed = yaml.safe_load(lab.paths.federation_yaml.read_text())
    found = {}
    for cloud in lab.clouds:
        entry = fed["clouds"].get(cloud.name) or {}
        listen = (entry.get("metrics") or {}).get("listen")
        if listen:
            found[cloud.name] = str(listen)
    return found


@pytest.fixture(scope="module")
def scraped(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    if not lab.routed:
        missing("the lab runs without routers (scoperouter lab up --require-router)")
    listeners = _listeners(lab)
    if len(listeners) != len(lab.clouds):
        missing(f"the lab's routers have no metrics listener (clouds.<name>.metrics.listen in "
                f"{lab.paths.federation_yaml}: {sorted(listeners)})")  # fmt: skip
    tmp = tmp_path_factory.mktemp("prometheus-lab")
    config = broker_config(tmp / "broker.yaml", f"sqlite:///{tmp / 'broker.db'}", tmp / "cloud")
    data = yaml.safe_load(config.read_text())
    broker_metrics = f"127.0.0.1:{free_port()}"
    data["metrics"] = {"enabled": True, "listen": broker_metrics}
    config.write_text(yaml.safe_dump(data))
    broker = BrokerProcess(config, tmp / "broker.log").start()
    prometheus: Prometheus | None = None
    try:
        jobs = {
            ROUTER_JOB: [(address, {"source_cloud": name}) for name, address in listeners.items()],
            BROKER_JOB: [(broker_metrics, {})],
        }
        prometheus = Prometheus(tmp, jobs, free_port()).start()
        for cloud in lab.clouds:  # a request through each router, a reload of each
            url = cloud.frontend_url("identity") + "/v3"
            httpx.get(url, timeout=30, trust_env=False, verify=False)
            os.kill(router_record(lab, cloud).pid, signal.SIGHUP)
        with OSBClient(broker.url, "broker", PASSWORD) as osb:
            op = osb.provision("prom-lab-1", fakes.SERVICE_ID, fakes.PLAN_ID, {}).operation
            assert osb.wait("prom-lab-1", op, timeout=60).body["state"] == "succeeded"
        yield Scraped(lab, prometheus, listeners)
    finally:
        if prometheus is not None:
            prometheus.stop()
        broker.stop()


def _all_up(scraped: Scraped) -> bool:
    ups = scraped.prometheus.query('up{job=~"scoperouter|scoperouter-broker"}')
    return len(ups) == len(scraped.listeners) + 1 and all(r["value"][1] == "1" for r in ups)


def test_every_metric_a_rule_uses_exists_on_the_lab(scraped: Scraped) -> None:
    p = scraped.prometheus
    p.wait_for(lambda: _all_up(scraped), 60, "scraping every lab router and the broker")
    needs = rule_requirements(rules_doc())
    wait_for_requirements(p, needs, 30)


def _down(scraped: Scraped, instance: str) -> list[dict[str, Any]]:
    alerts = scraped.prometheus.alerts("ScoperouterRouterDown")
    return [a for a in alerts if a["labels"]["instance"] == instance]


def test_router_down_fires_for_a_stopped_lab_router_and_clears(scraped: Scraped) -> None:
    lab, p = scraped.lab, scraped.prometheus
    p.wait_for(lambda: _all_up(scraped), 60, "scraping every lab router and the broker")
    two = lab.clouds[1]
    instance = scraped.listeners[two.name]
    name = f"{two.slug}-router"
    assert not _down(scraped, instance)
    assert lab.process_table().stop(name), f"{name} was not running"
    try:
        fired = p.wait_for(lambda: _down(scraped, instance), 30, "firing RouterDown")
        assert fired[0]["labels"]["source_cloud"] == two.name
        assert not _down(scraped, scraped.listeners[lab.clouds[0].name])
    finally:  # started again as `lab up` starts it (bench.chaos's restart_router does so)
        from scoperouter_lab.lab import Lab as LabRunner

        with open(os.devnull, "w") as quiet:
            LabRunner(lab.root, out=quiet)._ensure_router(two)
    p.wait_for(lambda: not _down(scraped, instance), 60, "clearing RouterDown")
    status = [str(Path(sys.executable).with_name("scoperouter")), "lab", "status"]

    def whole() -> bool:
        done = subprocess.run([*status, "--dir", str(lab.root)], capture_output=True, timeout=120)
        return done.returncode == 0

    wait_until("the lab whole again (lab status exit 0)", whole, timeout=120)
