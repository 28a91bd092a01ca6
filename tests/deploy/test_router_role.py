"""playbooks/roles/scoperouter applied for real to this machine (ansible_connection=local),
in its plain mode (PID 1 here is not systemd): the router it installs, configures and starts
routes a request; a second run changes nothing; --check --diff works; a config override
restarts the router; secrets stay out of the output; the rendered unit passes
`systemd-analyze verify`.

Slow (a virtualenv with scoperouter's dependencies is built, ~1-2 minutes) and root-only (a
system user is created): selected with `pytest -m deploy`. Ansible comes from the operator's
own virtualenv (playbooks/requirements.txt): `<repo>/.venv-deploy`, else PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter import __version__

pytestmark = pytest.mark.deploy

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
FRONT_HOST = "127.0.5.2"
BACK_HOST = "127.0.6.2"
SECRET = f"s3cr3t-{uuid.uuid4().hex}"


def _ansible(tool: str) -> str:
    for candidate in (REPO / ".venv-deploy" / "bin" / tool, shutil.which(tool)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail(
        f"{tool} not found: python3 -m venv .venv-deploy && "
        ".venv-deploy/bin/pip install -r playbooks/requirements.txt",
        pytrace=False,
    )


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"backend": "TestOne-image", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Deployment:
    base: Path
    front_port: int
    inventory: Path

    def run(self, *extra: str, overrides: dict[str, Any] | None = None) -> str:
        argv = [_ansible("ansible-playbook"), "-i", str(self.inventory), "router.yml", *extra]
        if overrides is not None:
            argv += ["-e", json.dumps({"scoperouter_federation_overrides": overrides})]
        env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg")}
        proc = subprocess.run(
            argv, cwd=PLAYBOOKS, capture_output=True, text=True, timeout=900, env=env
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-6000:]
        return output

    @property
    def ctl(self) -> Path:
        return self.base / "etc" / "scoperouter-testone-ctl"

    def pid(self) -> int:
        return int((self.base / "run" / "scoperouter-testone.pid").read_text())

    def get(self, path: str) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{FRONT_HOST}:{self.front_port}{path}", timeout=30) as resp:
            return dict(json.load(resp))


def _changed(output: str) -> int:
    counts = re.findall(r"changed=(\d+)", output)
    assert counts, output[-3000:]
    return sum(int(c) for c in counts)


def _unchanged(output: str) -> None:
    """Nothing changed; else name the tasks that did."""
    blocks = output.split("TASK [")[1:]
    tasks = [b.split("]", 1)[0] for b in blocks if "\nchanged:" in b]
    assert _changed(output) == 0, f"changed: {tasks}\n{output[-3000:]}"


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    if os.geteuid() != 0:
        pytest.skip("the role creates a system user: run as root")
    base = Path(f"/tmp/scoperouter-role-{uuid.uuid4().hex[:8]}")
    base.mkdir(mode=0o755)
    backend = ThreadingHTTPServer((BACK_HOST, 0), _Echo)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    wheels = base / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True,
        timeout=300,
    )
    front_port = _free_port(FRONT_HOST)
    front = f"http://{FRONT_HOST}:{front_port}"
    federation = {
        "version": 1,
        "clouds": {
            "TestOne": {
                "frontends": [{"url": front}],
                "services": {
                    "image": {
                        "public": {
                            "url": front,
                            "backend": f"http://{BACK_HOST}:{backend.server_address[1]}",
                        }
                    }
                },
            }
        },
    }
    host_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "scoperouter_cloud": "TestOne",
        "scoperouter_package": f"scoperouter=={__version__}",
        "scoperouter_pip_environment": {"PIP_FIND_LINKS": str(wheels)},
        "scoperouter_venv": str(base / "venv"),
        "scoperouter_etc_dir": str(base / "etc"),
        "scoperouter_home": str(base / "home"),
        "scoperouter_run_dir": str(base / "run"),
        "scoperouter_log_dir": str(base / "log"),
        "scoperouter_service_mode": "plain",
        "scoperouter_federation": federation,
        "scoperouter_clouds": {
            "router-at-elsewhere": {
                "auth_type": "v3applicationcredential",
                "auth": {"auth_url": "http://127.0.5.9:5000/v3", "application_credential_id": "x"},
            }
        },
        "scoperouter_secure": {
            "router-at-elsewhere": {"auth": {"application_credential_secret": SECRET}}
        },
    }
    inventory = base / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"scoperouter": {"hosts": {"localhost": host_vars}}}}})
    )
    deployment = Deployment(base, front_port, inventory)
    try:
        yield deployment
    finally:
        if deployment.ctl.exists():
            subprocess.run([str(deployment.ctl), "stop"], check=False, timeout=60)
        backend.shutdown()
        shutil.rmtree(base, ignore_errors=True)


def test_first_run_installs_configures_and_starts_a_working_router(deployment: Deployment) -> None:
    output = deployment.run("--diff", "-v")
    assert _changed(output) > 0
    assert SECRET not in output  # secure.yaml's task is no_log, even with --diff -v
    seen = deployment.get("/v2/images")
    assert seen == {"backend": "TestOne-image", "path": "/v2/images"}
    etc = deployment.base / "etc"
    secure = etc / "secure.yaml"
    assert secure.stat().st_mode & 0o777 == 0o600
    assert secure.owner() == "scoperouter"
    assert SECRET in secure.read_text()
    assert (etc / "clouds.yaml").stat().st_mode & 0o777 == 0o600
    assert SECRET not in (etc / "clouds.yaml").read_text()
    status = subprocess.run([str(deployment.ctl), "status"], capture_output=True, text=True)
    assert status.returncode == 0 and "running" in status.stdout
    # the router runs as the service user, with the unit's very command
    unit = (etc / "scoperouter-testone.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    cmdline = Path(f"/proc/{deployment.pid()}/cmdline").read_bytes().split(b"\0")
    assert (
        exec_start.removeprefix("ExecStart=").split()[1:]
        == [part.decode() for part in cmdline if part][-len(exec_start.split()) + 1 :]
    )
    assert Path(f"/proc/{deployment.pid()}").owner() == "scoperouter"


def test_second_run_changes_nothing_and_check_mode_works(deployment: Deployment) -> None:
    pid = deployment.pid()
    _unchanged(deployment.run())
    _unchanged(deployment.run("--check", "--diff"))
    assert deployment.pid() == pid  # not restarted


def test_an_override_is_merged_and_restarts_the_router(deployment: Deployment) -> None:
    pid = deployment.pid()
    output = deployment.run(overrides={"settings": {"hop_limit": 3}})
    assert _changed(output) > 0
    config = yaml.safe_load((deployment.base / "etc" / "federation.yaml").read_text())
    assert config["settings"]["hop_limit"] == 3
    assert "TestOne" in config["clouds"]  # merged over, not replaced
    assert deployment.pid() != pid
    assert deployment.get("/v2/images")["backend"] == "TestOne-image"
    _unchanged(deployment.run(overrides={"settings": {"hop_limit": 3}}))


def test_rendered_unit_passes_systemd_analyze(deployment: Deployment) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = deployment.base / "etc" / "scoperouter-testone.service"
    proc = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    security = unit.read_text()
    for directive in ("NoNewPrivileges=yes", "ProtectSystem=strict", "User=scoperouter"):
        assert directive in security
