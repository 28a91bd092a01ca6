"""The soak's verdict (``python -m bench.soak``): pure functions of what the run recorded.

:func:`merge_intervals` adds the generators' interval lines up; :func:`verdicts` turns a
:class:`Record` (intervals, resource samples, log findings, reloads, transfers) into PASS, MISS
or INCONCLUSIVE rows (a row nothing measured: it fails the run like a MISS); :func:`render`
prints the summary. Every threshold is here (and in bench/README.md).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench import soak_reloads
from bench.report import Target, fmt, table, targets_table
from bench.soak_traffic import CATEGORIES, HANG, NON_JSON, UNANSWERED, WRONG, merge, percentile

RSS_GROWTH_MAX = 0.10  # each router process's RSS, from the baseline to the end
P99_RATIO_MAX = 1.5  # the last window's p99 against the first's
WINDOW_SHARE = 1 / 6  # the p99 windows: the first and last 10 minutes of an hour
BASELINE_SHARE = 1 / 12  # the RSS baseline: minute 5 of an hour
FDS_SLACK = 10  # open files may end this many above the baseline window's median...
FDS_SLACK_SHARE = 0.10  # ... or this share of it, whichever is more
LATE_SHARE_MAX = 0.01  # requests the generator sent late
# A p99 window may leave out at most this share of its intervals (those in which the generator
# sent a request late) when its p99 with them misses; more, and the row is INCONCLUSIVE.
LEFT_OUT_SHARE_MAX = 1 / 3
EXAMPLES = 5
GENERATOR = "the generator held the rate"


def window(duration: float) -> float:
    """The length of the p99 windows: the first and last sixth of the run."""
    return duration * WINDOW_SHARE


def interval_for(duration: float) -> float:
    """The generators' interval: 10 s, or less so that a window holds at least 6."""
    return max(1.0, min(10.0, window(duration) / 6))


def schedule(duration: float, every: float, phase: float) -> list[float]:
    """When a periodic event happens within a run: every `every` seconds, the first at
    `phase` x `every` (reloads at half a period: 150 s, 450 s...; transfers at a quarter:
    75 s, 375 s...). A period that divides the p99 windows puts as many events in each."""
    if every <= 0:
        return []
    times = []
    t = phase * every
    while t < duration:
        times.append(t)
        t += every
    return times


def merge_intervals(lines: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The generators' interval lines added up by interval index, in order."""
    out: dict[int, dict[str, Any]] = {}
    for line in lines:
        index = int(line["index"])
        into = out.setdefault(
            index,
            {
                "index": index,
                "due": 0,
                "ok": 0,
                "late": 0,
                "late_max_ms": 0.0,
                "hist": Counter(),
                "problems": Counter(),
                "kinds": Counter(),
                "modes": Counter(),
                "new_connections": 0,
                "examples": [],
                "around_reloads": [],
            },
        )
        for key in ("due", "ok", "late", "new_connections"):
            into[key] += int(line.get(key, 0))
        into["late_max_ms"] = max(into["late_max_ms"], float(line.get("late_max_ms", 0.0)))
        into["hist"].update({int(k): int(v) for k, v in line.get("hist", {}).items()})
        for key in ("problems", "kinds", "modes"):
            into[key].update(line.get(key, {}))
        into["examples"] = (into["examples"] + list(line.get("examples", [])))[:EXAMPLES]
        into["around_reloads"] += line.get("around_reloads", [])
    return [out[i] for i in sorted(out)]


def window_hist(
    intervals: list[dict[str, Any]], interval: float, start: float, end: float
) -> Counter[int]:
    """The latency histogram of the intervals that start within [start, end)."""
    return merge([i["hist"] for i in intervals if start <= i["index"] * interval < end])


@dataclass
class LogFindings:
    """What one router's log held (its stderr: JSON lines)."""

    lines: int = 0
    tracebacks: int = 0
    errors: int = 0  # "level": "ERROR" (and CRITICAL)
    warnings: Counter[str] = field(default_factory=Counter)  # by message
    examples: list[str] = field(default_factory=list)

    def scan(self, line: str) -> None:
        self.lines += 1
        if "Traceback" in line:
            self.tracebacks += 1
            self._example(line)
        level = _level(line)
        if level in ("ERROR", "CRITICAL"):
            self.errors += 1
            self._example(line)
        elif level == "WARNING":
            self.warnings[_message(line)] += 1

    def _example(self, line: str) -> None:
        if len(self.examples) < EXAMPLES:
            self.examples.append(line.strip()[:600])

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "tracebacks": self.tracebacks,
            "errors": self.errors,
            "warnings": dict(self.warnings.most_common(20)),
            "examples": self.examples,
        }


