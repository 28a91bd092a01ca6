"""The two builds (issue 31, scoperouter._build): compiled or pure, chosen once per process,
all or nothing; SCOPEROUTER_PURE=1; a stale compiled build runs pure with one warning.

The rule is checked on a package dir of its own (sources, a record, stand-in extension
files); the real build in subprocesses: this checkout's as installed (compiled under CI=true,
which must not have fallen back to pure), and a copy of it whose source was edited.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import scoperouter
from scoperouter import _build
from scoperouter._build import COMPILED_MODULES, SHARED_LIBRARY, decide

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = EXTENSION_SUFFIXES[0]


def _is_extension(path: str) -> bool:
    return path.endswith(tuple(EXTENSION_SUFFIXES))


def _package(tmp_path: Path) -> Path:
    """A package dir with every compiled module's source, an extension file for each and the
    record of a compiled build of them (what setup.py writes)."""
    root = tmp_path / "scoperouter"
    extensions = {}
    for name in (*COMPILED_MODULES, SHARED_LIBRARY):
        parts = name.split(".")[1:]
        source = root.joinpath(*parts[:-1], parts[-1] + ".py")
        source.parent.mkdir(parents=True, exist_ok=True)
        if name != SHARED_LIBRARY:
            source.write_text(f"# {name}\n")
        extension = source.with_name(parts[-1] + SUFFIX)
        extension.write_bytes(b"\x7fELF")
        extensions[name] = extension.relative_to(root).as_posix()
    _build.write_record(root, _build.compiled_entry(root, COMPILED_MODULES, extensions))
    return root


def test_a_compiled_build_whose_sources_are_unchanged_is_compiled(tmp_path: Path) -> None:
    root = _package(tmp_path)
    assert decide({}, root) == _build.Build("compiled")
    assert decide({"SCOPEROUTER_PURE": "0"}, root).kind == "compiled"  # 0: not asked for


def test_scoperouter_pure_makes_the_build_pure(tmp_path: Path) -> None:
    root = _package(tmp_path)
    chosen = decide({"SCOPEROUTER_PURE": "1"}, root)
    assert chosen.kind == "pure" and chosen.line() == "pure (SCOPEROUTER_PURE=1)"
    assert not chosen.stale


def test_a_source_changed_since_the_compile_makes_the_build_stale_and_pure(
    tmp_path: Path,
) -> None:
    root = _package(tmp_path)
    routing = root / "routing.py"
    routing.write_text(routing.read_text() + "# edited\n")
    chosen = decide({}, root)
    assert chosen.kind == "pure" and chosen.stale
    assert "scoperouter/routing.py changed since it was compiled" in chosen.why
    assert "`pip install -e .` rebuilds" in chosen.why
    # Same size, same mtime, other bytes: caught when the stat differs... and only then; a
    # file touched but unchanged (a checkout, a copy) is no stale build.
    routing.write_text("# scoperouter.routing\n")
    os.utime(routing, ns=(1, 1))
    assert decide({}, root) == _build.Build("compiled")
    scope = root / "scope.py"
    scope.write_text(scope.read_text().replace("scope", "SCOPE"))  # same size
    os.utime(scope, ns=(2, 2))
    assert decide({}, root).why.startswith("stale: scoperouter/scope.py changed")


def test_a_record_of_another_list_of_modules_makes_the_build_stale(tmp_path: Path) -> None:
    """The shared library holds every module compiled then: one since taken out of the list
    (or added to it) would be imported from it, not from its source."""
    root = _package(tmp_path)
    record = json.loads((root / _build.RECORD).read_text())
    entry = record[_build.interpreter_key()]
    entry["modules"]["scoperouter.oldhot"] = dict(entry["modules"]["scoperouter.scope"])
    (root / _build.RECORD).write_text(json.dumps(record))
    chosen = decide({}, root)
    assert chosen.kind == "pure" and chosen.stale
    assert "another list of modules (scoperouter.oldhot)" in chosen.why
    del entry["modules"]["scoperouter.oldhot"], entry["modules"]["scoperouter.scope"]
    (root / _build.RECORD).write_text(json.dumps(record))
    assert "another list of modules (scoperouter.scope)" in decide({}, root).why


def test_a_build_without_its_extension_modules_or_record_is_pure(tmp_path: Path) -> None:
    root = _package(tmp_path)
    (root / "http" / f"server{SUFFIX}").unlink()
    chosen = decide({}, root)
    assert chosen.kind == "pure" and not chosen.stale
    assert chosen.why.startswith("not built: no extension module for scoperouter.http.server")
    (root / _build.RECORD).unlink()
    assert decide({}, root).why.startswith("not built: nothing compiled for this interpreter")


def test_the_record_is_per_interpreter_and_says_why_an_install_is_pure(tmp_path: Path) -> None:
    """A 3.11 and a 3.12 virtualenv may share an editable checkout: each has its entry."""
    root = _package(tmp_path)
    _build.write_record(root, _build.pure_entry("SCOPEROUTER_BUILD=pure at install"), "other-1")
    assert decide({}, root).kind == "compiled"
    record = json.loads((root / _build.RECORD).read_text())
    assert set(record) == {_build.interpreter_key(), "other-1"}
    _build.write_record(root, _build.pure_entry("no C compiler ('cc' not found)"))
    assert decide({}, root).line() == "pure (not built: no C compiler ('cc' not found))"


def test_this_process_runs_one_build_all_of_it() -> None:
    """Every compiled module is an extension module in the compiled build, its .py in the
    pure one. Under CI=true the build must be the one asked for: compiled (the install
    compiles), unless SCOPEROUTER_PURE is set (.ci/run's pure step)."""
    kind = scoperouter.build()
    files = {name: importlib.import_module(name).__file__ or "" for name in COMPILED_MODULES}
    if kind == "compiled":
        assert all(_is_extension(f) for f in files.values()), files
    else:
        assert all(f.endswith(".py") for f in files.values()), files
    if os.environ.get("CI") == "true":
        wanted = "pure" if os.environ.get("SCOPEROUTER_PURE", "") not in ("", "0") else "compiled"
        assert kind == wanted, f"CI ran the {scoperouter.build_line()} build, not {wanted}"


def _child(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SCOPEROUTER_", "_SCOPE"))}
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(cwd), **env},
        timeout=60,
        check=False,
    )


