"""``python -m bench.broker``: the broker's polling path (run by hand; figures in the README).

What platforms do most: poll ``last_operation`` (Cloud Foundry every few seconds per operation
in flight) and fetch ``/v2/catalog``. Both read configuration and the database only. The bench
starts a real ``scoperouter broker serve`` (SQLite file by default, no worker threads, access
log off), seeds `--instances` instances each with a provision *in progress* (so every poll is
the realistic answer: state, description and ``Retry-After``), and measures each route twice:

- **capacity**: wrk, `--connections` closed-loop keep-alive connections (each sends its next
  request when its answer arrives), each request for the next instance in turn: the most the
  server answers per second, and its CPU time per request (user + system of the ``serve``
  processes over the run: unlike req/s, hardly moved by what else runs on the machine). The
  latency of a closed loop is the queue it builds itself (Little's law: p50 ~ connections /
  throughput), so it is not reported as the goal's latency.
- **latency at an offered rate**: `--connections` pollers, each on its own connection polling
  on a fixed interval, `--rate` requests per second in all (bench/broker_pollers.py: latency
  from the scheduled send time, so falling behind counts; connections warm before the window).

Goal (issue 9): >= 1,000 req/s with 100 pollers on SQLite and p99 < 50 ms on the project's
2-core machine, read as: capacity >= 1,000 req/s, and p99 < 50 ms when 100 pollers offer
1,000 req/s. `--repeat N` runs each measurement N times (the machine is shared: the spread
says how much to trust one figure); the load average is printed with the results.

The goal is printed as PASS, MISS or INCONCLUSIVE rows per route (:func:`goal_targets`: the
slowest run's capacity, the worst run's p99, the errors); a row that could not be computed (no
run, a p99 not measured, a run not at the goal's setting: another --rate, --connections or a
database other than SQLite) is INCONCLUSIVE. Only all-PASS exits 0.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.load import (
    WRK_SCRIPT,
    LoadResult,
    LoadTool,
    _result,
    ensure_wrk,
    parse_benchjson,
    python_tool,
)
from bench.report import Target, as_dicts, exit_status, not_passed, targets_table
from scoperouter.broker import migrate
from scoperouter.broker.secrets import generate_key
from scoperouter.broker.services.base import stable_id
from scoperouter.broker.store import Store
from scoperouter.broker.tables import (
    IN_PROGRESS,
    PROVISIONING,
    Instance,
    Operation,
    new_operation_id,
    utcnow,
)

ROOT = Path(__file__).resolve().parents[1]
GOAL_RPS, GOAL_P99_MS = 1000.0, 50.0

# pollers walk through the instances in turn; bench.load's `done` hook prints the figures
LUA_REQUEST = r"""
-- written by `python -m bench.broker`
local paths = {PATHS}
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[(i % #paths) + 1])
end
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def seed(url: str, count: int) -> list[str]:
    """`count` instances of openstack-project, each with a provision in progress."""
    store = Store(url)
    service_id = stable_id("openstack-project")
    plan_id = stable_id("openstack-project", "standard")
    ids = []
    now = utcnow()
    with store.write() as session:
        for n in range(count):
            instance_id = f"osb-bench-{n:04d}"
            op = Operation(
                id=new_operation_id("provision"),
                kind="provision",
                instance_id=instance_id,
                state=IN_PROGRESS,
                description="creating the project (bench: nothing runs it)",
                progress={},
                request={},
                request_hash="-",
                not_before=now + timedelta(seconds=3),
                deadline_at=now + timedelta(hours=1),
                attempts=1,
            )
            session.add(
                Instance(
                    id=instance_id,
                    service_id=service_id,
                    plan_id=plan_id,
                    service_name="openstack-project",
                    parameters={},
                    context={},
                    resources={},
                    state=PROVISIONING,
                    request_hash="-",
                    active_operation_id=op.id,
                )
            )
            session.flush()
            session.add(op)
            ids.append(f"/v2/service_instances/{instance_id}/last_operation?operation={op.id}")
    store.dispose()
    return ids


def run_wrk(
    tool: LoadTool,
    base: str,
    paths: list[str],
    connections: int,
    seconds: float,
    headers: dict[str, str],
    workdir: Path,
) -> LoadResult:
    header_args: list[str] = []
    for name, value in headers.items():
        header_args += ["-H", f"{name}: {value}"]
    if tool.kind == "wrk":
        script = workdir / "broker.lua"
        lua_paths = "{" + ",".join(json.dumps(p) for p in paths) + "}"
        script.write_text(LUA_REQUEST.replace("{PATHS}", lua_paths) + WRK_SCRIPT)
        argv = [
            tool.binary or "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "--latency",
            "-s",
            str(script),
            *header_args,
            base,
        ]
    else:  # one path only: pyload has no per-request script
        argv = [
            sys.executable,
            "-m",
            "bench.pyload",
            "--url",
            base + paths[0],
            "-c",
            str(connections),
            "-d",
            str(seconds),
            *header_args,
        ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, cwd=ROOT)
    data = parse_benchjson(proc.stdout)
    if proc.returncode != 0 or data is None:
        raise RuntimeError(f"load generator failed: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return _result(tool.kind, connections, data)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its children that are still running
    (the ``serve`` processes: with ``processes: N`` the parent forks N)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(c) for c in children.read_text().split()]
    total = 0
    for one in pids:
        fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


def run_pollers(
    base: str,
    paths: list[str],
    pollers: int,
    rate: float,
    seconds: float,
    headers: dict[str, str],
    workdir: Path,
) -> LoadResult:
    """bench/broker_pollers.py in its own process (its own core when there is one)."""
    paths_file = workdir / "paths.json"
    paths_file.write_text(json.dumps(paths))
    argv = [
        sys.executable,
        "-m",
        "bench.broker_pollers",
        "--url",
        base,
        "--paths",
        str(paths_file),
        "-c",
        str(pollers),
        "-r",
        str(rate),
        "-d",
        str(seconds),
    ]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    data = parse_benchjson(proc.stdout)
    if proc.returncode != 0 or data is None:
        raise RuntimeError(f"pollers failed: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return _result("open-loop pollers", pollers, data)


def spread(values: list[float]) -> str:
    """`median (min-max)` of repeated measurements, or the one value."""
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    if len(ordered) == 1:
        return f"{median:,.1f}"
    return f"{median:,.1f} ({ordered[0]:,.1f}-{ordered[-1]:,.1f})"


def goal_targets(
    route: str,
    capacity: list[LoadResult],
    offered: list[LoadResult],
    rate: float,
    connections: int,
    database: str,
) -> list[Target]:
    """The goal (issue 9) on one route's runs, as verdict rows: capacity >= GOAL_RPS in every
    closed-loop run, p99 < GOAL_P99_MS in every run at GOAL_RPS offered, no error. A row is
    INCONCLUSIVE (None) when nothing ran, a p99 is missing, or the run is not at the goal's
    setting (100 pollers offering 1,000 req/s, on SQLite)."""
    setting = []
    if connections != 100:
        setting.append(f"{connections} connections, not 100")
    if database != "sqlite":
        setting.append(f"on {database}, not SQLite")
    rps = [r.rps for r in capacity]
    if not rps:
        cap = Target(f"{route}: capacity", f">= {GOAL_RPS:,.0f} req/s", "no run", None)
    else:
        measured = f"slowest of {len(rps)} run(s) {min(rps):,.1f} req/s"
        cap = Target(
            f"{route}: capacity",
            f">= {GOAL_RPS:,.0f} req/s, closed loop, every run",
            measured + (f" (not judged: {'; '.join(setting)})" if setting else ""),
            None if setting else min(rps) >= GOAL_RPS,
        )
    p99 = [r.p99_ms for r in offered]
    latency_setting = setting + ([f"{rate:,.0f} req/s offered"] if rate != GOAL_RPS else [])
    name, goal = f"{route}: p99", f"< {GOAL_P99_MS:.0f} ms at {GOAL_RPS:,.0f} req/s, every run"
    if not p99 or any(v is None or v != v for v in p99):  # v != v: NaN
        lat = Target(name, goal, f"p99 not measured in {len(p99)} run(s)", None)
    else:
        lat = Target(
            name,
            goal,
            f"worst of {len(p99)} run(s) {max(p99):,.1f} ms"
            + (f" (not judged: {'; '.join(latency_setting)})" if latency_setting else ""),
            None if latency_setting else max(p99) < GOAL_P99_MS,
        )
    runs = capacity + offered
    errors = sum(r.error_count for r in runs)
    err = Target(
        f"{route}: errors",
        "0",
        f"{errors} in {len(capacity)} closed-loop + {len(offered)} offered run(s)"
        if runs
        else "no run",
        errors == 0 if runs else None,
    )
    return [cap, lat, err]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--connections", type=int, default=100, help="concurrent pollers")
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument(
        "--rate", type=float, default=GOAL_RPS, help="req/s the open-loop pollers offer in all"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--processes", type=int, default=1, help="serve processes (one port)")
    parser.add_argument("--database", metavar="URL", help="default: a SQLite file in a temp dir")
    parser.add_argument("--no-apt", action="store_true", help="do not apt-get install wrk")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)

    say = lambda text: print(f"bench.broker: {text}", file=sys.stderr, flush=True)  # noqa: E731
    tool = ensure_wrk(not args.no_apt, say) or python_tool()
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        workdir = Path(tmp)
        url = args.database or f"sqlite:///{workdir / 'broker.db'}"
        migrate.upgrade(url)
        paths = seed(url, args.instances)
        port = free_port()
        config = {
            "listen": f"127.0.0.1:{port}",
            "database": {"url": url},
            "worker": {"threads": 0},
            "processes": args.processes,
            "log_level": "WARNING",
            "clouds": {"CloudOne": {"entry": "unused-by-the-bench"}},
            "services": {"openstack-project": {}},
        }
        (workdir / "broker.yaml").write_text(yaml.safe_dump(config))
        password = secrets.token_hex(16)
        env = {
            **os.environ,
            "SCOPEROUTER_BROKER_PASSWORD": password,
            "SCOPEROUTER_BROKER_SECRET_KEYS": generate_key(),
            "PYTHONOPTIMIZE": "1",
        }
        log = (workdir / "broker.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scoperouter.broker",
                "serve",
                "--config",
                str(workdir / "broker.yaml"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        base = f"http://127.0.0.1:{port}"
        auth = base64.b64encode(f"broker:{password}".encode()).decode()
        headers = {"Authorization": f"Basic {auth}", "X-Broker-API-Version": "2.17"}
        try:
            for _ in range(600):
                try:
                    if httpx.get(base + "/v2/catalog", headers=headers).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            check = httpx.get(base + paths[0], headers=headers)
            assert check.status_code == 200 and check.json()["state"] == "in progress", check.text
            assert "retry-after" in check.headers
            results: dict[str, Any] = {
                "tool": tool.description,
                "database": url.split(":")[0],
                "processes": args.processes,
                "load_average_before": load_average(),
            }
            rows: list[Target] = []
            for name, targets in (("last_operation", paths), ("catalog", ["/v2/catalog"])):
                run_wrk(tool, base, targets, args.connections, 2, headers, workdir)  # warm-up
                capacity, cpu_us, offered = [], [], []
                for _ in range(args.repeat):
                    before = cpu_seconds(proc.pid)
                    closed = run_wrk(
                        tool, base, targets, args.connections, args.seconds, headers, workdir
                    )
                    used = cpu_seconds(proc.pid) - before
                    capacity.append(closed)
                    cpu_us.append(used / max(closed.requests, 1) * 1e6)
                    offered.append(
                        run_pollers(
                            base,
                            targets,
                            args.connections,
                            args.rate,
                            args.seconds,
                            headers,
                            workdir,
                        )
                    )
                rps = [r.rps for r in capacity]
                p50 = [r.p50_ms for r in offered]
                p99 = [r.p99_ms for r in offered]
                errors = sum(r.error_count for r in capacity + offered)
                route = goal_targets(
                    name, capacity, offered, args.rate, args.connections, url.split(":")[0]
                )
                rows += route
                results[name] = {
                    "capacity": [r.as_dict() for r in capacity],
                    "cpu_us_per_request": cpu_us,
                    "offered": [r.as_dict() for r in offered],
                }
                if not capacity:
                    print(f"{name:15} nothing ran (--repeat {args.repeat})")
                    continue
                print(
                    f"{name:15} {args.processes} process(es), {args.connections} connections, "
                    f"{args.repeat} run(s), median (min-max):\n"
                    f"  capacity (closed loop)   {spread(rps)} req/s, "
                    f"CPU {spread(cpu_us)} us/request\n"
                    f"  at {args.rate:,.0f} req/s offered  p50 {spread(p50)} ms, "
                    f"p99 {spread(p99)} ms, max {max(r.max_ms for r in offered):,.1f} ms\n"
                    f"  errors {errors}"
                )
            results["load_average_after"] = load_average()
            print(
                f"load average: {results['load_average_before']} before, "
                f"{results['load_average_after']} after"
            )
            print()
            print(targets_table(rows))
            for line in not_passed(rows):
                print(line)
            results["verdicts"] = as_dicts(rows)
            if args.json:
                print(json.dumps(results, indent=2))
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