def _level(line: str) -> str | None:
    for level in ("ERROR", "CRITICAL", "WARNING"):
        if f'"level":"{level}"' in line or f'"level": "{level}"' in line:
            return level
    return None


def _message(line: str) -> str:
    """A warning's message, its numbers blanked (counted together)."""
    import json

    try:
        text = str(json.loads(line).get("msg", line))
    except (ValueError, AttributeError):
        text = line
    return "".join("#" if c.isdigit() else c for c in text)[:160]


@dataclass
class Record:
    """Everything a run recorded (bench.soak fills it; the JSON file is its as_dict)."""

    duration: float  # seconds of traffic
    rate: float  # planned requests a second (all generators)
    interval: float  # the generators' interval, seconds
    baseline_t: float  # when the RSS and open-files baselines are taken
    workers: int
    intervals: list[dict[str, Any]] = field(default_factory=list)
    # every sample: {"t": s, "procs": {"CloudOne worker 123": {"rss_mb": .., "fds": ..}}, ...}
    samples: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, LogFindings] = field(default_factory=dict)
    reloads_sent: dict[str, int] = field(default_factory=dict)  # SIGHUPs, per router
    reload_times: list[tuple[float, float]] = field(default_factory=list)  # (planned, sent) s
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # per router, at the end
    transfers: list[dict[str, Any]] = field(default_factory=list)
    transfers_planned: int = 0
    late_ms: float = 100.0
    exit_codes: dict[str, int | None] = field(default_factory=dict)  # routers, on SIGTERM


def totals(record: Record) -> dict[str, Any]:
    due = sum(i["due"] for i in record.intervals)
    problems: Counter[str] = Counter()
    for i in record.intervals:
        problems.update(i["problems"])
    return {
        "due": due,
        "ok": sum(i["ok"] for i in record.intervals),
        "late": sum(i["late"] for i in record.intervals),
        "late_max_ms": max((i["late_max_ms"] for i in record.intervals), default=0.0),
        "problems": problems,
        "examples": [e for i in record.intervals for e in i["examples"]][:EXAMPLES],
        "new_connections": sum(i["new_connections"] for i in record.intervals),
    }


def _series(record: Record) -> dict[str, list[tuple[float, float, int]]]:
    """Each router process's (t, RSS MB, open files), in sample order."""
    out: dict[str, list[tuple[float, float, int]]] = {}
    for sample in record.samples:
        for name, values in sample["procs"].items():
            out.setdefault(name, []).append((sample["t"], values["rss_mb"], values["fds"]))
    return out


def rss_growth(record: Record) -> dict[str, tuple[float, float]]:
    """Each router process's RSS (MB) at the baseline and at the end: the first sample at or
    after the baseline, the last one. Processes not sampled at both are left out (a worker
    restarted meanwhile: the restarts have their own verdict)."""
    out = {}
    for name, points in _series(record).items():
        after = [p for p in points if p[0] >= record.baseline_t]
        if len(after) >= 2:
            out[name] = (after[0][1], after[-1][1])
    return out


