"""`GET /healthz`: open (no auth, no version header), no data, 200 while the database answers,
503 when it does not: a real PostgreSQL database dropped under a broker, a SQLite database
whose schema is gone, and (unit) a database that hangs."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from scoperouter.broker.api import Health, create_app
from tests.broker.conftest import Harness, make_broker
from tests.broker.pg import Cluster


def test_healthz_is_open_and_says_nothing_but_ok(harness: Harness) -> None:
    client = TestClient(harness.app, raise_server_exceptions=False)  # no auth, no version
    response = client.get("/healthz", headers={"X-Broker-API-Request-Identity": "probe-1"})
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["x-broker-api-request-identity"] == "probe-1"
    assert client.get("/v2/catalog").status_code == 401  # the rest stays closed
    assert client.post("/healthz").status_code == 401  # GET only


def test_healthz_is_503_when_the_postgresql_database_is_gone(
    pg_cluster: Cluster | None, tmp_path: Path
) -> None:
    if pg_cluster is None:
        pytest.skip("PostgreSQL is not installed")
    name = pg_cluster.new_database(template="broker_template")
    broker = make_broker(pg_cluster.url(name), tmp_path / "cloud")
    try:
        client = TestClient(create_app(broker, password="x"), raise_server_exceptions=False)
        assert client.get("/healthz").status_code == 200
        pg_cluster.sql(f"DROP DATABASE {name} WITH (FORCE)")
        response = client.get("/healthz")
        assert response.status_code == 503
        assert response.json() == {"status": "unavailable"}  # the cause is in the log only
        pg_cluster.sql(f"CREATE DATABASE {name} TEMPLATE broker_template")
        assert client.get("/healthz").status_code == 200  # back when the database is
    finally:
        broker.close()


def test_healthz_is_503_when_the_schema_is_gone(sqlite_url: str, tmp_path: Path) -> None:
    broker = make_broker(sqlite_url, tmp_path / "cloud")
    try:
        client = TestClient(create_app(broker, password="x"), raise_server_exceptions=False)
        assert client.get("/healthz").status_code == 200
        with broker.store.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE operations RENAME TO operations_moved")
        assert client.get("/healthz").status_code == 503
    finally:
        broker.close()


def test_a_hanging_database_is_503_and_holds_one_thread() -> None:
    release = threading.Event()
    calls = []

    def ping() -> None:
        calls.append(1)
        release.wait(60)  # hangs until the probes have their answers

    health = Health(ping, timeout=0.2)

    async def probes() -> tuple[list[int], float]:
        started = time.monotonic()
        answers = await asyncio.gather(*(health() for _ in range(5)))
        elapsed = time.monotonic() - started
        release.set()  # (asyncio.run waits for the thread when it closes the loop)
        return [a.status for a in answers], elapsed

    statuses, elapsed = asyncio.run(probes())
    assert statuses == [503] * 5
    assert elapsed < 30  # answered at its timeout, not when the database came back
    assert len(calls) == 1  # the probes shared the one check in flight
