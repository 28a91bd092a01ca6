"""Which build of scoperouter this process runs: the hot path compiled (mypyc's extension
modules) or pure Python, chosen once, when ``scoperouter`` is imported, for the whole process.

* :data:`COMPILED_MODULES` - the modules every request crosses (issue 31: the HTTP layer, the
  pipeline, the routing decision, the scope parser, catalog lookups, the access line), the one
  list ``setup.py`` compiles and ``bench/build.py`` checks;
* ``setup.py`` records what it compiled in ``scoperouter/_build.json`` (git-ignored): per
  interpreter ABI (``cpython-311-x86_64-linux-gnu``), each module's source (size, mtime,
  sha256) and its extension module's file name; or that the install is pure, and why;
* :func:`choose` (``scoperouter/__init__.py`` calls it) reads that record. The build is pure,
  all of it, when ``SCOPEROUTER_PURE`` is set (not empty, not ``0``), when nothing was
  compiled for this interpreter, when an extension module is missing, or when a compiled
  module's source changed since it was compiled (**stale**: an editable checkout edited after
  ``pip install -e .``; one warning names the command that rebuilds). Pure, a meta-path
  finder gives every compiled module its ``.py``: never a mix of compiled and pure modules in
  one process. Compiled, the import system's own order finds the extension modules (an
  extension module comes before a ``.py`` of the same name in a directory).

The check is cheap: it reads the record and stats each source and extension module (~0.2 ms
for 23 modules); only a source whose size or mtime differs from the record's is hashed (a
wheel's install writes new mtimes: its 21 sources are then hashed, ~0.3 ms more),
so a file touched but unchanged is no stale build. This module imports only the standard
library: ``setup.py`` loads it by its path, before anything is installed.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

COMPILED_MODULES = (
    "scoperouter.http.client",
    "scoperouter.http.flow",
    "scoperouter.http.heads",
    "scoperouter.http.pool",
    "scoperouter.http.request",
    "scoperouter.http.server",
    "scoperouter.http.upstream",
    "scoperouter.http.wire",
    "scoperouter.router.pipeline",
    "scoperouter.router.accesslog",
    "scoperouter.routing",
    "scoperouter.scope",
    "scoperouter.catalog",
    # the rest of the request path (hotpath)
    "scoperouter.proxy.reverse",
    "scoperouter.router.state",
    "scoperouter.router.targets",
    "scoperouter.router.health",
    "scoperouter.router.metrics",
    "scoperouter.router.tokens",
    "scoperouter.semantics",
    "scoperouter.prepared",
    "scoperouter.proxy.busypoll",  # poke(): at each request read and each answer written
    # the access line (accessline)
    "scoperouter.router.logs",
    # the catalog build (catalog)
    "scoperouter.config",
    # the combined requests' path (A & B, A | B: the fan-out, the merge, the budget)
    "scoperouter.router.combined",
    "scoperouter.router.fanout",
    "scoperouter.router.budget",
    "scoperouter.merge",
    "scoperouter.merge_marker",
)
"""What mypyc compiles: the request path, and the HTTP modules it calls into."""

SHARED_LIBRARY = "scoperouter._compiled__mypyc"
"""The extension module mypyc puts the compiled code of every module in (each module's own
extension module is a small shim that imports it): inside the package, where an editable
install's finder looks (``mypycify(group_name="scoperouter._compiled")``)."""

RECORD = "_build.json"
PURE_ENV = "SCOPEROUTER_PURE"
BUILD_ENV = "SCOPEROUTER_BUILD"  # read by setup.py at install time: "pure" compiles nothing
REBUILD = "pip install -e ."
_WARNED_ENV = "_SCOPEROUTER_STALE_WARNED"  # the processes a warned process starts say it once

PACKAGE_DIR = Path(__file__).resolve().parent


class StaleBuildWarning(RuntimeWarning):
    """A compiled module's source changed after it was compiled: the process runs pure."""


@dataclass(frozen=True, slots=True)
class Build:
    """The build this process runs, and why it is pure when it is."""

    kind: Literal["compiled", "pure"]
    why: str = ""  # "" when compiled
    stale: bool = False

    def line(self) -> str:
        """``compiled``, or ``pure (<why>)``: what a start line or a report says."""
        return self.kind if self.kind == "compiled" else f"pure ({self.why})"


def source_of(module: str, root: Path = PACKAGE_DIR) -> Path:
    """The ``.py`` of a module of :data:`COMPILED_MODULES` under the package dir `root`."""
    parts = module.split(".")
    assert parts[0] == "scoperouter" and len(parts) > 1, module
    return root.joinpath(*parts[1:-1], parts[-1] + ".py")


def extension_modules(root: Path, suffix: str) -> dict[str, Path]:
    """Every extension module of one interpreter (its ``EXT_SUFFIX``, e.g.
    ``.cpython-311-x86_64-linux-gnu.so``) under the package dir `root`, by dotted name: what an
    earlier compile left beside the sources (the package has no other extension modules)."""
    found = {}
    for path in root.rglob(f"*{suffix}"):
        parts = path.relative_to(root).with_name(path.name.removesuffix(suffix)).parts
        found[".".join(("scoperouter", *parts))] = path
    return found


def stale_extensions(root: Path, suffix: str) -> list[Path]:
    """The extension modules under `root` of modules no longer compiled (a module taken out of
    :data:`COMPILED_MODULES`): the import system would take one before its ``.py``, and it
    would look for its code in a shared library that no longer has it."""
    wanted = {SHARED_LIBRARY, *COMPILED_MODULES}
    return sorted(p for name, p in extension_modules(root, suffix).items() if name not in wanted)


def sha256_of(path: Path) -> str:
    import hashlib  # only when a stat differs: not on every start

    return hashlib.sha256(path.read_bytes()).hexdigest()


