"""Outcomes of one run (pytest-reportlog's JSON lines) and the comparison of the three modes.
Pure: no OpenStack, no network."""

from __future__ import annotations

import json
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
    """The modes side by side. ``baseline`` is the direct mode; a *regression* is a test that
    passes there and does not pass (fails, or is missing) in another mode."""

    modes: tuple[str, ...]
    rows: dict[str, dict[str, Outcome]] = field(default_factory=dict)

    def status(self, tid: str, mode: str) -> Status:
        outcome = self.rows[tid].get(mode)
        return outcome.status if outcome else Status.MISSING

    def regressions(self) -> dict[str, list[str]]:
        """test id -> the modes where it passed in the baseline and failed or went missing."""
        base = self.modes[0]
        out: dict[str, list[str]] = {}
        for tid in sorted(self.rows):
            if self.status(tid, base) is not Status.PASSED:
                continue
            bad = [
                m for m in self.modes[1:] if self.status(tid, m) in (Status.FAILED, Status.MISSING)
            ]
            if bad:
                out[tid] = bad
        return out

    def differences(self) -> list[str]:
        """Every test whose status is not the same in all modes."""
        return [
            tid for tid in sorted(self.rows) if len({self.status(tid, m) for m in self.modes}) > 1
        ]

    def failing_everywhere(self) -> list[str]:
        return [
            tid
            for tid in sorted(self.rows)
            if all(self.status(tid, m) is Status.FAILED for m in self.modes)
        ]


def compare(by_mode: Mapping[str, Results], modes: Sequence[str]) -> Comparison:
    comp = Comparison(tuple(modes))
    for mode in modes:
        for tid, outcome in by_mode.get(mode, {}).items():
            comp.rows.setdefault(tid, {})[mode] = outcome
    return comp