_FILES = textwrap.dedent(
    """
    import importlib, json, scoperouter
    from scoperouter._build import COMPILED_MODULES
    files = [importlib.import_module(n).__file__ for n in COMPILED_MODULES]
    print(json.dumps({"line": scoperouter.build_line(), "files": files}))
    """
)


def test_scoperouter_pure_gives_every_compiled_module_its_source() -> None:
    done = _child(_FILES, ROOT, SCOPEROUTER_PURE="1")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["line"] == "pure (SCOPEROUTER_PURE=1)"
    assert all(f.endswith(".py") for f in found["files"]), found["files"]
    assert all(f.startswith(str(ROOT / "scoperouter")) for f in found["files"])


def test_a_stale_checkout_runs_pure_with_one_warning(tmp_path: Path) -> None:
    """A copy of this checkout's compiled package, one source edited: every compiled module
    is imported from its .py, one warning names the command that rebuilds, and a process it
    starts (a router's worker) runs pure without saying it again."""
    installed = decide({}, _build.PACKAGE_DIR)  # this checkout's, whatever SCOPEROUTER_PURE
    if installed.kind != "compiled":
        if os.environ.get("CI") == "true":  # CI's install compiles
            pytest.fail(f"no compiled build to test: {installed.line()}")
        pytest.skip(f"needs this checkout's compiled build (pip install -e .): {installed.line()}")
    shutil.copytree(ROOT / "scoperouter", tmp_path / "scoperouter", symlinks=True)
    routing = tmp_path / "scoperouter" / "routing.py"
    routing.write_text(routing.read_text() + "\n# edited after the compile\n")
    compiled = _child(_FILES, ROOT)  # the checkout itself
    assert json.loads(compiled.stdout)["line"] == "compiled", compiled.stderr
    code = _FILES + (
        "\nimport subprocess, sys\n"
        "subprocess.run([sys.executable, '-Wdefault', '-c', 'import scoperouter'], check=True)\n"
    )
    done = _child(code, tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["line"].startswith("pure (stale: scoperouter/routing.py changed since it was")
    assert all(f.endswith(".py") for f in found["files"]), found["files"]
    assert all(f.startswith(str(tmp_path)) for f in found["files"])
    warnings = [line for line in done.stderr.splitlines() if "StaleBuildWarning" in line]
    assert len(warnings) == 1, done.stderr  # the child started by it says nothing
    assert "`pip install -e .` rebuilds" in warnings[0]


def test_extension_modules_of_modules_no_longer_compiled_are_stale(tmp_path: Path) -> None:
    """A module taken out of COMPILED_MODULES leaves its extension module beside its .py: the
    import system would take it first and fail (its code is gone from the shared library), so
    setup.py removes what _build.stale_extensions names, and only that."""
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    kept = [
        tmp_path / f"_compiled__mypyc{suffix}",
        tmp_path / "http" / f"server{suffix}",
        tmp_path / "router" / f"pipeline{suffix}",
    ]
    stale = [tmp_path / f"oldhot{suffix}", tmp_path / "router" / f"gone{suffix}"]
    other_abi = tmp_path / "router" / "gone.cpython-312-x86_64-linux-gnu.so"
    for path in [*kept, *stale, other_abi, tmp_path / "router" / "gone.py"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    found = _build.extension_modules(tmp_path, suffix)
    assert found["scoperouter.http.server"] == kept[1]
    assert found["scoperouter._compiled__mypyc"] == kept[0]
    assert _build.stale_extensions(tmp_path, suffix) == sorted(stale)
    setup_py = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert "_remove_stale(PACKAGE)" in setup_py  # before the up-to-date check returns
