"""``bench.peers``'s figures: the rounds summarized (medians, ratios to HAProxy + Lua within
each round), the targets judged on them, and the report."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench import report
from bench.build import line as build_line
from bench.render import _noise
from bench.run import SMALL_PATH
from scoperouter.http.pool import IDLE_SECONDS

DIRECT, HAPROXY, ROUTER = "direct", "HAProxy + Lua", "scoperouter"
# --floor: bench.floor's lean httptools proxy (no routing) on the router's loop, as many
# processes as the router has workers: the least a Python proxy costs here (judged on nothing)
FLOOR = "lean floor"
PATHS = (DIRECT, HAPROXY, FLOOR, ROUTER)
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
                    "rest_us_per_req": _median([r.get("rest_us_per_req") for r in group]),
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
    headers += ["CPU µs/req", "backend + load µs/req", "RSS MB", "errors", "others' cores"]
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
            f"{rest:,.1f}" if (rest := s.get("rest_us_per_req")) is not None else "",
            _rss_text(s["rss_mb"]),
            str(s["errors"]),
            f"{s['other_cpu_cores']:.2f}",
        ]
        if rounds > 1:
            line.append(f"{s['rps_min']:,.0f}-{s['rps_max']:,.0f}")
        lines.append(line)
    return report.markdown_table(headers, lines, align="lrrrrrrrrrrr" + "r" * (rounds > 1))


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
        f"- build measured: {build_line(results.get('build') or {})}; "
        f"interpreter: {ctx.get('interpreter') or 'not recorded'}",
        f"- GET {SMALL_PATH}, keep-alive, scoped token (image: CloudOne) on every request; "
        f"{args.duration:g} s points after {args.warmup:g} s warm-up, {args.rounds} alternating "
        "round(s), medians",
        "",
        table(summary, args.rounds),
        "",
        "x HAProxy: the median of each round's ratio to HAProxy + Lua at the same point; CPU: "
        "the proxy's processes (the router's supervisor and workers, haproxy's threads) per "
        "request; backend + load: the CPU per request of the backend (nginx) and the load "
        "generator (wrk), the same on every path but for how often the proxy wakes them; "
        "RSS: after the point (the router: all its processes, and each worker); "
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
