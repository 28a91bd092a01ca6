"""bench.peers' run drawn as an SVG (``--svg``, ``--plot``): req/s and the CPU time per request
against connections, the router beside HAProxy + Lua and the direct path.

Drawn from the run's JSON (the ``summary`` rows ``--json`` writes) with matplotlib's
object-oriented API and its SVG canvas: no pyplot, no display, no global backend. Each path's
line carries an SVG id (``rps-<path>``, ``cpu-<path>``: :func:`series_id`), so a page or a test
can find it. matplotlib is the bench extra's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.peers_verdict import DIRECT, FLOOR, HAPROXY, PATHS, ROUTER

STYLE = {  # path (bench.peers' PATHS) -> (colour, marker)
    DIRECT: ("#7f7f7f", "s"),
    HAPROXY: ("#1f77b4", "o"),
    FLOOR: ("#2ca02c", "^"),
    ROUTER: ("#d62728", "D"),
}


def series_id(kind: str, path: str) -> str:
    """The SVG id of a path's line: ``rps-haproxy-lua``, ``cpu-scoperouter``..."""
    return f"{kind}-" + re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _points(summary: list[dict[str, Any]], path: str, key: str) -> tuple[list[int], list[float]]:
    """(connections, figure) of `path` where `key` was measured, by connections."""
    rows = sorted((s for s in summary if s["path"] == path), key=lambda s: s["connections"])
    kept = [(s["connections"], s[key]) for s in rows if s.get(key) is not None]
    return [c for c, _ in kept], [float(v) for _, v in kept]


def draw(results: dict[str, Any], target: Path) -> None:
    """Write the run of `results` (bench.peers' JSON) to `target` as an SVG."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    summary: list[dict[str, Any]] = results["summary"]
    conns = sorted({int(s["connections"]) for s in summary})
    if not conns:
        raise ValueError("the run has no point")
    figure = Figure(figsize=(11, 4.4), layout="constrained")
    FigureCanvasSVG(figure)
    rps_axes, cpu_axes = figure.subplots(1, 2)
    panels = (
        (rps_axes, "rps", "rps", "requests per second"),
        (cpu_axes, "cpu", "cpu_us_per_req", "CPU µs per request (the proxy's processes)"),
    )
    for axes, kind, key, label in panels:
        for path in PATHS:
            xs, ys = _points(summary, path, key)
            if not xs:  # the direct path has no proxy CPU
                continue
            colour, marker = STYLE.get(path, ("#000000", "o"))
            axes.plot(xs, ys, marker=marker, color=colour, label=path, gid=series_id(kind, path))
        axes.set_xscale("log")
        axes.xaxis.set_major_locator(FixedLocator(conns))
        axes.xaxis.set_minor_locator(NullLocator())
        axes.set_xticklabels([f"{c:,}" for c in conns])
        axes.set_xlabel("connections (wrk, keep-alive)")
        axes.set_ylabel(label)
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize="small")
    rps_axes.set_title("req/s (median of the rounds)")
    cpu_axes.set_title("CPU per request (median of the rounds)")
    context = results.get("context") or {}
    build = (results.get("build") or {}).get("build", "unknown")
    figure.suptitle(
        f"bench.peers: scoperouter {context.get('scoperouter', '?')} "
        f"({context.get('commit') or 'no commit'}, {build} build) beside HAProxy + Lua, "
        f"{context.get('cpus', '?')} CPUs"
    )
    # Text as text (not glyph outlines), and no date and no random ids in the file: the same
    # run draws the same SVG.
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "bench.peers"}):
        figure.savefig(target, format="svg", metadata={"Date": None})
