"""Fixtures of the broker's tests: a database on SQLite or on a throwaway PostgreSQL cluster
(every test that takes `db_url` runs on both), a broker with the fake service, an API client.

PostgreSQL tests need Debian's ``postgresql`` package; without it they are skipped, except under
CI (``CI=true``), where a missing PostgreSQL is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scoperouter.broker import migrate
from scoperouter.broker.api import create_app
from scoperouter.broker.config import config_from_dict
from scoperouter.broker.runtime import Broker
from scoperouter.broker.secrets import Secrets, generate_key
from scoperouter.broker.worker import Worker
from tests.broker import fakes
from tests.broker.pg import Cluster, pg_bin

PASSWORD = "test-password-not-a-secret"
HEADERS = {"X-Broker-API-Version": "2.17"}


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster | None]:
    if pg_bin() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: PostgreSQL is not installed (.ci/run installs it)")
        yield None
        return
    cluster = Cluster()
    cluster.start()
    try:
        template = "broker_template"
        cluster.sql(f"CREATE DATABASE {template}")
        migrate.upgrade(cluster.url(template))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'broker.db'}"
        migrate.upgrade(url)
        return url
    cluster = request.getfixturevalue("pg_cluster")
    if cluster is None:
        pytest.skip("PostgreSQL is not installed")
    return cluster.url(cluster.new_database(template="broker_template"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    migrate.upgrade(url)
    return url


def broker_config(db_url: str, state_dir: Path, **overrides: Any) -> Any:
    fake = {"state_dir": str(state_dir), "synchronous_seconds": 5}
    fake.update(overrides.pop("fake", {}))
    data = {
        "database": {"url": db_url},
        "worker": {"threads": 0, "lease_seconds": 5, "heartbeat_seconds": 1, "poll_seconds": 0.05},
        "services": {"fake": fake},
    }
    data.update(overrides)
    return config_from_dict(data)


def make_broker(db_url: str, state_dir: Path, **overrides: Any) -> Broker:
    return Broker(
        broker_config(db_url, state_dir, **overrides),
        secrets=Secrets([generate_key()]),
        clouds=None or _NoClouds(),
        service_classes_={"fake": fakes.FakeService},
    )


class _NoClouds:
    """The fake service reaches no cloud."""

    def names(self) -> tuple[str, ...]:
        return ("FakeCloud",)

    def connect(self, cloud: str, **_: Any) -> Any:
        raise AssertionError("the fake service does not connect to clouds")

    def capacity(self, cloud: str) -> Any:
        raise AssertionError("unused")

    def identity_url(self, cloud: str) -> str:
        return "http://127.0.0.9:5000/v3"

    def region(self, cloud: str) -> str:
        return cloud


class Harness:
    """A broker, its API client (no worker threads: tests drive passes with `drain`)."""

    def __init__(self, broker: Broker, state_dir: Path) -> None:
        self.broker = broker
        self.state_dir = state_dir
        self.worker = Worker(broker)
        self.app = create_app(broker, worker=self.worker, password=PASSWORD)
        self.client = TestClient(self.app, raise_server_exceptions=False)
        self.client.auth = ("broker", PASSWORD)
        self.client.headers.update(HEADERS)

    def drain(self, wait: float = 5.0) -> int:
        return self.worker.drain(wait=wait)

    def provision(
        self, instance_id: str, parameters: dict[str, Any] | None = None, **kw: Any
    ) -> Any:
        body = {
            "service_id": fakes.SERVICE_ID,
            "plan_id": fakes.PLAN_ID,
            "organization_guid": "org",
            "space_guid": "space",
            "context": {
                "platform": "cloudfoundry",
                "organization_guid": "org",
                "space_guid": "space",
            },
            "parameters": parameters or {},
        }
        body.update(kw.pop("body", {}))
        return self.client.put(
            f"/v2/service_instances/{instance_id}",
            params={"accepts_incomplete": kw.pop("accepts_incomplete", "true")},
            json=body,
            **kw,
        )

    def deprovision(self, instance_id: str, **params: Any) -> Any:
        query = {
            "service_id": fakes.SERVICE_ID,
            "plan_id": fakes.PLAN_ID,
            "accepts_incomplete": "true",
        }
        query.update(params)
        return self.client.delete(f"/v2/service_instances/{instance_id}", params=query)

    def bind(
        self, instance_id: str, binding_id: str, parameters: dict[str, Any] | None = None, **kw: Any
    ) -> Any:
        body = {
            "service_id": fakes.SERVICE_ID,
            "plan_id": fakes.PLAN_ID,
            "bind_resource": {"app_guid": "app-1"},
            "parameters": parameters or {},
        }
        body.update(kw.pop("body", {}))
        params = {}
        if kw.pop("accepts_incomplete", True):
            params["accepts_incomplete"] = "true"
        return self.client.put(
            f"/v2/service_instances/{instance_id}/service_bindings/{binding_id}",
            params=params,
            json=body,
            **kw,
        )

    def unbind(self, instance_id: str, binding_id: str, **params: Any) -> Any:
        query = {"service_id": fakes.SERVICE_ID, "plan_id": fakes.PLAN_ID}
        query.update(params)
        return self.client.delete(
            f"/v2/service_instances/{instance_id}/service_bindings/{binding_id}", params=query
        )

    def last_operation(self, instance_id: str, binding_id: str | None = None, **params: Any) -> Any:
        path = f"/v2/service_instances/{instance_id}"
        if binding_id:
            path += f"/service_bindings/{binding_id}"
        return self.client.get(path + "/last_operation", params=params)

    def provisioned(self, instance_id: str, parameters: dict[str, Any] | None = None) -> None:
        response = self.provision(instance_id, parameters)
        assert response.status_code == 202, response.text
        self.drain()
        state = self.last_operation(instance_id).json()["state"]
        assert state == "succeeded", state


@pytest.fixture
def harness(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    broker = make_broker(db_url, tmp_path / "cloud")
    h = Harness(broker, tmp_path / "cloud")
    yield h
    h.client.close()
    broker.close()
