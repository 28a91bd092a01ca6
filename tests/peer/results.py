"""Outcomes of one run (pytest-reportlog's JSON lines, or Tempest's subunit stream) and the
comparison of the three modes. Pure: no OpenStack, no network."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # a failure or an error (setup, call or teardown)
    SKIPPED = "skipped"
    MISSING = "missing"  # not in this mode's report at all (not collected, run aborted)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Outcome:
    status: Status
    message: str = ""  # first line of the failure, error or skip reason
    seconds: float = 0.0


Results = dict[str, Outcome]  # test id (module.Class.test) -> outcome


def test_id(nodeid: str) -> str:
    """pytest's ``pkg/mod.py::Class::test`` -> ``pkg.mod.Class.test``."""
    path, _, rest = nodeid.partition("::")
    dotted = path.removesuffix(".py").replace("/", ".")
    return ".".join([dotted, *rest.split("::")]) if rest else dotted


def parse_report_log(path: Path) -> Results:
    """pytest-reportlog's JSON lines (``--report-log``) -> outcome per test id.

    The log is written phase by phase (setup, call, teardown), so a run that was stopped still
    tells what it did; a test that started and never finished counts as failed. A module that
    failed to import counts as one failed "test" under its own name."""
    phases: dict[str, dict[str, tuple[Status, str, float]]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            try:
                report = json.loads(line)
            except ValueError:  # the last line of a killed run may be cut short
                continue
            kind, outcome = report.get("$report_type"), report.get("outcome")
            if kind == "CollectReport" and outcome == "failed":
                when = "collect"
            elif kind == "TestReport" and outcome in _OUTCOMES:
                when = report.get("when", "call")
            else:
                continue
            status = _OUTCOMES[outcome]
            message = "" if status is Status.PASSED else _message(report.get("longrepr"))
            seconds = float(report.get("duration") or 0.0)
            phases.setdefault(test_id(report["nodeid"]), {})[when] = (status, message, seconds)
    return {tid: _outcome(p) for tid, p in phases.items()}


# subunit's final statuses (a test still "inprogress" at the end of the stream did not finish)
_SUBUNIT = {
    "success": Status.PASSED,
    "fail": Status.FAILED,
    "uxsuccess": Status.FAILED,  # an expected failure that passed
    "skip": Status.SKIPPED,
    "xfail": Status.SKIPPED,
}
_FIXTURE = re.compile(r"(setUpClass|tearDownClass|setUpModule|tearDownModule) \((.+)\)")


def tempest_test_id(raw: str) -> str:
    """A tempest test id as the comparison keys it: without its attributes
    (``...test_x[id-...,smoke]`` -> ``...test_x``); a class fixture's failure
    (``setUpClass (pkg.mod.Class)``) -> ``pkg.mod.Class.setUpClass``."""
    m = _FIXTURE.fullmatch(raw.strip())
    if m:
        return f"{m.group(2)}.{m.group(1)}"
    return raw.split("[", 1)[0]


def parse_subunit(path: Path) -> Results:
    """A subunit v2 stream (stestr's ``--subunit``) -> outcome per test id.

    A stream cut short (a stopped run) still tells what finished; a test that started and never
    finished counts as failed. A class whose setUpClass failed reports that one failure (its
    tests are then missing, which the comparison sees)."""
    import subunit
    import testtools

    out: Results = {}

    def on_test(test: Mapping[str, Any]) -> None:
        status = str(test.get("status"))
        if status == "exists":  # listed, not run
            return
        details = test.get("details") or {}
        message = ""
        if status == "inprogress":
            outcome = Status.FAILED
            message = "did not finish (the run was stopped)"
        elif status in _SUBUNIT:
            outcome = _SUBUNIT[status]
        else:
            return
        if outcome is not Status.PASSED and not message:
            for key in ("traceback", "reason"):
                if key in details:
                    message = _first_line(details[key].as_text())
                    break
        stamps = [t for t in test.get("timestamps") or () if t is not None]
        seconds = (stamps[-1] - stamps[0]).total_seconds() if len(stamps) == 2 else 0.0
        out[tempest_test_id(str(test["id"]))] = Outcome(outcome, message, seconds)

    result = testtools.StreamToDict(on_test)
    result.startTestRun()
    with open(path, "rb") as stream:
        try:
            subunit.ByteStreamToStreamResult(stream, non_subunit_name="stdout").run(result)
        finally:
            result.stopTestRun()
    return out


_OUTCOMES = {"passed": Status.PASSED, "failed": Status.FAILED, "skipped": Status.SKIPPED}


def _outcome(phases: Mapping[str, tuple[Status, str, float]]) -> Outcome:
    seconds = sum(s for _, _, s in phases.values())
    for when in ("collect", "setup", "call", "teardown"):
        status, message, _ = phases.get(when, (Status.PASSED, "", 0.0))
        if status is Status.FAILED:
            return Outcome(Status.FAILED, f"{message} ({when})" if when != "call" else message,
                           seconds)  # fmt: skip
    for status, message, _ in phases.values():
        if status is Status.SKIPPED:
            return Outcome(Status.SKIPPED, message, seconds)
    if "call" not in phases:
        return Outcome(Status.FAILED, "did not finish (the run was stopped)", seconds)
    return Outcome(Status.PASSED, "", seconds)


def _message(longrepr: Any) -> str:
    """What pytest-reportlog serialised of a failure or skip -> one line."""
    if isinstance(longrepr, list | tuple) and len(longrepr) == 3:  # a skip: path, line, reason
        return str(longrepr[2]).removeprefix("Skipped: ")
    if isinstance(longrepr, dict):
        crash = longrepr.get("reprcrash") or {}
        return _first_line(str(crash.get("message", "")))
    return _first_line(str(longrepr or ""))


def _first_line(text: str) -> str:
    """One line that says what happened: the exception of a traceback (its last line), else the
    first line (a skip reason, an assertion)."""
    lines = [line.strip() for line in text.strip().splitlines()]
    lines = [line for line in lines if line and set(line) - set("^~ ")]
    if not lines:
        return ""
    if any("Traceback (most recent call last)" in line for line in lines):
        return lines[-1][:300]
    return lines[0].removeprefix("Failed: ")[:300]


@dataclass
class Summary:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def run(self) -> int:
        """Tests that ran (passed or failed): skipped ones did not exercise anything."""
        return self.passed + self.failed

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


def summarize(results: Results) -> Summary:
    s = Summary()
    for outcome in results.values():
        if outcome.status is Status.PASSED:
            s.passed += 1
        elif outcome.status is Status.FAILED:
            s.failed += 1
        elif outcome.status is Status.SKIPPED:
            s.skipped += 1
    return s


@dataclass
class Comparison:
    """The modes side by side. ``baseline`` is the direct mode; a *regression* is a test whose
    outcome in another mode is :func:`worse` than there: it passes direct and fails or errors,
    is skipped, or is missing; or it is skipped direct and fails, is missing or is skipped for
    another reason. OpenStack's functional tests skip when a service or feature looks absent,
    so a router that hid one would turn failures into skips; a skip whose reason is the same in
    every mode is not a difference."""

    modes: tuple[str, ...]
    rows: dict[str, dict[str, Outcome]] = field(default_factory=dict)

    def status(self, tid: str, mode: str) -> Status:
        outcome = self.rows[tid].get(mode)
        return outcome.status if outcome else Status.MISSING

    def regressions(self) -> dict[str, list[str]]:
        """test id -> the modes where its outcome is worse than in the baseline."""
        base = self.modes[0]
        out: dict[str, list[str]] = {}
        for tid in sorted(self.rows):
            first = self.rows[tid].get(base)
            if first is None:
                continue
            bad = [m for m in self.modes[1:] if worse(first, self.rows[tid].get(m))]
            if bad:
                out[tid] = bad
        return out

    def differences(self) -> list[str]:
        """Every test whose status is not the same in all modes, or that is skipped in every
        mode for reasons that differ (a skip whose reason is the same everywhere is not a
        difference)."""
        return [tid for tid in sorted(self.rows) if self._differs(tid)]

    def _differs(self, tid: str) -> bool:
        statuses = {self.status(tid, m) for m in self.modes}
        if statuses == {Status.SKIPPED}:
            return len({self.rows[tid][m].message for m in self.modes}) > 1
        return len(statuses) > 1

    def failing_everywhere(self) -> list[str]:
        return [
            tid
            for tid in sorted(self.rows)
            if all(self.status(tid, m) is Status.FAILED for m in self.modes)
        ]


def worse(base: Outcome, other: Outcome | None) -> bool:
    """Whether a mode's outcome of a test (None: missing) is a regression from the direct
    mode's `base`: a pass that became anything else; a skip that became a failure, went
    missing, or skipped for another reason."""
    if base.status is Status.PASSED:
        return other is None or other.status is not Status.PASSED
    if base.status is Status.SKIPPED:
        if other is None or other.status is Status.FAILED:
            return True
        return other.status is Status.SKIPPED and other.message != base.message
    return False


def compare(by_mode: Mapping[str, Results], modes: Sequence[str]) -> Comparison:
    comp = Comparison(tuple(modes))
    for mode in modes:
        for tid, outcome in by_mode.get(mode, {}).items():
            comp.rows.setdefault(tid, {})[mode] = outcome
    return comp
