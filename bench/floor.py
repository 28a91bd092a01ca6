"""``python -m bench.floor``: how much of a request's cost is the router's, mitmproxy's, Python's.

In one run, on the same backend (nginx) and load generator (wrk), small keep-alive requests at
1 and 50 connections through:

* **direct**: the backend itself;
* **mitmproxy**: a minimal embedded mitmproxy reverse proxy, no addon of ours
  (``bench/floor_servers.py mitm``), 1 and 2 processes sharing the port (``SO_REUSEPORT``);
* **router**: ``scoperouter serve`` (CloudOne's router, local backend), 1 and 2 workers;
* **lean httptools**: an asyncio reverse proxy on httptools with a pooled upstream connection
  (``bench/floor_servers.py lean``), 1 and 2 processes, on the event loop the router's workers
  run (uvloop when it is installed: the label names it).

Every proxy runs under ``python -O``. Per point: req/s, its ratio to direct, p50 and what it adds
to direct, the CPU each proxy spends per request (all its processes) and, when ``perf`` is
there, the user-space instructions it executes per request: a figure that, unlike time, other
processes competing for the cores do not inflate. With ``--rounds N`` every
point is measured N times, round after round, and the table shows medians and the spread.

    python -m bench.floor                    # ~3 minutes
    python -m bench.floor --rounds 3 --duration 5
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from bench import backend
from bench.floor_servers import LEAN_LOOP
from bench.machine import machine_context
from bench.options import parse_args as bench_args
from bench.procs import (
    BenchError,
    free_port,
    wait_listening,
)
from bench.run import SMALL_PATH, Bench, _get, say, scoped_headers

PROXY_HOST = "127.0.0.4"  # the floor proxies listen here (routers: .2/.3, backends: .1.x)


@dataclass(frozen=True)
class Path:
    label: str
    processes: int
    host: str
    port: int
    pids: tuple[int, ...]  # whose CPU is the proxy's (a supervisor counts its workers)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.floor", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", default="1,50")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quiet-wait", type=float, default=10.0)
    return parser.parse_args(argv)


def start_floor_proxy(bench: Bench, kind: str, processes: int, upstream: str) -> Path:
    port = free_port(PROXY_HOST)
    pids = []
    for n in range(processes):
        argv = [sys.executable, "-O", "-m", "bench.floor_servers", kind]
        argv += ["--listen", f"{PROXY_HOST}:{port}", "--upstream", upstream]
        if kind == "lean":
            argv += ["--loop", LEAN_LOOP]
        proc = bench.procs.start(f"floor-{kind}-{processes}-{n}", argv, bench._sub_env())
        wait_listening(PROXY_HOST, port, proc, timeout=60)
        pids.append(proc.pid)
    label = {"mitm": "mitmproxy (minimal)", "lean": f"lean httptools ({LEAN_LOOP})"}[kind]
    return Path(label, processes, PROXY_HOST, port, tuple(pids))


def check(path: Path, headers: dict[str, str]) -> None:
    status, body = _get(path.host, path.port, "GET", SMALL_PATH, headers)
    if status != 200 or not backend.check_small(body, "CloudOne"):
        raise BenchError(f"sanity check failed for {path.label}: {status} {body[:200]!r}")


def measure(
    bench: Bench, path: Path, conns: int, headers: dict[str, str], threads: int = 1
) -> dict[str, Any]:
    """One load point on `path`: the figures of the row, with the CPU time and instructions of
    the path's processes (the proxy's; none for direct) and what the rest of the machine did."""
    url = f"http://{path.host}:{path.port}{SMALL_PATH}"
    say(f"load: {path.label} x{path.processes}, {conns} connection(s), {bench.args.duration:g} s")
    watched = {str(p.pid): p.pid for p in bench.procs.procs}  # all the bench's: the noise
    watched |= {str(pid): pid for pid in path.pids}
    result, cost = bench.load_point(url, conns, headers, watched, path.pids, threads)
    cpu = sum(cost.cpu[str(pid)] for pid in path.pids)
    # What the path costs the rest of the bench: the backend's CPU (nginx and its worker) and
    # the load generator's, per request. Same backend and wrk on every path: what differs is
    # how often the proxy wakes them (a proxy always runnable on both cores gets preempted by
    # them and hands them one request a wake-up instead of several).
    # Blank, not smaller, when the backend's CPU was not sampled (NaN: psutil lost it).
    backend_cpu = cost.cpu.get(str(bench.small.proc.pid)) if bench.small is not None else None
    rest = None
    if backend_cpu is not None and not math.isnan(backend_cpu):
        rest = cost.per_request((backend_cpu + cost.loadgen_cpu_cores * cost.wall) * 1e6, result)
    return {
        "path": path.label,
        "processes": path.processes,
        "connections": conns,
        "rps": result.rps,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "cpu_us_per_req": cost.per_request(cpu * 1e6, result) if path.pids else None,
        "rest_us_per_req": rest,
        "instructions_per_req": cost.per_request(cost.instructions, result),
        **cost.noise(),
        "errors": result.error_count,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    options = bench_args(
        [
            "--duration", str(args.duration),
            "--warmup", str(args.warmup),
            "--quiet-wait", str(args.quiet_wait),
            "--router-workers", "2",
        ]
    )  # fmt: skip
    bench = Bench(options)
    conns_list = [int(c) for c in args.connections.split(",")]
    headers = scoped_headers({"image": "CloudOne"})
    rows: list[dict[str, Any]] = []
    try:
        bench.choose_tools()
        bench.start_federation()
        one = bench.clouds["CloudOne"]
        upstream = f"http://{one.backend_host}:{one.small_port}"
        direct = Path("direct", 0, one.backend_host, one.small_port, ())
        proxies = [
            start_floor_proxy(bench, kind, n, upstream) for kind in ("mitm", "lean") for n in (1, 2)
        ]
        for path in (direct, *proxies):
            check(path, headers)
        for _ in range(args.rounds):
            for workers in (2, 1):
                if workers != bench.args.router_workers:
                    bench.stop_router("CloudOne")
                    bench.args.router_workers = workers
                    bench.start_router("CloudOne", "WARNING")
                router = Path(
                    "router",
                    workers,
                    one.router_host,
                    one.image_port,
                    (bench.routers["CloudOne"].pid,),
                )
                check(router, headers)
                paths = [direct, *proxies, router] if workers == 2 else [router]
                for conns in conns_list:
                    for path in paths:
                        rows.append(measure(bench, path, conns, headers))
    finally:
        bench.cleanup()
    return rows


def report(rows: list[dict[str, Any]], rounds: int) -> str:
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["path"], row["processes"], row["connections"]), []).append(row)
    direct = {
        conns: statistics.median(r["rps"] for r in group)
        for (path, _, conns), group in groups.items()
        if path == "direct"
    }
    direct_p50 = {
        conns: statistics.median(r["p50_ms"] for r in group)
        for (path, _, conns), group in groups.items()
        if path == "direct"
    }
    spread = rounds > 1
    head = (
        f"{'path':24} {'procs':>5} {'conns':>5} {'req/s':>8} {'x direct':>8} {'p50 ms':>8} "
        f"{'p50 added':>9} {'CPU us/req':>10} {'k instr/req':>11}"
    )
    if spread:
        head += f"  {'req/s min-max':>15}  {'CPU us/req min-max':>18}"
    lines = [head, "-" * len(head)]
    for conns in sorted(direct):
        for (path, procs, c), group in groups.items():
            if c != conns:
                continue
            rps = statistics.median(r["rps"] for r in group)
            p50 = statistics.median(r["p50_ms"] for r in group)
            cpus = [r["cpu_us_per_req"] for r in group if r["cpu_us_per_req"] is not None]
            cpu = statistics.median(cpus) if cpus else None
            counts = [r["instructions_per_req"] for r in group if r.get("instructions_per_req")]
            instr = statistics.median(counts) / 1000 if counts else None
            line = (
                f"{path:24} {procs or '':>5} {conns:>5} {rps:>8,.0f} {rps / direct[conns]:>8.3f} "
                f"{p50:>8.3f} "
                + (f"{p50 - direct_p50[conns]:>+9.3f}" if path != "direct" else f"{'':>9}")
                + (f" {cpu:>10,.0f}" if cpu is not None else f" {'':>10}")
                + (f" {instr:>11,.0f}" if instr is not None else f" {'':>11}")
            )
            if spread:
                line += (
                    f"  {min(r['rps'] for r in group):>7,.0f}-{max(r['rps'] for r in group):<7,.0f}"
                )
                if cpus:
                    line += f"  {min(cpus):>9,.0f}-{max(cpus):<8,.0f}"
            lines.append(line)
    busy = [r["machine_busy_cores"] for r in rows]
    lines.append(
        f"machine: whole-machine busy cores during the points {min(busy):.2f}-{max(busy):.2f} "
        "(2 cores; wrk, nginx and the proxy included)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    context = machine_context()
    try:
        rows = run(args)
    except (BenchError, subprocess.SubprocessError) as exc:
        say(f"error: {exc}")
        return 1
    cpus, loadavg = context.get("cpus"), context.get("loadavg_before")
    print(f"scoperouter bench.floor: {cpus} CPUs, load average before start {loadavg}")
    print(
        f"small GET {SMALL_PATH} (~100-byte JSON from nginx), keep-alive, wrk 1 thread, "
        f"{args.duration:g} s per point, {args.rounds} round(s); every proxy under python -O"
    )
    print(report(rows, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
