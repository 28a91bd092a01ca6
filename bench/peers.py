"""``python -m bench.peers``: scoperouter against HAProxy + Lua, the design it improves on.

OpenStackoid routed scopes with HAProxy and a Lua script (``bench/haproxy.py``). In one run, in
front of the same nginx backend (~100-byte JSON for ``GET /v2/images``), with the same requests
(wrk, keep-alive, a scoped token on every request: ``{"image": "CloudOne"}``, the local cloud,
so every path ends at that backend):

* **direct**: the backend itself;
* **HAProxy + Lua**: Debian's haproxy, ``--haproxy-threads`` (1) threads, the scope script;
* **scoperouter**: CloudOne's router, ``scoperouter serve --workers 2``, ``python -O``, WARNING;
* with ``--floor``, **lean floor**: ``bench.floor``'s lean httptools proxy (parse, forward over
  a pooled connection, answer: no routing, no log, no limits) on the router workers' event
  loop, in as many processes as the router has workers: the least a Python proxy on this
  machine costs, measured in the same rounds (no target is judged on it).

At 1, 10, 50, 200 and 1,000 connections, in alternating rounds (each round measures every path
at a point, then the next point; medians across rounds): req/s, p50, p99, the CPU time the proxy
spent per request (all its processes), its RSS, and the ratios to HAProxy + Lua in the same
round; the build measured (compiled or pure); then the targets of issues 21 and 31, PASS, MISS
or INCONCLUSIVE (see bench/README.md): the exit status is 0 only when every one passed.
``--svg`` draws the run (req/s and CPU per request against connections, each path); ``--plot``
draws an earlier run from its ``--json``, without running anything.

    python -m bench.peers                     # ~6 minutes: 3 rounds of 5 s points
    python -m bench.peers --quick             # ~1 minute: 1 round of 2 s points
    python -m bench.peers --haproxy-threads 2 --json peers.json --svg peers.svg
    python -m bench.peers --floor --connections 10,50,200
    python -m bench.peers --plot peers.json --svg peers.svg
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench import backend, floor, haproxy, peers_plot, report
from bench.build import measured_build
from bench.floor import Path as ProxyPath
from bench.machine import machine_context
from bench.options import parse_args as bench_args
from bench.peers_verdict import (
    DIRECT,
    FLOOR,
    HAPROXY,
    ROUTER,
    SETTLE_S,
    all_targets,
    flat_cost,
    render,
    summarize,
)
from bench.procs import BenchError, free_port, interrupt_on_termination
from bench.run import SMALL_PATH, Bench, _get, say, scoped_headers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s points (~1 minute)")
    parser.add_argument("--duration", type=float, help="seconds per point (default 5, quick 2)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up (default 1, quick 0.5)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3, quick 1)")
    parser.add_argument("--connections", default="1,10,50,200,1000")
    parser.add_argument("--router-workers", type=int, default=2)
    parser.add_argument("--haproxy-threads", type=int, choices=(1, 2), default=1)
    parser.add_argument(
        "--wrk-threads",
        type=int,
        default=1,
        help="wrk's threads (at most one per connection); on 2 cores each takes a core's "
        "share from the proxy",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument(
        "--svg",
        metavar="FILE",
        help="also draw the run as an SVG: req/s and CPU per request against connections",
    )
    parser.add_argument(
        "--plot",
        metavar="JSON",
        help="run nothing: draw the run a --json FILE holds into --svg (default: JSON's name "
        "with .svg)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure bench.floor's lean httptools proxy (no routing) on the router's "
        "loop, one process per router worker: what any Python proxy costs here",
    )
    parser.add_argument("--quiet-wait", type=float, default=10.0, metavar="S")
    parser.add_argument("--quiet-cores", type=float, default=0.2)
    parser.add_argument("--no-apt", action="store_true", help="never call apt-get")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (configs, logs)")
    args = parser.parse_args(argv)
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.conns = sorted({int(c) for c in args.connections.split(",") if c.strip()})
    if not args.conns or min(args.conns) < 1:
        parser.error("--connections: positive counts, comma-separated")
    return args


def raise_fd_limit(connections: int) -> tuple[int, int]:
    """Raise this process's limit on open files (its children inherit it: wrk, nginx, the
    routers, haproxy) to what `connections` clients need at every hop and HAProxy's maxconn
    asks for: the soft limit within the hard one, and the hard one too as root. Returns
    (soft, hard) after."""
    need = max(8 * connections + 1024, 2 * haproxy.maxconn_for(connections) + 1024)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need and os.geteuid() == 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, need))
            hard = need
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def rss(pid: int) -> dict[str, Any]:
    """RSS (MB) of a proxy: its process, each child (a router's workers) and the total."""
    try:
        proc = psutil.Process(pid)
        mine = proc.memory_info().rss / 2**20
        children = []
        for child in sorted(proc.children(recursive=True), key=lambda c: c.pid):
            with contextlib.suppress(psutil.Error):
                children.append(child.memory_info().rss / 2**20)
    except psutil.Error:
        return {"total": None, "main": None, "children": []}
    return {"total": mine + sum(children), "main": mine, "children": children}


def start_paths(bench: Bench, args: argparse.Namespace) -> tuple[list[ProxyPath], str]:
    """The backend, HAProxy + Lua, CloudOne's router (and the lean floor with ``--floor``);
    returns the paths and HAProxy's version. HAProxy's other cloud is CloudTwo's router (a
    scope naming CloudTwo goes there)."""
    found = haproxy.ensure_haproxy(not args.no_apt, say)
    if found is None:
        raise BenchError("haproxy is not installed (apt-get install haproxy) and could not be")
    bench.choose_tools()
    bench.start_federation()
    one, two = bench.clouds["CloudOne"], bench.clouds["CloudTwo"]
    listen = (haproxy.HOST, free_port(haproxy.HOST))
    backends = {
        "CloudOne": (one.backend_host, one.small_port),
        "CloudTwo": (two.router_host, two.image_port),
    }
    say(f"starting HAProxy + Lua ({args.haproxy_threads} thread(s)) on {listen[0]}:{listen[1]}")
    proc = haproxy.start(
        bench.procs,
        found,
        listen,
        "CloudOne",
        "image",
        backends,
        threads=args.haproxy_threads,
        maxconn=haproxy.maxconn_for(max(args.conns)),
    )
    paths = [
        ProxyPath(DIRECT, 0, one.backend_host, one.small_port, ()),
        ProxyPath(HAPROXY, args.haproxy_threads, *listen, (proc.pid,)),
        ProxyPath(
            ROUTER, args.router_workers, one.router_host, one.image_port,
            (bench.routers["CloudOne"].pid,),
        ),
    ]  # fmt: skip
    if args.floor:
        upstream = f"http://{one.backend_host}:{one.small_port}"
        lean = floor.start_floor_proxy(bench, "lean", args.router_workers, upstream)
        paths.insert(2, ProxyPath(FLOOR, lean.processes, lean.host, lean.port, lean.pids))
    return paths, found.version


def sanity_check(paths: list[ProxyPath]) -> None:
    """Every path answers from CloudOne's backend; the proxies send CloudTwo's scope on to
    CloudTwo (HAProxy's second backend entry, the router's remote route)."""
    for path in paths:
        floor.check(path, scoped_headers({"image": "CloudOne"}))
        if path.label not in (DIRECT, FLOOR):  # the floor does not route
            headers = scoped_headers({"image": "CloudTwo"})
            status, body = _get(path.host, path.port, "GET", SMALL_PATH, headers)
            if status != 200 or not backend.check_small(body, "CloudTwo"):
                raise BenchError(f"{path.label}: a CloudTwo scope got {status} {body[:200]!r}")


def make_bench(args: argparse.Namespace) -> Bench:
    """A Bench (processes, work dir, tools, federation) set as this run's options say."""
    options = [
        "--duration", str(args.duration),
        "--warmup", str(args.warmup),
        "--quiet-wait", str(args.quiet_wait),
        "--quiet-cores", str(args.quiet_cores),
        "--router-workers", str(args.router_workers),
        "--connections", args.connections,
    ]  # fmt: skip
    options += ["--no-apt"] * args.no_apt + ["--keep"] * args.keep
    return Bench(bench_args(options))


def run(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Start every path, check them, measure the rounds; the rows and the RSS figures."""
    headers = scoped_headers({"image": "CloudOne"})
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {"rows": rows}
    paths, version = start_paths(bench, args)
    sanity_check(paths)
    router_pid = bench.routers["CloudOne"].pid
    haproxy_pid = paths[1].pids[0]
    results["settings"] = {
        **bench.results["settings"],
        "haproxy": f"{version}, {args.haproxy_threads} thread(s), Lua scope script",
        "haproxy_config": (bench.workdir / "haproxy.cfg").read_text(),
        "lua_script": haproxy.LUA_SCRIPT,
        "open_files_limit": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    }
    results["rss_before"] = {ROUTER: rss(router_pid), HAPROXY: rss(haproxy_pid)}
    # the build the routers import (their interpreter, flags and environment)
    python = [sys.executable, *bench.args.router_python_flags.split()]
    results["build"] = measured_build(python, bench._sub_env())
    for round_ in range(1, args.rounds + 1):
        for conns in args.conns:
            # alternate the order too: a drift within a point's minute falls on each path
            for path in paths if round_ % 2 else paths[::-1]:
                threads = min(args.wrk_threads, conns)
                row = floor.measure(bench, path, conns, headers, threads)
                row["round"] = round_
                row["wrk_threads"] = threads
                row["rss_mb"] = rss(path.pids[0]) if path.pids else None
                rows.append(row)
    results["rss_after"] = {ROUTER: rss(router_pid), HAPROXY: rss(haproxy_pid)}
    say(f"idle for {SETTLE_S:g} s, then the RSS again (memory back to its baseline?)")
    time.sleep(SETTLE_S)
    results["rss_settled"] = {ROUTER: rss(router_pid), HAPROXY: rss(haproxy_pid)}
    for proc in bench.procs.procs:
        if not proc.alive():
            raise BenchError(f"{proc.name} died during the run: {proc.log_tail()}")
    return results


def plot(args: argparse.Namespace) -> int:
    """``--plot JSON``: draw an earlier run (its --json) into --svg; nothing runs."""
    source = Path(args.plot)
    try:
        results = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        say(f"error: cannot read {source}: {exc}")
        return 1
    target = Path(args.svg) if args.svg else source.with_suffix(".svg")
    try:
        peers_plot.draw(results, target)
    except (KeyError, TypeError, ValueError) as exc:
        say(f"error: {source} is not a run of bench.peers (--json): {exc!r}")
        return 1
    say(f"drawn into {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        return plot(args)
    started = time.monotonic()
    soft, hard = raise_fd_limit(max(args.conns))
    if soft < 2 * haproxy.maxconn_for(max(args.conns)) + 1024:
        say(
            f"warning: open files limited to {soft} (hard {hard}): haproxy (maxconn "
            f"{haproxy.maxconn_for(max(args.conns))}), wrk or the router may fail; raise "
            "`ulimit -n` or run as root"
        )
    say("measuring what else the machine is doing (1 s)")
    context = machine_context()
    bench = make_bench(args)
    atexit.register(bench.procs.stop_all)
    interrupt_on_termination()
    try:
        results = run(bench, args)
    except (BenchError, subprocess.SubprocessError) as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted: stopping the bench's processes")
        return 130
    finally:
        bench.cleanup()
    results["context"] = context
    results["summary"] = summarize(results["rows"])
    results["targets"] = [vars(t) for t in all_targets(results)]
    results["flat_cost"] = {p: flat_cost(results["summary"], p) for p in (ROUTER, HAPROXY)}
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["args"] = vars(args)
    print(render(results, args))
    print(f"\n(bench took {results['elapsed_s']:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
        say(f"figures written to {args.json}")
    if args.svg:
        peers_plot.draw(results, Path(args.svg))
        say(f"the run drawn into {args.svg}")
    return report.exit_status(all_targets(results))


if __name__ == "__main__":
    sys.exit(main())
