"""setup.cfg's requirements.

A router installed as production installs it (``pip install 'scoperouter[router]'``) imports:
every third-party module the router's processes import is one of setup.cfg's
``install_requires`` or its ``router`` extra (or what those bring). Found by the federation
playbook's test, whose routers are such an install: fan-out's module imported httpx (the
broker's and the tests' requirement) and every router worker died at start.

Every exact pin and every upper bound tighter than the next major release carries its reason
in a comment (issue 33: the pins mitmproxy 11 forced on everything outlived their reason).
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules only the other extras bring (setup.cfg extras_require but `router`; not required by
# mitmproxy, keystoneauth1 or openstacksdk either), and uvloop (the `router` extra's, imported
# only when the workers run on it: without it they run on asyncio's loop): a router must start
# without any of them.
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


def _requirements() -> list[tuple[str, str, list[str]]]:
    """(section, requirement, the comments that may give its reason) of every requirement of
    setup.cfg: the comment lines right above it and those above its extra's name."""
    found: list[tuple[str, str, list[str]]] = []
    above_key: list[str] = []
    comments: list[str] = []
    key = ""
    for line in (ROOT / "setup.cfg").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
        elif not stripped or stripped.startswith("["):
            comments, key = [], ""
        elif not line[0].isspace():  # `name =`: an option, an extra
            key = stripped.partition("=")[0].strip()
            above_key, comments = comments, []
        elif key in ("install_requires", *_extras()):
            found.append((key, stripped, above_key + comments))
            comments = []
    return found


def _extras() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return list(parser["options.extras_require"])


def _is_tight(specifier: str) -> bool:
    """An exact pin, or an upper bound below the next major release (`<0.30`, `<2.2`, `<5`
    is a major bound; `<1` on a 0.x package too)."""
    if "==" in specifier:
        return True
    return any("." in bound for bound in re.findall(r"<=?\s*([0-9][0-9.]*)", specifier))


def test_each_pin_says_why() -> None:
    requirements = _requirements()
    assert len(requirements) > 30, requirements  # the parser found them
    unexplained = []
    for section, requirement, comments in requirements:
        spec = requirement.partition(";")[0]
        name = re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0]
        if _is_tight(spec) and not any(name.lower() in c.lower() for c in comments):
            unexplained.append(f"{section}: {requirement}")
    assert not unexplained, unexplained


def test_the_pins_mitmproxy_11_forced_are_gone() -> None:
    """cryptography<44.1, httpcore<1.0.8 (h11), httpx<0.29, bcrypt<5 held every install back;
    mitmproxy 11.0.2's own metadata still caps cryptography and h11 where it is installed
    (Python 3.11, the router extra), and bcrypt<5 stays beside it only."""
    by_name: dict[str, list[str]] = {}
    for section, requirement, _ in _requirements():
        name = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()
        by_name.setdefault(name, []).append(f"{section}: {requirement}")
    assert by_name["cryptography"] == ["install_requires: cryptography>=42"]
    assert "httpcore" not in by_name and "h11" not in by_name
    assert by_name["httpx"] == ["broker: httpx>=0.27,<0.30"]
    assert by_name["bcrypt"] == ['peer: bcrypt<5; python_version < "3.12"']
    assert "mitmproxy" not in " ".join(
        requirement for section, requirement, _ in _requirements() if section != "router"
    )


def test_the_test_extra_composes_the_others() -> None:
    """`test` names the other extras (pip resolves a self-reference), not their lists again."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    extras = parser["options.extras_require"]
    test = [line.strip() for line in extras["test"].splitlines() if line.strip()]
    assert test[0] == "scoperouter[client,router,broker,broker-ansible,bench]"
    own = {line.split("=")[0].split(">")[0].split("<")[0] for line in test[1:]}
    for extra in ("client", "router", "broker", "broker-ansible", "bench"):
        for line in extras[extra].splitlines():
            name = re.split(r"[<>=!~\[ ;]", line.strip(), maxsplit=1)[0]
            assert name not in own, f"test repeats {extra}'s {name}"
