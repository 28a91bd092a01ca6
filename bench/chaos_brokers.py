"""``bench.chaos``'s broker: a throwaway PostgreSQL, two replicas on it, and the instance
lifecycles sent to them over OSB."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml

from bench import chaos_verdict as cv
from bench.chaos_lab import LabView

BROKER_DEADLINE = 120.0  # each broker operation's own deadline (services.*.deadlines)
LEASE, MAX_RETRY = 6.0, 5.0  # worker.lease_seconds, worker.max_retry_seconds
# a platform waits for an operation its deadline, plus a lease (a killed replica's pass is free
# again after it), a retry's backoff and two polls; "stuck" past that
OP_SLACK = LEASE + MAX_RETRY + 10.0
ACCEPT_FOR = 90.0  # how long an OSB request is retried (replica down, PostgreSQL restarting)


class Brokers:
    """A throwaway PostgreSQL and two `broker serve` replicas on it (started, killed and
    restarted from the main thread: their death signal is that thread's)."""

    def __init__(self, lab: LabView, work: Path) -> None:
        from scoperouter.broker import migrate
        from tests.broker.conftest import PASSWORD
        from tests.broker.pg import Cluster, free_port
        from tests.broker.procs import BrokerProcess

        self.password = PASSWORD
        self.cluster = Cluster()
        self.cluster.start()
        self.cluster.sql("CREATE DATABASE chaos")
        url = self.url = self.cluster.url("chaos")
        migrate.upgrade(url)
        deadlines = dict.fromkeys(("provision", "deprovision", "bind", "unbind"), BROKER_DEADLINE)
        config = {
            "listen": f"127.0.0.1:{free_port()}",
            "database": {"url": url},
            "clouds_yaml": [str(lab.clouds_yaml)],
            "clouds": {c.name: {"entry": f"{c.slug}-admin"} for c in lab.clouds},
            "worker": {
                "threads": 2,
                "lease_seconds": LEASE,
                "heartbeat_seconds": LEASE / 4,
                "poll_seconds": 0.2,
                "max_retry_seconds": MAX_RETRY,
            },
            "services": {
                "openstack-project": {
                    "deadlines": deadlines,
                    "default_cloud": lab.clouds[0].name,
                    "plans": [{"name": "standard", "description": "a project"}],
                }
            },
            "log_level": "INFO",
        }
        self.config = work / "broker.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.logs = [work / "broker-1.log", work / "broker-2.log"]
        self.listens = [f"127.0.0.1:{free_port()}" for _ in self.logs]
        self.make = BrokerProcess
        self.keys = BrokerProcess.keys
        self.replicas = [
            BrokerProcess(self.config, log, listen=listen).start()
            for log, listen in zip(self.logs, self.listens, strict=True)
        ]
        catalog = httpx.get(
            self.replicas[0].url + "/v2/catalog",
            auth=("broker", PASSWORD),
            headers={"X-Broker-API-Version": "2.17"},
            timeout=30,
        ).json()
        [service] = [s for s in catalog["services"] if s["name"] == "openstack-project"]
        self.service_id, self.plan_id = service["id"], service["plans"][0]["id"]

    def urls(self) -> list[str]:
        return [f"http://{listen}" for listen in self.listens]

    def kill_and_restart(self, index: int) -> None:
        self.replicas[index].kill()
        self.replicas[index] = self.make(
            self.config, self.logs[index], listen=self.listens[index]
        ).start()

    def repair(self) -> tuple[dict[str, Any] | None, str]:
        done = subprocess.run(
            [sys.executable, "-m", "scoperouter.broker", "repair", "--config", str(self.config),
             "--json"],
            capture_output=True, text=True, check=False, timeout=600,
            env={**os.environ, "SCOPEROUTER_BROKER_SECRET_KEYS": self.keys},
        )  # fmt: skip
        try:
            report: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            return None, f"exit {done.returncode}: {done.stdout[-300:]} {done.stderr[-600:]}"
        return report, "" if done.returncode in (0, 1) else f"exit {done.returncode}"

    def records_left(self) -> list[str]:
        """What the database still holds that a finished run must not: operations in
        progress, instances not gone, bindings not unbound (each as a line)."""
        from sqlalchemy import create_engine, text

        queries = {
            "operations in progress": "SELECT id FROM operations WHERE state = 'in progress'",
            "instances not gone": "SELECT id FROM instances WHERE state <> 'gone'",
            "bindings left": "SELECT id FROM bindings WHERE state IN ('binding', 'bound', "
            "'unbinding')",
        }
        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                found = {
                    what: conn.execute(text(sql)).scalars().all() for what, sql in queries.items()
                }
        finally:
            engine.dispose()
        return [f"{what}: {ids[:5]}" for what, ids in found.items() if ids]

    def stop(self) -> None:
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.stop()
        self.cluster.stop()


class Run(Protocol):
    """What a lifecycle thread uses of the run (:class:`bench.chaos.Chaos`)."""

    args: argparse.Namespace
    run: str
    lab: LabView
    brokers: Brokers | None
    lock: threading.Lock
    record: cv.Record
    stop_lifecycles: threading.Event

    def now(self) -> float: ...


class Lifecycles(threading.Thread):
    """Instances through provision, bind, unbind and deprovision, one after the other, each
    OSB call to either replica; what each operation ended with goes to the record."""

    def __init__(self, chaos: Run, index: int) -> None:
        super().__init__(name=f"lifecycle-{index}", daemon=True)
        self.chaos = chaos
        self.index = index
        self.rng = random.Random(chaos.args.seed * 1000 + index)
        from scoperouter.broker.osbclient import OSBClient

        brokers = chaos.brokers
        assert brokers is not None
        self.brokers = brokers
        context = {
            "platform": "cloudfoundry",
            "organization_guid": f"chaos-{chaos.run}",
            "space_guid": f"chaos-{chaos.run}-{index}",
        }
        self.clients = [
            OSBClient(url, "broker", brokers.password, context=context, timeout=30)
            for url in brokers.urls()
        ]
        self.turn = self.rng.randrange(len(self.clients))

    def run(self) -> None:
        n = 0
        while not self.chaos.stop_lifecycles.is_set():
            n += 1
            self.lifecycle(f"chaos-{self.chaos.run}-{self.index}-{n}")

    def lifecycle(self, iid: str) -> None:
        sid, pid = self.brokers.service_id, self.brokers.plan_id
        cloud = self.rng.choice(self.chaos.lab.clouds).name
        state = self.operation(
            "provision", iid, None, lambda c: c.provision(iid, sid, pid, {"cloud": cloud})
        )
        if state == cv.SUCCEEDED:
            binding = f"{iid}-b"
            self.operation("bind", iid, binding, lambda c: c.bind(iid, binding, sid, pid))
            # a bind that failed is unbound as well: a platform's orphan mitigation
            for _ in range(3):
                unbound = self.operation(
                    "unbind", iid, binding, lambda c: c.unbind(iid, binding, sid, pid)
                )
                if unbound == cv.GONE:
                    break
        for _ in range(5):  # a failed deprovision is sent again, as an operator would
            gone = self.operation("deprovision", iid, None, lambda c: c.deprovision(iid, sid, pid))
            if gone == cv.GONE:
                return
            time.sleep(5)
        with self.chaos.lock:
            self.chaos.record.leftovers.append(iid)

    def call(self, send: Callable[[Any], Any]) -> Any:
        """One OSB request to the next replica in turn (a request sent again after an error
        goes to the other one: a load balancer's retry)."""
        self.turn = (self.turn + 1) % len(self.clients)
        return send(self.clients[self.turn])

    def operation(
        self, kind: str, iid: str, binding: str | None, send: Callable[[Any], Any]
    ) -> str:
        start = time.monotonic()
        entry: dict[str, Any] = {"kind": kind, "instance": iid, "t": round(self.chaos.now(), 1)}
        description, answer, operation = "", None, None
        end = start + ACCEPT_FOR
        while True:  # the request, until a replica accepts it
            try:
                answer = self.call(send)
            except httpx.HTTPError as exc:
                description = f"{type(exc).__name__}: {exc}"
                answer = None
            if answer is not None:
                if answer.status == 202:
                    operation = answer.operation
                    break
                if answer.status in (200, 201):
                    return self._done(entry, cv.SUCCEEDED, "", start)
                if answer.status == 410 and kind in ("unbind", "deprovision"):
                    return self._done(entry, cv.GONE, "", start)
                description = f"{answer.status}: {json.dumps(answer.body, default=str)[:300]}"
                if not isinstance(answer.body, dict):  # OSB errors are JSON objects
                    with self.chaos.lock:
                        self.chaos.record.broker_error(f"{kind} {iid}: {description}")
                if answer.status < 500 and answer.status != 422:  # 422: another operation runs
                    return self._done(entry, cv.REJECTED, description, start)
            if time.monotonic() > end:
                return self._done(entry, cv.REJECTED, f"never accepted: {description}", start)
            time.sleep(1.0)
        deadline = time.monotonic() + BROKER_DEADLINE + OP_SLACK
        while True:  # last_operation, until the operation is over
            try:
                last = self.call(lambda c: c.last_operation(iid, operation, binding))
            except httpx.HTTPError:
                last = None
            if last is not None:
                if last.status == 410:
                    return self._done(entry, cv.GONE, "", start)
                if last.status == 200 and isinstance(last.body, dict):
                    state = last.body.get("state")
                    if state in (cv.SUCCEEDED, cv.FAILED):
                        return self._done(entry, state, str(last.body.get("description") or ""),
                                          start)  # fmt: skip
                    description = str(last.body.get("description") or "")
                else:
                    description = f"last_operation {last.status}: {str(last.body)[:200]}"
                    if not isinstance(last.body, dict):
                        with self.chaos.lock:
                            self.chaos.record.broker_error(f"{kind} {iid}: {description}")
            if time.monotonic() > deadline:
                return self._done(entry, cv.STUCK, description, start)
            time.sleep(1.0)

    def _done(self, entry: dict[str, Any], state: str, description: str, start: float) -> str:
        entry.update(state=state, description=description, took=round(time.monotonic() - start, 1))
        with self.chaos.lock:
            self.chaos.record.operations.append(entry)
        return state
