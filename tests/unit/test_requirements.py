"""A router installed as production installs it (``pip install scoperouter``, no extra) imports:
every third-party module the router's processes import is one of setup.cfg's
``install_requires`` (or what those bring). Found by the federation playbook's test, whose
routers are such an install: fan-out's module imported httpx (the broker's and the tests'
requirement) and every router worker died at start."""

from __future__ import annotations

import configparser
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules only the extras bring (setup.cfg extras_require; not required by mitmproxy,
# keystoneauth1 or openstacksdk either): a router must start without any of them.
EXTRAS_ONLY = (
    "httpx",
    "httpcore",
    "fastapi",
    "starlette",
    "pydantic",
    "uvicorn",
    "uvloop",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "openstackclient",
    "osc_lib",
    "scoperouter_lab",
)
# What the router's processes import: the CLI (serve, route, check-config), the supervisor,
# a worker with its reverse server and its forward proxy.
ROUTER_MODULES = (
    "scoperouter.cli",
    "scoperouter.proxy.supervisor",
    "scoperouter.proxy.worker",
    "scoperouter.proxy.reverse",
    "scoperouter.proxy.forward.engine",
    "scoperouter.router.combined",
)


def _extra_requirements() -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    names = set()
    for _, value in parser.items("options.extras_require"):
        for line in value.splitlines():
            line = line.split("#")[0].strip()
            if line:
                names.add(line.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip())
    return names


def test_the_blocked_modules_are_not_router_requirements() -> None:
    """The list above matches setup.cfg: none of them is a requirement of the router."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    required = parser.get("options", "install_requires").lower()
    for module in ("httpx", "fastapi", "sqlalchemy", "uvloop"):
        assert f"\n{module}" not in required, f"{module} became a router requirement"
    assert {"httpx", "fastapi", "sqlalchemy"} <= {n.lower() for n in _extra_requirements()}


def test_the_router_imports_without_the_extras() -> None:
    code = textwrap.dedent(
        f"""
        import importlib, importlib.abc, sys
        BLOCKED = {EXTRAS_ONLY!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
                return None

        sys.meta_path.insert(0, Block())
        for module in {ROUTER_MODULES!r}:
            importlib.import_module(module)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
