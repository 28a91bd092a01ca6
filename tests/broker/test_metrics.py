"""The broker's metrics (scoperouter/broker/metrics.py): real `broker serve` processes with
`metrics.enabled`, driven by the project's OSB client, their /metrics read as Prometheus reads
it; `scoperouter broker status` on the same database; the config of the listener.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scoperouter.broker import metrics
from scoperouter.broker.config import BrokerConfigError, config_from_dict
from scoperouter.broker.osbclient import OSBClient
from tests.broker import fakes
from tests.broker.conftest import HEADERS, PASSWORD
from tests.broker.pg import free_port
from tests.broker.procs import ROOT, BrokerProcess, write_config

S, P = fakes.SERVICE_ID, fakes.PLAN_ID
INSTANCE = "/v2/service_instances/{instance_id}"


class Served:
    def __init__(
        self,
        tmp: Path,
        db_url: str,
        *,
        processes: int = 1,
        deadline: float | None = None,
        **worker: Any,
    ) -> None:
        self.state = tmp / "cloud"
        self.config = write_config(tmp / "broker.yaml", db_url, self.state, **worker)
        data = yaml.safe_load(self.config.read_text())
        self.metrics_address = f"127.0.0.1:{free_port()}"
        data["metrics"] = {"enabled": True, "listen": self.metrics_address}
        data["processes"] = processes
        if deadline is not None:
            data["services"]["fake"]["deadlines"] = {"provision": deadline}
        self.config.write_text(yaml.safe_dump(data))
        self.db = db_url.removeprefix("sqlite:///")
        self.log = tmp / "broker.log"
        self.broker = BrokerProcess(self.config, self.log)

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of the broker's /metrics: (name, sorted labels) -> value."""
        reply = httpx.get(f"http://{self.metrics_address}/metrics", timeout=10, trust_env=False)
        assert reply.status_code == 200, reply.text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(reply.text)
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, tuple(sorted(labels.items()))))

    def until(self, probe: Callable[[], Any], timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)


@pytest.fixture
def served(sqlite_url: str, tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path, sqlite_url)
    s.broker.start()
    try:
        yield s
    finally:
        s.broker.stop()


def test_operations_worker_api_and_database_are_counted(served: Served) -> None:
    with OSBClient(served.broker.url, "broker", PASSWORD) as osb:
        ok = osb.provision("m-ok", S, P, {})
        bad = osb.provision("m-bad", S, P, {"fail": True})
        assert osb.wait("m-ok", ok.operation, timeout=30).body["state"] == "succeeded"
        assert osb.wait("m-bad", bad.operation, timeout=30).body["state"] == "failed"
    ops = "scoperouter_broker_operations_total"
    assert served.until(lambda: served.value(ops, service="fake", kind="provision",
                                             state="failed") == 1)  # fmt: skip
    assert served.value(ops, service="fake", kind="provision", state="succeeded") == 1
    # every kind and state exists from the start, at 0 (rules can be checked before a failure)
    assert served.value(ops, service="fake", kind="unbind", state="failed") == 0
    duration = "scoperouter_broker_operation_duration_seconds_count"
    assert served.value(duration, service="fake", kind="provision") == 2
    assert (served.value("scoperouter_broker_worker_passes_total") or 0) >= 2
    assert served.value("scoperouter_broker_worker_retries_total") == 0
    assert served.value("scoperouter_broker_database_up") == 1
    assert (served.value("scoperouter_broker_database_latency_seconds") or -1) >= 0
    assert served.value("scoperouter_broker_operations_stuck") == 0
    running = "scoperouter_broker_operations_in_progress"
    assert served.value(running, service="fake", kind="provision") == 0
    api = "scoperouter_broker_api_requests_total"
    assert served.value(api, endpoint=INSTANCE, method="PUT", status="202") == 2
    polls = served.value(api, endpoint=INSTANCE + "/last_operation", method="GET", status="200")
    assert polls is not None and polls >= 2
    version = served.samples()
    assert any(name == "scoperouter_broker_build_info" for name, _ in version)


