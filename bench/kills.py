"""``python -m bench.kills``: the broker SIGKILLed at random points of its operations.

    python -m bench.kills                     # 50 kills on SQLite, then 50 on PostgreSQL
    python -m bench.kills --smoke             # 10 kills on each (.ci/run)
    python -m bench.kills --db postgresql --kills 20 --seed 7 --json kills.json

Real ``scoperouter broker serve`` processes (tests/broker/procs.py) with the fake service of
the broker's tests, whose "cloud" is a folder (tests/broker/fakes.py: one file per resource, a
journal of every create and delete). On SQLite one broker, restarted right after each kill; on
PostgreSQL (a throwaway cluster on loopback, tests/broker/pg.py) two replicas, the killed one
restarted while the other may pick the operation up (30 % of the kills take both replicas at
once: then a restarted one must). A platform (:class:`bench.kills_platform.Platform`) sends
provision, update, bind, unbind and deprovision as Cloud Foundry does (asynchronous, then
``last_operation`` polled; a request whose connection died is sent again, to the other replica
when there is one; an async binding's credentials fetched once it succeeded).

Each kill targets one operation, of the kind with the fewest kills so far: its request is sent,
and after a random delay (seeded: ``--seed`` replays the same operations, parameters and
delays) the broker that holds the operation's lease (else the one the request went to) gets
SIGKILL. Where the kill fell is read from the store just before it: in the request, in a pass,
between passes, in the other replica's pass, after the operation. A few instances with a binding
are made first, without kills, and never deleted, so the end state has live records to lose.

After the run the brokers are stopped and the store, the cloud's folder and the platform's view
are compared (:mod:`bench.kills_verdict`): 0 lost records, 0 duplicates, 0 orphans, 0 operations
left in progress, every interrupted operation ``succeeded``. PASS, MISS or INCONCLUSIVE (a row
nothing measured, or no row) per database; exit status 0 only when every database PASSes.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.kills_plan import KINDS, Planner
from bench.kills_platform import InFlight, Platform
from bench.kills_verdict import (
    Kill,
    Observed,
    OpResult,
    finisher,
    observe,
    scan_log,
    verdicts,
    where_counts,
)
from bench.machine import machine_context
from bench.procs import interrupt_on_termination
from bench.report import Target, exit_status, mark, not_passed, overall, table, targets_table
from scoperouter.broker import migrate
from scoperouter.broker.store import Store
from scoperouter.broker.tables import IN_PROGRESS
from tests.broker.pg import Cluster, free_port

with warnings.catch_warnings():  # the tests' conftest imports FastAPI's TestClient (unused
    warnings.simplefilter("ignore")  # here), whose module warns about httpx
    from tests.broker.procs import BrokerProcess, write_config

DATABASES = ("sqlite", "postgresql")


def say(message: str) -> None:
    print(f"[kills] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kills",
        description="The broker SIGKILLed at random points of provision, update, bind, unbind "
        "and deprovision, on SQLite and on PostgreSQL with two replicas: nothing lost, "
        "duplicated, orphaned or left in progress (bench/README.md).",
    )
    parser.add_argument("--smoke", action="store_true", help="the CI-sized run: 10 kills each")
    parser.add_argument("--kills", type=int, help="SIGKILLs per database (50; smoke 10)")
    parser.add_argument(
        "--seed", type=int, help="of the operations, parameters and kill points (default: new)"
    )
    parser.add_argument("--db", choices=[*DATABASES, "both"], default="both")
    parser.add_argument(
        "--lease", type=float, default=2.0, help="the brokers' lease, seconds (heartbeat 1/3)"
    )
    parser.add_argument(
        "--op-timeout", type=float, default=120.0, help="the platform gives up on an operation"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every kill and operation")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, cloud)")
    args = parser.parse_args(argv)
    if args.kills is None:
        args.kills = 10 if args.smoke else 50
    if args.seed is None:
        args.seed = int(time.time()) % 1_000_000
    if args.kills < 1 or args.lease <= 1:
        parser.error("--kills must be >= 1 and --lease > 1")
    return args


# ----------------------------------------------------------------------------- brokers


class Deployment:
    """The brokers of one database: one on SQLite, two replicas on PostgreSQL."""

    def __init__(self, db: str, url: str, workdir: Path, lease: float) -> None:
        self.db = db
        self.url = url
        self.state = workdir / "cloud"
        self.workdir = workdir
        config = write_config(workdir / "broker.yaml", url, self.state, lease=lease, threads=2)
        names = ["broker"] if db == "sqlite" else ["replica0", "replica1"]
        self.brokers = {
            name: BrokerProcess(config, workdir / f"{name}.log", listen=f"127.0.0.1:{free_port()}")
            for name in names
        }
        self.store = Store(url)

    def start(self) -> None:
        for broker in self.brokers.values():
            broker.start()

    def urls(self) -> list[str]:
        return [b.url for b in self.brokers.values()]

    def pid(self, name: str) -> int:
        return self.brokers[name].pid

    def kill(self, name: str) -> bool:
        """SIGKILL the broker's process group; whether a live process died of it."""
        broker = self.brokers[name]
        assert broker.proc is not None
        alive = broker.proc.poll() is None
        broker.kill()
        return alive and broker.proc.returncode == -signal.SIGKILL

    def restart(self, name: str) -> None:
        old = self.brokers[name]
        self.brokers[name] = BrokerProcess(old.config, old.log, listen=old.listen).start()

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop()

    def logs(self) -> dict[str, str]:
        out = {}
        for name, broker in self.brokers.items():
            with contextlib.suppress(OSError):
                out[name] = broker.log.read_text(errors="replace")
        return out

    def log_problems(self) -> dict[str, list[str]]:
        return {name: scan_log(text) for name, text in self.logs().items()}

    def close(self) -> None:
        self.stop()
        self.store.dispose()


