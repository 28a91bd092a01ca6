"""The lab's OpenStack venv counts as installed by what it is, not by the Python running the
lab: `scoperouter lab up` from a Python 3.12 virtualenv (issue 33's run of the lab on
mitmproxy 12) and then from Debian's 3.11 one uses the same venv without a pip install at each
switch; a venv now on another Python, or another pin list, is installed again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scoperouter_lab import infra
from scoperouter_lab.layout import LabPaths

PYVENV_CFG = "home = /opt/python/{v}/bin\nversion = {v}\nexecutable = /opt/python/{v}/bin/python3\n"


def _installed_venv(root: Path, version: str) -> LabPaths:
    """A venv as ensure_venv leaves it: its interpreter, uwsgi, pyvenv.cfg and the marker."""
    paths = LabPaths(root)
    (paths.venv / "bin").mkdir(parents=True)
    for name in ("python", "uwsgi"):
        paths.venv_bin(name).touch()
    (paths.venv / "pyvenv.cfg").write_text(PYVENV_CFG.format(v=version))
    (paths.venv / ".scoperouter-lab").write_text(infra.venv_state(paths) + "\n")
    return paths


def test_a_lab_run_from_another_python_keeps_the_installed_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _installed_venv(tmp_path, "3.11.7")
    assert infra.venv_ready(paths)
    assert infra.ensure_venv(paths) == "up to date"  # no pip run (it would fail here)
    other = "3.13.0 (main) [GCC 12.2.0]" if sys.version_info < (3, 13) else "3.11.7 (main)"
    monkeypatch.setattr(sys, "version", other)
    assert infra.venv_ready(paths)
    assert infra.ensure_venv(paths) == "up to date"


def test_a_venv_on_another_python_or_pin_list_is_installed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _installed_venv(tmp_path, "3.11.7")
    (paths.venv / "pyvenv.cfg").write_text(PYVENV_CFG.format(v="3.12.1"))
    assert not infra.venv_ready(paths)
    paths = _installed_venv(tmp_path / "again", "3.11.7")
    monkeypatch.setattr(infra, "pins_text", lambda: "keystone==99.0.0\n")
    assert not infra.venv_ready(paths)
