"""``bench.wan``'s figures: a measured point and the table of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Point:
    path: str
    connection: str  # "new per request" or "open"
    concurrency: int
    requests: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    wan_handshakes_per_request: float
    statuses: dict[int, int]
    router_cpu_us: list[float] | None = None  # CPU per request of each router (all processes)


def render(result: dict[str, Any]) -> str:
    points = [Point(**p) for p in result["points"]]
    floor = {
        (p.path.split()[-1], p.concurrency): p.p50_ms
        for p in points
        if p.path.startswith("direct") and p.connection == "open"
    }
    fresh = {
        (p.path.split()[-1], p.concurrency): p.p50_ms
        for p in points
        if p.path.startswith("direct") and p.connection != "open"
    }
    lines = [
        "| path | connection | clients | p50 ms | p99 ms | WAN handshakes / request "
        "| p50 / floor (direct, open) | p50 / direct new connection | router CPU us/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        kind = "TLS" if "TLS" in p.path else "plain"
        base, new = floor.get((kind, p.concurrency)), fresh.get((kind, p.concurrency))
        ratio = f"{p.p50_ms / base:.2f}" if p.p50_ms and base else "-"
        ratio_new = f"{p.p50_ms / new:.2f}" if p.p50_ms and new else "-"
        lines.append(
            f"| {p.path} | {p.connection} | {p.concurrency} | {_ms(p.p50_ms)} | {_ms(p.p99_ms)} "
            f"| {p.wan_handshakes_per_request:g} | {ratio} | {ratio_new} "
            f"| {_cpu_text(p.router_cpu_us) if p.router_cpu_us else ''} |"
            + (f" {p.errors} errors" if p.errors else "")
        )
    merged = result.get("merged")
    if merged:
        lines += ["", *merged["target"]["lines"]]
    lines += [f"\n{note}" for note in result.get("notes", [])]
    return "\n".join(lines)


def _cpu_text(per_router: list[float]) -> str:
    """Each router's CPU per request; with more than two, CloudOne's + the others' in all."""
    if len(per_router) <= 2:
        return " + ".join(map(str, per_router))
    others = per_router[1:]
    return f"{per_router[0]} + {round(sum(others))} ({len(others)} routers)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