def fds_windows(record: Record) -> dict[str, tuple[float, float]]:
    """Each router process's floor of open files (the fewest sampled) in the window after the
    baseline and in the last window of the run. A leak raises the floor; a burst of
    connections (a stall of the machine makes an open-loop client open more) raises the peaks
    for as long as the pools keep them idle, not the floor."""
    span = window(record.duration)
    out: dict[str, tuple[float, float]] = {}
    for name, points in _series(record).items():
        first = [p[2] for p in points if record.baseline_t <= p[0] <= record.baseline_t + span]
        last = [p[2] for p in points if record.duration - span <= p[0] <= record.duration]
        if first and last and points[0][0] <= record.baseline_t:
            out[name] = (min(first), min(last))
    return out


def p99_windows(record: Record, steady: bool = True) -> tuple[float | None, float | None, int]:
    """The p99 of the first and the last window, and how many intervals were left out: with
    `steady`, those in which the generator itself sent a request late (the machine stalled the
    client too: what the requests then measured is the machine, not the router)."""
    span = window(record.duration)
    kept = [i for i in record.intervals if not (steady and i["late"])]
    first = window_hist(kept, record.interval, 0, span)
    last = window_hist(kept, record.interval, record.duration - span, record.duration)
    left_out = sum(
        1
        for i in record.intervals
        if steady
        and i["late"]
        and not span <= i["index"] * record.interval < record.duration - span
    )
    return percentile(first, 99), percentile(last, 99), left_out


def left_out_shares(record: Record) -> tuple[tuple[int, int], tuple[int, int]]:
    """(intervals the generator was late in, intervals) of the first and of the last window."""
    span = window(record.duration)

    def count(start: float, end: float) -> tuple[int, int]:
        chosen = [i for i in record.intervals if start <= i["index"] * record.interval < end]
        return sum(1 for i in chosen if i["late"]), len(chosen)

    return count(0, span), count(record.duration - span, record.duration)


def p99_stable(record: Record) -> Target:
    """The last window's p99 against the first's. Judged on every request first: a pass
    there is a pass. When that misses, the intervals in which the generator itself sent a
    request late are left out (the machine stalled the client too) and the rest judged, but
    only while each window keeps more than 1 - LEFT_OUT_SHARE_MAX of its intervals: a
    regression that slows the machine makes the generator late too, and leaving its intervals
    out must not hide it (that row is INCONCLUSIVE, which fails the run)."""
    span = _minutes(window(record.duration))
    goal = f"last {span} <= {P99_RATIO_MAX}x first {span}"
    raw_first, raw_last, _ = p99_windows(record, steady=False)
    raw_ratio = raw_last / raw_first if raw_first and raw_last else None
    with_all = f"{fmt(raw_first)} -> {fmt(raw_last)} ms ({fmt(raw_ratio)}x)"
    name = "p99 stable"
    if raw_ratio is None:
        empty = " and ".join(w for w, p in (("first", raw_first), ("last", raw_last)) if not p)
        return Target(name, goal, f"{with_all}: no request answered in the {empty} window", None)
    if raw_ratio <= P99_RATIO_MAX:
        return Target(name, goal, with_all, True)
    first_p99, last_p99, left_out = p99_windows(record)
    (late_first, n_first), (late_last, n_last) = left_out_shares(record)
    shares = (
        f"the generator late in {late_first} of {n_first} intervals of the first window, "
        f"{late_last} of {n_last} of the last"
    )
    if not left_out:
        return Target(name, goal, with_all, False)
    if (
        late_first > LEFT_OUT_SHARE_MAX * n_first
        or late_last > LEFT_OUT_SHARE_MAX * n_last
        or not first_p99
        or not last_p99
    ):
        return Target(
            name,
            goal,
            f"{with_all} with every request; {shares}: too many to leave out "
            f"(> {LEFT_OUT_SHARE_MAX:.0%} of a window)",
            None,
        )
    ratio = last_p99 / first_p99
    return Target(
        name,
        goal,
        f"{fmt(first_p99)} -> {fmt(last_p99)} ms ({fmt(ratio)}x); {left_out} intervals left "
        f"out, {shares} (with them: {with_all})",
        ratio <= P99_RATIO_MAX,
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.0f} s"


