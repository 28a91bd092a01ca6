"""The gates of the soak, chaos and kills runs: a row nobody could compute (nothing run, not
sampled, a p99 window emptied) is INCONCLUSIVE and fails the run like a MISS (issue 32).

Each test plants one such case in what a run recorded and checks the exit status the bench's
``main`` returns (:func:`bench.report.exit_status`) is 1; the clean runs beside it are 0.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import broker, report, soak_reloads, soak_traffic, soak_verdict, wan, wan_verdict
from bench import chaos_verdict as cv
from bench.kills import DbRun, summary
from bench.load import LoadResult
from bench.report import INCONCLUSIVE, Target, exit_status, not_passed
from bench.test_chaos import clean_record
from bench.test_soak import _record


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


# --- bench.wan: the targets of the default run (bench/wan_verdict.py) ----------------------


def _wan_point(path: str, connection: str, clients: int, p50: float, **more: Any) -> dict[str, Any]:
    point = {
        "path": path,
        "connection": connection,
        "concurrency": clients,
        "requests": 200,
        "errors": 0,
        "p50_ms": p50,
        "p99_ms": p50 + 1,
        "wan_handshakes_per_request": 0.0,
        "statuses": {"200": 200},
        "router_cpu_us": None,
    }
    return {**point, **more}


def _wan_run(p50_20: float = 53.0, handshakes_20: float = 0.0) -> dict[str, Any]:
    """One default run's points (direct floor, both transports between the routers)."""
    points = []
    for c in (1, 20):
        for kind in ("plain", "TLS"):
            points.append(_wan_point(f"direct {kind}", "open", c, 51.2 if c == 1 else 52.0))
            points.append(_wan_point(f"direct {kind}", "new per request", c, 102.7))
    for between in ("plain", "TLS"):
        for c, p50, syn in ((1, 52.4, 0.0), (20, p50_20, handshakes_20)):
            points.append(
                _wan_point(
                    f"routers, {between} between",
                    "new per request",
                    c,
                    p50,
                    wan_handshakes_per_request=syn,
                )
            )
    return {"points": points, "notes": []}


def _wan_rows(runs: list[dict[str, Any]], **kw: Any) -> dict[str, Target]:
    rows = wan_verdict.targets(runs, kw.get("delay_ms", 25.0), kw.get("warmup"))
    return {t.name: t for t in rows}


def test_wan_targets_pass_on_a_good_run() -> None:
    rows = _wan_rows([_wan_run()] * 5)
    assert [report.mark(t.ok) for t in rows.values()] == ["PASS"] * 4, rows
    floor = rows["20 clients against the floor"]
    assert floor.measured.startswith("1.019x (53.0 / 52.0 ms)") and "(5 runs)" in floor.measured
    assert exit_status(list(rows.values())) == 0


def test_wan_targets_miss_the_floor_the_p50_and_the_handshakes() -> None:
    """One run of five at 55.5 ms, 1.07x the floor, with handshakes at 20 clients: the 5-of-5
    rows miss; at 1 client it still passes."""
    rows = _wan_rows([_wan_run()] * 4 + [_wan_run(p50_20=55.5, handshakes_20=0.18)])
    assert rows["p50, 1 client, TLS between routers"].ok is True
    assert rows["p50, 20 clients, TLS between routers"].ok is False
    assert rows["20 clients against the floor"].ok is False
    assert "1.067x" in rows["20 clients against the floor"].measured
    hs = rows["WAN handshakes per request, steady state"]
    assert hs.ok is False and "0.18 at 20" in hs.measured
    assert exit_status(list(rows.values())) == 1
    # a point whose requests failed misses, whatever its p50
    run = _wan_run()
    run["points"][-1].update(errors=3, statuses={"200": 190, "502": 7})
    row = _wan_rows([run])["p50, 20 clients, TLS between routers"]
    assert row.ok is False and "3 errors, 7 non-2xx of 203" in row.measured


