"""``python -m bench.peers``: scoperouter against HAProxy + Lua, the design it improves on.

OpenStackoid routed scopes with HAProxy and a Lua script (``bench/haproxy.py``). In one run, in
front of the same nginx backend (~100-byte JSON for ``GET /v2/images``), with the same requests
(wrk, keep-alive, a scoped token on every request: ``{"image": "CloudOne"}``, the local cloud,
so every path ends at that backend):

* **direct**: the backend itself;
* **HAProxy + Lua**: Debian's haproxy, ``--haproxy-threads`` (1) threads, the scope script;
* **scoperouter**: CloudOne's router, ``scoperouter serve --workers 2``, ``python -O``, WARNING.

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
    python -m bench.peers --plot peers.json --svg peers.svg
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench import backend, floor, haproxy, peers_plot, report
from bench.build import line as build_line
from bench.build import measured_build
from bench.floor import Path as ProxyPath
from bench.machine import machine_context
from bench.options import parse_args as bench_args
from bench.procs import BenchError, free_port, interrupt_on_termination
from bench.render import _noise
from bench.run import SMALL_PATH, Bench, _get, say, scoped_headers
from scoperouter.http.pool import IDLE_SECONDS

DIRECT, HAPROXY, ROUTER = "direct", "HAProxy + Lua", "scoperouter"
PATHS = (DIRECT, HAPROXY, ROUTER)
# The targets of issue 21 on the 2-core machine, as ratios within one run.
TARGET_RPS_RATIO = 0.75  # the router's req/s >= 0.75x HAProxy + Lua's, at every concurrency
TARGET_P99_RATIO = 1.5  # the router's p99 <= 1.5x HAProxy's at 1,000 connections
TARGET_FLAT_COST = 1.2  # the router's CPU per request at 1,000 connections <= 1.2x at 50
FLAT_FROM = 50  # the concurrency the flat-cost target compares with
# Issue 31: the router's CPU per request <= 2.0x HAProxy's, at each of these concurrencies
TARGET_CPU_RATIO = 2.0
CPU_AT = (10, 50, 200)
# Issue 32: memory back to its baseline. The router's RSS (supervisor and workers), SETTLE_S
# seconds after the last point (its connections closed, nothing sent), against its RSS before the
# first: at most TARGET_RSS_GROWTH more (what a worker may keep: the allocator's arenas); a
# bigger growth is memory the run left behind. The wait outlasts the pool's idle time, after
# which the idle upstream connections the last point opened are closed (they are kept that long
# by design, and measuring before would count them as left behind).
SETTLE_S = IDLE_SECONDS + 5.0
TARGET_RSS_GROWTH = 0.10
# And no growth from round to round: the router's RSS after the most connections in the last
# round against the first round's (a leak grows with every round; memory kept by the allocator
# after a first crowd does not). Needs two rounds or more.
TARGET_ROUND_GROWTH = 0.02


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
    """The backend, HAProxy + Lua and CloudOne's router; returns the three paths and HAProxy's
    version. HAProxy's other cloud is CloudTwo's router (a scope naming CloudTwo goes there)."""
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
    return paths, found.version


def sanity_check(paths: list[ProxyPath]) -> None:
    """Every path answers from CloudOne's backend; the proxies send CloudTwo's scope on to
    CloudTwo (HAProxy's second backend entry, the router's remote route)."""
    for path in paths:
        floor.check(path, scoped_headers({"image": "CloudOne"}))
        if path.label != DIRECT:
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


# ---------------------------------------------------------------------- figures


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _field(row: dict[str, Any] | None, key: str) -> float | None:
    """A figure of a row that may be missing (a point not measured)."""
    return None if row is None else row.get(key)


def _per_round_ratio(
    group: list[dict[str, Any]], peers: list[dict[str, Any] | None], key: str
) -> float | None:
    """The median of each round's ratio of `key` to the same round's HAProxy row."""
    return _median([_ratio(r[key], _field(p, key)) for r, p in zip(group, peers, strict=True)])


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (connections, path): the medians across rounds, the spread of req/s, and
    the median of each round's ratios to HAProxy + Lua at the same point."""
    haproxy_rows = {(r["round"], r["connections"]): r for r in rows if r["path"] == HAPROXY}
    out = []
    for conns in sorted({r["connections"] for r in rows}):
        for path in PATHS:
            group = [r for r in rows if r["path"] == path and r["connections"] == conns]
            if not group:
                continue
            peers = [haproxy_rows.get((r["round"], conns)) for r in group]
            rss_rows = [r["rss_mb"] for r in group if r.get("rss_mb")]
            out.append(
                {
                    "path": path,
                    "connections": conns,
                    "rounds": len(group),
                    "rps": _median([r["rps"] for r in group]),
                    "rps_min": min(r["rps"] for r in group),
                    "rps_max": max(r["rps"] for r in group),
                    "p50_ms": _median([r["p50_ms"] for r in group]),
                    "p99_ms": _median([r["p99_ms"] for r in group]),
                    "cpu_us_per_req": _median([r["cpu_us_per_req"] for r in group]),
                    "instructions_per_req": _median([r["instructions_per_req"] for r in group]),
                    "rps_x_haproxy": _per_round_ratio(group, peers, "rps"),
                    "cpu_x_haproxy": _per_round_ratio(group, peers, "cpu_us_per_req"),
                    "p99_x_haproxy": _per_round_ratio(group, peers, "p99_ms"),
                    "rss_mb": rss_rows[-1] if rss_rows else None,  # after the last round's point
                    "errors": sum(r["errors"] for r in group),
                    "other_cpu_cores": max(r["other_cpu_cores"] for r in group),
                }
            )
    return out