def verdicts(record: Record) -> list[Target]:
    """The soak's assertions, each PASS, MISS or INCONCLUSIVE (nothing measured it)."""
    got = totals(record)
    problems: Counter[str] = got["problems"]
    due = got["due"]
    rows = []
    unanswered = problems[HANG] + problems[UNANSWERED] + problems[WRONG]
    rows.append(
        Target(
            "every request answered as it deserves",
            "0 hangs, 0 unanswered, 0 wrong",
            f"{due:,} requests, {got['ok']:,} ok; {problems[HANG]} hangs, "
            f"{problems[UNANSWERED]} unanswered, {problems[WRONG]} wrong"
            + ("" if due else ": no request sent"),
            unanswered == 0 if due else None,
        )
    )
    rows.append(
        Target(
            "error answers are the router's JSON",
            "0 non-JSON errors",
            f"{problems[NON_JSON]} non-JSON",
            problems[NON_JSON] == 0 if due else None,
        )
    )
    intact = sum(1 for t in record.transfers if t.get("ok"))
    rows.append(
        Target(
            "100 MiB transfers through two routers",
            "every one intact (SHA-256)",
            f"{intact} of {len(record.transfers)} intact ({record.transfers_planned} planned)"
            + ("" if record.transfers_planned else ": none planned"),
            (intact == len(record.transfers) == record.transfers_planned)
            if record.transfers_planned
            else None,
        )
    )
    tracebacks = sum(f.tracebacks for f in record.logs.values())
    errors = sum(f.errors for f in record.logs.values())
    failed = {name: code for name, code in record.exit_codes.items() if code != 0}
    stopped = (
        ", ".join(f"{name} exited {code}" for name, code in sorted(failed.items()))
        if failed
        else "stopped with status 0"
    )
    rows.append(
        Target(
            "routers' logs, and their stop",
            "0 tracebacks, 0 ERROR lines; exit 0 on SIGTERM",
            f"{tracebacks} tracebacks, {errors} ERROR lines; {stopped}"
            if record.logs
            else "no router log read",
            tracebacks == 0 and errors == 0 and not failed if record.logs else None,
        )
    )
    rows.append(_reloads(record))
    growth = rss_growth(record)
    if growth:
        name, (base, end) = max(growth.items(), key=lambda kv: kv[1][1] / kv[1][0])
        worst = end / base - 1
        measured = f"worst {worst:+.1%}: {name} {base:.1f} -> {end:.1f} MB"
    else:
        worst, measured = 0.0, "not sampled: no process sampled at the baseline and the end"
    rows.append(
        Target(
            "router RSS growth, each process",
            f"< {RSS_GROWTH_MAX:.0%} from {_minutes(record.baseline_t)} to the end",
            measured,
            worst < RSS_GROWTH_MAX if growth else None,
        )
    )
    fds = fds_windows(record)
    if fds:

        def excess(values: tuple[float, float]) -> float:
            first, last = values
            return last - first - max(FDS_SLACK, FDS_SLACK_SHARE * first)

        name, (first, last) = max(fds.items(), key=lambda kv: excess(kv[1]))
        measured = f"most grown: {name} {first:g} -> {last:g} (floors)"
    else:
        measured = "not sampled: no process sampled in the baseline and the last window"
    rows.append(
        Target(
            "open files, each router process",
            f"flat: last window's floor <= baseline window's + max({FDS_SLACK}, "
            f"{FDS_SLACK_SHARE:.0%})",
            measured,
            all(excess(v) <= 0 for v in fds.values()) if fds else None,
        )
    )
    rows.append(p99_stable(record))
    rows.append(soak_reloads.verdict(record.intervals, record.interval, record.reload_times))
    rows.append(_generator(record, got))
    return rows