# ------------------------------------------------------------------------------ the run


@dataclass
class DbRun:
    db: str
    kills: list[Kill] = field(default_factory=list)
    results: list[OpResult] = field(default_factory=list)
    observed: Observed | None = None
    rows: list[Target] = field(default_factory=list)
    log_problems: dict[str, list[str]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    deprovisions_with_bindings: int = 0


class KillRun:
    def __init__(self, deploy: Deployment, args: argparse.Namespace, seed: int) -> None:
        self.deploy = deploy
        self.args = args
        self.platform = Platform(deploy.urls(), args.op_timeout)
        self.planner = Planner(random.Random(seed), self.platform.view)
        self.out = DbRun(deploy.db)

    def setup(self) -> None:
        """A few instances with a binding each, without kills, kept to the end."""
        for _ in range(max(2, self.args.kills // 10)):
            instance = self.planner.new_id("keep-i")
            binding = self.planner.new_id("keep-b")
            self.planner.kept |= {instance, binding}
            spec = {"instance": instance, "parameters": self.planner.provision_params(quick=True)}
            self._unkilled("provision", spec)
            spec = {"instance": instance, "binding": binding, "parameters": {}}
            self._unkilled("bind", spec)

    def _unkilled(self, kind: str, spec: dict[str, Any]) -> OpResult:
        result = self.platform.run(kind, spec, InFlight())
        self.out.results.append(result)
        return result

    def one_kill(self, index: int) -> None:
        kind, spec, window = self.planner.next()
        delay, pick, every = self.planner.kill_delay(window)
        while self.planner.prelude:
            self._unkilled(*self.planner.prelude.pop(0))
        flight = InFlight()
        box: list[OpResult] = []
        thread = threading.Thread(
            target=lambda: box.append(self.platform.run(kind, spec, flight)), daemon=True
        )
        started = time.monotonic()
        thread.start()
        time.sleep(max(0.0, started + delay - time.monotonic()))
        names = list(self.deploy.brokers)
        target, where = self._aim(flight, names, pick)
        targets = [target] + ([n for n in names if n != target] if every else [])
        kill = Kill(index, kind, "+".join(targets), round(delay, 3), where)
        kill.pids = [self.deploy.pid(t) for t in targets]
        kill.at = time.time()
        kill.died = all([self.deploy.kill(t) for t in targets])
        self.out.kills.append(kill)
        # from this (the main) thread: a broker dies with the thread that started it
        # (PR_SET_PDEATHSIG, tests/broker/procs.py); the other replica works meanwhile
        started = time.monotonic()
        for t in targets:
            self.deploy.restart(t)
        kill.restart_s = round(time.monotonic() - started, 2)
        thread.join(self.args.op_timeout * 3)
        result = (
            box[0]
            if box
            else OpResult(
                kind,
                spec["instance"],
                spec.get("binding"),
                flight.operation,
                "timeout",
                "the platform thread did not end",
            )
        )
        result.killed = True
        kill.operation = result.operation
        self.out.results.append(result)
        what = spec.get("binding") or spec["instance"]
        say(
            f"{self.deploy.db} kill {index + 1}/{self.args.kills}: {kind} {what} at {delay:.2f} s"
            f" ({where}, {kill.target}): {result.state} in {result.seconds:.1f} s"
        )
        self._mitigate(kind, spec, result)

    def _aim(self, flight: InFlight, names: list[str], pick: float) -> tuple[str, str]:
        """Which broker to kill and where the kill falls, from the store just before."""
        fallback = names[int(pick * len(names)) % len(names)]
        if not flight.answered.is_set():
            return names[flight.target % len(names)], "in the request"
        if flight.operation is None:
            return fallback, "after the operation"
        with self.deploy.store.read() as session:
            op = self.deploy.store.operation(session, flight.operation)
            state = op.state if op is not None else None
            owner = op.lease_owner if op is not None else None
        if state != IN_PROGRESS:
            return fallback, "after the operation"
        if owner is None:
            return fallback, "between passes"
        pid = int(owner.rsplit(":", 2)[-2])
        for name in names:
            if self.deploy.pid(name) == pid:
                return name, "in a pass"
        return fallback, "in the other replica's pass"

    def _mitigate(self, kind: str, spec: dict[str, Any], result: OpResult) -> None:
        """A platform deletes what failed to be made (OSB orphan mitigation)."""
        if result.state != "failed":
            return
        if kind == "provision":
            self._unkilled("deprovision", {"instance": spec["instance"]})
        elif kind == "bind":
            self._unkilled("unbind", {"instance": spec["instance"], "binding": spec["binding"]})

    def run(self) -> DbRun:
        started = time.monotonic()
        try:
            self.setup()
            for index in range(self.args.kills):
                self.one_kill(index)
        finally:
            self.platform.close()
            self.deploy.stop()  # SIGTERM: nothing moves while the store and cloud are read
        self.out.observed = observe(self.deploy.store, self.deploy.state)
        self.out.log_problems = self.deploy.log_problems()
        logs = self.deploy.logs()
        for kill in self.out.kills:
            kill.finished_by = finisher(kill, logs)
        self.out.rows = verdicts(
            self.platform.view,
            self.out.results,
            self.out.observed,
            self.out.kills,
            self.args.kills,
            self.out.log_problems,
        )
        self.out.elapsed_s = round(time.monotonic() - started, 1)
        self.out.deprovisions_with_bindings = self.planner.with_bindings
        return self.out


def database_url(db: str, workdir: Path, cluster: Cluster | None) -> str:
    if db == "sqlite":
        url = f"sqlite:///{workdir / 'broker.db'}"
    else:
        assert cluster is not None
        url = cluster.url(cluster.new_database())
    migrate.upgrade(url)
    return url


def run_database(db: str, args: argparse.Namespace, root: Path) -> DbRun:
    workdir = root / db
    workdir.mkdir()
    cluster = None
    try:
        if db == "postgresql":
            say("starting a throwaway PostgreSQL cluster on loopback")
            cluster = Cluster()
            cluster.start()
        deploy = Deployment(db, database_url(db, workdir, cluster), workdir, args.lease)
        try:
            say(f"{db}: starting {len(deploy.brokers)} broker process(es)")
            deploy.start()
            return KillRun(deploy, args, args.seed).run()
        finally:
            deploy.close()
    finally:
        if cluster is not None:
            cluster.stop()


# ---------------------------------------------------------------------------- reporting

TITLES = {
    "sqlite": "SQLite: one broker, restarted after each kill",
    "postgresql": "PostgreSQL: two replicas; a kill takes one (the other works on) or both",
}


def render(run: DbRun) -> str:
    lines = [f"== {TITLES[run.db]} ==", ""]
    by_kind = {k: sum(1 for x in run.kills if x.kind == k) for k in KINDS}
    lines.append(
        "kills by kind:     "
        + ", ".join(f"{k} {n}" for k, n in by_kind.items())
        + f" ({run.deprovisions_with_bindings} deprovisions with bindings left)"
    )
    lines.append(
        "where they fell:   " + ", ".join(f"{w} {n}" for w, n in where_counts(run.kills).items())
    )
    finished = Counter(k.finished_by for k in run.kills)
    lines.append("finished by:       " + ", ".join(f"{w} {n}" for w, n in finished.most_common()))
    interrupted = [r.seconds for r in run.results if r.killed]
    restarts = [k.restart_s for k in run.kills if k.restart_s is not None]
    if interrupted:
        lines.append(
            f"interrupted operations: median {statistics.median(interrupted):.1f} s, "
            f"max {max(interrupted):.1f} s from request to final state "
            f"(broker restart median {statistics.median(restarts) if restarts else 0:.1f} s)"
        )
    states = {r.state for r in run.results}
    lines.append(
        f"operations: {len(run.results)} ("
        + ", ".join(f"{s} {sum(1 for r in run.results if r.state == s)}" for s in sorted(states))
        + f"); {run.elapsed_s:.0f} s"
    )
    lines += ["", targets_table(run.rows)]
    return "\n".join(lines)


def as_json(runs: list[DbRun], args: argparse.Namespace, context: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "context": context,
        "args": vars(args),
        "databases": {
            run.db: {
                "verdicts": [
                    {"name": r.name, "goal": r.goal, "measured": r.measured, "result": mark(r.ok)}
                    for r in run.rows
                ],
                "where": where_counts(run.kills),
                "deprovisions_with_bindings": run.deprovisions_with_bindings,
                "kills": [asdict(k) for k in run.kills],
                "operations": [asdict(r) for r in run.results],
                "observed": asdict(run.observed) if run.observed else None,
                "log_problems": run.log_problems,
                "elapsed_s": run.elapsed_s,
            }
            for run in runs
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    interrupt_on_termination()
    dbs = list(DATABASES) if args.db == "both" else [args.db]
    say(f"seed {args.seed} (replay: --seed {args.seed}), {args.kills} kills on {' and '.join(dbs)}")
    context = machine_context()
    say(f"load average {context['loadavg_before']}, {context['busy_pct_before']:.0f}% busy")
    root = Path(tempfile.mkdtemp(prefix="bench-kills-"))
    runs: list[DbRun] = []
    try:
        for db in dbs:
            runs.append(run_database(db, args, root))
    except KeyboardInterrupt:
        say("interrupted: the brokers and the cluster are stopped")
        return 130
    finally:
        if args.keep:
            say(f"work dir kept: {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    for run in runs:
        print(render(run) + "\n")
    status, lines = summary(runs)
    print("\n".join(lines))
    print(f"\n(seed {args.seed}; load average before: {context['loadavg_before']})")
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(runs, args, context), indent=1, default=str))
        say(f"written to {args.json}")
    return status


def summary(runs: list[DbRun]) -> tuple[int, list[str]]:
    """The exit status and the summary's lines: a database's result is PASS only when every
    one of its rows passed (none missing: a run that computed no row is INCONCLUSIVE), and
    the status is 0 only when every database ran and PASSed."""
    rows = [[run.db, mark(overall(run.rows))] for run in runs]
    lines = [table(["database", "result"], rows)]
    lines += [f"{run.db}: {line}" for run in runs for line in not_passed(run.rows)]
    if not runs:
        lines.append("INCONCLUSIVE: no database ran")
    passed = bool(runs) and all(exit_status(run.rows) == 0 for run in runs)
    return (0 if passed else 1), lines


if __name__ == "__main__":
    sys.exit(main())
