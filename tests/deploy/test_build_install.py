"""An install that cannot compile goes on pure Python (issue 31, setup.py): asked for
(``SCOPEROUTER_BUILD=pure``) or without a C compiler, ``pip wheel`` makes a pure wheel whose
record says why, with one warning line; ``SCOPEROUTER_BUILD=compiled`` makes the missing
compiler a failed build. (The compiled wheel: tests/deploy/test_containerfile.py; the
compiled editable install: CI's install, checked by tests/unit/test_build.py.)

Slow-ish (isolated pip builds, no compile): selected with ``pytest -m deploy``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.deploy

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "scoperouter")


def _wheel(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`pip wheel -v` of a copy of the sources (never this checkout: its build/ and its
    compiled modules stay out of it)."""
    src = tmp_path / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name,
                src / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.so", "_build.json"),
            )
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SCOPEROUTER_")}, **env},
    )
    return done, wheels


def _pure_wheel(wheels: Path) -> str:
    """The pure wheel's record of why (and that it carries no extension module)."""
    [wheel] = wheels.glob("scoperouter-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name  # no platform: nothing compiled
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if n.endswith((".so", ".pyd"))]
        [entry] = json.loads(zf.read("scoperouter/_build.json")).values()
    assert entry["build"] == "pure"
    return str(entry["why"])


def test_scoperouter_build_pure_makes_a_pure_wheel(tmp_path: Path) -> None:
    done, wheels = _wheel(tmp_path, SCOPEROUTER_BUILD="pure")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _pure_wheel(wheels) == "SCOPEROUTER_BUILD=pure at install"
    said = [
        line for line in (done.stdout + done.stderr).splitlines() if "scoperouter build:" in line
    ]
    assert len(said) == 1, said  # one line, saying why
    assert said[0].strip() == (
        "scoperouter build: WARNING: scoperouter is installed pure Python, not compiled: "
        "SCOPEROUTER_BUILD=pure at install"
    )


def test_without_a_c_compiler_the_wheel_is_pure_unless_compiled_is_required(
    tmp_path: Path,
) -> None:
    done, wheels = _wheel(tmp_path / "a", CC="/nonexistent/cc")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _pure_wheel(wheels) == "no C compiler ('/nonexistent/cc' not found)"
    done, wheels = _wheel(tmp_path / "b", CC="/nonexistent/cc", SCOPEROUTER_BUILD="compiled")
    assert done.returncode != 0 and not list(wheels.glob("*.whl"))
    assert "SCOPEROUTER_BUILD=compiled, but no C compiler" in done.stdout + done.stderr