def _reloads(record: Record) -> Target:
    sent = record.reloads_sent
    parts, ok = [], True
    for router, count in sorted(sent.items()):
        metrics = record.metrics.get(router, {})
        applied = metrics.get("reloads_ok")
        refused = metrics.get("reloads_refused", 0.0)
        restarts = metrics.get("worker_restarts", 0.0)
        want = count * record.workers
        ok = ok and applied == want and not refused and not restarts
        parts.append(
            f"{router} {count} sent, {fmt(applied, 0)}/{want} ok, {fmt(refused, 0)} refused, "
            f"{fmt(restarts, 0)} restarts"
        )
    return Target(
        "reloads (SIGHUP) applied, no worker lost",
        "every worker reloads, 0 refused, 0 restarts",
        "; ".join(parts) or "none sent",
        ok if sent and any(sent.values()) else None,
    )


def _generator(record: Record, got: Mapping[str, Any]) -> Target:
    planned = record.rate * record.duration
    due = got["due"]
    late_share = got["late"] / due if due else 0.0
    held = due >= 0.999 * planned and late_share <= LATE_SHARE_MAX
    return Target(
        GENERATOR,
        f"{record.rate:g} req/s, <= {LATE_SHARE_MAX:.0%} sent > {record.late_ms:g} ms late",
        f"{due / record.duration if record.duration else 0:,.1f} req/s sent; "
        f"{late_share:.2%} late, the latest {got['late_max_ms']:,.0f} ms"
        + ("" if due else ": no request sent"),
        held if due else None,
    )


def timeline(record: Record, rows: int = 12) -> list[dict[str, Any]]:
    """The run in `rows` equal segments: req/s, ok share, p50/p99, problems, late, and the
    routers' RSS and open files (sums of each router's processes) at the segment's end."""
    step = record.duration / rows
    out = []
    for n in range(rows):
        start, end = n * step, (n + 1) * step
        chosen = [i for i in record.intervals if start <= i["index"] * record.interval < end]
        hist = merge([i["hist"] for i in chosen])
        problems: Counter[str] = Counter()
        for i in chosen:
            problems.update(i["problems"])
        due = sum(i["due"] for i in chosen)
        sample = next((s for s in reversed(record.samples) if s["t"] <= end), None)
        before = next((s for s in reversed(record.samples) if s["t"] <= start), None)
        cpu = _cpu_between(before, sample)
        others = [
            s["others_cores"]
            for s in record.samples
            if start < s["t"] <= end and "others_cores" in s
        ]
        routers: dict[str, list[float]] = {}
        if sample is not None:
            for name, values in sample["procs"].items():
                router = name.split()[0]
                entry = routers.setdefault(router, [0.0, 0.0])
                entry[0] += values["rss_mb"]
                entry[1] += values["fds"]
        out.append(
            {
                "from_s": start,
                "to_s": end,
                "rps": due / step if step else 0.0,
                "ok": sum(i["ok"] for i in chosen),
                "due": due,
                "p50_ms": percentile(hist, 50),
                "p99_ms": percentile(hist, 99),
                "problems": sum(problems.values()),
                "late": sum(i["late"] for i in chosen),
                "others_cores": max(others, default=None),
                "router_cpu_us_per_req": cpu / due * 1e6 if cpu is not None and due else None,
                "routers": routers,
            }
        )
    return out


