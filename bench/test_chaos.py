"""The chaos run's checks (bench/chaos_verdict.py, bench/chaos.py) can fail: a hang, a non-JSON
error, a wrong answer, a stuck or undescribed broker operation, drift after the run and a
traceback in a log each turn the verdict into a MISS. The run itself needs the lab: it is
`python -m bench.chaos --smoke` in .ci/run's e2e step."""

from __future__ import annotations

import json

from bench import chaos_verdict as cv
from bench.chaos import FAULTS, parse_args
from bench.chaos_clients import Kind, wrong_images
from bench.soak_verdict import LogFindings

ROUTER_ERROR = json.dumps({"error": {"code": 502, "title": "Bad Gateway", "message": "x"}})


def clean_record() -> cv.Record:
    """A run in which everything went as it must, faults included."""
    record = cv.Record(duration=180, deadline=60, seed=1)
    for _ in range(20):
        record.request("image list at A", cv.OK, status=200)
    record.request("image list at A", cv.JSON_ERROR, "502", status=502)
    record.request("cross-cloud image list A->B", cv.REFUSED, "Connection refused")
    record.request("image list at B", cv.DROPPED, "Connection aborted")
    record.operations = [
        {"kind": "provision", "instance": "i1", "state": cv.SUCCEEDED, "description": ""},
        {"kind": "bind", "instance": "i1", "state": cv.FAILED, "description": "keystone 503"},
        {"kind": "unbind", "instance": "i1", "state": cv.GONE, "description": ""},
        {"kind": "deprovision", "instance": "i1", "state": cv.GONE, "description": ""},
    ]
    record.faults = [
        {"t": 10.0, "kind": kind, "target": "CloudOne", "done": True} for kind in FAULTS
    ]
    record.repair = {"orphans": [], "missing": [], "unchecked": [], "errors": []}
    record.logs = {"CloudOne router": LogFindings(lines=10)}
    return record


def misses(record: cv.Record) -> list[str]:
    return [row.name for row in cv.verdicts(record) if row.ok is False]


def test_a_clean_run_passes() -> None:
    record = clean_record()
    assert misses(record) == []
    assert "PASS" in cv.render(record, cv.verdicts(record))


def test_a_hang_is_a_miss() -> None:
    record = clean_record()
    record.request("A & B image list", cv.HANG, "ReadTimeout")
    assert misses(record) == ["every client request ended in time"]
    assert "ReadTimeout" in cv.render(record, cv.verdicts(record))


def test_a_non_json_error_or_a_wrong_answer_is_a_miss() -> None:
    for outcome in (cv.NON_JSON, cv.WRONG):
        record = clean_record()
        record.request("image show at A", outcome, "502 text/html")
        assert misses(record) == ["errors are clean JSON"], outcome
    record = clean_record()
    record.broker_error("provision i1: 502: '<html>Bad Gateway</html>'")
    assert misses(record) == ["errors are clean JSON"]


def test_a_stuck_or_undescribed_operation_is_a_miss() -> None:
    record = clean_record()
    record.operations.append(
        {"kind": "provision", "instance": "i2", "state": cv.STUCK, "description": "in progress"}
    )
    assert misses(record) == ["every broker operation ended"]
    record = clean_record()
    record.operations.append({"kind": "bind", "instance": "i2", "state": cv.FAILED})
    assert misses(record) == ["every broker operation ended"]


def test_drift_or_a_leftover_is_a_miss() -> None:
    for planted in (
        {"orphans": [{"instance_id": "i3", "resource": "project"}]},
        {"missing": [{"instance_id": "i4"}]},
        {"unchecked": ["CloudTwo"]},
    ):
        record = clean_record()
        assert record.repair is not None
        record.repair.update(planted)
        assert misses(record) == ["no drift afterwards (broker repair)"], planted
    record = clean_record()
    record.leftovers.append("i5")
    assert misses(record) == ["no drift afterwards (broker repair)"]
    record = clean_record()
    record.repair = None  # repair never ran (or its output was not JSON)
    assert misses(record) == ["no drift afterwards (broker repair)"]


def test_a_traceback_in_a_log_or_a_fault_not_done_is_a_miss() -> None:
    record = clean_record()
    findings = LogFindings()
    findings.scan("Traceback (most recent call last):")
    record.logs["broker 1"] = findings
    assert misses(record) == ["routers' and brokers' logs"]
    record = clean_record()
    record.faults.append({"t": 50.0, "kind": "router restart", "done": False, "error": "boom"})
    assert misses(record) == ["the faults happened"]


def test_answers_are_classified() -> None:
    router = ROUTER_ERROR.encode()
    assert cv.classify_answer(200, "application/json", b'{"images": []}', 1, 60) == cv.OK
    assert cv.classify_answer(502, "application/json", router, 1, 60) == cv.JSON_ERROR
    # a service's own OpenStack JSON error is clean too (the clients print its message)
    nova = b'{"itemNotFound": {"code": 404, "message": "x"}}'
    assert cv.classify_answer(404, "application/json", nova, 1, 60) == cv.JSON_ERROR
    html = b"<html><body>502 Bad Gateway</body></html>"
    assert cv.classify_answer(502, "text/html", html, 1, 60) == cv.NON_JSON
    assert cv.classify_answer(503, "application/json", b"", 1, 60) == cv.NON_JSON
    assert cv.classify_answer(200, "application/json", b"<html>", 1, 60) == cv.WRONG
    assert cv.classify_answer(200, "application/json", b"{}", 61, 60) == cv.HANG


def test_an_and_list_missing_a_cloud_is_wrong() -> None:
    tiny = {0: "image-a", 1: "image-b"}
    both = Kind("A & B", 0, "image", "/v2/images", "{}", (frozenset({0, 1}),))
    either = Kind("B | A", 0, "image", "/v2/images", "{}", (frozenset({1}), frozenset({0})))
    listing = {"images": [{"id": "image-a"}, {"id": "image-b"}, {"id": "other"}]}
    assert wrong_images(both, listing, tiny) is None
    assert wrong_images(both, {"images": [{"id": "image-a"}]}, tiny) is not None
    assert wrong_images(either, {"images": [{"id": "image-a"}]}, tiny) is None
    assert wrong_images(either, listing, tiny) is not None


def test_smoke_preset_and_seed() -> None:
    args = parse_args(["--smoke", "--seed", "7"])
    assert (args.duration, args.fault_every, args.seed) == (180.0, 20.0, 7)
    assert parse_args([]).duration == 600.0