def find(summary: list[dict[str, Any]], path: str, conns: int) -> dict[str, Any] | None:
    return next((s for s in summary if s["path"] == path and s["connections"] == conns), None)


def _judged(
    name: str,
    at_least: bool,
    limit: float,
    ratio: float | None,
    a: float | None,
    b: float | None,
    unit: str,
) -> report.Target:
    """A target on a ratio: `a` vs `b` are shown beside it (the router's figure and the other's)."""
    goal = f"{'>=' if at_least else '<='} {limit:g}x"
    if ratio is None or a is None or b is None:
        return report.Target(name, goal, "-", None)
    digits = 0 if unit == "req/s" else 1
    measured = f"{ratio:.2f}x ({a:,.{digits}f} vs {b:,.{digits}f} {unit})"
    return report.Target(name, goal, measured, ratio >= limit if at_least else ratio <= limit)


def targets(summary: list[dict[str, Any]]) -> list[report.Target]:
    """The issue's targets, judged on the summary (n/a when a point was not measured)."""
    out = []
    conns_list = sorted({s["connections"] for s in summary})
    for conns in conns_list:
        router, peer = find(summary, ROUTER, conns), find(summary, HAPROXY, conns)
        out.append(
            _judged(
                f"router req/s vs HAProxy + Lua, {conns:,} conns", True, TARGET_RPS_RATIO,
                _field(router, "rps_x_haproxy"), _field(router, "rps"), _field(peer, "rps"),
                "req/s",
            )
        )  # fmt: skip
    most = max(conns_list, default=0)
    router, peer = find(summary, ROUTER, most), find(summary, HAPROXY, most)
    out.append(
        _judged(
            f"router p99 vs HAProxy's, {most:,} conns", False, TARGET_P99_RATIO,
            _field(router, "p99_x_haproxy"), _field(router, "p99_ms"), _field(peer, "p99_ms"),
            "ms",
        )
    )  # fmt: skip
    flat = flat_cost(summary, ROUTER)
    out.append(
        _judged(
            f"router CPU/request at {most:,} conns vs at {FLAT_FROM}", False, TARGET_FLAT_COST,
            flat["ratio"], flat["at_most"], flat["at_from"], "µs",
        )
    )  # fmt: skip
    for conns in CPU_AT:  # judged whether measured or not: a point not measured is INCONCLUSIVE
        router, peer = find(summary, ROUTER, conns), find(summary, HAPROXY, conns)
        out.append(
            _judged(
                f"router CPU/request vs HAProxy's, {conns:,} conns", False, TARGET_CPU_RATIO,
                _field(router, "cpu_x_haproxy"), _field(router, "cpu_us_per_req"),
                _field(peer, "cpu_us_per_req"), "µs",
            )
        )  # fmt: skip
    return out


