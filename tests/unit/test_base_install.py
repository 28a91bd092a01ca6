"""The base install (``pip install scoperouter``, no extra) is the client's and the core's: the
router's libraries are setup.cfg's ``router`` extra. Here with those modules blocked by an
import hook (fast); tests/deploy/test_base_install.py makes a real base install in a fresh
virtualenv."""

from __future__ import annotations

import configparser
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ROUTER_ONLY = ("mitmproxy", "httptools")
"""Modules only the `router` extra brings (prometheus-client too, but openstacksdk imports it
when it is installed, so it is not checked here; the real base install has none)."""


BROKER_ONLY = ("pydantic", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "httpx")
"""Modules only the `broker` extra brings."""


def entry_point_modules(group: str) -> list[str]:
    """The modules setup.cfg's [options.entry_points] `group` names."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return [
        line.split("=", 1)[1].strip().partition(":")[0]
        for line in setup["options.entry_points"][group].splitlines()
        if "=" in line
    ]


def _run(code: str, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    prelude = textwrap.dedent(
        f"""
        import importlib.abc, sys
        BLOCKED = {blocked!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Block())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_client_entry_points_never_import_the_router() -> None:
    """The `openstack --os-scope` plugin and the console script's parser: no router module."""
    modules = entry_point_modules("openstack.cli.extension")
    assert modules == ["scoperouter.client.osc"]
    done = _run(
        f"""
        import importlib
        for module in {modules!r}:
            importlib.import_module(module)
        from scoperouter.cli import build_parser
        build_parser()
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({ROUTER_ONLY!r}))
        print(loaded)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("absent", ROUTER_ONLY)
@pytest.mark.parametrize(
    "argv", [["serve", "--help"], ["serve", "--config", "config/federation.yaml"], ["serve"]]
)
def test_serve_without_the_router_extra_says_which_extra_to_install(
    absent: str, argv: list[str]
) -> None:
    """One line naming the extra, exit 2, no traceback; `serve --help` too (the lab asks it to
    decide whether a router is available)."""
    done = _run(f"from scoperouter.cli import main\nsys.exit(main({argv!r}))", (absent,))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"scoperouter serve: the router is not installed (no {absent}): "
        "pip install 'scoperouter[router]'"
    ]


def test_the_other_commands_work_without_the_router_extra() -> None:
    """check-config (and the top-level help, which lists serve with the extra it needs)."""
    done = _run(
        """
        from scoperouter.cli import main
        sys.exit(main(["check-config", "config/federation.yaml"]))
        """,
        (*ROUTER_ONLY, "prometheus_client"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    done = _run("from scoperouter.cli import main\nsys.exit(main(['--help']))", ROUTER_ONLY)
    assert done.returncode == 0
    assert "(needs: pip install 'scoperouter[router]')" in " ".join(done.stdout.split())


def test_the_console_script_works_without_the_broker_extra() -> None:
    """A router host or a laptop has no broker extra: every command parses, and `broker` says
    in one line what to install (the broker's CLI package failed in `register`, after the
    console script's import check, and every `scoperouter` command died with a traceback)."""
    for argv, code in ((["--help"], 0), (["check-config", "config/federation.yaml"], 0)):
        done = _run(f"from scoperouter.cli import main\nsys.exit(main({argv!r}))", BROKER_ONLY)
        assert done.returncode == code and "Traceback" not in done.stderr, done.stderr[-3000:]
    done = _run("from scoperouter.cli import main\nsys.exit(main(['broker']))", BROKER_ONLY)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().endswith("pip install 'scoperouter[broker]'")
