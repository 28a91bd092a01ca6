"""The README's test command runs the tests in parallel; what shares the lab never does.

pyproject.toml's addopts give `python -m pytest` its pytest-xdist workers (``--dist
loadgroup``); .ci/run's steps against the lab (e2e, TLS e2e, deploy, federation) run theirs with
``-n 0``, and the Python 3.12 step (a venv without xdist) replaces the addopts; and a run
whose ``-m`` may select the e2e or deploy tests (`pytest -m e2e`, as the docs show it) runs
serially whatever its ``-n`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import selects_the_lab

ROOT = Path(__file__).resolve().parents[2]


def addopts() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return shlex.split(tomllib.load(f)["tool"]["pytest"]["ini_options"]["addopts"])


def ci_pytest_lines() -> list[str]:
    """Every `python -m pytest` command of .ci/run, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / ".ci" / "run").read_text())
    return [
        line.strip()
        for line in text.splitlines()
        if "-m pytest" in line and not line.strip().startswith("#")
    ]


def test_the_readmes_test_command_runs_in_parallel() -> None:
    options = addopts()
    workers = options[options.index("-n") + 1]
    assert workers == "auto" or int(workers) >= 2, options
    assert options[options.index("--dist") + 1] == "loadgroup", options


def test_the_ci_steps_that_share_the_lab_run_serially() -> None:
    lines = ci_pytest_lines()
    # in parallel: the README's, and the pure build's unit suite (issue 31; no lab)
    parallel = {
        ".venv/bin/python -m pytest",
        "SCOPEROUTER_PURE=1 .venv/bin/python -m pytest tests/unit -q",
    }
    assert parallel <= set(lines), lines
    others = [line for line in lines if line not in parallel]
    assert len(others) >= 5, lines  # e2e, TLS e2e, deploy, federation, Python 3.12
    serial = [
        line
        for line in others
        if re.search(r"-m pytest (.* )?-n 0 ", line) or re.search(r" -o addopts=(?!.*-n)", line)
    ]
    assert serial == others, sorted(set(others) - set(serial))


CHILD_TESTS = """
import os
from pathlib import Path

import pytest

OUT = Path(os.environ["PARALLEL_OUT"])


@pytest.mark.parametrize("n", range(4))
@pytest.mark.{marker}
def test_lab(n):
    OUT.joinpath(f"lab-{{n}}").write_text(os.environ.get("PYTEST_XDIST_WORKER", "serial"))


@pytest.mark.parametrize("n", range(4))
def test_other(n):
    OUT.joinpath(f"other-{{n}}").write_text(os.environ.get("PYTEST_XDIST_WORKER", "serial"))
"""


def child_run(tmp_path: Path, marker: str, markexpr: str, *more: str) -> dict[str, str]:
    """A child pytest with 2 workers and tests/conftest.py's hook, over 4 tests marked `marker`
    and 4 others, selected by `-m markexpr`: where each test ran."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_cmdline_main  # noqa: F401\n"
    )
    (tmp_path / "test_child.py").write_text(CHILD_TESTS.format(marker=marker))
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # our worker's
    env.update(PARALLEL_OUT=str(out), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "pytest", str(tmp_path / "test_child.py"), "-p",
            "no:cacheprovider", "-q", "-o", "addopts=", "--rootdir", str(tmp_path), "-n", "2",
            "-m", markexpr, "-W", "ignore::pytest.PytestUnknownMarkWarning", *more]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {path.name: path.read_text() for path in out.iterdir()}


@pytest.mark.parametrize("marker", ["e2e", "deploy"])
def test_a_run_that_selects_the_lab_runs_serially(tmp_path: Path, marker: str) -> None:
    """`pytest -m e2e` (as the docs show it) with the workers of the addopts: serial."""
    for markexpr in (marker, f"{marker} and not tls_lab", f"{marker} or not {marker}"):
        ran = child_run(tmp_path, marker, markexpr)
        assert set(ran.values()) == {"serial"} and len(ran) >= 4, (markexpr, ran)
    ran = child_run(tmp_path, marker, "not e2e and not deploy")  # the default: in parallel
    assert sorted(ran) == [f"other-{n}" for n in range(4)], ran
    assert set(ran.values()) <= {"gw0", "gw1"}, ran


def test_a_pdb_run_is_serial(tmp_path: Path) -> None:
    """`pytest --pdb` with the addopts' `-n 2`: serial (xdist would refuse it), no -n 0 needed."""
    ran = child_run(tmp_path, "e2e", "not e2e", "--pdb")
    assert sorted(ran) == [f"other-{n}" for n in range(4)], ran
    assert set(ran.values()) == {"serial"}, ran


def test_what_may_select_the_lab() -> None:
    assert selects_the_lab("e2e") and selects_the_lab("deploy")
    assert selects_the_lab("e2e and not tls_lab") and selects_the_lab("integration or e2e")
    assert not selects_the_lab("not e2e and not deploy") and not selects_the_lab("")
    assert not selects_the_lab("integration") and not selects_the_lab("not deploy")


CRASHING_TESTS = """
import os
import signal

import pytest


@pytest.mark.parametrize("n", range(6))
def test_one(n):
    if n == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer ends a worker
"""


def test_a_worker_that_dies_fails_the_run_and_names_its_test(tmp_path: Path) -> None:
    """With the addopts' xdist options a SIGKILLed worker ends the run, failed, naming the test
    it ran: replaced (xdist's default), it left loadgroup's scheduler waiting forever."""
    (tmp_path / "test_crash.py").write_text(CRASHING_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    options = [o for o in addopts() if o not in ("-m", "not e2e and not deploy")]
    argv = [sys.executable, "-m", "pytest", str(tmp_path / "test_crash.py"), "-p",
            "no:cacheprovider", "-q", "-o", "addopts=", "--rootdir", str(tmp_path),
            *options]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "crashed while running 'test_crash.py::test_one[3]'" in done.stdout, done.stdout[-3000:]