def memory_target(results: dict[str, Any]) -> report.Target:
    """The router's RSS SETTLE_S after the last point against before the first (INCONCLUSIVE
    when either was not sampled)."""
    name = f"router RSS {SETTLE_S:g} s after the last point vs before the run"
    goal = f"<= +{TARGET_RSS_GROWTH:.0%}"
    before = (results.get("rss_before") or {}).get(ROUTER) or {}
    settled = (results.get("rss_settled") or {}).get(ROUTER) or {}
    b, a = before.get("total"), settled.get("total")
    if not b or a is None:
        return report.Target(name, goal, "-", None)
    growth = a / b - 1
    measured = f"{growth:+.1%} ({_rss_text(before)} -> {_rss_text(settled)} MB)"
    return report.Target(name, goal, measured, a <= b * (1 + TARGET_RSS_GROWTH))


def rounds_target(rows: list[dict[str, Any]]) -> report.Target:
    """The router's RSS after the most connections in the last round against the first round's
    (INCONCLUSIVE with fewer than two rounds, or not sampled)."""
    name = "router RSS after the most connections, last round vs first (no growth per round)"
    goal = f"<= +{TARGET_ROUND_GROWTH:.0%}"
    router = [r for r in rows if r["path"] == ROUTER and (r.get("rss_mb") or {}).get("total")]
    most = max((r["connections"] for r in router), default=0)
    at_most = sorted((r for r in router if r["connections"] == most), key=lambda r: r["round"])
    if len(at_most) < 2:
        return report.Target(name, goal, "-", None)
    first, last = at_most[0]["rss_mb"], at_most[-1]["rss_mb"]
    growth = last["total"] / first["total"] - 1
    measured = (
        f"{growth:+.1%} ({_rss_text(first)} -> {_rss_text(last)} MB, rounds "
        f"{at_most[0]['round']} and {at_most[-1]['round']} at {most:,} conns)"
    )
    return report.Target(name, goal, measured, growth <= TARGET_ROUND_GROWTH)


def all_targets(results: dict[str, Any]) -> list[report.Target]:
    """Every target of the run: those on the summary, then memory."""
    return [
        *targets(results["summary"]),
        memory_target(results),
        rounds_target(results.get("rows") or []),
    ]