def test_wan_targets_not_measured_are_inconclusive() -> None:
    """`--concurrency 1` alone, `--between plain`, another delay, no warm-up, no run."""
    one_client = {"points": [p for p in _wan_run()["points"] if p["concurrency"] == 1]}
    rows = _wan_rows([one_client])
    assert rows["p50, 1 client, TLS between routers"].ok is True
    for name in ("p50, 20 clients, TLS between routers", "20 clients against the floor"):
        assert rows[name].ok is None and rows[name].measured == "not measured", name
    assert exit_status(list(rows.values())) == 1
    plain = {"points": [p for p in _wan_run()["points"] if "TLS between" not in p["path"]]}
    assert all(t.ok is None for t in _wan_rows([plain]).values())
    rows = _wan_rows([_wan_run()], delay_ms=10.0)
    assert all(t.ok is None and "not judged: 10 ms each way" in t.measured for t in rows.values())
    row = _wan_rows([_wan_run()], warmup=0)["WAN handshakes per request, steady state"]
    assert row.ok is None and "--warmup 0" in row.measured
    assert {t.measured for t in _wan_rows([]).values()} == {"no run"}
    assert not_passed(wan_verdict.targets([], 25.0, None))[0].startswith(INCONCLUSIVE)


def test_wan_merged_target_of_clouds_runs() -> None:
    def merged(verdict: str) -> dict[str, Any]:
        return {**_wan_run(), "merged": {"target": {"verdict": verdict, "lines": []}}}

    def row(verdict: str) -> Target:
        return _wan_rows([merged(verdict)])["merged list (issue 21)"]

    assert row("PASS").ok is True and row("MISS").ok is False
    assert row("n/a").ok is None and "not judged" in row("n/a").measured
    assert "merged list (issue 21)" not in _wan_rows([_wan_run()])


# --- bench.broker: the goal (>= 1,000 req/s, p99 < 50 ms at 1,000 req/s offered) -----------


def _load(rps: float = 5000.0, p99: float = 30.0, errors: int = 0) -> LoadResult:
    return LoadResult(
        "wrk", 100, int(rps * 8), 8.0, rps, 2.0, 5.0, p99, p99 + 10, 3.0,
        {"status 500": errors} if errors else {},
    )  # fmt: skip


def _broker_rows(
    capacity: list[LoadResult], offered: list[LoadResult], **kw: Any
) -> dict[str, Target]:
    rows = broker.goal_targets(
        "last_operation",
        capacity,
        offered,
        kw.get("rate", 1000.0),
        kw.get("connections", 100),
        kw.get("database", "sqlite"),
    )
    return {t.name.split(": ")[1]: t for t in rows}


def test_broker_goal_passes() -> None:
    rows = _broker_rows([_load(), _load(4945.0)], [_load(), _load(p99=39.2)])
    assert [t.ok for t in rows.values()] == [True, True, True]
    assert rows["capacity"].measured == "slowest of 2 run(s) 4,945.0 req/s"
    assert rows["p99"].measured == "worst of 2 run(s) 39.2 ms"
    assert exit_status(list(rows.values())) == 0


def test_broker_goal_misses() -> None:
    """One slow run, one p99 over 50 ms, one error: each row misses on its own."""
    rows = _broker_rows([_load(), _load(900.0)], [_load(), _load(p99=58.0, errors=1)])
    assert [t.ok for t in rows.values()] == [False, False, False]
    assert rows["errors"].measured == "1 in 2 closed-loop + 2 offered run(s)"
    assert exit_status(list(rows.values())) == 1


def test_broker_goal_not_computed_is_inconclusive() -> None:
    rows = _broker_rows([], [])  # --repeat 0
    assert [t.ok for t in rows.values()] == [None, None, None]
    assert exit_status(list(rows.values())) == 1
    rows = _broker_rows([_load()], [_load(p99=float("nan"))])
    assert rows["p99"].ok is None and rows["capacity"].ok is True
    # not at the goal's setting: measured, not judged
    rows = _broker_rows([_load()], [_load()], rate=500.0)
    assert rows["p99"].ok is None and "500 req/s offered" in rows["p99"].measured
    assert rows["capacity"].ok is True
    rows = _broker_rows([_load()], [_load()], connections=10, database="postgresql")
    assert rows["capacity"].ok is None and rows["p99"].ok is None
    assert "10 connections, not 100; on postgresql, not SQLite" in rows["capacity"].measured


# --- bench.soak: a reload never stalls requests in flight (bench/soak_reloads.py) ----------


def _reload_row(record: soak_verdict.Record) -> Target:
    return _rows(record)[soak_reloads.NAME]


