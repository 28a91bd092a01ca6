"""The printed table and the targets (PASS, MISS or INCONCLUSIVE)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Targets on the reference machine (2 cores): docs in bench/README.md.
TARGET_RPS = 2500.0  # req/s through one cloud's router (2 workers), 50 connections
TARGET_HOP_P50_MS = 0.5  # added p50 latency per router hop at 1 connection
TARGET_LOG_COST = 0.03  # the per-request INFO log line's share of the router's work (issue 21)
TARGET_CATALOG_BUILD_S = 1.0  # building the catalog of 10,000 clouds x 10 services (issue 21)
CATALOG_BUILD_CLOUDS = 10_000
TARGET_DECISION_US = 5.0  # routing decision at 1000 clouds x 10 services
TARGET_RSS_MB = 100.0  # a router process's RSS during the 100 MB transfers


INCONCLUSIVE = "INCONCLUSIVE"  # a verdict nobody could compute: it fails the run like a MISS


def mark(ok: bool | None) -> str:
    """PASS, MISS, or INCONCLUSIVE when the row could not be computed (nothing run, not
    sampled, a window emptied): its `measured` says why."""
    if ok is None:
        return INCONCLUSIVE
    return "PASS" if ok else "MISS"


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A plain-text table; `align` has one 'l' or 'r' per column (default: first l, rest r)."""
    align = align or ("l" + "r" * (len(headers) - 1))
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.ljust(widths[i]) if align[i] == "l" else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def markdown_table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A markdown table (pastes into the docs as it is); `align` as for :func:`table`."""
    align = align or ("l" + "r" * (len(headers) - 1))
    rule = ["---:" if a == "r" else "---" for a in align]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [headers, rule, *rows])


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    ok: bool | None

    def row(self) -> list[str]:
        return [self.name, self.goal, self.measured, mark(self.ok)]


def as_dicts(targets: list[Target]) -> list[dict[str, str]]:
    """The rows for a bench's ``--json`` output: name, goal, measured, result."""
    return [
        {"name": t.name, "goal": t.goal, "measured": t.measured, "result": mark(t.ok)}
        for t in targets
    ]


def targets_table(targets: list[Target]) -> str:
    return table(
        ["target", "goal", "measured", "result"],
        [t.row() for t in targets],
        align="lllr",
    )


def overall(targets: list[Target]) -> bool | None:
    """A run's verdict: MISS (False) if a row missed, else INCONCLUSIVE (None) if a row could
    not be computed or there is no row at all, else PASS (True)."""
    if any(t.ok is False for t in targets):
        return False
    if not targets or any(t.ok is None for t in targets):
        return None
    return True


def not_passed(targets: list[Target]) -> list[str]:
    """One line per row that did not pass, with what it measured (the reason)."""
    if not targets:
        return [f"{INCONCLUSIVE}: no verdict computed (nothing ran)"]
    return [f"{mark(t.ok)}: {t.name}: {t.measured}" for t in targets if t.ok is not True]


def exit_status(targets: list[Target]) -> int:
    """The exit status of a run judged by `targets`: 0 only when every row is PASS."""
    return 0 if overall(targets) is True else 1
