"""The bench's printed report: one function per part, and the targets table."""

from __future__ import annotations

import argparse
from typing import Any

from bench import backend, report
from bench.run import PATH_LABELS, SMALL_PATH


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    targets: list[report.Target] = []
    parts = [
        _header(results, args),
        _http(results, args, targets),
        _log_cost(results, targets),
        _decision(results, targets),
        _transfers(results, targets),
    ]
    out = [part for part in parts if part]
    if targets:
        out.append("targets (this machine: 2 cores)\n" + report.targets_table(targets))
    return "\n\n".join(out)


def find(rows: list[dict[str, Any]], path: str, conns: int) -> dict[str, Any] | None:
    for row in rows:
        if row["path"] == path and row["connections"] == conns:
            return row
    return None


def _header(results: dict[str, Any], args: argparse.Namespace) -> str:
    ctx = results.get("context", {})
    settings = results.get("settings", {})
    out = [
        "scoperouter bench",
        f"machine: {ctx.get('cpus')} CPUs ({ctx.get('cpu_model')}), {ctx.get('memory_gib')} GiB, "
        f"{ctx.get('os')}; Python {ctx.get('python')}, mitmproxy {ctx.get('mitmproxy')}, "
        f"scoperouter {ctx.get('scoperouter')} ({ctx.get('commit') or 'no commit'})",
    ]
    if args.router_pythonpath:
        out.append(f"VARIANT: scoperouter from {ctx.get('scoperouter_path')}")
    others = ", ".join(
        f"pid {o['pid']} {o['cpu_pct']:.0f}% {o['cmd'][:40]}"
        for o in ctx.get("busy_processes_before", [])
    )
    out.append(
        f"load before start: loadavg {ctx.get('loadavg_before')}, {ctx.get('busy_pct_before')}% "
        f"busy over 1 s" + (f" ({others})" if others else "")
    )
    if settings:
        out.append(f"load generator: {settings.get('load_generator')}")
        out.append(f"small backend: {settings.get('backend_small')}")
        out.append(f"routers: {settings.get('router_command')}")
    return "\n".join(out)


