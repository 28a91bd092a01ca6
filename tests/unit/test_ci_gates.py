"""Under CI=true nothing the acceptance relies on may skip (issue 32, gate 3).

The e2e tests' guards (a lab without a service, without TLS, without routers) skip on a
developer's machine and fail under CI=true: shown by running small test modules that use the
real guards in a child pytest, with and without CI=true, and reading its --junitxml the way
.ci/run's steps do (``python -m tests.ci REPORT --min N``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ci

ROOT = Path(__file__).resolve().parents[2]

GUARDED = {
    # a lab of one cloud without routers, with the default services: no swift, no federation
    "test_plain_lab.py": """
import pytest

from tests.e2e.conftest import fed
from tests.e2e.labservices import require_service


class PlainLab:
    state = {"services": ["keystone", "glance", "placement", "nova"], "tls": False}
    clouds = ["CloudOne"]
    routed = False


@pytest.fixture(scope="session")
def lab():
    return PlainLab()


def test_swift(lab):
    require_service(lab, "swift")


def test_a_federation(fed):
    pass
""",
    # a routed federation that came up without TLS
    "test_no_tls_lab.py": """
import pytest

from tests.e2e.test_tls_lab import tls


class RoutedLab:
    state = {"services": ["keystone", "glance", "placement", "nova"], "tls": False}
    routed = True


@pytest.fixture(scope="session")
def lab():
    return RoutedLab()


@pytest.fixture(scope="session")
def fed():
    return ("CloudOne", "CloudTwo", {})


def test_the_tls_lab(tls):
    pass
""",
}


def _run(tmp_path: Path, ci_value: str | None) -> tuple[ci.Counts, str]:
    for name, text in GUARDED.items():
        (tmp_path / name).write_text(text)
    report = tmp_path / f"report-{ci_value}.xml"
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci_value is not None:
        env["CI"] = ci_value
    argv = [sys.executable, "-m", "pytest", str(tmp_path), "-p", "no:cacheprovider", "-q",
            "-o", "addopts=", "--rootdir", str(tmp_path), f"--junitxml={report}"]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return ci.counts(report), proc.stdout + proc.stderr


def test_a_missing_lab_capability_skips_outside_ci_and_fails_under_it(tmp_path: Path) -> None:
    found, output = _run(tmp_path, None)
    assert (found.skipped, found.failures + found.errors) == (3, 0), output
    found, output = _run(tmp_path, "true")
    assert found.skipped == 0 and found.failures + found.errors == 3, output
    for reason in ("the lab runs without swift", "needs a TLS lab", "needs a routed lab"):
        assert reason in output and "CI=true: a missing capability fails" in output, reason


def test_the_pass_count_check_refuses_skips_failures_and_too_few(tmp_path: Path) -> None:
    def report(tests: int, failures: int = 0, errors: int = 0, skipped: int = 0) -> str:
        path = tmp_path / f"r{tests}-{failures}-{errors}-{skipped}.xml"
        path.write_text(
            f'<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
            f'errors="{errors}" skipped="{skipped}"/></testsuites>'
        )
        return str(path)

    assert ci.main([report(10), "--min", "10"]) == 0
    assert ci.main([report(10, skipped=6), "--min", "4"]) == 1  # a skip fails the step
    assert ci.main([report(10, failures=1), "--min", "9"]) == 1
    assert ci.main([report(10, errors=1), "--min", "9"]) == 1
    assert ci.main([report(9), "--min", "10"]) == 1  # fewer than expected
    assert ci.main([str(tmp_path / "absent.xml"), "--min", "1"]) == 1  # the step ran nothing


def test_missing_follows_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        ci.missing("no swift")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no swift"):
        ci.missing("no swift")


def test_the_plain_e2e_step_deselects_the_tls_lab_tests() -> None:
    """.ci/run's plain e2e step runs `-m "e2e and not tls_lab"`: the TLS-only tests are
    deselected there, not skipped (under CI=true a skip fails); its TLS step selects them."""

    def collected(*args: str) -> set[str]:
        argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                *args]  # fmt: skip
        out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
        return {line for line in out.splitlines() if "::" in line}

    plain = collected("-m", "e2e and not tls_lab", "tests/e2e")
    tls = collected("-m", "e2e", "tests/e2e/test_tls_lab.py")
    assert len(tls) >= 6 and plain and not plain & tls
    assert not any("test_tls_lab.py" in t for t in plain)
