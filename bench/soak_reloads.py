"""The soak's reload verdict: "a reload never stalls requests in flight" (issue 21), computed from
the requests the generators recorded one by one around each SIGHUP (``around_reloads`` of
their interval lines, :mod:`bench.soak_traffic`).

**In flight at a reload**: a request due within :data:`WINDOW_S` (1 s) of a SIGHUP, before or
after it (the supervisor reads the config and the workers build the catalog in that time: the
old stall, fixed in 8323b3e, was 50-180 ms right after the signal).

**The verdict** on those requests, against the same run's requests outside every window:

* every one answered (none hung or unanswered);
* none waited :data:`SLOWEST_MS` (100 ms) or more: the old stall's size; the soak's requests
  outside reloads are answered in a few ms, so a request that waits 100 ms at a reload is a
  stall, not the machine's noise;
* their p99 is at most :data:`P99_RATIO_MAX` (2x) the p99 outside the windows, and at least
  :data:`P99_FLOOR_MS` (10 ms): a stall shorter than 100 ms that delays more than 1 % of the
  requests around the reloads (at 200 req/s, a 25 ms stall delays ~5 of the ~400 requests of a
  window) doubles their p99; the floor keeps a 1 ms p99 from turning 2-3 ms of scheduling noise
  into a MISS.

INCONCLUSIVE, with the reason: no reload sent, no request due in a window, no request answered
outside the windows (nothing to compare with), or a reload sent so far from its planned time
that the generators did not record all of its window (they record ``margin`` seconds around
the planned times, which they are given before the run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.report import Target
from bench.soak_traffic import merge, percentile

WINDOW_S = 1.0
SLOWEST_MS = 100.0
P99_RATIO_MAX = 2.0
P99_FLOOR_MS = 10.0
MARGIN_S = 2.0  # the generators record each request due this close to a planned reload

NAME = "a reload never stalls requests in flight"
GOAL = (
    f"requests due within {WINDOW_S:g} s of a SIGHUP: all answered, none >= {SLOWEST_MS:g} ms, "
    f"p99 <= max({P99_RATIO_MAX:g}x the p99 outside those windows, {P99_FLOOR_MS:g} ms)"
)


def verdict(
    intervals: Sequence[Mapping[str, Any]],
    interval: float,
    reloads: Sequence[Sequence[float]],
    margin: float = MARGIN_S,
) -> Target:
    """The row, from the merged interval lines (each with its ``hist`` and ``around_reloads``),
    the generators' `interval` (s) and `reloads`: ``(planned, sent)`` times of each SIGHUP, in
    seconds from the start of the traffic."""
    if not reloads:
        return Target(NAME, GOAL, "no reload sent", None)
    drifted = [sent for planned, sent in reloads if abs(sent - planned) + WINDOW_S > margin]
    if drifted:
        return Target(
            NAME,
            GOAL,
            f"{len(drifted)} of {len(reloads)} reloads sent more than "
            f"{margin - WINDOW_S:g} s off their planned time (first at {drifted[0]:.1f} s): "
            "their windows were not recorded whole",
            None,
        )
    sent = [s for _, s in reloads]
    around: list[float | None] = [
        ms
        for line in intervals
        for at, ms in line.get("around_reloads", [])
        if any(abs(at - t) <= WINDOW_S for t in sent)
    ]
    outside = merge(
        [
            line["hist"]
            for line in intervals
            if not any(
                line["index"] * interval < t + WINDOW_S
                and t - WINDOW_S < (line["index"] + 1) * interval
                for t in sent
            )
        ]
    )
    p99_outside = percentile(outside, 99)
    if not around:
        return Target(NAME, GOAL, f"{len(sent)} reloads, no request due in their windows", None)
    if p99_outside is None:
        return Target(NAME, GOAL, "no request answered outside the reloads' windows", None)
    answered = sorted(ms for ms in around if ms is not None)
    failed = len(around) - len(answered)
    limit = max(P99_RATIO_MAX * p99_outside, P99_FLOOR_MS)
    p99 = _p99(answered)
    slowest = answered[-1] if answered else None
    measured = (
        f"{len(around)} requests in the windows of {len(sent)} reloads: "
        + (f"{failed} unanswered, " if failed else "")
        + (
            f"p99 {p99:.1f} ms (limit {limit:.1f}: p99 outside {p99_outside:.1f}), "
            f"slowest {slowest:.1f} ms"
            if p99 is not None and slowest is not None
            else "none answered"
        )
    )
    ok = (
        not failed
        and p99 is not None
        and slowest is not None
        and slowest < SLOWEST_MS
        and p99 <= limit
    )
    return Target(NAME, GOAL, measured, ok)


def _p99(ordered: Sequence[float]) -> float | None:
    """The 99th percentile of sorted latencies (the rank bench.soak_traffic's uses)."""
    if not ordered:
        return None
    rank = max(1, -(-99 * len(ordered) // 100))  # ceil
    return ordered[rank - 1]
