"""Gates under CI (``CI=true``): nothing the acceptance relies on may skip.

:func:`missing` is how an e2e, deploy or TLS test says the lab (or the machine) lacks what it
needs: a skip on a developer's machine, a failure under ``CI=true``, where .ci/run brought up
exactly what the step needs. ``python -m tests.ci REPORT.xml --min N`` is how a step of .ci/run
asserts its pass count from pytest's ``--junitxml``: at least N passed, none failed, errored or
skipped (a lab that came up without TLS, or without swift, would otherwise leave the step green
with the tests that prove them skipped).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(reason: str) -> NoReturn:
    """What the test needs is absent: skip, or under CI=true fail with the reason."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing capability fails, it is not skipped)",
                    pytrace=False)  # fmt: skip
    pytest.skip(reason)


def need_module(name: str, extra: str) -> None:
    """A test that needs a module of a pip extra the README's install does not bring (`peer`):
    skipped outside CI with how to install it; under CI=true (.ci/run installs the extra) a
    failure if it is missing."""
    try:
        importlib.import_module(name)
    except ImportError:
        missing(f"needs {name}, of the {extra!r} extra: pip install -e '.[{extra}]'")


@dataclass(frozen=True)
class Counts:
    tests: int
    failures: int
    errors: int
    skipped: int

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped

    def __str__(self) -> str:
        return (
            f"{self.passed} passed, {self.failures} failed, {self.errors} errors, "
            f"{self.skipped} skipped"
        )


def counts(report: Path) -> Counts:
    """The totals of a pytest --junitxml report (its testsuite elements added up)."""
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))

    def total(key: str) -> int:
        return sum(int(s.get(key, "0")) for s in suites)

    return Counts(total("tests"), total("failures"), total("errors"), total("skipped"))


def check(found: Counts, minimum: int) -> list[str]:
    """What is wrong with a step's counts: empty when at least `minimum` passed and none
    failed, errored or skipped."""
    problems = []
    if found.passed < minimum:
        problems.append(f"{found.passed} passed, fewer than the {minimum} expected")
    for what, n in (("failed", found.failures), ("errored", found.errors)):
        if n:
            problems.append(f"{n} {what}")
    if found.skipped:
        problems.append(f"{found.skipped} skipped (under CI nothing may skip: deselect instead)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.ci",
        description="Assert a pytest step's pass count from its --junitxml report.",
    )
    parser.add_argument("report", type=Path, help="the --junitxml file of the step")
    parser.add_argument("--min", type=int, required=True, help="tests that must pass")
    parser.add_argument("--step", default="", help="the step's name, for the message")
    args = parser.parse_args(argv)
    name = f"{args.step}: " if args.step else ""
    if not args.report.is_file():
        print(f"{name}no report {args.report}: the step ran no test", file=sys.stderr)
        return 1
    found = counts(args.report)
    problems = check(found, args.min)
    if problems:
        print(f"{name}{found}: FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"{name}{found} (at least {args.min} expected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
