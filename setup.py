"""scoperouter's build: setup.cfg's metadata, and the hot path compiled with mypyc (issue 31).

``pip install -e .`` and ``pip wheel .`` compile the modules of
``scoperouter._build.COMPILED_MODULES`` (the request path) into extension modules, and record
what they compiled in ``scoperouter/_build.json`` (what ``scoperouter.build()`` reads at run
time: a source changed since makes the process run pure). The install goes on pure Python,
saying why in one line on stderr (``pip -v`` shows it; so does ``scoperouter serve``'s start
line), when ``SCOPEROUTER_BUILD=pure`` is set, when mypyc cannot be imported, when there is no
C compiler or no Python headers, or when the compile fails; ``SCOPEROUTER_BUILD=compiled``
makes those a failed build instead (the Containerfile's).

mypyc type-checks what it compiles with its own settings (written under build/), not
pyproject.toml's: the build's isolated environment has setuptools and mypy but none of the
router's libraries (httptools, prometheus-client...), so their types are Any there
(``ignore_missing_imports``) and the strict flags that forbid Any would refuse them; errors of
modules that are imported but not compiled are not the compile's (``follow_imports =
silent``). ``mypy --strict scoperouter`` (CI) is what checks the types.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "scoperouter"

# scoperouter._build by its path: the package itself is not importable yet (not installed,
# and its __init__ would choose a build).
_spec = importlib.util.spec_from_file_location("_scoperouter_build", PACKAGE / "_build.py")
assert _spec is not None and _spec.loader is not None
_build: Any = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _build  # dataclasses look their module up
_spec.loader.exec_module(_build)

MYPYC_CONFIG = """\
[mypy]
ignore_missing_imports = True
follow_imports = silent
"""


def say(line: str) -> None:
    print(f"scoperouter build: {line}", file=sys.stderr, flush=True)


def _why_pure() -> str | None:
    """Why this install cannot compile (checked before anything is built), else None."""
    wanted = os.environ.get(_build.BUILD_ENV, "")
    if wanted == "pure":
        return f"{_build.BUILD_ENV}=pure at install"
    if wanted not in ("", "compiled"):
        return f"{_build.BUILD_ENV}={wanted[:20]!r} is neither 'compiled' nor 'pure'"
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc (mypy) cannot be imported"
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(compiler)
    if not words or shutil.which(words[0]) is None:
        return f"no C compiler ({compiler!r} not found)"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"no Python headers ({include}/Python.h; Debian: python3-dev)"
    return None


def _must_compile(why: str) -> None:
    """``SCOPEROUTER_BUILD=compiled``: a build that cannot compile fails (the Containerfile)."""
    if os.environ.get(_build.BUILD_ENV) == "compiled":
        raise SystemExit(f"scoperouter build: {_build.BUILD_ENV}=compiled, but {why}")


WHY_PURE = _why_pure()
if WHY_PURE is not None:
    _must_compile(WHY_PURE)


def _extension_names() -> list[str]:
    return [_build.SHARED_LIBRARY, *_build.COMPILED_MODULES]


def _suffix() -> str:
    """This interpreter's extension modules' file name ending (``.cpython-311-...so``)."""
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _remove_stale(root: Path) -> None:
    """Remove this interpreter's extension modules of modules no longer compiled from under
    `root` (the package dir): one would be imported before its ``.py`` and fail."""
    for file in _build.stale_extensions(root, _suffix()):
        say(f"removing {file.name}: its module is no longer compiled")
        file.unlink(missing_ok=True)


def _go_pure(why: str, root: Path, editable: bool, warn: bool = True) -> None:
    """Record a pure build under `root` (the package dir), and remove this interpreter's
    extension modules of an earlier build from beside it (the source tree, or a wheel's
    build/lib: they would be stale, or travel in a pure wheel)."""
    if warn:
        say(f"WARNING: scoperouter is installed pure Python, not compiled: {why}")
    for file in _build.extension_modules(root, _suffix()).values():
        file.unlink(missing_ok=True)  # those of the list, and any a module left behind
    root.mkdir(parents=True, exist_ok=True)
    if not editable:
        (root / _build.RECORD).unlink(missing_ok=True)  # this build's record only
    _build.write_record(root, _build.pure_entry(why))


class BuildPy(build_py):
    """A wheel's record starts pure (build_ext replaces it when it compiles); an editable
    install that compiles nothing cleans its earlier build out of the source tree."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            if WHY_PURE is not None:
                _go_pure(WHY_PURE, PACKAGE, editable=True)
            return
        target = Path(self.build_lib) / "scoperouter"
        if WHY_PURE is not None:
            _go_pure(WHY_PURE, target, editable=False)
        else:  # until build_ext has compiled (a wheel without its record would not say)
            _go_pure("the compile did not run", target, editable=False, warn=False)


class BuildExt(build_ext):
    """mypyc's C generated here (not when setup.py is merely read: pip reads it for the
    metadata too), compiled, and recorded; any failure makes the install pure."""

    def run(self) -> None:
        editable = bool(self.editable_mode or self.inplace)
        record_root = PACKAGE if editable else Path(self.build_lib) / "scoperouter"
        if editable:
            _remove_stale(PACKAGE)
        if editable and _build.decide({}, PACKAGE).kind == "compiled":
            # The source tree's compiled build is this interpreter's and its sources are
            # unchanged (the rule a process applies at import): nothing to compile (a second
            # `pip install -e .`, another extra). Removing scoperouter/_build.json forces it.
            say("the compiled build in the source tree is up to date: nothing to compile")
            self.extensions = []
            return
        extensions: dict[str, str] = {}
        for ext in self.extensions:
            relative = Path(self.get_ext_filename(ext.name)).relative_to("scoperouter")
            extensions[ext.name] = relative.as_posix()
        try:
            entry = _build.compiled_entry(PACKAGE, _build.COMPILED_MODULES, extensions)
            self._mypycify()
            super().run()
        except (Exception, SystemExit) as exc:  # mypyc exits on a type error
            why = f"the compile failed ({type(exc).__name__}: {exc})"[:300]
            _must_compile(why)
            _go_pure(why, record_root, editable)
            self.extensions = []
            return
        _build.write_record(record_root, entry)
        say(f"compiled {len(_build.COMPILED_MODULES)} modules with mypyc")

    def _mypycify(self) -> None:
        """Fill the placeholder extensions setup() was given with mypyc's."""
        from mypyc.build import mypycify

        work = Path(self.build_temp) / "mypyc"
        work.mkdir(parents=True, exist_ok=True)
        config = work / "mypy.ini"
        config.write_text(MYPYC_CONFIG)
        sources = [str(_build.source_of(name, PACKAGE)) for name in _build.COMPILED_MODULES]
        made = mypycify(
            ["--config-file", str(config), "--cache-dir", str(work / "mypy_cache"), *sources],
            target_dir=str(work),
            group_name=_build.SHARED_LIBRARY.removesuffix("__mypyc"),
        )
        by_name = {ext.name: ext for ext in made}
        assert set(by_name) == {ext.name for ext in self.extensions}, sorted(by_name)
        kept = {"_full_name", "_links_to_dynamic", "_needs_stub", "_file_name"}
        for ext in self.extensions:
            for key, value in vars(by_name[ext.name]).items():
                if key not in kept:
                    setattr(ext, key, value)


setup(
    # Placeholders named as mypyc names them (their sources are generated by BuildExt): a
    # platform wheel and a build_ext run when compiling; none when the install is pure.
    ext_modules=[] if WHY_PURE else [Extension(n, sources=[]) for n in _extension_names()],
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
)