def flat_cost(summary: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """A proxy's CPU per request at the most connections against its figure at FLAT_FROM."""
    most = max((s["connections"] for s in summary), default=0)
    high, low = find(summary, path, most), find(summary, path, FLAT_FROM)
    at_most, at_from = _field(high, "cpu_us_per_req"), _field(low, "cpu_us_per_req")
    ratio = _ratio(at_most, at_from) if most > FLAT_FROM else None
    return {"connections": most, "at_most": at_most, "at_from": at_from, "ratio": ratio}


def _rss_text(rss_mb: dict[str, Any] | None) -> str:
    if not rss_mb or rss_mb.get("total") is None:
        return ""
    if not rss_mb["children"]:
        return f"{rss_mb['total']:,.0f}"
    workers = " / ".join(f"{c:,.0f}" for c in rss_mb["children"])
    return f"{rss_mb['total']:,.0f} (workers {workers})"


def _ratio_text(value: float | None, path: str) -> str:
    if path == HAPROXY:
        return "1"
    return f"{value:.2f}" if value is not None else ""


def table(summary: list[dict[str, Any]], rounds: int) -> str:
    headers = ["path", "conns", "req/s", "x HAProxy", "p50 ms", "p99 ms", "p99 x HAProxy"]
    headers += ["CPU µs/req", "RSS MB", "errors", "others' cores"]
    if rounds > 1:
        headers.append("req/s min-max")
    lines = []
    for s in summary:
        cpu = s["cpu_us_per_req"]
        line = [
            s["path"],
            f"{s['connections']:,}",
            f"{s['rps']:,.0f}",
            _ratio_text(s["rps_x_haproxy"], s["path"]),
            f"{s['p50_ms']:.3f}",
            f"{s['p99_ms']:.2f}",
            _ratio_text(s["p99_x_haproxy"], s["path"]),
            f"{cpu:,.1f}" if cpu is not None else "",
            _rss_text(s["rss_mb"]),
            str(s["errors"]),
            f"{s['other_cpu_cores']:.2f}",
        ]
        if rounds > 1:
            line.append(f"{s['rps_min']:,.0f}-{s['rps_max']:,.0f}")
        lines.append(line)
    return report.markdown_table(headers, lines, align="lrrrrrrrrrr" + "r" * (rounds > 1))


def memory_lines(results: dict[str, Any], most: int) -> list[str]:
    out = []
    before, after = results.get("rss_before", {}), results.get("rss_after", {})
    for path in (ROUTER, HAPROXY):
        b, a = before.get(path), after.get(path)
        if not b or not a or b["total"] is None or a["total"] is None:
            continue
        out.append(
            f"- {path} RSS: {_rss_text(b)} MB before the run, {_rss_text(a)} MB after the "
            f"{most:,}-connection point of the last round ({a['total'] - b['total']:+,.1f} MB)"
        )
    return out


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    summary = results["summary"]
    ctx, settings = results.get("context", {}), results.get("settings", {})
    most = max(args.conns)
    out = [
        "## scoperouter against HAProxy + Lua (`python -m bench.peers`)",
        "",
        f"- machine: {ctx.get('cpus')} CPUs ({ctx.get('cpu_model')}), load average before start "
        f"{ctx.get('loadavg_before')}; scoperouter {ctx.get('scoperouter')} "
        f"({ctx.get('commit') or 'no commit'})",
        f"- backend: {settings.get('backend_small')}; load: "
        f"{str(settings.get('load_generator')).replace(', 1 thread', '')}, "
        f"{args.wrk_threads} thread(s) (at most one per connection); open files limit (soft, "
        f"hard) {settings.get('open_files_limit')}",
        f"- HAProxy: {settings.get('haproxy')}",
        f"- router: {settings.get('router_command')}".replace("--cloud NAME", "--cloud CloudOne"),
        f"- build measured: {build_line(results.get('build') or {})}",
        f"- GET {SMALL_PATH}, keep-alive, scoped token (image: CloudOne) on every request; "
        f"{args.duration:g} s points after {args.warmup:g} s warm-up, {args.rounds} alternating "
        "round(s), medians",
        "",
        table(summary, args.rounds),
        "",
        "x HAProxy: the median of each round's ratio to HAProxy + Lua at the same point; CPU: "
        "the proxy's processes (the router's supervisor and workers, haproxy's threads) per "
        "request; RSS: after the point (the router: all its processes, and each worker); "
        "others' cores: the most the machine's other processes used during a point (2 cores)",
    ]
    noise = _noise(results["rows"])
    out += ["", *(f"- {line.strip()}" for line in noise)] if noise else []
    out.append("")
    for path in (ROUTER, HAPROXY):
        flat = flat_cost(summary, path)
        if flat["ratio"] is not None:
            out.append(
                f"- {path} CPU per request at {most:,} connections: {flat['at_most']:,.1f} µs, "
                f"{flat['ratio']:.2f}x its {FLAT_FROM}-connection figure "
                f"({flat['at_from']:,.1f} µs)"
            )
    out += memory_lines(results, most)
    out += ["", "### Targets (issues 21 and 31, ratios within this run)", ""]
    judged = all_targets(results)
    out.append(
        report.markdown_table(
            ["target", "goal", "measured", "result"], [t.row() for t in judged], align="lllr"
        )
    )
    out += ["", *report.not_passed(judged)] if report.overall(judged) is not True else []
    return "\n".join(out)


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
