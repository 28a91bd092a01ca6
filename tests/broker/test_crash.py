"""SIGKILL of a real `scoperouter broker serve` process at several points of a provision, a
bind and a deprovision; a restarted broker (or the other replica) finishes the operation:
no lost record, no resource built twice, nothing orphaned. Also: concurrent identical requests
make exactly one resource, and two replicas on one PostgreSQL never run one operation twice.

The "cloud" is the fake service's folder (one file per resource, a journal of every create and
of every pass with its process and times), so what was built is checked directly."""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scoperouter.broker.osbclient import OSBClient
from scoperouter.broker.store import Store
from tests.broker import fakes
from tests.broker.conftest import PASSWORD
from tests.broker.pg import free_port
from tests.broker.procs import BrokerProcess, write_config

S, P = fakes.SERVICE_ID, fakes.PLAN_ID


class Env:
    def __init__(self, db_url: str, tmp: Path) -> None:
        self.db_url = db_url
        self.state = tmp / "cloud"
        self.config = write_config(tmp / "broker.yaml", db_url, self.state)
        self.log = tmp / "broker.log"
        self.broker = BrokerProcess(self.config, self.log)
        self.osb = OSBClient(self.broker.url, "broker", PASSWORD, timeout=30)
        self.store = Store(db_url)

    def restart(self) -> None:
        self.broker.kill()
        self.broker = BrokerProcess(self.config, self.log, listen=self.broker.listen).start()

    def until(self, predicate: Callable[[], Any], timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out; broker log:\n{self.log.read_text()[-3000:]}")

    def op(self, operation_id: str) -> Any:
        with self.store.read() as session:
            return self.store.operation(session, operation_id)

    def journal(self) -> list[str]:
        return fakes.journal(self.state)

    def close(self) -> None:
        self.broker.stop()
        self.osb.close()
        self.store.dispose()


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> Iterator[Env]:
    e = Env(db_url, tmp_path)
    try:
        e.broker.start()
        yield e
    finally:
        e.close()


def _provision(env: Env, instance: str, **params: Any) -> str:
    answer = env.osb.provision(instance, S, P, params)
    assert answer.status == 202, answer.body
    assert answer.operation
    return answer.operation


# The two slowest tests of the default run (about 15 s each a database): here on SQLite; on
# PostgreSQL in CI's e2e step (tests/e2e/test_broker_crash_postgresql.py). The code path they
# exercise is the same on both databases; the claim and lease queries that differ run on both
# in the default run (test_worker.py, the replica test below).
SQLITE_HERE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@SQLITE_HERE
def test_sigkill_during_provision_at_three_points(env: Env) -> None:
    # 1. in the first pass, before anything is built
    op1 = _provision(env, "k1", sleep=1.0)
    env.until(lambda: env.op(op1).lease_owner is not None)
    env.restart()
    assert env.osb.wait("k1", op1, timeout=30).body["state"] == "succeeded"
    # 2. after the resource was created, before the pass's outcome was stored
    op2 = _provision(env, "k2", sleep_after=2.0)
    env.until(lambda: "create k2" in env.journal())
    env.restart()
    assert env.osb.wait("k2", op2, timeout=30).body["state"] == "succeeded"
    # 3. between passes (progress saved, lease released), and again in the next pass
    op3 = _provision(env, "k3", steps=3, sleep=0.5)
    env.until(lambda: env.op(op3).progress.get("step") == 1)
    env.restart()
    env.until(lambda: env.op(op3).progress.get("step") == 2 or env.op(op3).state != "in progress")
    env.restart()
    assert env.osb.wait("k3", op3, timeout=30).body["state"] == "succeeded"
    journal = env.journal()
    for name in ("k1", "k2", "k3"):
        assert journal.count(f"create {name}") == 1, journal  # never built twice
        assert (env.state / f"instance-{name}").exists()
        assert env.osb.get_instance(name).status == 200
    steps = [line.split()[2] for line in journal if line.startswith("pass k3 ")]
    assert sorted(steps) == ["0", "1", "2"], journal  # no step was redone


@SQLITE_HERE
def test_sigkill_during_bind_and_deprovision(env: Env) -> None:
    op = _provision(env, "b")
    assert env.osb.wait("b", op).body["state"] == "succeeded"
    # bind: killed after keystone-like creation, before the credentials were stored
    answer = env.osb.bind("b", "bind-1", S, P, {"sleep_after": 2.0})
    assert answer.status == 202
    env.until(lambda: "create-binding bind-1" in env.journal())
    env.restart()
    assert env.osb.wait("b", answer.operation, binding_id="bind-1").body["state"] == "succeeded"
    got = env.osb.get_binding("b", "bind-1")
    assert got.status == 200
    # the one credential that exists is the one the platform got: nothing orphaned
    assert got.body["credentials"]["password"] == (env.state / "binding-bind-1").read_text()
    unbind = env.osb.unbind("b", "bind-1", S, P)
    assert env.osb.wait("b", unbind.operation, binding_id="bind-1").status == 410
    # deprovision: killed in the middle
    answer = env.osb.provision("d", S, P, {"deprovision_sleep": 2.0})
    assert env.osb.wait("d", answer.operation).body["state"] == "succeeded"
    gone = env.osb.deprovision("d", S, P)
    assert gone.status == 202
    env.until(lambda: env.op(gone.operation).lease_owner is not None)
    env.restart()
    assert env.osb.wait("d", gone.operation, timeout=30).status == 410
    assert not (env.state / "instance-d").exists()
    assert sorted(p.name for p in env.state.iterdir() if p.name != "journal") == ["instance-b"]


def test_delete_during_provisioning_through_a_real_broker(env: Env) -> None:
    op = _provision(env, "x", steps=20, sleep=0.2)
    env.until(lambda: (env.state / "instance-x").exists())
    gone = env.osb.deprovision("x", S, P)
    assert gone.status == 202
    assert env.osb.wait("x", gone.operation, timeout=30).status == 410
    assert env.osb.last_operation("x", op).body["state"] == "failed"
    assert not (env.state / "instance-x").exists()
    passes = [line for line in env.journal() if line.startswith("pass x ")]
    assert len(passes) < 20  # it was stopped, not run to the end


def test_concurrent_identical_requests_make_one_resource(env: Env) -> None:
    def provision(_: int) -> Any:
        with OSBClient(env.broker.url, "broker", PASSWORD) as osb:
            return osb.provision("same", S, P, {"size": 3})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(provision, range(16)))
    assert {a.status for a in answers} <= {200, 202}, [a.body for a in answers]
    operations = {a.operation for a in answers if a.status == 202}
    assert len(operations) == 1
    [op] = operations
    assert env.osb.wait("same", op).body["state"] == "succeeded"

    def bind(_: int) -> Any:
        with OSBClient(env.broker.url, "broker", PASSWORD) as osb:
            return osb.bind("same", "one", S, P, {})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        binds = list(pool.map(bind, range(16)))
    assert {b.status for b in binds} <= {200, 202}, [b.body for b in binds]
    assert len({b.operation for b in binds if b.status == 202}) == 1
    journal = env.journal()
    assert journal.count("create same") == 1
    env.until(lambda: env.osb.get_binding("same", "one").status == 200)
    assert fakes.journal(env.state).count("create-binding one") == 1


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # replicas share one
def test_two_replicas_never_run_one_operation_twice(db_url: str, tmp_path: Path) -> None:
    state = tmp_path / "cloud"
    config = write_config(tmp_path / "broker.yaml", db_url, state, threads=3)
    replicas: list[BrokerProcess] = []
    try:
        for i in range(2):  # one at a time, each stopped below even if the next fails to start
            replica = BrokerProcess(
                config, tmp_path / f"broker{i}.log", listen=f"127.0.0.1:{free_port()}"
            )
            replicas.append(replica)
            replica.start()
        clients = [OSBClient(r.url, "broker", PASSWORD) for r in replicas]
        ops = {}
        for i in range(12):
            answer = clients[i % 2].provision(f"r{i}", S, P, {"steps": 3, "sleep": 0.05})
            assert answer.status == 202
            ops[f"r{i}"] = answer.operation
        for name, op in ops.items():
            assert clients[0].wait(name, op, timeout=60).body["state"] == "succeeded"
        journal = fakes.journal(state)
        pids = set()
        for name in ops:
            assert journal.count(f"create {name}") == 1
            passes = [line.split() for line in journal if line.startswith(f"pass {name} ")]
            assert sorted(p[2] for p in passes) == ["0", "1", "2"], passes  # each step once
            spans = sorted((float(p[4]), float(p[5])) for p in passes)
            for (_, end), (start, _) in itertools.pairwise(spans):
                assert end <= start, f"two passes of {name} overlapped: {passes}"
            pids |= {p[3] for p in passes}
        assert len(pids) == 2, "both replicas should have worked"
    finally:
        for r in replicas:
            r.stop()


def test_serve_with_two_processes_on_one_port(sqlite_url: str, tmp_path: Path) -> None:
    import yaml

    state = tmp_path / "cloud"
    config = write_config(tmp_path / "broker.yaml", sqlite_url, state, threads=1)
    data = yaml.safe_load(config.read_text())
    data["processes"] = 2
    config.write_text(yaml.safe_dump(data))
    broker = BrokerProcess(config, tmp_path / "broker.log").start()
    try:
        # the probe route of a real serve process: open, 200 while the database answers
        assert httpx.get(broker.url + "/healthz", timeout=10).json() == {"status": "ok"}
        with OSBClient(broker.url, "broker", PASSWORD) as osb:
            ops = {f"p{i}": osb.provision(f"p{i}", S, P, {}).operation for i in range(6)}
            for name, op in ops.items():
                assert osb.wait(name, op, timeout=30).body["state"] == "succeeded"
        pids = {line.split()[3] for line in fakes.journal(state) if line.startswith("pass ")}
        log = (tmp_path / "broker.log").read_text()
        assert log.count("broker serving http://") == 2, log[-2000:]
        assert pids  # passes ran; in which of the two processes is up to the kernel
    finally:
        broker.stop()
    assert broker.proc is not None and broker.proc.returncode is not None