def interpreter_key() -> str:
    """Whose extension modules a record entry describes: the interpreter's ABI, as its
    extension modules' names carry it (``cpython-311-x86_64-linux-gnu``)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # ".cpython-311-x86_64-linux-gnu.so"
    return suffix.strip(".").rpartition(".")[0] or sys.implementation.name


def read_record(root: Path = PACKAGE_DIR) -> dict[str, Any]:
    """The whole record (every interpreter's entry); empty when there is none."""
    try:
        data = json.loads((root / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def compiled_entry(
    root: Path, modules: Sequence[str], extensions: Mapping[str, str]
) -> dict[str, Any]:
    """The record entry of a compiled build (``setup.py``): each module's source as compiled
    and its extension module's file (`extensions`: module -> path relative to `root`)."""
    entry: dict[str, Any] = {"build": "compiled", "modules": {}, "extensions": {}}
    for name in modules:
        source = source_of(name, root)
        st = source.stat()
        entry["modules"][name] = {
            "source": source.relative_to(root).as_posix(),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": sha256_of(source),
        }
    entry["extensions"] = dict(extensions)
    return entry


def pure_entry(why: str) -> dict[str, Any]:
    """The record entry of an install that compiled nothing (``setup.py``), and why."""
    return {"build": "pure", "why": why}


def write_record(root: Path, entry: Mapping[str, Any], key: str | None = None) -> None:
    """Put `entry` in the record under `root` for this interpreter (other interpreters'
    entries kept: a 3.11 and a 3.12 virtualenv may share an editable checkout)."""
    data = read_record(root)
    data[key or interpreter_key()] = dict(entry)
    tmp = root / (RECORD + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / RECORD)


def decide(environ: Mapping[str, str], root: Path = PACKAGE_DIR) -> Build:
    """The build a process started with `environ` runs (see the module's docstring)."""
    pure = environ.get(PURE_ENV, "")
    if pure not in ("", "0"):
        return Build("pure", f"{PURE_ENV}={pure[:20]}")
    entry = read_record(root).get(interpreter_key())
    if not isinstance(entry, dict):
        return Build("pure", f"not built: nothing compiled for this interpreter ({REBUILD})")
    if entry.get("build") != "compiled":
        why = str(entry.get("why", "unknown"))[:200]
        return Build("pure", f"not built: {why}")
    extensions: dict[str, str] = entry.get("extensions", {})
    for name in (*COMPILED_MODULES, SHARED_LIBRARY):
        file = extensions.get(name)
        if file is None or not (root / file).is_file():
            return Build("pure", f"not built: no extension module for {name} ({REBUILD})")
    modules: dict[str, dict[str, Any]] = entry.get("modules", {})
    if set(modules) != set(COMPILED_MODULES):
        # The shared library holds the modules compiled then: one taken out of the list since
        # would still be imported from it by the others (its .py edits ignored).
        other = sorted(set(modules) ^ set(COMPILED_MODULES))
        return Build(
            "pure",
            f"stale: compiled for another list of modules ({', '.join(other)[:120]}); "
            f"`{REBUILD}` rebuilds",
            stale=True,
        )
    for name in COMPILED_MODULES:
        changed = _changed(root, modules[name])  # each one is recorded (the check above)
        if changed is not None:
            return Build(
                "pure",
                f"stale: {changed} changed since it was compiled; `{REBUILD}` rebuilds",
                stale=True,
            )
    return Build("compiled")


def _changed(root: Path, recorded: Mapping[str, Any]) -> str | None:
    """The source (relative path) when it is not what was compiled, else None."""
    relative = str(recorded.get("source", "?"))
    source = root / relative
    try:
        st = source.stat()
    except OSError:
        return f"scoperouter/{relative}"
    if st.st_size == recorded.get("size") and st.st_mtime_ns == recorded.get("mtime_ns"):
        return None
    if st.st_size == recorded.get("size") and sha256_of(source) == recorded.get("sha256"):
        return None  # touched (a checkout, a copy), not changed
    return f"scoperouter/{relative}"


class SourceFinder:
    """Gives each module of :data:`COMPILED_MODULES` its ``.py`` (the pure build), wherever
    its package is; any other module is the next finders'. (A meta-path finder:
    ``importlib.abc.MetaPathFinder``'s protocol, without importing it at every start.)"""

    def __init__(self, names: Sequence[str] = COMPILED_MODULES) -> None:
        self.names = frozenset(names)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        import importlib.util

        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path if path is not None else sys.path:
            file = os.path.join(entry or ".", leaf)
            if os.path.isfile(file):
                return importlib.util.spec_from_file_location(fullname, file)
        return None

    def invalidate_caches(self) -> None:
        """Nothing cached (``importlib.invalidate_caches`` calls it)."""


_chosen: Build | None = None


def choose() -> Build:
    """Decide this process's build (once): the finder installed when it is pure, the stale
    warning given (once per process tree). ``scoperouter/__init__.py`` calls it."""
    global _chosen
    if _chosen is not None:
        return _chosen
    chosen = decide(os.environ)
    if chosen.kind == "pure" and not any(isinstance(f, SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder())
    if chosen.stale and not os.environ.get(_WARNED_ENV):
        os.environ[_WARNED_ENV] = "1"  # its routers' workers need not say it again
        warnings.warn(
            f"scoperouter runs pure Python: its compiled build is {chosen.why}",
            StaleBuildWarning,
            stacklevel=2,
        )
    _chosen = chosen
    return chosen


def build() -> Literal["compiled", "pure"]:
    """``"compiled"`` or ``"pure"``: the build this process runs."""
    return choose().kind


def build_line() -> str:
    """``compiled``, or ``pure (<why>)``."""
    return choose().line()
