"""Outcomes of one run (pytest's JUnit XML) and the comparison of the three modes. Pure: no
OpenStack, no network."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # a failure or an error (setup, call or teardown)
    SKIPPED = "skipped"
    MISSING = "missing"  # not in this mode's report at all (not collected, run aborted)

    def __str__(self) -> str:
        return self.value


# when pytest reports one test twice (a failing call and an erroring teardown), the worst wins
_RANK = {Status.PASSED: 0, Status.SKIPPED: 1, Status.FAILED: 2}


@dataclass(frozen=True)
class Outcome:
    status: Status
    message: str = ""  # first line of the failure, error or skip reason
    seconds: float = 0.0


Results = dict[str, Outcome]  # test id (module.Class.test) -> outcome


def test_id(classname: str, name: str) -> str:
    return f"{classname}.{name}" if classname else name


def parse_junit(path: Path) -> Results:
    """``pytest --junitxml`` output -> outcome per test id (``module.Class.test``)."""
    root = ET.parse(path).getroot()
    out: Results = {}
    for case in root.iter("testcase"):
        tid = test_id(case.get("classname", ""), case.get("name", ""))
        status, message = Status.PASSED, ""
        for child in case:
            kind = {"failure": Status.FAILED, "error": Status.FAILED, "skipped": Status.SKIPPED}
            if child.tag in kind:
                status = kind[child.tag]
                # pytest shortens a multi-line message to its first line ("[+N more lines;
                # full report in element text]"): the element's text has the traceback
                text = child.text or ""
                message = _first_line(text if "Traceback" in text else child.get("message", ""))
                break
        seconds = float(case.get("time") or 0.0)
        previous = out.get(tid)
        if previous is not None:
            seconds += previous.seconds
            if _RANK[previous.status] >= _RANK[status]:
                out[tid] = Outcome(previous.status, previous.message, seconds)
                continue
        out[tid] = Outcome(status, message, seconds)
    return out


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
