"""The top-level Containerfile, checked without a container engine (there is neither docker nor
podman here): parsed with dockerfile-parse, its stages, sources, user and entry point are held
to what the image promises; and (selected with `pytest -m deploy`) the wheel is built from
exactly the files the build stage copies, as the image build would.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser  # type: ignore[import-untyped]

from scoperouter._build import COMPILED_MODULES, SHARED_LIBRARY

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"
BASE = "python:3.12-slim-bookworm"  # 3.12+: the router extra brings mitmproxy 12
VENV = "/opt/scoperouter"
# What a final stage must not install: a compiler or headers (the build stage may).
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "python3-dev", "libc6-dev", "cargo")


def _instructions() -> list[dict[str, Any]]:
    with CONTAINERFILE.open("rb") as f:
        return [i for i in DockerfileParser(fileobj=f).structure if i["instruction"] != "COMMENT"]


def _stages() -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for instruction in _instructions():
        if instruction["instruction"] == "FROM":
            stages.append([])
        assert stages, "the Containerfile must start with FROM"
        stages[-1].append(instruction)
    return stages


def _of(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [str(i["value"]) for i in stage if i["instruction"] == name]


def _copy_args(value: str) -> tuple[list[str], list[str], str]:
    """(flags, sources, destination) of a COPY (shell or JSON form)."""
    words = json.loads(value) if value.lstrip().startswith("[") else shlex.split(value)
    flags = [w for w in words if w.startswith("--")]
    rest = [w for w in words if not w.startswith("--")]
    return flags, rest[:-1], rest[-1]


def test_two_stages_on_the_same_slim_python() -> None:
    stages = _stages()
    assert len(stages) == 2
    build, final = (_of(stage, "FROM")[0].split() for stage in stages)
    assert build[0] == BASE and build[1:] == ["AS", "build"]
    assert final == [BASE]  # same base: the venv's interpreter path holds in the final stage


def test_build_stage_builds_the_wheel_and_installs_it_with_the_router_and_broker_extras() -> None:
    build = _stages()[0]
    run = " ".join(_of(build, "RUN"))
    assert "pip wheel" in run or "python -m build" in run
    assert f"python -m venv {VENV}" in run
    assert "[router,broker]" in run  # the base install has no router (mitmproxy, httptools)


def test_build_stage_compiles_the_hot_path() -> None:
    """mypyc's C needs a compiler in the build stage (the slim image has none), and the wheel
    must come out compiled or the image build fails (SCOPEROUTER_BUILD=compiled)."""
    build = _stages()[0]
    run = " ".join(_of(build, "RUN"))
    assert "gcc" in shlex.split(run) and "libc6-dev" in shlex.split(run)
    assert "SCOPEROUTER_BUILD=compiled python -m pip wheel" in run
    copied = [src for value in _of(build, "COPY") for src in _copy_args(value)[1]]
    assert "setup.py" in copied


def test_every_copy_source_exists() -> None:
    stage_names = {_of(s, "FROM")[0].split()[-1] for s in _stages()}
    for stage in _stages():
        for value in _of(stage, "COPY"):
            flags, sources, _ = _copy_args(value)
            from_stage = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
            if from_stage:
                assert from_stage[0] in stage_names, value
                continue
            assert sources, value
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"


def test_final_stage_has_no_compiler_and_only_the_venv() -> None:
    final = _stages()[1]
    for command in _of(final, "RUN"):
        for tool in BUILD_TOOLS:
            assert tool not in shlex.split(command), f"final stage installs {tool}"
    for value in _of(final, "COPY") + _of(final, "ADD"):
        flags, sources, dest = _copy_args(value)
        assert "--from=build" in flags and sources == [VENV] and dest == VENV, value


def test_final_user_is_not_root() -> None:
    users = _of(_stages()[1], "USER")
    assert users, "the final stage sets no USER: the image would run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) != 0, "a numeric uid lets runAsNonRoot check it"
    assert not group or (group.isdigit() and int(group) != 0)
    creates = " ".join(_of(_stages()[1], "RUN"))
    assert f"--uid {user}" in creates  # the user exists in the image's passwd


def test_entrypoint_is_a_console_script_of_the_package() -> None:
    entrypoints = _of(_stages()[1], "ENTRYPOINT")
    assert entrypoints
    command = json.loads(entrypoints[-1])  # exec form: signals reach the process itself
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    scripts = {
        line.split("=", 1)[0].strip()
        for line in setup["options.entry_points"]["console_scripts"].splitlines()
        if "=" in line
    }
    assert command[0] in scripts, (command, scripts)
    path = [e for e in _of(_stages()[1], "ENV") if "PATH=" in e]
    assert path and f"PATH={VENV}/bin:" in path[0]


def test_the_image_s_python_takes_mitmproxy_12() -> None:
    """The base's Python (its tag) picks the router extra's mitmproxy 12 pin, not 11.0.2 (the
    pin Python 3.11 keeps: issue 33)."""
    from packaging.requirements import Requirement

    tag = _of(_stages()[1], "FROM")[0].split(":", 1)[1]  # "3.12-slim-bookworm"
    python = ".".join(tag.split("-", 1)[0].split(".")[:2])
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    lines = setup["options.extras_require"]["router"].splitlines()
    pins = [Requirement(line) for line in lines if line.strip().startswith("mitmproxy")]
    taken = [
        str(r.specifier)
        for r in pins
        if r.marker is None or r.marker.evaluate({"python_version": python})
    ]
    assert len(taken) == 1 and taken[0].startswith("==12."), (python, taken)


def test_router_and_broker_extras_exist() -> None:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert {"router", "broker"} <= set(setup["options.extras_require"])


@pytest.mark.deploy
def test_the_wheel_builds_from_exactly_the_copied_files(tmp_path: Path) -> None:
    """The build stage's context: only what its COPY instructions take from the repository."""
    context = tmp_path / "src"
    context.mkdir()
    for value in _of(_stages()[0], "COPY"):
        _, sources, dest = _copy_args(value)
        for source in sources:
            target = (
                context / dest
                if not dest.endswith("/") and len(sources) == 1
                else (context / dest / Path(source).name)
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(REPO / source, target)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(context)],
        check=True,
        timeout=600,
        env={**os.environ, "SCOPEROUTER_BUILD": "compiled"},  # as the build stage: must compile
    )
    [wheel] = wheels.glob("scoperouter-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert "scoperouter = scoperouter.cli:main" in zf.read(entry_points).decode()
        assert "Provides-Extra: broker" in zf.read(metadata).decode()
        assert "Provides-Extra: router" in zf.read(metadata).decode()
        record = json.loads(zf.read("scoperouter/_build.json"))
    # the broker's migrations travel in the wheel (`broker db upgrade` in the image needs them)
    assert any(n.startswith("scoperouter/broker/migrations/versions/") for n in names)
    assert "scoperouter/broker/migrations/script.py.mako" in names
    # the compiled hot path (setup.py, mypyc): every module's extension module, and the record
    # of what they were compiled from (scoperouter._build), for this interpreter only
    [entry] = record.values()
    assert entry["build"] == "compiled"
    assert set(entry["extensions"]) == {*COMPILED_MODULES, SHARED_LIBRARY}
    assert {f"scoperouter/{f}" for f in entry["extensions"].values()} <= set(names)
