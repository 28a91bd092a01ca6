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
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench import chaos_verdict as cv
from bench.chaos_brokers import BROKER_DEADLINE, OP_SLACK, Brokers, Lifecycles
from bench.chaos_clients import Client, kinds
from bench.chaos_lab import ChaosError, LabView
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
