"""What the deploy tests share to run the playbooks for real: where Ansible is, a playbook run
whose output is kept for the assertions, the "changed" counts of its recap, a free port, a
role applied to this machine under a scratch directory, `systemd-analyze verify`.

Ansible (and kubectl, kubernetes-validate) come from the operator's own virtualenv
(playbooks/requirements.txt):
`<repo>/.venv-deploy`, else PATH. Every run uses playbooks/ansible.cfg, as an operator's would
from that directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.ci import missing

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"


def deploy_tool(tool: str) -> str:
    """The path of a tool of the deploy venv (ansible-playbook, kubectl,
    kubernetes-validate...), or a failure that says how to install it."""
    for candidate in (REPO / ".venv-deploy" / "bin" / tool, shutil.which(tool)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail(
        f"{tool} not found: python3 -m venv .venv-deploy && "
        ".venv-deploy/bin/pip install -r playbooks/requirements.txt",
        pytrace=False,
    )


def run_playbook(
    playbook: str,
    inventory: Path | str,
    *extra: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
    tail: int = 6000,
    succeed: bool = True,
) -> str:
    """Run playbooks/<playbook> on `inventory` and return its output (stdout then stderr).
    The run must succeed (else the test fails with the last `tail` characters of the output),
    or with succeed=False fail. `env` is the whole environment of the run (default: this
    process's), to which ANSIBLE_CONFIG is added."""
    argv = [deploy_tool("ansible-playbook"), "-i", str(inventory), playbook, *extra]
    base = os.environ if env is None else env
    run_env = {**base, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg")}
    proc = subprocess.run(
        argv, cwd=PLAYBOOKS, capture_output=True, text=True, timeout=timeout, env=run_env
    )
    output = proc.stdout + proc.stderr
    if (proc.returncode == 0) != succeed:
        # the failed tasks' first lines first: a long task output (pip's) would push them out
        # of the tail
        failures = [
            line[:1500] for line in output.splitlines() if line.startswith(("fatal:", "failed:"))
        ]
        pytest.fail("\n".join([*failures[:5], output[-tail:]]), pytrace=False)
    return output


def changed(output: str) -> int:
    """The sum of the recap's changed= counts over every host."""
    counts = re.findall(r"changed=(\d+)", output)
    assert counts, output[-3000:]
    return sum(int(c) for c in counts)


def unchanged(output: str) -> None:
    """Nothing changed; else name the tasks that did."""
    blocks = output.split("TASK [")[1:]
    tasks = [b.split("]", 1)[0] for b in blocks if "\nchanged:" in b]
    assert changed(output) == 0, f"changed: {tasks}\n{output[-3000:]}"


def free_port(host: str) -> int:
    """A port free on `host` now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wheelhouse(base: Path) -> Path:
    """<base>/wheels with this checkout's wheel (no dependencies): a role's pip task given
    PIP_FIND_LINKS=<it> installs this very code as scoperouter==<its version>."""
    wheels = base / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True,
        timeout=300,
        # pure (setup.py compiles nothing): the roles' tests are about deploying, and a compile
        # costs ~1 min; the compiled wheel is tests/deploy/test_containerfile.py's
        env={**os.environ, "SCOPEROUTER_BUILD": "pure"},
    )
    return wheels


def local_role_vars(prefix: str, base: Path, suffix: str = "") -> dict[str, Any]:
    """Host vars that apply a role (`prefix`: scoperouter, scoperouter_broker) to this machine
    in its plain mode (PID 1 is not systemd here), its directories under `base` (each named
    with `suffix`, for several hosts on one machine) instead of /etc, /var/lib, /run, /var/log."""
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        f"{prefix}_etc_dir": str(base / f"etc{suffix}"),
        f"{prefix}_home": str(base / f"home{suffix}"),
        f"{prefix}_run_dir": str(base / f"run{suffix}"),
        f"{prefix}_log_dir": str(base / f"log{suffix}"),
        f"{prefix}_service_mode": "plain",
    }


@dataclass
class Deployment:
    """One service a role put under `base` (see local_role_vars), run by its ctl script."""

    base: Path
    inventory: Path
    playbook: str  # router.yml, broker.yml
    service: str  # the unit's name: scoperouter-<cloud>, scoperouter-broker...
    overrides_var: str  # the role's dict merged over the rendered config

    def run(self, *extra: str, overrides: dict[str, Any] | None = None) -> str:
        if overrides is not None:
            extra += ("-e", json.dumps({self.overrides_var: overrides}))
        return run_playbook(self.playbook, self.inventory, *extra)

    @property
    def etc(self) -> Path:
        return self.base / "etc"

    @property
    def ctl(self) -> Path:
        return self.etc / f"{self.service}-ctl"

    def pid(self) -> int:
        return int((self.base / "run" / f"{self.service}.pid").read_text())

    def stop(self) -> None:
        if self.ctl.exists():
            subprocess.run([str(self.ctl), "stop"], check=False, timeout=60)


def systemd_verify(unit: str | Path, unit_path: Path | None = None) -> str:
    """`systemd-analyze verify` of a rendered unit (a path, or a unit name found on
    `unit_path` first: a drop-in is verified beside its unit); skips where it is not
    installed (fails under CI=true). Returns its output."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        missing("systemd-analyze is not installed")
    env = dict(os.environ)
    if unit_path is not None:
        env["SYSTEMD_UNIT_PATH"] = f"{unit_path}:"  # the trailing colon: then the default path
    proc = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, env=env
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def scratch_dir(kind: str) -> Path:
    """A new /tmp/scoperouter-<kind>-<random> for a role's directories: not pytest's tmp_path,
    which is under /tmp/pytest-of-root (mode 0700), where the role's service user could not
    reach its own files."""
    base = Path(f"/tmp/scoperouter-{kind}-{uuid.uuid4().hex[:8]}")
    base.mkdir(mode=0o755)
    return base
