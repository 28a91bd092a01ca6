"""Checks of ``python -m bench.soak``'s parts (no router needed): the request mix, the checks of
the answers, the latency histogram, the schedule, the verdicts, the routers' config and the
load generator against a backend on loopback."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import backend, federation, report, soak, soak_traffic, soak_verdict
from bench.procs import Processes, free_port
from bench.test_bench import _facts
from scoperouter.config import load_catalog
from scoperouter.routing import Failover, Forward, decide


def test_soak_mix_covers_every_route_and_is_drawn_by_weight() -> None:
    kinds = {k.name: k for k in soak_traffic.MIX}
    expressions = [
        json.loads(k.scope)[k.service] for k in soak_traffic.MIX if k.status == 200 and k.scope
    ]
    assert "CloudOne" in expressions and "CloudTwo" in expressions  # local and cross-cloud
    assert any("&" in e for e in expressions) and any("|" in e for e in expressions)
    assert any(e.startswith(soak_traffic.DOWN_CLOUD + " |") for e in expressions)
    assert {k.entry for k in soak_traffic.MIX} == set(federation.CLOUDS)
    assert {k.status for k in soak_traffic.MIX} == {200, 400, 409}
    assert all("," not in name for name in kinds)  # --kinds takes them comma-separated
    assert (
        kinds["unscoped"].scope is None
        and "!SCOPE!" not in kinds["unscoped"].headers()["X-Auth-Token"]
    )
    bad = kinds["bad scope JSON (400)"].headers()
    assert bad["X-Scope"] == '{"image": ' and bad["X-Auth-Token"].endswith('!SCOPE!{"image": ')
    # the same seed draws the same sequence; 20,000 draws come near the weights
    draws = list(itertools.islice(soak_traffic.plan(7), 20_000))
    assert draws[:50] == list(itertools.islice(soak_traffic.plan(7), 50))
    assert draws[:50] != list(itertools.islice(soak_traffic.plan(8), 50))
    counts = Counter(k.name for k, _ in draws)
    for name, share in soak_traffic.expected_share().items():
        assert abs(counts[name] / len(draws) - share) < 0.015, name
    modes = Counter(m for _, m in draws)
    assert set(modes) == {soak_traffic.KEEP_ALIVE, soak_traffic.NEW, soak_traffic.NEW_CLOSE}
    assert modes[soak_traffic.KEEP_ALIVE] > modes[soak_traffic.NEW] > modes[soak_traffic.NEW_CLOSE]


def test_soak_request_bytes() -> None:
    kind = next(k for k in soak_traffic.MIX if k.method == "PUT")
    target = soak_traffic.build(kind, ("127.0.0.2", 8080))
    head, _, body = target.keep_alive.partition(b"\r\n\r\n")
    assert head.startswith(b"PUT /v1/AUTH_soak/c/o HTTP/1.1\r\nHost: 127.0.0.2:8080\r\n")
    assert b"Content-Length: 1024" in head and body == b"x" * 1024
    assert b"Connection: close" in target.close and b"Connection" not in target.keep_alive


def _error(status: int, code: int | None = None) -> bytes:
    return json.dumps(
        {"error": {"code": code or status, "title": "t", "message": "what went wrong"}}
    ).encode()


def test_soak_json_error_check() -> None:
    problem = soak_traffic.error_problem
    assert problem(400, "application/json", _error(400)) is None
    assert problem(502, "application/json; charset=utf-8", _error(502)) is None
    assert "Content-Type 'text/html'" in (problem(502, "text/html", b"<html>") or "")
    assert "Content-Type 'none'" in (problem(500, "", b"") or "")
    assert "not an OpenStack error" in (problem(400, "application/json", b"[1]") or "")
    assert "not an OpenStack error" in (problem(400, "application/json", b"{oops") or "")
    assert "says code 500" in (problem(400, "application/json", _error(400, 500)) or "")
    no_message = json.dumps({"error": {"code": 400, "message": ""}}).encode()
    assert "without a message" in (problem(400, "application/json", no_message) or "")


def test_soak_answer_check() -> None:
    kinds = {k.name: k for k in soak_traffic.MIX}
    check = soak_traffic.check
    one, two = backend.small_body("CloudOne").encode(), backend.small_body("CloudTwo").encode()
    merged = json.dumps(
        {"images": [{"cloud": "CloudOne", "x-scope-cloud": "CloudOne"}, {"cloud": "CloudTwo"}]}
    ).encode()
    assert check(kinds["local"], 200, "application/json", one) is None
    assert check(kinds["Down | B"], 200, "application/json", two) is None
    assert check(kinds["A & B list"], 200, "application/json", merged) is None
    assert check(kinds["cross-cloud"], 200, "application/json", one) == (
        soak_traffic.WRONG,
        "cross-cloud: answered by ['CloudOne'], expected ['CloudTwo']",
    )
    assert check(kinds["A & B list"], 200, "application/json", two)[0] == soak_traffic.WRONG  # type: ignore[index]
    # an error the request deserves, and one it does not
    assert check(kinds["bad expression (400)"], 400, "application/json", _error(400)) is None
    assert (
        check(kinds["A & B one image in both (409)"], 409, "application/json", _error(409)) is None
    )
    wrong = check(kinds["Down | B"], 502, "application/json", _error(502))
    assert wrong is not None and wrong[0] == soak_traffic.WRONG and "502 (expected 200)" in wrong[1]
    # an error that is not the router's JSON is that, whatever was expected
    assert (
        check(kinds["bad expression (400)"], 400, "text/plain", b"bad")[0] == soak_traffic.NON_JSON
    )  # type: ignore[index]
    assert check(kinds["local"], 502, "text/html", b"<html>")[0] == soak_traffic.NON_JSON  # type: ignore[index]
    put = kinds["small PUT (cross-cloud)"]
    short = json.dumps({"cloud": "CloudTwo", "body_bytes": 10}).encode()
    assert "10 body bytes" in check(put, 200, "application/json", short)[1]  # type: ignore[index]
    assert check(kinds["local"], 200, "application/json", b"<html>")[0] == soak_traffic.WRONG  # type: ignore[index]


def test_soak_latency_histogram() -> None:
    values = [0.01, 0.05, 0.3, 1.0, 1.2, 2.5, 9.9, 80.0, 1234.5]
    for ms in values:
        b = soak_traffic.bucket(ms)
        assert soak_traffic.upper(b) >= ms and (b == 0 or soak_traffic.upper(b - 1) < ms)
    latencies = [0.2 + i * 0.01 for i in range(1000)]  # 0.2 .. 10.19 ms
    hist = Counter(soak_traffic.bucket(ms) for ms in latencies)
    p99 = soak_traffic.percentile(hist, 99)
    assert p99 is not None and 10.09 <= p99 <= 10.09 * soak_traffic.HIST_RATIO
    assert soak_traffic.percentile(Counter(), 99) is None
    halves = [Counter(soak_traffic.bucket(ms) for ms in latencies[i::2]) for i in (0, 1)]
    assert soak_traffic.merge(halves) == hist


def test_soak_schedule_and_windows() -> None:
    # an hour: reloads at 150 s, 450 s ..., transfers at 75 s, 375 s ...; as many of each in
    # the first and last 10 minutes
    reloads = soak_verdict.schedule(3600, 300, 0.5)
    transfers = soak_verdict.schedule(3600, 300, 0.25)
    assert reloads[:2] == [150, 450] and len(reloads) == 12
    assert transfers[:2] == [75, 375] and len(transfers) == 12
    span = soak_verdict.window(3600)
    assert span == 600 and soak_verdict.interval_for(3600) == 10
    for times in (reloads, transfers):
        assert sum(t < span for t in times) == sum(t >= 3600 - span for t in times) == 2
    # the smoke: 3 minutes, reloads every 30 s, one transfer at 45 s
    assert soak_verdict.schedule(180, 30, 0.5) == [15, 45, 75, 105, 135, 165]
    assert soak_verdict.schedule(180, 180, 0.25) == [45]
    assert soak_verdict.window(180) == 30 and soak_verdict.interval_for(180) == 5
    assert soak_verdict.schedule(180, 0, 0.5) == []


def _interval(index: int, p99_ms: float, slow: int = 10, **extra: Any) -> dict[str, Any]:
    """A generator's interval line of 5 s at 100 req/s: `slow` requests at `p99_ms`, the rest
    at 1 ms."""
    hist = {soak_traffic.bucket(1.0): 500 - slow, soak_traffic.bucket(p99_ms): slow}
    line: dict[str, Any] = {"index": index, "due": 500, "ok": 500, "late": 0, "hist": hist}
    line.update(extra)
    return line


def _record(**changes: Any) -> soak_verdict.Record:
    """A clean run of 60 s at 100 req/s by two generators (5 s intervals, windows of 10 s,
    baseline at 5 s): every verdict passes; `changes` spoil parts of it."""
    record = soak_verdict.Record(duration=60, rate=100, interval=5, baseline_t=5, workers=2)
    halves = [
        {**x, "due": 250, "ok": 250, "hist": {k: v // 2 for k, v in x["hist"].items()}}
        for x in [_interval(i, 5.0) for i in range(12)]
    ]
    record.intervals = soak_verdict.merge_intervals(halves * 2)
    for t in range(0, 61, 5):
        procs = {
            "CloudOne supervisor 1": {"rss_mb": 50.0, "fds": 15},
            "CloudOne worker 2": {"rss_mb": 40.0 + t / 60, "fds": 30 + (25 if t == 55 else 0)},
        }
        record.samples.append({"t": t, "procs": procs})
    record.logs = {"CloudOne": soak_verdict.LogFindings(lines=3)}
    record.reloads_sent = {"CloudOne": 2}
    record.reload_times = [(15.0, 15.02), (45.0, 45.01)]  # (planned, sent)
    # the requests due within 2 s of each, recorded one by one: 1.5 ms each
    record.intervals[3]["around_reloads"] = [[13.0 + i / 100, 1.5] for i in range(401)]
    record.intervals[9]["around_reloads"] = [[43.0 + i / 100, 1.5] for i in range(401)]
    record.metrics = {
        "CloudOne": {"reloads_ok": 4.0, "reloads_refused": 0.0, "worker_restarts": 0.0}
    }
    record.transfers = [
        {"t": 15, "direction": d, "ok": True, "mb_per_s": 300.0, "detail": ""}
        for d in ("upload", "download")
    ]
    record.transfers_planned = 2
    record.exit_codes = {"CloudOne": 0}
    for key, value in changes.items():
        setattr(record, key, value)
    return record


def _results(record: soak_verdict.Record) -> dict[str, str]:
    return {t.name: report.mark(t.ok) for t in soak_verdict.verdicts(record)}


def test_soak_verdicts_on_a_clean_run_pass() -> None:
    record = _record()
    results = _results(record)
    assert set(results.values()) == {"PASS"}, results
    assert len(results) == 10
    text = soak_verdict.render(record, soak_verdict.verdicts(record))
    assert "6,000 requests, 6,000 ok; 0 hangs, 0 unanswered, 0 wrong" in text
    assert "MISS" not in text and "fell behind" not in text


def test_soak_verdicts_miss_what_went_wrong() -> None:
    def only_miss(record: soak_verdict.Record) -> set[str]:
        return {name for name, mark in _results(record).items() if mark != "PASS"}

    clean = _record()
    hung = [dict(i) for i in clean.intervals]
    hung[3] = {**hung[3], "problems": Counter({soak_traffic.HANG: 1})}
    assert only_miss(_record(intervals=hung)) == {"every request answered as it deserves"}
    html = [dict(i) for i in clean.intervals]
    html[0] = {**html[0], "problems": Counter({soak_traffic.NON_JSON: 2})}
    assert only_miss(_record(intervals=html)) == {"error answers are the router's JSON"}
    broken = [dict(clean.transfers[0]), {**clean.transfers[1], "ok": False}]
    assert only_miss(_record(transfers=broken)) == {"100 MiB transfers through two routers"}
    assert only_miss(_record(transfers=broken[:1])) == {"100 MiB transfers through two routers"}
    traceback = soak_verdict.LogFindings()
    traceback.scan("Traceback (most recent call last):")
    logs = "routers' logs, and their stop"
    assert only_miss(_record(logs={"CloudOne": traceback})) == {logs}
    error = soak_verdict.LogFindings()
    error.scan('{"ts":"x","level":"ERROR","msg":"reload refused"}')
    assert only_miss(_record(logs={"CloudOne": error})) == {logs}
    assert only_miss(_record(exit_codes={"CloudOne": 0, "CloudTwo": -9})) == {logs}
    restarted = {"CloudOne": {"reloads_ok": 4.0, "worker_restarts": 1.0}}
    assert only_miss(_record(metrics=restarted)) == {"reloads (SIGHUP) applied, no worker lost"}
    missed = {"CloudOne": {"reloads_ok": 3.0}}
    assert only_miss(_record(metrics=missed)) == {"reloads (SIGHUP) applied, no worker lost"}
    # RSS: +12 % from the baseline (5 s) to the end
    grown = [
        {
            **s,
            "procs": {
                **s["procs"],
                "CloudOne worker 2": {"rss_mb": 40 + 0.1 * s["t"] * (4.8 / 6), "fds": 30},
            },
        }
        for s in clean.samples
    ]
    assert only_miss(_record(samples=grown)) == {"router RSS growth, each process"}
    # open files: a floor that rises is a leak; a burst at the end is not
    leaking = [
        {**s, "procs": {**s["procs"], "CloudOne worker 2": {"rss_mb": 40.0, "fds": 30 + s["t"]}}}
        for s in clean.samples
    ]
    assert only_miss(_record(samples=leaking)) == {"open files, each router process"}
    # p99: the last window's 2x the first's
    slow = clean.intervals[:10] + soak_verdict.merge_intervals(
        [_interval(10, 11.0), _interval(11, 11.0)]
    )
    assert only_miss(_record(intervals=slow)) == {"p99 stable"}
    # the generator late in one of the last window's two intervals: too many to leave out
    stalled = clean.intervals[:11] + soak_verdict.merge_intervals(
        [_interval(11, 50.0, slow=100, late=1)]
    )
    assert only_miss(_record(intervals=stalled)) == {"p99 stable"}
    assert _results(_record(intervals=stalled))["p99 stable"] == "INCONCLUSIVE"
    # the generator: 2 % of the requests sent late, in every interval (so no p99 to judge)
    late = _record(intervals=[{**i, "late": 10} for i in clean.intervals])
    assert only_miss(late) == {soak_verdict.GENERATOR}  # the p99 with every request passes
    assert _results(late)[soak_verdict.GENERATOR] == "MISS"
    assert "fell behind" in soak_verdict.render(late, soak_verdict.verdicts(late))


def test_soak_log_findings_and_metrics() -> None:
    findings = soak_verdict.LogFindings()
    for line in (
        '{"level":"INFO","msg":"reloaded"}',
        '{"level":"WARNING","msg":"peer 127.0.0.3:9443 down for 5 s"}',
        '{"level":"WARNING","msg":"peer 127.0.0.3:9443 down for 7 s"}',
        '{"level":"CRITICAL","msg":"x"}',
        "Traceback (most recent call last):",
    ):
        findings.scan(line)
    assert (findings.lines, findings.errors, findings.tracebacks) == (5, 1, 1)
    assert findings.warnings == {"peer ###.#.#.#:#### down for # s": 2}
    assert len(findings.examples) == 2
    text = (
        "# HELP scoperouter_config_reloads_total Config reloads by result (ok, refused).\n"
        'scoperouter_config_reloads_total{result="ok"} 24.0\n'
        "scoperouter_worker_restarts_total 0.0\n"
        "scoperouter_open_connections 3.0\n"
    )
    assert soak.parse_metrics(text) == {
        "reloads_ok": 24.0,
        "worker_restarts": 0.0,
        "open_connections": 3.0,
    }
    assert soak.seconds("1h") == 3600 and soak.seconds("20m") == 1200 and soak.seconds("90") == 90
    args = soak.parse_args(["--smoke", "--rate", "150"])
    assert (args.duration, args.rate, args.reload_every, args.transfer_every) == (180, 150, 30, 180)


def test_soak_config_has_a_down_cloud_and_metrics(tmp_path: Path) -> None:
    bench = soak.SoakBench(soak.parse_args(["--smoke", "--workers", "2"]))
    try:
        bench._addresses()
        data = bench.federation_data()
    finally:
        bench.cleanup()
    path = federation.write_config(data, tmp_path / "f.yaml")
    catalog = load_catalog(path)
    assert set(catalog.clouds) == {"CloudOne", "CloudTwo", soak_traffic.DOWN_CLOUD}
    assert set(bench.metrics) == {"CloudOne", "CloudTwo"}
    one = bench.clouds["CloudOne"]
    kind = next(k for k in soak_traffic.MIX if k.name == "Down | B")
    headers = {k.lower(): v for k, v in kind.headers().items()}
    facts = _facts("GET", one.router_host, one.image_port, "/v2/images", headers)
    decision = decide(facts, catalog, "CloudOne", combined=True)
    assert isinstance(decision, Failover)
    first = decision.candidates[0]
    assert isinstance(first, Forward) and first.url.startswith(f"http://{soak.DOWN_HOST}:")


def test_soak_generator_against_a_backend(tmp_path: Path, procs: Processes) -> None:
    """The generator's machinery on loopback (every kind sent to one asyncio backend, whose
    answers are not what the kinds deserve): every request ends, intervals are written."""
    host = "127.0.1.2"
    port = free_port(host)
    backend.start_asyncio(procs, [(host, port, "CloudOne")], "backend")
    services = {"image": [host, port], "identity": [host, port], "object-store": [host, port]}
    spec = {
        "start_at": time.time() + 0.2,
        "duration": 1.0,
        "rate": 60,
        "interval": 0.5,
        "deadline": 5,
        "addresses": {"CloudOne": services, "CloudTwo": services},
        "reloads_at": [0.5],  # the requests due within 0.21 s of it: recorded one by one
        "reload_margin": 0.21,
    }
    out = tmp_path / "out.jsonl"
    asyncio.run(soak_traffic.Generator(spec, out).run())
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["index"] for x in lines] == [0, 1]
    intervals = soak_verdict.merge_intervals(lines)
    assert sum(i["due"] for i in intervals) == 60
    problems = Counter[str]()
    for i in intervals:
        problems.update(i["problems"])
    assert problems[soak_traffic.HANG] == problems[soak_traffic.UNANSWERED] == 0
    assert sum(i["ok"] for i in intervals) + problems[soak_traffic.WRONG] == 60
    assert sum(sum(i["hist"].values()) for i in intervals) == 60
    assert 0 < sum(i["new_connections"] for i in intervals) < 60  # keep-alive reused
    around = [r for i in intervals for r in i["around_reloads"]]
    assert 24 <= len(around) <= 26, around  # due at 18/60 .. 42/60 s
    assert all(abs(at - 0.5) <= 0.21 and ms is not None and ms > 0 for at, ms in around)
