"""The gates of the soak, chaos and kills runs: a row nobody could compute (nothing run, not
sampled, a p99 window emptied) is INCONCLUSIVE and fails the run like a MISS (issue 32).

Each test plants one such case in what a run recorded and checks the exit status the bench's
``main`` returns (:func:`bench.report.exit_status`) is 1; the clean runs beside it are 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench import chaos_verdict as cv
from bench import report, soak_traffic, soak_verdict
from bench.kills import DbRun, summary
from bench.report import INCONCLUSIVE, Target, exit_status, not_passed
from bench.test_bench import _record
from bench.test_chaos import clean_record


def _rows(record: soak_verdict.Record) -> dict[str, Target]:
    return {t.name: t for t in soak_verdict.verdicts(record)}


def test_a_clean_soak_exits_0() -> None:
    rows = soak_verdict.verdicts(_record())
    assert exit_status(rows) == 0 and not_passed(rows) == []


def _smoke_interval(index: int, slow_ms: float, slow: int, late: int) -> dict[str, Any]:
    """One 5 s interval of the CI's smoke (200 req/s): `slow` requests at `slow_ms`, the rest
    at 1 ms; `late` of them sent late by the generator."""
    hist = Counter({soak_traffic.bucket(1.0): 1000 - slow})
    hist[soak_traffic.bucket(slow_ms)] += slow
    line = {"index": index, "due": 1000, "ok": 1000, "late": late, "hist": hist}
    return soak_verdict.merge_intervals([line])[0]


def test_a_p99_regression_hidden_by_late_intervals_fails_the_soak() -> None:
    """The issue's case: p99 1 ms -> 505 ms in the last window with 0.02 % of the requests
    sent late (one in each of its intervals) gave `p99 stable: n/a` and exit 0."""
    lines = [_smoke_interval(i, 1.0, 0, 0) for i in range(30)]
    lines += [_smoke_interval(i, 505.0, 20, 1) for i in range(30, 36)]
    record = _record(duration=180, rate=200, interval=5, intervals=lines)
    assert sum(i["late"] for i in record.intervals) / (200 * 180) < 0.0002
    row = _rows(record)["p99 stable"]
    assert report.mark(row.ok) == INCONCLUSIVE, row
    assert "late in 0 of 6 intervals of the first window, 6 of 6 of the last" in row.measured
    assert exit_status(soak_verdict.verdicts(record)) == 1
    assert any(line.startswith("INCONCLUSIVE: p99 stable: ") for line in not_passed([row]))
    # late in 2 of the 6: the 4 others are judged, and still show the regression
    lines[-6:] = [_smoke_interval(i, 505.0, 20, int(i < 32)) for i in range(30, 36)]
    record = _record(duration=180, rate=200, interval=5, intervals=lines)
    assert report.mark(_rows(record)["p99 stable"].ok) == "MISS"
    # the same late intervals without a regression: a pass on every request
    lines[-6:] = [_smoke_interval(i, 1.0, 0, 1) for i in range(30, 36)]
    record = _record(duration=180, rate=200, interval=5, intervals=lines)
    assert _rows(record)["p99 stable"].ok is True


def test_an_empty_p99_window_fails_the_soak() -> None:
    record = _record()
    record.intervals = [i for i in record.intervals if i["index"] >= 2]  # no first window
    row = _rows(record)["p99 stable"]
    assert row.ok is None and "no request answered in the first window" in row.measured
    assert exit_status(soak_verdict.verdicts(record)) == 1


def test_unsampled_rss_and_open_files_fail_the_soak() -> None:
    record = _record(samples=[])
    rows = _rows(record)
    for name in ("router RSS growth, each process", "open files, each router process"):
        assert rows[name].ok is None and rows[name].measured.startswith("not sampled"), name
    assert exit_status(list(rows.values())) == 1


def test_a_soak_that_sent_nothing_fails() -> None:
    record = _record(
        intervals=[], samples=[], logs={}, reloads_sent={}, transfers=[], transfers_planned=0
    )
    rows = soak_verdict.verdicts(record)
    assert {t.name for t in rows if t.ok is None} == {t.name for t in rows}
    assert exit_status(rows) == 1
    assert "INCONCLUSIVE: every request answered as it deserves" in "\n".join(not_passed(rows))


def test_an_empty_chaos_run_fails() -> None:
    """No request, no operation, no fault (broker repair ran and found nothing): exit 1."""
    record = cv.Record(duration=180, deadline=60, seed=1)
    record.repair = {"orphans": [], "missing": [], "unchecked": [], "errors": []}
    rows = cv.verdicts(record)
    assert [t.name for t in rows if t.ok is None] == [
        "every client request ended in time",
        "errors are clean JSON",
        "every broker operation ended",
        "routers' and brokers' logs",
        "the faults happened",
    ]
    assert exit_status(rows) == 1
    assert "INCONCLUSIVE: the faults happened: 0 done (): none planned" in not_passed(rows)
    assert exit_status(cv.verdicts(clean_record())) == 0


def test_an_empty_or_unjudged_kills_run_fails() -> None:
    passed = [Target("x", "goal", "fine", True)]
    assert summary([DbRun("sqlite", rows=passed)])[0] == 0
    # a database whose run computed no row, a row not computed, no database at all
    for runs in (
        [DbRun("sqlite", rows=passed), DbRun("postgresql")],
        [DbRun("sqlite", rows=[*passed, Target("y", "goal", "nothing measured", None)])],
        [],
    ):
        status, lines = summary(runs)
        assert status == 1, runs
        assert INCONCLUSIVE in "\n".join(lines)
