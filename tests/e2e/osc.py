"""The `openstack` CLI of the venv running the tests (it carries the `--os-scope` plugin), for
the e2e tests: run it against the lab, fail the test with its stderr when it fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

OPENSTACK = Path(sys.executable).with_name("openstack")
SERVER_TIMEOUT = 300


def cli(
    lab, cloud: str | None, *args: str, scope: str | None = None, json_out: bool = True,
    check: bool = True, timeout: float = SERVER_TIMEOUT,
) -> Any:  # fmt: skip
    """Run the main venv's `openstack` (with our plugin). check=False: the CompletedProcess."""
    if not OPENSTACK.exists():
        pytest.fail(f"{OPENSTACK} is missing: install the package with its `client` extra")
    argv = [str(OPENSTACK)]
    if cloud is not None:
        argv += ["--os-cloud", cloud]
    if scope is not None:
        argv += ["--os-scope", scope]
    argv += list(args)
    if json_out:
        argv += ["-f", "json"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=lab.env(), check=False
    )
    if not check:
        return proc
    if proc.returncode != 0:
        shown = " ".join(argv[1:])
        pytest.fail(
            f"`openstack {shown}` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n"
            f"logs: {lab.paths.logs}"
        )
    return json.loads(proc.stdout) if json_out and proc.stdout.strip() else proc.stdout