def _http_row(row: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    direct = find(rows, "direct", row["connections"])
    routed = row["path"] != "direct"
    vs = row["rps"] / direct["rps"] if direct and direct["rps"] else None
    p50_add = row["p50_ms"] - direct["p50_ms"] if direct else None
    cpu = row["router_cpu_us_per_req"]
    return [
        row["path"],
        str(row["connections"]),
        f"{row['rps']:,.0f}",
        f"{vs:.3f}" if vs is not None and routed else "1",
        f"{row['p50_ms']:.3f}",
        f"{row['p99_ms']:.3f}",
        f"+{p50_add:.3f}" if routed and p50_add is not None else "",
        " + ".join(f"{v:,.0f}" for v in cpu.values() if v is not None),
        " / ".join(f"{v:.0f}" for v in row["router_rss_mb"].values()),
        f"{row['machine_busy_cores']:.2f} ({row['other_cpu_cores']:.2f})",
        str(row.get("error_count", sum(row["errors"].values()))),
    ]


def _http(results: dict[str, Any], args: argparse.Namespace, targets: list[report.Target]) -> str:
    rows = results.get("http", [])
    if not rows:
        return ""
    workers = results.get("settings", {}).get("router_workers", "?")
    out = [
        f"[1] small requests: GET {SMALL_PATH} (~100-byte JSON), keep-alive, {args.duration:g} s "
        f"per point after {args.warmup:g} s warm-up; scope on the token and in X-Scope; each "
        f"router runs {workers} worker processes",
        "    one router = CloudOne's router, image scoped to CloudOne (local backend); "
        "two routers = CloudOne's router -> CloudTwo's router -> CloudTwo's backend",
        report.table(
            [
                "path",
                "conns",
                "req/s",
                "x direct",
                "p50 ms",
                "p99 ms",
                "p50 added",
                "router CPU us/req",
                "router RSS MB",
                "busy cores (others)",
                "errors",
            ],
            [_http_row(row, rows) for row in rows],
        ),
        "    router CPU us/req: CPU time of each router on the path per request, all its "
        "processes (CloudOne + CloudTwo); router RSS: its largest process after the point; "
        "busy cores: the whole machine during the point, (others) = not the bench's processes",
    ]
    out += _noise(rows)
    out += _hop_targets(rows, targets)
    out += _throughput_target(rows, workers, targets)
    return "\n".join(out)


def _noise(rows: list[dict[str, Any]]) -> list[str]:
    noisy = max(r["other_cpu_cores"] for r in rows)
    if noisy <= 0.25:
        return []
    out = [
        f"    WARNING: other processes used up to {noisy:.2f} cores during these points "
        "(2 cores in all): absolute figures are low and noisy; compare ratios, rerun on a quiet "
        "machine"
    ]
    seen: dict[str, int] = {}
    for r in rows:
        for o in r.get("other_busy_processes", []):
            seen[o["cmd"]] = max(seen.get(o["cmd"], 0), o["cpu_pct"])
    if seen:
        busiest = sorted(seen.items(), key=lambda x: -x[1])[:4]
        out.append("    busiest other processes: " + "; ".join(f"{c} ({v}%)" for c, v in busiest))
    return out


def _hop_targets(rows: list[dict[str, Any]], targets: list[report.Target]) -> list[str]:
    d1, r1, t1 = (find(rows, p, 1) for p in PATH_LABELS)
    if not d1:
        return []
    lines, hops = [], []
    if r1:
        hops.append(r1["p50_ms"] - d1["p50_ms"])
        lines.append(f"one router: +{hops[-1]:.3f} ms")
    if t1:
        hops.append((t1["p50_ms"] - d1["p50_ms"]) / 2)
        extra = f"; second hop alone +{t1['p50_ms'] - r1['p50_ms']:.3f} ms" if r1 else ""
        lines.append(f"two routers: +{hops[-1]:.3f} ms per hop{extra}")
    if not hops:
        return []
    targets.append(
        report.Target(
            "added p50 per hop, 1 connection",
            f"<= {report.TARGET_HOP_P50_MS:g} ms",
            " / ".join(f"{h:.3f} ms" for h in hops) + " (one router / per hop of two)",
            max(hops) <= report.TARGET_HOP_P50_MS,
        )
    )
    return ["    added p50 per hop at 1 connection: " + "; ".join(lines)]


def _throughput_target(
    rows: list[dict[str, Any]], workers: object, targets: list[report.Target]
) -> list[str]:
    max_conns = max(r["connections"] for r in rows)
    out = []
    r50 = find(rows, "one router", max_conns)
    if r50:
        cpu_us = r50["router_cpu_us_per_req"].get("CloudOne")
        cap = f", CPU per request {cpu_us:,.0f} us" if cpu_us else ""
        out.append(
            f"    one router at {max_conns} connections: {r50['rps']:,.0f} req/s, "
            f"{r50['router_cpu_cores']['CloudOne']:.2f} cores used by its {workers} workers{cap}"
        )
        targets.append(
            report.Target(
                f"req/s through one cloud's router ({workers} workers)",
                f">= {report.TARGET_RPS:,.0f}",
                f"{r50['rps']:,.0f} ({max_conns} conns)",
                r50["rps"] >= report.TARGET_RPS,
            )
        )
    t50 = find(rows, "two routers", max_conns)
    if t50:
        cpus = t50["router_cpu_us_per_req"]
        out.append(
            f"    two routers at {max_conns} connections: {t50['rps']:,.0f} req/s through the "
            "chain (both routers, wrk and the backend share 2 cores); router CPU per request: "
            + ", ".join(f"{n} {v:,.0f} us" for n, v in cpus.items() if v)
        )
    return out


def _log_cost(results: dict[str, Any], targets: list[report.Target]) -> str:
    cost = results.get("log_cost")
    if not cost:
        return ""
    lost = 1 - cost["rps_info"] / cost["rps_warning"] if cost["rps_warning"] else float("nan")
    info_i, warn_i = cost.get("instructions_info"), cost.get("instructions_warning")
    extra = 1 - warn_i / info_i if info_i and warn_i else None
    info_c, warn_c = cost.get("cpu_us_info"), cost.get("cpu_us_warning")
    extra_cpu = 1 - warn_c / info_c if info_c and warn_c else None
    # The goal is on throughput. A router at capacity serves its cores / its CPU per request,
    # so the throughput the line costs it is the share of CPU time per request (user + system,
    # every process of the router: the kernel's cost of writing the line included) the line
    # adds, INFO and WARNING alternating. User-space instructions (perf) leave the write(2) out,
    # and req/s at one load point moves by more than the line costs on a machine others use:
    # both are shown, neither judges. No CPU measured: INCONCLUSIVE.
    rps_part = f"{lost:.1%} of req/s ({cost['rps_info']:,.0f} vs {cost['rps_warning']:,.0f})"
    if extra_cpu is not None:
        measured = f"{extra_cpu:.1%} of CPU per request; " + rps_part
    else:
        measured = "CPU per request not measured; " + rps_part
    if extra is not None:
        measured += f"; {extra:.1%} of user-space instructions"
    targets.append(
        report.Target(
            "the INFO access line's share of the router's CPU per request",
            f"<= {report.TARGET_LOG_COST:.0%}",
            measured,
            extra_cpu <= report.TARGET_LOG_COST if extra_cpu is not None else None,
        )
    )
    rounds = cost.get("rounds", 1)
    line = (
        f"[1b] the per-request log line: one router, {cost['connections']} connections, "
        f"INFO and WARNING alternating, {rounds} point(s) each (medians): "
        f"{cost['rps_info']:,.0f} vs {cost['rps_warning']:,.0f} req/s ({lost:+.1%} lost), "
        f"router CPU {report.fmt(cost['cpu_us_info'], 0)} vs "
        f"{report.fmt(cost['cpu_us_warning'], 0)} us/req"
    )
    if "rps_info_all" in cost:
        line += (
            "\n    req/s per point: INFO "
            + ", ".join(f"{v:,.0f}" for v in cost["rps_info_all"])
            + "; WARNING "
            + ", ".join(f"{v:,.0f}" for v in cost["rps_warning_all"])
        )
    if extra is not None:
        line += (
            f"\n    router instructions per request: {info_i / 1000:,.0f}k at INFO vs "
            f"{warn_i / 1000:,.0f}k at WARNING: the line is {extra:.1%} of the router's work"
        )
    return line


def _decision(results: dict[str, Any], targets: list[report.Target]) -> str:
    dec = results.get("decision", [])
    if not dec:
        return ""
    builds = {b["clouds"]: b for b in results.get("catalog_builds", [])}
    rows = []
    for d in dec:
        b = builds.get(d["clouds"])
        # The target is for requests of a running session; a new scope's first request is
        # shown for information.
        targeted = d["clouds"] >= 1000 and not (
            "cache miss" in d["case"] or "new" in d["case"] or "refused" in d["case"]
        )
        ok = d["us_per_decision"] <= report.TARGET_DECISION_US if targeted else None
        rows.append(
            [
                f"{d['clouds']} x {d['services']}",
                d["case"],
                f"{d['us_per_decision']:.2f}",
                f"{d['us_median']:.2f}",
                f"{d['iterations']:,}",
                d["outcome"],
                f"{b['build_ms']:.0f}" if b else "",
                report.mark(ok) if ok is not None else "",
            ]
        )
    typical = next(
        (
            d
            for d in dec
            if d["clouds"] >= 1000 and d["case"].startswith("scoped, image on another")
        ),
        None,
    )
    if typical:
        targets.append(
            report.Target(
                "routing decision, 1000 clouds",
                f"<= {report.TARGET_DECISION_US:g} us",
                f"{typical['us_per_decision']:.2f} us (scoped, cross-cloud)",
                typical["us_per_decision"] <= report.TARGET_DECISION_US,
            )
        )
    large = results.get("catalog_build_large")
    if large:
        targets.append(
            report.Target(
                f"catalog build, {large['clouds']:,} clouds x 10 services",
                f"<= {report.TARGET_CATALOG_BUILD_S:g} s",
                f"{large['best_s']:.2f} s of CPU (median {large['median_s']:.2f})",
                large["best_s"] <= report.TARGET_CATALOG_BUILD_S,
            )
        )
    headers = ["clouds x services", "case", "us best", "us median", "calls", "decided"]
    return "\n".join(
        [
            "[2] routing decision alone: scoperouter.routing.decide(), GET /v2/images?limit=20 "
            "on the image frontend, the client plugin's complete 5-service scope on the token "
            "and in X-Scope; best of 5 timings",
            report.table([*headers, "catalog build ms", "<=5us"], rows, align="llrrrlrr"),
        ]
    )


def _transfers(results: dict[str, Any], targets: list[report.Target]) -> str:
    transfers = results.get("transfers", [])
    if not transfers:
        return ""
    size_mb = transfers[0]["size"] / 2**20
    rows = []
    peak_all = 0.0
    for t in transfers:
        direct = next(
            (x for x in transfers if x["direction"] == t["direction"] and x["path"] == "direct"),
            None,
        )
        vs = t["mb_per_s"] / direct["mb_per_s"] if direct else None
        routed = t["path"] != "direct"
        if routed:
            peak_all = max(peak_all, *t["rss_peak_mb"].values())
        rows.append(
            [
                t["direction"],
                t["path"],
                f"{t['seconds']:.2f}",
                f"{t['mb_per_s'] * 1e6 / 2**20:,.0f}",
                f"{vs:.2f}" if vs is not None and routed else "1",
                " / ".join(f"{v:.0f}" for v in t["rss_before_mb"].values()) if routed else "",
                " / ".join(f"{v:.0f}" for v in t["rss_peak_mb"].values()) if routed else "",
            ]
        )
    targets.append(
        report.Target(
            f"router process RSS during {size_mb:.0f} MiB transfers",
            f"<= {report.TARGET_RSS_MB:g} MB",
            f"{peak_all:.0f} MB peak",
            peak_all <= report.TARGET_RSS_MB,
        )
    )
    headers = ["transfer", "path", "seconds", "MiB/s", "x direct"]
    return "\n".join(
        [
            f"[3] large bodies: {size_mb:.0f} MiB PUT and GET on object-store, scoped to "
            f"CloudTwo, entering at CloudOne's router; backend: {backend.BIG_HINT}",
            report.table(
                [*headers, "router RSS before MB", "router RSS peak MB"], rows, align="llrrrrr"
            ),
            "    RSS: the largest process of CloudOne / CloudTwo's router, sampled every 10 ms",
        ]
    )
