"""``bench.wan``'s targets (issues 11 and 21) computed from the points a run measured: pure
functions, no I/O, no root.

The targets, over the 50 ms link (25 ms each way), CloudOne's router reached by a client opening
a new connection per request, TLS between the routers (the point ``routers, TLS between``):

* p50 <= 55 ms at 1 client, and at 20 clients;
* at 20 clients, p50 <= 1.05x the one-round-trip floor of the same run (the direct TLS
  connection kept open, at 20 clients);
* 0 WAN handshakes per request in steady state (after the warm-up) at every number of clients.

Each row holds for every run of ``--repeat N`` ("in 5 runs of 5": ``--repeat 5``); its
``measured`` lists the runs' figures. A row is INCONCLUSIVE when the run could not compute it:
the point not measured (``--concurrency`` without 1 or 20, ``--between`` without tls), not at
the target's setting (another ``--delay-ms``), no warm-up (``--warmup 0``: not steady state),
a point that answered nothing. A point with errors or a non-2xx answer misses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.report import Target

TARGET_DELAY_MS = 25.0  # each way: the 50 ms link
TARGET_P50_MS = 55.0
FLOOR_RATIO_MAX = 1.05
FLOOR_CLIENTS = 20
ROUTED = "routers, TLS between"
FLOOR = "direct TLS"

Point = Mapping[str, Any]


def _point(points: Sequence[Point], path: str, connection: str, clients: int) -> Point | None:
    for p in points:
        if p["path"] == path and p["connection"] == connection and p["concurrency"] == clients:
            return p
    return None


def _failed(p: Point) -> str | None:
    """Why a point's requests did not all succeed, or None."""
    bad = sum(int(n) for status, n in p.get("statuses", {}).items() if not 200 <= int(status) < 300)
    if p.get("errors") or bad:
        return f"{p.get('errors', 0)} errors, {bad} non-2xx of {p['requests'] + p.get('errors', 0)}"
    return None


def _runs(parts: list[str]) -> str:
    return ", ".join(parts) + (f" ({len(parts)} runs)" if len(parts) > 1 else "")


def _setting(delay_ms: float, warmup: int | None, steady: bool = False) -> str | None:
    if delay_ms != TARGET_DELAY_MS:
        return f"not judged: {delay_ms:g} ms each way, the target is at {TARGET_DELAY_MS:g}"
    if steady and warmup == 0:
        return "not judged: --warmup 0, no steady state"
    return None


def p50_target(runs: Sequence[Sequence[Point]], clients: int, delay_ms: float) -> Target:
    name = f"p50, {clients} client{'' if clients == 1 else 's'}, TLS between routers"
    goal = f"<= {TARGET_P50_MS:g} ms over the 50 ms link, new connection per request"
    parts: list[str] = []
    oks: list[bool | None] = []
    for points in runs:
        p = _point(points, ROUTED, "new per request", clients)
        if p is None or p.get("p50_ms") is None:
            parts.append("not measured" if p is None else "no answer")
            oks.append(None)
            continue
        failed = _failed(p)
        parts.append(f"{p['p50_ms']:.1f} ms" + (f" ({failed})" if failed else ""))
        oks.append(failed is None and p["p50_ms"] <= TARGET_P50_MS)
    return _row(name, goal, parts, oks, _setting(delay_ms, None))


def floor_target(runs: Sequence[Sequence[Point]], delay_ms: float) -> Target:
    name = f"{FLOOR_CLIENTS} clients against the floor"
    goal = (
        f"p50 <= {FLOOR_RATIO_MAX:g}x the same run's one round trip "
        f"({FLOOR}, open connection, {FLOOR_CLIENTS} clients)"
    )
    parts: list[str] = []
    oks: list[bool | None] = []
    for points in runs:
        p = _point(points, ROUTED, "new per request", FLOOR_CLIENTS)
        floor = _point(points, FLOOR, "open", FLOOR_CLIENTS)
        if p is None or floor is None or not p.get("p50_ms") or not floor.get("p50_ms"):
            parts.append("not measured" if p is None or floor is None else "no answer")
            oks.append(None)
            continue
        ratio = p["p50_ms"] / floor["p50_ms"]
        failed = _failed(p)
        parts.append(
            f"{ratio:.3f}x ({p['p50_ms']:.1f} / {floor['p50_ms']:.1f} ms)"
            + (f" ({failed})" if failed else "")
        )
        oks.append(failed is None and ratio <= FLOOR_RATIO_MAX)
    return _row(name, goal, parts, oks, _setting(delay_ms, None))


def handshakes_target(
    runs: Sequence[Sequence[Point]], delay_ms: float, warmup: int | None
) -> Target:
    name = "WAN handshakes per request, steady state"
    goal = "0 at every number of clients, after the warm-up"
    parts: list[str] = []
    oks: list[bool | None] = []
    for points in runs:
        routed = [p for p in points if p["path"] == ROUTED and p["connection"] == "new per request"]
        if not routed or any(not p["requests"] for p in routed):
            parts.append("not measured" if not routed else "no answer")
            oks.append(None)
            continue
        parts.append(
            " / ".join(f"{p['wan_handshakes_per_request']:g} at {p['concurrency']}" for p in routed)
        )
        oks.append(all(p["wan_handshakes_per_request"] == 0 for p in routed))
    return _row(name, goal, parts, oks, _setting(delay_ms, warmup, steady=True))


def _row(
    name: str, goal: str, parts: list[str], oks: list[bool | None], setting: str | None
) -> Target:
    if not parts:
        return Target(name, goal, "no run", None)
    measured = _runs(parts)
    if setting is not None:
        return Target(name, goal, f"{measured}; {setting}", None)
    if any(ok is False for ok in oks):
        return Target(name, goal, measured, False)
    if any(ok is None for ok in oks):
        return Target(name, goal, measured, None)
    return Target(name, goal, measured, True)


def merged_target(runs: Sequence[Mapping[str, Any]]) -> Target | None:
    """The issue-21 merged-list target of ``--clouds N`` runs (:mod:`bench.wan_clouds`), or
    None without ``--clouds``: its "n/a" (not at 10 clouds, 25 ms) is INCONCLUSIVE here."""
    merged = [r.get("merged") for r in runs]
    if not any(merged):
        return None
    verdicts = [m["target"]["verdict"] if m else "n/a" for m in merged]
    ok: bool | None
    if "MISS" in verdicts:
        ok = False
    elif all(v == "PASS" for v in verdicts):
        ok = True
    else:
        ok = None
    return Target(
        "merged list (issue 21)",
        "p50 <= 60 ms, 10 clouds, 25 ms each way",
        _runs([v if v != "n/a" else "not judged (not 10 clouds at 25 ms)" for v in verdicts]),
        ok,
    )


def targets(runs: Sequence[Mapping[str, Any]], delay_ms: float, warmup: int | None) -> list[Target]:
    """Every target's row over `runs` (each a run's result: its ``points``)."""
    points = [list(r.get("points", [])) for r in runs]
    rows = [
        p50_target(points, 1, delay_ms),
        p50_target(points, FLOOR_CLIENTS, delay_ms),
        floor_target(points, delay_ms),
        handshakes_target(points, delay_ms, warmup),
    ]
    merged = merged_target(runs)
    return rows + ([merged] if merged is not None else [])