def test_the_endpoint_label_is_the_route_never_the_path(served: Served) -> None:
    hostile = [
        "/v2/service_instances/%3Cscript%3Ealert(1)%22%0A",  # quote, newline: one id
        "/v2/service_instances/" + "x" * 3000 + "/service_bindings/b/last_operation",
        "/v2/service_instances/i/../../etc/passwd",
        "/v2/" + "a/" * 500,
        "/metrics%0d%0aX-Injected: 1",
    ]
    auth = ("broker", PASSWORD)
    with httpx.Client(base_url=served.broker.url, auth=auth, headers=HEADERS, timeout=10) as c:
        for path in hostile:
            c.get(path)
        c.request("BREW", "/v2/catalog")
    text = httpx.get(f"http://{served.metrics_address}/metrics", timeout=10).text
    for needle in ("<script>", "x" * 100, "passwd", "a/a/a/", "Injected", "BREW"):
        assert needle not in text, needle
    endpoints = {
        dict(s.labels)["endpoint"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "scoperouter_broker_api_requests_total"
    }
    assert endpoints <= set(metrics.ENDPOINTS), endpoints
    assert {INSTANCE, "other"} <= endpoints


def test_stuck_operations_and_a_database_that_fails(sqlite_url: str, tmp_path: Path) -> None:
    # no worker thread: the provision stays in progress, past its 6 s deadline it is stuck
    served = Served(tmp_path, sqlite_url, threads=0, deadline=6)
    served.broker.start()
    try:
        with OSBClient(served.broker.url, "broker", PASSWORD) as osb:
            assert osb.provision("m-stuck", S, P, {}).status == 202
        running = "scoperouter_broker_operations_in_progress"
        assert served.value(running, service="fake", kind="provision") == 1
        assert served.value("scoperouter_broker_operations_stuck") == 0  # not yet
        assert served.until(lambda: served.value("scoperouter_broker_operations_stuck") == 1)
        status = _status(served, "--json")
        assert status.returncode == 1, status.stderr
        report = json.loads(status.stdout)
        assert report["operations"]["stuck"] == 1
        assert report["database"]["up"] is True
        assert report["running"]["worker_passes"] == 0
        assert {"endpoint": INSTANCE, "method": "PUT", "status": "202", "count": 1.0} in report[
            "running"
        ]["api"]
        # the schema goes away under the broker: the database is reported down, then back
        with sqlite3.connect(served.db) as db:
            db.execute("ALTER TABLE operations RENAME TO operations_moved")
        assert served.until(lambda: served.value("scoperouter_broker_database_up") == 0)
        assert served.value("scoperouter_broker_operations_stuck") != 0  # NaN: unknown
        with sqlite3.connect(served.db) as db:
            db.execute("ALTER TABLE operations_moved RENAME TO operations")
        assert served.until(lambda: served.value("scoperouter_broker_database_up") == 1)
    finally:
        served.broker.stop()
    log = served.log.read_text()
    assert log.count("metrics: the database does not answer") == 1, log[-2000:]


def test_an_expired_lease_nobody_took_over_is_stuck(sqlite_url: str, tmp_path: Path) -> None:
    served = Served(tmp_path, sqlite_url, threads=1)  # write_config: a 3 s lease
    served.broker.start()
    with OSBClient(served.broker.url, "broker", PASSWORD) as osb:
        assert osb.provision("m-lease", S, P, {"sleep": 60}).status == 202
    assert served.until(lambda: ": pass 1" in served.log.read_text())  # the pass sleeps
    assert served.value("scoperouter_broker_operations_stuck") == 0  # leased, running
    served.broker.kill()  # mid-pass: the lease is left to expire
    # the same database served by a broker without workers: nobody takes the operation over
    data = yaml.safe_load(served.config.read_text())
    assert data["worker"]["lease_seconds"] == 3.0
    data["worker"]["threads"] = 0
    served.config.write_text(yaml.safe_dump(data))
    served.broker = BrokerProcess(served.config, served.log)
    served.broker.start()
    try:
        assert served.value("scoperouter_broker_operations_in_progress", service="fake",
                            kind="provision") == 1  # fmt: skip
        assert served.until(lambda: served.value("scoperouter_broker_operations_stuck") == 1)
    finally:
        served.broker.stop()


def test_two_processes_add_up(sqlite_url: str, tmp_path: Path) -> None:
    served = Served(tmp_path, sqlite_url, processes=2)
    served.broker.start()
    api = "scoperouter_broker_api_requests_total"
    labels = {"endpoint": "/v2/catalog", "method": "GET", "status": "200"}
    try:
        before = served.value(api, **labels) or 0  # the start's own polls of the catalog
        with httpx.Client(
            base_url=served.broker.url, auth=("broker", PASSWORD), headers=HEADERS, timeout=10
        ) as client:
            for _ in range(40):  # new connections: the kernel spreads them over both
                with httpx.Client(base_url=served.broker.url, auth=client.auth,
                                  headers=HEADERS, timeout=10) as once:  # fmt: skip
                    assert once.get("/v2/catalog").status_code == 200
        assert served.value(api, **labels) == before + 40
        assert served.log.read_text().count("broker metrics on http://") == 1
    finally:
        served.broker.stop()


def _status(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scoperouter.broker", "status", "--config", str(served.config),
         *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def test_status_prints_the_summary(served: Served) -> None:
    with OSBClient(served.broker.url, "broker", PASSWORD) as osb:
        op = osb.provision("m-status", S, P, {}).operation
        assert osb.wait("m-status", op, timeout=30).body["state"] == "succeeded"
    done = _status(served)
    assert done.returncode == 0, done.stderr
    assert "database: up" in done.stdout
    assert "0 in progress, 0 stuck" in done.stdout
    assert "fake     provision  succeeded  1" in done.stdout
    assert INSTANCE in done.stdout


def test_the_listener_answers_metrics_only(served: Served) -> None:
    base = f"http://{served.metrics_address}"
    assert httpx.get(base + "/").status_code == 404
    assert httpx.get(base + "/").json() == {"error": "try /metrics"}
    assert httpx.post(base + "/metrics").status_code == 405


# ------------------------------------------------------------------------------- unit


def test_endpoint_templates() -> None:
    assert metrics.endpoint("/v2/catalog") == "/v2/catalog"
    assert metrics.endpoint("/v2/service_instances/a") == INSTANCE
    assert (
        metrics.endpoint("/v2/service_instances/a/last_operation") == INSTANCE + "/last_operation"
    )
    binding = INSTANCE + "/service_bindings/{binding_id}"
    assert metrics.endpoint("/v2/service_instances/a/service_bindings/b") == binding
    assert (
        metrics.endpoint("/v2/service_instances/a/service_bindings/b/last_operation")
        == binding + "/last_operation"
    )
    for other in ("/", "/v2", "/v2/service_instances/", "/v2/service_instances//x",
                  "/v2/service_instances/a/service_bindings/", "/v2/service_instances/a/b/c/d/e",
                  "/V2/catalog", "/v2/catalog/x"):  # fmt: skip
        assert metrics.endpoint(other) == "other", other


def test_metrics_are_off_by_default_and_loopback_when_on() -> None:
    config = config_from_dict({})
    assert config.metrics.enabled is False
    assert config.metrics.address == ("127.0.0.1", 8091)
    on = config_from_dict({"metrics": {"enabled": True}})
    assert on.metrics.address[0] == "127.0.0.1"


@pytest.mark.parametrize(
    ("metrics_section", "message"),
    [
        ({"listen": "nowhere"}, "metrics.listen: Value error, expected HOST:PORT"),
        ({"enabled": "perhaps"}, "metrics.enabled"),
        ({"port": 1}, "metrics.port"),
        ({"enabled": True, "listen": "127.0.0.1:8090"}, "metrics.listen: the same address"),
    ],
)
def test_bad_metrics_config_names_the_key(metrics_section: dict[str, Any], message: str) -> None:
    with pytest.raises(BrokerConfigError, match=message):
        config_from_dict({"metrics": metrics_section})


def test_serve_says_when_the_metrics_port_is_taken(sqlite_url: str, tmp_path: Path) -> None:
    served = Served(tmp_path, sqlite_url)
    host, port = served.metrics_address.split(":")
    with socket.socket() as taken:
        taken.bind((host, int(port)))
        taken.listen()
        with pytest.raises(RuntimeError, match="exited 2"):
            served.broker.start(timeout=60)
    assert f"metrics.listen: cannot listen on {host}:{port}" in served.log.read_text()


def test_the_cli_leaves_prometheus_client_to_serve() -> None:
    """`scoperouter broker serve` sets PROMETHEUS_MULTIPROC_DIR before prometheus-client is
    imported (it picks its mode at import; serve refuses to start otherwise): building the
    console script's parser must not import it."""
    code = (
        "import sys; from scoperouter.cli import build_parser; build_parser(); "
        "print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert done.stdout.strip() == "False", done.stderr
