"""The worker's guarantees on a real database (SQLite and PostgreSQL): one owner per
operation at a time, leases that expire and are renewed, a lost lease that drops the pass's
outcome, deadlines, and the schema the migrations build matching the models."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import inspect

from scoperouter.broker import migrate
from scoperouter.broker.contract import LeaseLost
from scoperouter.broker.engine import make_engine
from scoperouter.broker.store import Store
from scoperouter.broker.tables import Base, utcnow
from scoperouter.broker.worker import Heartbeat, Runner, owner_id
from tests.broker.conftest import Harness

LEASE = timedelta(seconds=5)


def _op(harness: Harness, instance: str = "w1", **params: Any) -> str:
    response = harness.provision(instance, params)
    assert response.status_code == 202, response.text
    return str(response.json()["operation"])


def test_one_claim_wins_among_many(harness: Harness) -> None:
    _op(harness)
    store = harness.broker.store
    results: list[str | None] = []
    barrier = threading.Barrier(8)

    def claim() -> None:
        barrier.wait()
        results.append(store.claim(owner_id(), LEASE))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([r for r in results if r is not None]) == 1


def test_an_expired_lease_is_taken_over_and_the_old_owner_cannot_write(harness: Harness) -> None:
    op_id = _op(harness)
    store = harness.broker.store
    # long enough that the next statement runs inside it even on a loaded machine
    assert store.claim("old", timedelta(seconds=1.5)) == op_id
    assert store.claim("new", LEASE) is None  # still leased
    time.sleep(1.6)
    assert store.claim("new", LEASE) == op_id
    assert not store.renew(op_id, "old", LEASE)
    try:
        with store.write() as session:
            store.owned(session, op_id, "old")
        raise AssertionError("the old owner could write")
    except LeaseLost:
        pass
    # the old owner's pass outcome is dropped: the new owner's pass finishes the operation
    runner = Runner(harness.broker)
    assert runner.run_pass(op_id, "old") is None
    assert runner.run_pass(op_id, "new") is not None
    assert harness.last_operation("w1", operation=op_id).json()["state"] == "succeeded"


def test_heartbeat_keeps_a_long_pass_leased(harness: Harness) -> None:
    op_id = _op(harness)
    store = harness.broker.store
    lease = timedelta(seconds=0.6)
    assert store.claim("me", lease) == op_id
    beat = Heartbeat(store, lease, 0.1)
    beat.hold(op_id, "me")
    beat.start()
    try:
        time.sleep(1.2)  # twice the lease
        assert store.claim("other", lease) is None
        assert not beat.lost(op_id)
    finally:
        beat.stop()
    # a renewal that finds another owner marks the lease lost
    with store.write() as session:
        store.owned(session, op_id, "me").lease_owner = "thief"
    beat.beat()
    assert beat.lost(op_id)


def test_a_pass_that_loses_its_lease_stops_at_its_next_save(harness: Harness) -> None:
    op_id = _op(harness, steps=3)
    store = harness.broker.store
    runner = Runner(harness.broker)
    assert store.claim("me", LEASE) == op_id
    with store.write() as session:  # another worker took it meanwhile
        store.owned(session, op_id, "me").lease_owner = "other"
    assert runner.run_pass(op_id, "me") is None
    with store.read() as session:
        op = store.operation(session, op_id)
        assert op is not None and op.progress == {} and op.lease_owner == "other"


def test_deadline_fails_the_operation_with_where_it_stood(harness: Harness) -> None:
    op_id = _op(harness, steps=100)
    harness.worker.run_one("me")
    with harness.broker.store.write() as session:
        op = harness.broker.store.operation(session, op_id)
        assert op is not None
        op.deadline_at = utcnow() - timedelta(seconds=1)
    harness.drain()
    body = harness.last_operation("w1", operation=op_id).json()
    assert body["state"] == "failed"
    assert "deadline" in body["description"] and "step 1 of 100" in body["description"]


def test_an_error_in_a_pass_is_retried_with_backoff(harness: Harness, monkeypatch: Any) -> None:
    op_id = _op(harness)
    service = harness.broker.services["fake"]
    calls = []
    original = service.provision

    def flaky(op: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("cloud unreachable")
        return original(op)

    monkeypatch.setattr(service, "provision", flaky)
    harness.worker.run_one("me")
    body = harness.last_operation("w1", operation=op_id).json()
    assert body["state"] == "in progress"
    assert "ConnectionError: cloud unreachable" in body["description"]
    with harness.broker.store.read() as session:
        op = harness.broker.store.operation(session, op_id)
        assert op is not None and op.lease_owner is None and op.not_before > utcnow()
    harness.drain(wait=3)
    assert harness.last_operation("w1", operation=op_id).json()["state"] == "succeeded"


def test_redrive_restarts_a_failed_operation(harness: Harness) -> None:
    op_id = _op(harness, fail=True)
    harness.drain()
    assert harness.last_operation("w1").json()["state"] == "failed"
    store = harness.broker.store
    assert store.redrive(op_id, timedelta(seconds=60)).startswith("restarted")
    # the service no longer fails (an operator fixed the cause)
    with store.write() as session:
        instance = store.instance(session, "w1")
        assert instance is not None
        instance.parameters = {}
    harness.drain()
    assert harness.last_operation("w1", operation=op_id).json()["state"] == "succeeded"
    assert store.redrive(op_id, timedelta(seconds=60)).startswith("already succeeded")


def test_migrations_build_the_models_schema(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        found = inspect(engine)
        for table in Base.metadata.sorted_tables:
            columns = {c["name"] for c in found.get_columns(table.name)}
            assert columns == {c.name for c in table.columns}, table.name
        assert migrate.current(engine) == migrate.head()
    finally:
        engine.dispose()
    assert migrate.upgrade(db_url) == (migrate.head(), migrate.head())  # idempotent


def test_store_create_all_and_snapshot(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'x.db'}")
    store.create_all()
    assert store.snapshot() == {"instances": [], "bindings": [], "operations": []}
    store.dispose()


def test_a_database_that_goes_away_pauses_claims_with_one_line_each_way(
    pg_cluster: Any, tmp_path: Path, caplog: Any
) -> None:
    """Found by bench.chaos (PostgreSQL restarted under two replicas): every worker thread
    logged an ERROR with two chained tracebacks at every poll while the database was down. Now
    one WARNING line (no traceback) when claims start failing, claims back off, and one line
    when the database is back; the worker then runs operations again."""
    import pytest

    from scoperouter.broker.worker import Worker
    from tests.broker.conftest import make_broker

    if pg_cluster is None:
        pytest.skip("PostgreSQL is not installed")
    name = pg_cluster.new_database(template="broker_template")
    broker = make_broker(
        pg_cluster.url(name),
        tmp_path,
        worker={
            "threads": 0,
            "lease_seconds": 5,
            "heartbeat_seconds": 1,
            "poll_seconds": 0.05,
            "max_retry_seconds": 0.5,
        },
    )
    worker = Worker(broker)
    caplog.set_level("INFO", logger="scoperouter.broker.worker")
    worker.start(threads=2)
    try:
        time.sleep(0.3)  # claiming (nothing due) on live connections
        pg_cluster.sql(f"DROP DATABASE {name} WITH (FORCE)")  # its connections terminated too
        time.sleep(2.0)  # ~2 s down: at 0.05 s polls, 40 claims a thread without the backoff
        pg_cluster.sql(f"CREATE DATABASE {name} TEMPLATE broker_template")
        harness = Harness(broker, tmp_path)
        op_id = _op(harness, "after")
        end = time.monotonic() + 20
        while harness.last_operation("after", operation=op_id).json()["state"] == "in progress":
            assert time.monotonic() < end, "the worker did not run an operation again"
            time.sleep(0.1)
    finally:
        worker.stop()
        broker.store.engine.dispose()
    records = [r for r in caplog.records if r.name == "scoperouter.broker.worker"]
    down = [r for r in records if "database is unavailable" in r.getMessage()]
    back = [r for r in records if "database is available again" in r.getMessage()]
    assert 1 <= len(down) <= 2 and 1 <= len(back) <= 2, [r.getMessage() for r in records]
    assert all(r.exc_info is None and r.levelname == "WARNING" for r in down + back)
    assert not [r for r in records if r.levelname == "ERROR" or r.exc_info], [
        r.getMessage() for r in records if r.levelname == "ERROR"
    ]
