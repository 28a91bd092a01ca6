"""``python -m bench.chaos``: the lab's federation and a broker while things keep failing.

    python -m bench.chaos                     # 10 minutes, a fault every 30 s (by hand)
    python -m bench.chaos --smoke             # 3 minutes, a fault every 20 s (.ci/run)
    python -m bench.chaos --duration 20m --seed 7 --json chaos.json

Against a running lab (``scoperouter lab up``, $SCOPEROUTER_LAB_DIR; routed, two clouds at
least; nova for the server lists when the lab runs it). The harness starts a throwaway
PostgreSQL (tests/broker/pg.py) and two ``scoperouter broker serve`` replicas on it with the
``openstack-project`` service on the lab's first two clouds (through their routers). Then, for
``--duration``:

- client threads send what the OpenStack CLI sends, with a keystone password session per
  cloud (the lab's clouds.yaml ``demo`` users): image list and show, server list, a scoped
  cross-cloud read, ``A & B`` and ``A | B`` lists, entering at either router;
- broker threads run instance lifecycles (provision, bind, unbind, deprovision) over OSB,
  each call to either replica (the other when one does not answer, as a platform's load
  balancer does), polling ``last_operation`` to the end;
- the main thread injects a fault every ``--fault-every`` seconds (+-50 %), in an order drawn
  from ``--seed`` (printed; every kind once per round): a router worker SIGKILLed, a router
  SIGSTOPped for 2-8 s then SIGCONTinued, a router restarted (its peer's cross-cloud requests
  meet it down), keystone of one cloud restarted, a broker replica SIGKILLed (and started
  again), PostgreSQL restarted.

Then the faults stop, the lifecycles in flight end, every instance left is deprovisioned,
``scoperouter broker repair --json`` compares the database with the clouds, and the routers'
and brokers' logs of the run are scanned. Verdict (:mod:`bench.chaos_verdict`): 0 hangs, 0
non-JSON errors, 0 stuck operations, 0 drift, 0 tracebacks; exit status 1 on a MISS.
Progress goes to stderr. See bench/README.md, "Under faults".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench import chaos_verdict as cv
from bench.machine import machine_context
from bench.options import apply_preset
from bench.procs import interrupt_on_termination
from bench.report import exit_status, mark, not_passed
from bench.soak import seconds
from bench.soak_verdict import LogFindings

FAULTS = (
    "worker SIGKILL",
    "router SIGSTOP",
    "router restart",
    "keystone restart",
    "broker SIGKILL",
    "PostgreSQL restart",
)
SMOKE = {"duration": 180.0, "fault_every": 20.0}
DEFAULTS = {"duration": 600.0, "fault_every": 30.0}
BROKER_DEADLINE = 120.0  # each broker operation's own deadline (services.*.deadlines)
LEASE, MAX_RETRY = 6.0, 5.0  # worker.lease_seconds, worker.max_retry_seconds
# a platform waits for an operation its deadline, plus a lease (a killed replica's pass is free
# again after it), a retry's backoff and two polls; "stuck" past that
OP_SLACK = LEASE + MAX_RETRY + 10.0
ACCEPT_FOR = 90.0  # how long an OSB request is retried (replica down, PostgreSQL restarting)


def say(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description="The lab's federation and a broker under a storm of faults: every request "
        "ends in time, cleanly; every broker operation ends; no drift (bench/README.md).",
    )
    parser.add_argument("--smoke", action="store_true", help="the CI-sized run: 3 minutes")
    parser.add_argument("--duration", type=seconds, help="of the traffic (default 10m; smoke 3m)")
    parser.add_argument(
        "--fault-every", type=seconds, help="mean seconds between faults (30; smoke 20)"
    )
    parser.add_argument("--seed", type=int, help="of the faults and the mix (default: random)")
    parser.add_argument("--clients", type=int, default=3, help="client threads")
    parser.add_argument("--lifecycles", type=int, default=2, help="broker lifecycle threads")
    parser.add_argument("--deadline", type=float, default=60.0, help="each request's, seconds")
    parser.add_argument("--json", metavar="FILE", help="also write what the run saw as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (configs, logs)")
    args = parser.parse_args(argv)
    apply_preset(args, SMOKE if args.smoke else DEFAULTS)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1_000_000)
    if args.duration <= 0 or args.fault_every <= 0 or args.clients < 1 or args.lifecycles < 0:
        parser.error("--duration, --fault-every and --clients must be positive")
    return args


class ChaosError(Exception):
    pass


# ---------------------------------------------------------------------------- the lab


class LabView:
    """The running lab: its clouds, processes and clouds.yaml, and how to restart its parts
    (the lab's own code: scoperouter_lab)."""

    def __init__(self) -> None:
        from scoperouter_lab.cloud import Step
        from scoperouter_lab.lab import Lab
        from scoperouter_lab.layout import default_dir

        self.lab = Lab(default_dir(), out=open(os.devnull, "w"))  # noqa: SIM115
        if not self.lab.state:
            raise ChaosError(f"no lab in {self.lab.paths.root}: run `scoperouter lab up` first")
        if not self.lab.routed or len(self.lab.clouds) < 2:
            raise ChaosError("the lab must be routed, with two clouds at least")
        self.clouds = self.lab.clouds[:2]
        self.step = Step(report=lambda label, result, took: None)
        self.clouds_yaml = self.lab.paths.clouds_yaml
        self.entries: dict[str, Any] = yaml.safe_load(self.clouds_yaml.read_text())["clouds"]
        self.services = set(self.lab.services)

    def router(self, cloud: Any) -> Any:
        rec = self.lab.procs.running(f"{cloud.slug}-router")
        if rec is None:
            raise ChaosError(f"{cloud.name}'s router is not running")
        return rec

    def router_log(self, cloud: Any) -> Path:
        return Path(self.lab.paths.log(cloud, "router"))

    def restart_router(self, cloud: Any) -> None:
        """SIGTERM (the router drains), then started again as `lab up` starts it."""
        self.lab.procs.stop(f"{cloud.slug}-router")
        self.lab._ensure_router(cloud)

    def restart_keystone(self, cloud: Any) -> None:
        runner = self.lab.runner(cloud, self.step)
        self.lab.procs.stop(runner.pname("keystone"))
        runner._start("keystone")
        runner.wait_ready("keystone")


# ---------------------------------------------------------------------------- client requests


@dataclass(frozen=True)
class Kind:
    """A CLI-like request: where it enters, its scope, and what a success must hold."""

    name: str
    entry: int  # index of the cloud whose router it enters at
    service: str  # image or compute
    path: str
    scope: str | None = None
    # for image lists: the acceptable sets of clouds whose `tiny` image the answer lists
    tiny_from: tuple[frozenset[int], ...] = ()


def kinds(tiny: dict[int, str], compute: bool) -> list[Kind]:
    one, two = frozenset({0}), frozenset({1})
    out = [
        Kind("image list at A", 0, "image", "/v2/images", None, (one,)),
        Kind("image list at B", 1, "image", "/v2/images", None, (two,)),
        Kind("image show at A", 0, "image", f"/v2/images/{tiny[0]}"),
        Kind("cross-cloud image list A->B", 0, "image", "/v2/images", '{"image": "CloudTwo"}',
             (two,)),
        Kind("cross-cloud image show B->A", 1, "image", f"/v2/images/{tiny[0]}",
             '{"image": "CloudOne"}'),
        Kind("A & B image list", 0, "image", "/v2/images", '{"image": "CloudOne & CloudTwo"}',
             (one | two,)),
        Kind("B | A image list at A", 0, "image", "/v2/images", '{"image": "CloudTwo | CloudOne"}',
             (two, one)),
    ]  # fmt: skip
    if compute:
        out += [
            Kind("server list at A", 0, "compute", "/servers"),
            Kind("server list at B", 1, "compute", "/servers"),
        ]
    return out


def wrong_images(kind: Kind, document: Any, tiny: dict[int, str]) -> str | None:
    """What is wrong with an image list's clouds (None: nothing)."""
    if not kind.tiny_from:
        return None
    listed = {image.get("id") for image in document.get("images", [])}
    got = frozenset(i for i, image_id in tiny.items() if image_id in listed)
    if got in kind.tiny_from:
        return None
    wanted = [sorted(s) for s in kind.tiny_from]
    return f"lists tiny of clouds {sorted(got)}, expected one of {wanted}"


class Client(threading.Thread):
    """One CLI user: a keystone session per (entry cloud, scope), a request at a time."""

    def __init__(self, chaos: Chaos, index: int) -> None:
        super().__init__(name=f"client-{index}", daemon=True)
        self.chaos = chaos
        self.rng = random.Random(chaos.args.seed * 100 + index)
        self.sessions: dict[tuple[int, str | None], Any] = {}

    def session(self, kind: Kind) -> Any:
        key = (kind.entry, kind.scope)
        if key not in self.sessions:
            from keystoneauth1 import session as ks_session
            from keystoneauth1.identity import v3

            from scoperouter.client import scope_session

            cloud = self.chaos.lab.clouds[kind.entry]
            auth = dict(self.chaos.lab.entries[cloud.slug]["auth"])
            sess = ks_session.Session(auth=v3.Password(**auth), timeout=self.chaos.args.deadline)
            if kind.scope is not None:
                scope_session(sess, kind.scope, default_cloud=cloud.region)
            self.sessions[key] = sess
        return self.sessions[key]

    def run(self) -> None:
        mix = self.chaos.kinds
        while not self.chaos.stop_clients.is_set():
            self.one(self.rng.choice(mix))
            self.chaos.stop_clients.wait(self.rng.uniform(0.1, 0.6))

    def one(self, kind: Kind) -> None:
        from keystoneauth1 import exceptions as ks

        deadline = self.chaos.args.deadline
        cloud = self.chaos.lab.clouds[kind.entry]
        url = cloud.endpoint_url(kind.service, True).rstrip("/") + kind.path
        start = time.monotonic()
        try:
            response = self.session(kind).get(url, raise_exc=False, timeout=deadline)
        except ks.HttpError as exc:  # keystone's answer to the token request, through the router
            response = exc.response
            if response is None:
                self._end(kind, cv.JSON_ERROR, str(exc), start)
                return
        except (ks.ConnectTimeout, ks.ConnectFailure) as exc:
            text = str(exc)
            if isinstance(exc, ks.ConnectTimeout) or "timed out" in text.lower():
                outcome = cv.HANG
            elif "refused" in text.lower():
                outcome = cv.REFUSED
            else:
                outcome = cv.DROPPED
            self._end(kind, outcome, text, start)
            return
        except ks.ClientException as exc:  # anything else keystoneauth raises: not clean
            self._end(kind, cv.NON_JSON, f"{type(exc).__name__}: {exc}", start)
            return
        elapsed = time.monotonic() - start
        ctype = response.headers.get("Content-Type", "")
        outcome = cv.classify_answer(
            response.status_code, ctype, response.content, elapsed, deadline
        )
        detail = f"{response.status_code} {ctype}: {response.content[:200]!r}"
        if outcome == cv.OK:
            problem = wrong_images(kind, response.json(), self.chaos.tiny)
            if problem is not None:
                outcome, detail = cv.WRONG, problem
        self._end(kind, outcome, detail, start, response.status_code)

    def _end(self, kind: Kind, outcome: str, detail: str, start: float, status: int = 0) -> None:
        took = time.monotonic() - start
        if took > self.chaos.args.deadline and outcome != cv.HANG:
            outcome, detail = cv.HANG, f"took {took:.1f} s: {detail}"
        with self.chaos.lock:
            self.chaos.record.slowest = max(self.chaos.record.slowest, took)
            self.chaos.record.request(
                kind.name, outcome, f"t={self.chaos.now():.0f}s {detail}", status
            )


# ---------------------------------------------------------------------------- the broker


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


class Lifecycles(threading.Thread):
    """Instances through provision, bind, unbind and deprovision, one after the other, each
    OSB call to either replica; what each operation ended with goes to the record."""

    def __init__(self, chaos: Chaos, index: int) -> None:
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


# ---------------------------------------------------------------------------- the run


class LogTail:
    """The part of a log written since the run began."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def findings(self) -> LogFindings:
        out = LogFindings()
        with contextlib.suppress(OSError), self.path.open("rb") as log:
            log.seek(self.offset)
            for line in log.read().decode(errors="replace").splitlines():
                out.scan(line)
        return out


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = uuid.uuid4().hex[:6]
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.stop_clients = threading.Event()
        self.stop_lifecycles = threading.Event()
        self.record = cv.Record(duration=args.duration, deadline=args.deadline, seed=args.seed)
        self.work = Path(tempfile.mkdtemp(prefix="scoperouter-chaos-"))
        self.lab = LabView()
        self.tiny = self._tiny()
        self.kinds = kinds(self.tiny, "nova" in self.lab.services)
        self.brokers: Brokers | None = None
        self.t0 = time.monotonic()
        self.logs: dict[str, LogTail] = {
            f"{c.name} router": LogTail(self.lab.router_log(c)) for c in self.lab.clouds
        }

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _tiny(self) -> dict[int, str]:
        """The seeded `tiny` image's id in each cloud (the admin's view, through its router)."""
        from openstack import config as os_config
        from openstack import connection

        cfg = os_config.OpenStackConfig(
            config_files=[str(self.lab.clouds_yaml)], load_envvars=False
        )
        out = {}
        for i, cloud in enumerate(self.lab.clouds):
            conn = connection.Connection(config=cfg.get_one(cloud=cloud.slug))
            found = [image.id for image in conn.image.images(name="tiny")]
            if len(found) != 1:
                raise ChaosError(f"{cloud.name}: images named tiny: {found}")
            out[i] = found[0]
        return out

    # -- faults (main thread)

    def plan(self) -> list[tuple[float, str, int]]:
        """(when, fault, target index) for the whole run: every kind once per round, in an
        order drawn from the seed."""
        out: list[tuple[float, str, int]] = []
        t = self.args.fault_every * self.rng.uniform(0.5, 1.0)
        order: list[str] = []
        while t < self.args.duration:
            if not order:
                order = list(FAULTS)
                self.rng.shuffle(order)
            out.append((t, order.pop(), self.rng.randrange(2)))
            t += self.args.fault_every * self.rng.uniform(0.5, 1.5)
        return out

    def fault(self, kind: str, target: int) -> dict[str, Any]:
        lab, cloud = self.lab, self.lab.clouds[target]
        entry: dict[str, Any] = {"t": round(self.now(), 1), "kind": kind, "target": cloud.name}
        start = time.monotonic()
        try:
            if kind == "worker SIGKILL":
                supervisor = psutil.Process(lab.router(cloud).pid)
                workers = supervisor.children()
                if not workers:
                    raise ChaosError("the router has no worker")
                victim = self.rng.choice(workers)
                victim.send_signal(signal.SIGKILL)
                entry["target"] += f" worker {victim.pid}"

                def replaced() -> bool:  # the victim reaped, as many workers as before
                    pids = {c.pid for c in supervisor.children()}
                    return victim.pid not in pids and len(pids) >= len(workers)

                _wait(replaced, 60, "new worker")
            elif kind == "router SIGSTOP":
                pgid = lab.router(cloud).pgid
                pause = self.rng.uniform(2.0, 8.0)
                os.killpg(pgid, signal.SIGSTOP)
                try:
                    time.sleep(pause)
                finally:
                    os.killpg(pgid, signal.SIGCONT)
                entry["target"] += f" for {pause:.1f} s"
            elif kind == "router restart":
                lab.restart_router(cloud)
            elif kind == "keystone restart":
                lab.restart_keystone(cloud)
            elif kind == "broker SIGKILL":
                assert self.brokers is not None
                self.brokers.kill_and_restart(target)
                entry["target"] = f"broker replica {target + 1}"
            elif kind == "PostgreSQL restart":
                assert self.brokers is not None
                self.brokers.cluster.restart()
                entry["target"] = "the brokers' PostgreSQL"
            entry["done"] = True
        except Exception as exc:  # recorded: the verdict says which fault was not done
            entry["done"], entry["error"] = False, f"{type(exc).__name__}: {exc}"
        entry["took"] = round(time.monotonic() - start, 1)
        return entry

    # -- the whole run

    def start(self) -> None:
        say(f"seed {self.args.seed} (again: --seed {self.args.seed}); work dir {self.work}")
        say("a throwaway PostgreSQL and two broker replicas on it")
        self.brokers = Brokers(self.lab, self.work)
        for i, log in enumerate(self.brokers.logs):
            self.logs[f"broker {i + 1}"] = LogTail(log)
            self.logs[f"broker {i + 1}"].offset = 0
        self.t0 = time.monotonic()

    def go(self) -> None:
        args = self.args
        plan = self.plan()
        listed = ", ".join(f"{t:.0f}s {k} ({self.lab.clouds[i].name})" for t, k, i in plan)
        say(f"{args.duration:g} s of traffic, {len(plan)} faults: {listed}")
        threads: list[threading.Thread] = [Client(self, i) for i in range(args.clients)]
        lifecycles = [Lifecycles(self, i) for i in range(args.lifecycles)]
        for thread in threads + lifecycles:
            thread.start()
        for at, kind, target in plan:
            wait = at - self.now()
            if wait > 0:
                time.sleep(wait)
            entry = self.fault(kind, target)
            self.record.faults.append(entry)
            say(f"{entry['t']:.0f}s {kind} ({entry['target']}): "
                + ("done" if entry["done"] else f"NOT DONE: {entry['error']}")
                + f" in {entry['took']:.1f} s; {self._so_far()}")  # fmt: skip
        wait = args.duration - self.now()
        if wait > 0:
            time.sleep(wait)
        self.stop_clients.set()
        self.stop_lifecycles.set()
        say(f"traffic over ({self._so_far()}); the lifecycles in flight end")
        for thread in threads:
            thread.join(args.deadline + 30)
        for thread in lifecycles:
            thread.join(4 * (BROKER_DEADLINE + OP_SLACK) * 3 + 60)
            if thread.is_alive():
                raise ChaosError(f"{thread.name} did not end")
        assert self.brokers is not None
        say("broker repair")
        self.record.repair, self.record.repair_error = self.brokers.repair()
        self.record.leftovers += self.brokers.records_left()
        time.sleep(1.0)  # the routers write their log lines in batches
        self.record.logs = {name: tail.findings() for name, tail in self.logs.items()}

    def _so_far(self) -> str:
        with self.lock:
            got = self.record.outcomes()
            ops = self.record.op_states()
        return (
            f"requests {dict(got)}; operations {dict(ops)}"
            if got or ops
            else "no request ended yet"
        )

    def cleanup(self) -> None:
        self.stop_clients.set()
        self.stop_lifecycles.set()
        for cloud in self.lab.clouds:  # never a router left stopped (an interrupted SIGSTOP)
            rec = self.lab.lab.procs.running(f"{cloud.slug}-router")
            if rec is not None:
                with contextlib.suppress(OSError):
                    os.killpg(rec.pgid, signal.SIGCONT)
        if self.brokers is not None:
            self.brokers.stop()
        if not self.args.keep:
            import shutil

            shutil.rmtree(self.work, ignore_errors=True)


def _wait(ready: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            raise ChaosError(f"no {what} after {timeout:g} s")
        time.sleep(0.2)


def as_json(chaos: Chaos, rows: list[Any], context: dict[str, Any], elapsed: float) -> Any:
    record = chaos.record
    return {
        "context": context,
        "args": vars(chaos.args),
        "verdicts": [
            {"name": r.name, "goal": r.goal, "measured": r.measured, "result": mark(r.ok)}
            for r in rows
        ],
        "requests": [
            {"kind": k, "outcome": o, "count": n} for (k, o), n in sorted(record.requests.items())
        ],
        "statuses": [
            {"kind": k, "status": s, "count": n} for (k, s), n in sorted(record.statuses.items())
        ],
        "examples": record.examples,
        "broker_non_json": record.broker_non_json,
        "slowest_s": round(record.slowest, 2),
        "operations": record.operations,
        "faults": record.faults,
        "repair": record.repair,
        "leftovers": record.leftovers,
        "logs": {name: f.as_dict() for name, f in record.logs.items()},
        "elapsed_s": round(elapsed, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    interrupt_on_termination()
    context = machine_context()
    say(f"load average {context['loadavg_before']}, {context['busy_pct_before']:.0f}% busy")
    try:
        chaos = Chaos(args)
    except ChaosError as exc:
        say(f"error: {exc}")
        return 1
    try:
        chaos.start()
        chaos.go()
    except KeyboardInterrupt:
        say("interrupted: stopping the brokers and PostgreSQL")
        chaos.cleanup()
        return 130
    except ChaosError as exc:
        say(f"error: {exc}")
        chaos.cleanup()
        return 1
    chaos.cleanup()
    rows = cv.verdicts(chaos.record)
    elapsed = time.monotonic() - started
    print(cv.render(chaos.record, rows))
    print(f"\n(chaos run took {elapsed:.0f} s, {args.duration:g} s of traffic, seed {args.seed})")
    if args.json:
        Path(args.json).write_text(
            json.dumps(as_json(chaos, rows, context, elapsed), indent=1, default=str) + "\n"
        )
        say(f"written to {args.json}")
    for line in not_passed(rows):
        print(line)
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
