"""Which build of scoperouter a bench measured: compiled (the hot modules are extension
modules, mypyc's) or pure Python, as the router's own interpreter imports them.

Asked of a child started like the bench's routers (the same interpreter, flags and
environment: ``PYTHONPATH`` puts the checkout first), not of the bench's own process: what the
router ran is what counts. An INFO line of the report, never a verdict.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

from scoperouter._build import COMPILED_MODULES

# The modules every request crosses (issue 31): the HTTP layer, the pipeline, the routing
# decision, the scope parser, catalog lookups, the access line; the one list setup.py compiles.
HOT_MODULES = COMPILED_MODULES

_PROBE = (
    "import importlib, json, sys\n"
    "import scoperouter\n"
    "files = {}\n"
    "for name in sys.argv[1:]:\n"
    "    files[name] = getattr(importlib.import_module(name), '__file__', None) or ''\n"
    "print(json.dumps({'files': files, 'said': scoperouter.build_line()}))\n"
)


def probe(
    python: Sequence[str],
    env: Mapping[str, str] | None = None,
    modules: Sequence[str] = HOT_MODULES,
) -> tuple[dict[str, str], str]:
    """Each module's ``__file__`` as `python` (an interpreter and its flags) imports it, and
    what ``scoperouter.build_line()`` says there (``compiled``, ``pure (why)``)."""
    result = subprocess.run(
        [*python, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"could not import scoperouter's hot modules: {result.stderr[-500:]}")
    found = json.loads(result.stdout)
    return dict(found["files"]), str(found["said"])


def compiled(path: str) -> bool:
    """An extension module (``.so``, ``.pyd``: what mypyc builds), not Python source."""
    return path.endswith(tuple(EXTENSION_SUFFIXES)) or path.endswith((".so", ".pyd"))


def describe(files: Mapping[str, str], said: str | None = None) -> dict[str, Any]:
    """``{"build": kind, "compiled": [modules], "pure": [modules]}`` (and ``said``: what the
    package itself says, ``scoperouter.build_line()``); the kind is compiled, pure, mixed, or
    unknown (no module found, or the package says another build than its modules are)."""
    done = sorted(name for name, path in files.items() if compiled(path))
    pure = sorted(name for name, path in files.items() if not compiled(path))
    if not files:
        build = "unknown"
    elif not done:
        build = "pure"
    elif not pure:
        build = "compiled"
    else:
        build = "mixed"
    found: dict[str, Any] = {"build": build, "compiled": done, "pure": pure}
    if said is not None:
        found["said"] = said
        if build in ("pure", "compiled") and said.split(" ", 1)[0] != build:
            found["build"] = "unknown"
            found["error"] = f"scoperouter.build() says {said!r}, its modules are {build}"
    return found


def line(build: Mapping[str, Any]) -> str:
    """The report's line: the build (and why it is pure, as the package says), and which hot
    modules were what when it is mixed."""
    kind = build.get("build", "unknown")
    if kind == "pure":
        said = str(build.get("said", ""))
        why = f"; {said.partition(' ')[2].strip('()')}" if said.startswith("pure (") else ""
        return f"pure (no compiled module: scoperouter's hot modules are Python source{why})"
    if kind == "compiled":
        return f"compiled (the {len(build['compiled'])} hot modules are extension modules)"
    if kind == "mixed":
        return f"mixed: compiled {', '.join(build['compiled'])}; pure {', '.join(build['pure'])}"
    return f"unknown ({build.get('error', 'not determined')})"


def measured_build(python: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:func:`describe` of what `python` imports; ``unknown`` with the reason when it fails."""
    try:
        return describe(*probe(python, env))
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        return {"build": "unknown", "compiled": [], "pure": [], "error": str(exc)[:300]}