def _cpu_between(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> float | None:
    """The routers' CPU seconds (all of them, every process) between two samples."""
    if before is None or after is None or before is after:
        return None
    first, last = before.get("router_cpu_s", {}), after.get("router_cpu_s", {})
    if not first or set(first) != set(last):
        return None
    return float(sum(last[name] - first[name] for name in last))


def render(record: Record, rows: list[Target]) -> str:
    got = totals(record)
    lines = []
    segments = timeline(record)
    routers = sorted({r for s in segments for r in s["routers"]})
    headers = ["from", "to", "req/s", "ok %", "p50 ms", "p99 ms", "problems", "late", "others"]
    headers.append("CPU us/req")
    headers += [f"{r} RSS MB / fds" for r in routers]
    body = []
    for s in segments:
        cells = [clock(s["from_s"]), clock(s["to_s"]), fmt(s["rps"], 1)]
        cells.append(fmt(100 * s["ok"] / s["due"], 2) if s["due"] else "-")
        cells += [fmt(s["p50_ms"], 2), fmt(s["p99_ms"], 2), str(s["problems"]), str(s["late"])]
        cells.append(fmt(s["others_cores"], 2))
        cells.append(fmt(s["router_cpu_us_per_req"], 0))
        for r in routers:
            rss, fds = s["routers"].get(r, [float("nan"), float("nan")])
            cells.append(f"{fmt(rss, 1)} / {fmt(fds, 0)}")
        body.append(cells)
    lines.append(table(headers, body))
    lines.append(
        "(late: requests the generator sent more than "
        f"{record.late_ms:g} ms after they were due; others: the most cores the machine's other "
        "processes used between two samples, of " + str(os.cpu_count()) + "; CPU us/req: "
        "the routers' CPU time, every process of both, per request sent)"
    )
    lines.append("")
    lines.append(_per_kind(record))
    if got["examples"]:
        lines.append("\nFirst problems:")
        lines += [f"  {e}" for e in got["examples"]]
    lines.append("")
    lines.append(_processes(record))
    for router, findings in sorted(record.logs.items()):
        lines.append(
            f"\n{router}'s log: {findings.lines:,} lines, {findings.tracebacks} tracebacks, "
            f"{findings.errors} ERROR lines"
        )
        for message, count in findings.warnings.most_common(5):
            lines.append(f"  WARNING x{count}: {message}")
        lines += [f"  {e}" for e in findings.examples]
    if record.transfers:
        lines.append("\nTransfers (100 MiB through two routers):")
        for t in record.transfers:
            speed = f"{t['mb_per_s']:.0f} MB/s" if t.get("mb_per_s") else "-"
            mark = "intact" if t.get("ok") else "NOT INTACT"
            lines.append(
                f"  {clock(t['t'])} {t['direction']:8} {mark:10} {speed:>10}  {t['detail']}"
            )
    lines.append("")
    lines.append(targets_table(rows))
    if any(r.name == GENERATOR and r.ok is False for r in rows):
        lines.append(
            "\nThe generator fell behind: that MISS is the load generator's, not the router's "
            "(more --generators, or a quieter machine); the others are at the rate it sent."
        )
    return "\n".join(lines)


def _per_kind(record: Record) -> str:
    kinds: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    for i in record.intervals:
        kinds.update(i["kinds"])
        modes.update(i["modes"])
    total = sum(kinds.values()) or 1
    got = totals(record)
    mix = ", ".join(f"{k} {v / total:.0%}" for k, v in kinds.most_common())
    conns = ", ".join(f"{k} {v / total:.0%}" for k, v in modes.most_common())
    problems = ", ".join(f"{got['problems'][c]} {c}" for c in CATEGORIES)
    return (
        f"Requests: {got['due']:,} ({problems}); {got['new_connections']:,} new connections\n"
        f"  mix: {mix}\n  connections: {conns}"
    )


def _processes(record: Record) -> str:
    growth = rss_growth(record)
    fds = fds_windows(record)
    rows = []
    for name in sorted(set(growth) | set(fds)):
        base, end = growth.get(name, (float("nan"), float("nan")))
        first, last = fds.get(name, (float("nan"), float("nan")))
        change = end / base - 1 if base == base and base else float("nan")
        rows.append(
            [name, fmt(base, 1), fmt(end, 1), f"{change:+.1%}", fmt(first, 0), fmt(last, 0)]
        )
    return table(
        ["router process", "RSS MB at baseline", "at the end", "growth", "fds floor", "at the end"],
        rows,
    )


def clock(seconds: float) -> str:
    """m:ss"""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"