def test_reloads_that_stall_nothing_pass() -> None:
    record = _record()
    row = _reload_row(record)
    assert row.ok is True, row
    # 2 x 201 requests within 1 s of the two SIGHUPs (of the 2 x 401 recorded within 2 s); the
    # p99 outside the windows is the 5 ms bucket (5.2): the limit is twice it
    assert row.measured.startswith("402 requests in the windows of 2 reloads: p99 1.5 ms")
    assert "(limit 10.3: p99 outside 5.2), slowest 1.5 ms" in row.measured


def test_a_stall_at_a_reload_misses() -> None:
    # one request 150 ms late at the second reload: over the 100 ms bound
    record = _record()
    record.intervals[9]["around_reloads"][200][1] = 150.0
    row = _reload_row(record)
    assert row.ok is False and row.measured.endswith("slowest 150.0 ms"), row
    assert exit_status(soak_verdict.verdicts(record)) == 1
    # a 30 ms stall on 2 % of them: under 100 ms, but their p99 triples the limit
    record = _record()
    for k in range(196, 204):
        record.intervals[3]["around_reloads"][k][1] = 30.0
    row = _reload_row(record)
    assert row.ok is False and "p99 30.0 ms (limit 10.3" in row.measured, row
    # a request that got no answer
    record = _record()
    record.intervals[3]["around_reloads"][210][1] = None
    row = _reload_row(record)
    assert row.ok is False and "1 unanswered" in row.measured, row
    # the same 150 ms request 1.5 s from the reload is not in its window
    record = _record()
    record.intervals[9]["around_reloads"][50][1] = 150.0  # due at 43.5 s, the SIGHUP at 45.01
    assert _reload_row(record).ok is True


def test_reloads_not_measured_are_inconclusive() -> None:
    cases = {
        "no reload sent": {"reload_times": []},
        "2 reloads, no request due in their windows": {
            "reload_times": [(15.0, 15.02), (45.0, 45.01)],
            "intervals": [{**i, "around_reloads": []} for i in _record().intervals],
        },
        "1 of 2 reloads sent more than 1 s off their planned time (first at 46.2 s)": {
            "reload_times": [(15.0, 15.02), (45.0, 46.2)]
        },
    }
    for reason, changes in cases.items():
        record = _record(**changes)
        row = _reload_row(record)
        assert row.ok is None and row.measured.startswith(reason), (reason, row)
        assert exit_status(soak_verdict.verdicts(record)) == 1
        assert f"INCONCLUSIVE: {soak_reloads.NAME}: {reason}" in "\n".join(
            not_passed(soak_verdict.verdicts(record))
        )
    # every interval touches a window: no p99 to compare with
    row = soak_reloads.verdict(
        [{"index": 0, "hist": {10: 5}, "around_reloads": [[1.0, 1.0]]}], 5.0, [(1.0, 1.0)]
    )
    assert row.ok is None and row.measured == "no request answered outside the reloads' windows"


def test_wan_prints_the_targets_and_exits_1_unless_all_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.wan's end (after its runs): the targets table, the reasons, the exit status, and
    the verdicts in --json; --repeat at least 1."""
    args = wan.parse_args(["--json", str(tmp_path / "wan.json")])
    assert args.repeat == 1
    assert wan.judge(args, [_wan_run()]) == 0
    out = capsys.readouterr().out
    assert "Targets (1 run):" in out and "20 clients against the floor" in out
    assert [v["result"] for v in json.loads((tmp_path / "wan.json").read_text())["verdicts"]] == [
        "PASS"
    ] * 4
    args = wan.parse_args(["--repeat", "2", "--json", str(tmp_path / "wan.json")])
    assert wan.judge(args, [_wan_run(), _wan_run(handshakes_20=0.2)]) == 1
    out = capsys.readouterr().out
    assert "MISS: WAN handshakes per request, steady state: 0 at 1 / 0 at 20, " in out
    data = json.loads((tmp_path / "wan.json").read_text())
    assert len(data["runs"]) == 2 and data["verdicts"][3]["result"] == "MISS"
    one_client = {"points": [p for p in _wan_run()["points"] if p["concurrency"] == 1]}
    assert wan.judge(wan.parse_args(["--concurrency", "1"]), [one_client]) == 1
    assert "INCONCLUSIVE: 20 clients against the floor: not measured" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        wan.parse_args(["--repeat", "0"])
