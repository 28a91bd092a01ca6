"""A real base install (``pip install scoperouter``, no extra) in a fresh virtualenv: the client's
and the core's, without the router's libraries (issue 33). mitmproxy is not installed, the
client entry points import, `scoperouter serve` says in one line which extra to install, the
core's commands work; with the `client` extra, `openstack --help` has `--os-scope`, and still no
mitmproxy.

Slow-ish (two pip installs into a new virtualenv, 30-90 s with pip's cache): selected with
`pytest -m deploy` (.ci/run's deploy step). tests/unit/test_base_install.py checks the same
with the router's modules blocked, in a second.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_base_install import ROUTER_ONLY, entry_point_modules

pytestmark = pytest.mark.deploy

REPO = Path(__file__).resolve().parents[2]
# What a wheel is built from (as the Containerfile's build stage copies it).
SOURCES = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "scoperouter")
# Distributions only an extra brings: none may be in a base install.
EXTRAS_ONLY = ("mitmproxy", "httptools", "prometheus-client", "httpx", "fastapi", "sqlalchemy")


def _run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Installed pure (setup.py compiles nothing): what is checked here is the base install's
    # dependencies, not the compiled build (tests/unit/test_base_install.py imports the same
    # modules, compiled, with the router's libraries blocked); two compiles would cost ~2 min.
    env["SCOPEROUTER_BUILD"] = "pure"
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",  # never this checkout: the venv's own installation is what is imported
        env=env,
    )


def _installed(venv: Path) -> set[str]:
    done = _run(venv / "bin/python", "-m", "pip", "list", "--format=json")
    assert done.returncode == 0, done.stderr
    return {d["name"].lower() for d in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("base-install")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    venv = root / "venv"
    done = _run(sys.executable, "-m", "venv", venv)
    assert done.returncode == 0, done.stderr
    done = _run(venv / "bin/python", "-m", "pip", "install", "-q", src)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def test_the_base_install_has_no_router_library(venv: Path) -> None:
    installed = _installed(venv)
    assert "scoperouter" in installed
    assert not installed & set(EXTRAS_ONLY), sorted(installed & set(EXTRAS_ONLY))


def test_the_client_entry_points_import_without_mitmproxy(venv: Path) -> None:
    modules = entry_point_modules("openstack.cli.extension")
    code = (
        "import importlib, importlib.util, sys\n"
        "assert importlib.util.find_spec('mitmproxy') is None\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import scoperouter.client, scoperouter.scope, scoperouter.catalog\n"
        "from scoperouter.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        f"set({ROUTER_ONLY!r})), importlib.import_module('scoperouter').__file__)\n"
    )
    done = _run(venv / "bin/python", "-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, _, where = done.stdout.strip().partition(" ")
    assert loaded == "[]" and where.startswith(str(venv)), done.stdout


@pytest.mark.parametrize("argv", [["serve", "--help"], ["serve", "--config", "x.yaml"]])
def test_serve_says_which_extra_to_install(venv: Path, argv: list[str]) -> None:
    done = _run(venv / "bin/scoperouter", *argv)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("scoperouter serve: the router is not installed (no ")
    assert line.endswith(": pip install 'scoperouter[router]'")


def test_the_core_commands_work(venv: Path) -> None:
    done = _run(venv / "bin/scoperouter", "check-config", REPO / "config/federation.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    done = _run(
        venv / "bin/scoperouter",
        *("route", "--config", REPO / "config/federation.yaml", "--cloud", "CloudOne"),
        *("--scope", '{"image": "CloudTwo"}', "GET", "http://127.0.0.2:9292/v2/images"),
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_client_extra_adds_os_scope_and_no_router(venv: Path) -> None:
    src = venv.parent / "src"
    done = _run(venv / "bin/python", "-m", "pip", "install", "-q", f"{src}[client]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not _installed(venv) & set(EXTRAS_ONLY)
    done = _run(venv / "bin/openstack", "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--os-scope" in done.stdout
