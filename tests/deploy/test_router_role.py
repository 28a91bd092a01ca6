"""playbooks/roles/scoperouter applied for real to this machine (ansible_connection=local),
in its plain mode (PID 1 here is not systemd): the router it installs, configures and starts
routes a request; its forward proxy intercepts TLS with the CA the role wrote (the key mode
0600, the router's user's); a second run changes nothing; --check --diff works; a config
override restarts the router; secrets stay out of the output; the rendered unit passes
`systemd-analyze verify`.

Slow (a virtualenv with scoperouter's dependencies is built, ~1-2 minutes) and root-only (a
system user is created): selected with `pytest -m deploy`. Ansible: tests/deploy/ansible.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
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

from scoperouter import __version__, pki
from tests.ci import missing
from tests.deploy.ansible import (
    Deployment,
    changed,
    free_port,
    local_role_vars,
    scratch_dir,
    systemd_verify,
    unchanged,
    wheelhouse,
)

pytestmark = pytest.mark.deploy

FRONT_HOST = "127.0.5.2"
BACK_HOST = "127.0.6.2"
SECRET = f"s3cr3t-{uuid.uuid4().hex}"


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
class RouterDeployment(Deployment):
    front_port: int = 0
    proxy_port: int = 0

    def get(self, path: str) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{FRONT_HOST}:{self.front_port}{path}", timeout=30) as resp:
            return dict(json.load(resp))


@pytest.fixture(scope="module")
def deployment() -> Iterator[RouterDeployment]:
    if os.geteuid() != 0:
        missing("the role creates a system user: run as root")  # under CI=true: a failure
    base = scratch_dir("role")
    backend = ThreadingHTTPServer((BACK_HOST, 0), _Echo)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    wheels = wheelhouse(base)
    front_port, proxy_port = free_port(FRONT_HOST), free_port(FRONT_HOST)
    front = f"http://{FRONT_HOST}:{front_port}"
    etc = base / "etc"
    proxy_ca, proxy_ca_key = pki.new_ca("TestOne forward proxy CA")
    federation = {
        "version": 1,
        "clouds": {
            "TestOne": {
                "frontends": [{"url": front}],
                "proxy": {
                    "listen": f"{FRONT_HOST}:{proxy_port}",
                    "ca": str(etc / "proxy-ca.crt"),
                    "ca_key": str(etc / "proxy-ca.key"),
                },
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
        **local_role_vars("scoperouter", base),
        "scoperouter_cloud": "TestOne",
        "scoperouter_package": f"scoperouter[router]=={__version__}",
        "scoperouter_pip_environment": {"PIP_FIND_LINKS": str(wheels)},
        "scoperouter_venv": str(base / "venv"),
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
        "scoperouter_proxy_ca": proxy_ca.decode(),
        "scoperouter_proxy_ca_key": proxy_ca_key.decode(),
    }
    inventory = base / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"scoperouter": {"hosts": {"localhost": host_vars}}}}})
    )
    deployment = RouterDeployment(
        base,
        inventory,
        "router.yml",
        "scoperouter-testone",
        "scoperouter_federation_overrides",
        front_port,
        proxy_port,
    )
    try:
        yield deployment
    finally:
        deployment.stop()
        backend.shutdown()
        shutil.rmtree(base, ignore_errors=True)


def test_first_run_installs_configures_and_starts_a_working_router(
    deployment: RouterDeployment,
) -> None:
    output = deployment.run("--diff", "-v")
    assert changed(output) > 0
    assert SECRET not in output  # secure.yaml's task is no_log, even with --diff -v
    seen = deployment.get("/v2/images")
    assert seen == {"backend": "TestOne-image", "path": "/v2/images"}
    etc = deployment.etc
    secure = etc / "secure.yaml"
    assert secure.stat().st_mode & 0o777 == 0o600
    assert secure.owner() == "scoperouter"
    assert SECRET in secure.read_text()
    assert (etc / "clouds.yaml").stat().st_mode & 0o777 == 0o600
    assert SECRET not in (etc / "clouds.yaml").read_text()
    # the forward proxy's CA: its key the router's user's alone (else the router would not
    # have started), never in the output; a CONNECT to the catalog's frontend is intercepted
    key = etc / "proxy-ca.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.owner() == "scoperouter"
    assert key.read_text().splitlines()[1] not in output
    assert (etc / "proxy-ca.crt").stat().st_mode & 0o777 == 0o644
    target = f"{FRONT_HOST}:{deployment.front_port}".encode()
    with socket.create_connection((FRONT_HOST, deployment.proxy_port), timeout=30) as conn:
        conn.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target))
        assert conn.recv(4096).startswith(b"HTTP/1.1 200 ")
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


def test_second_run_changes_nothing_and_check_mode_works(deployment: RouterDeployment) -> None:
    pid = deployment.pid()
    unchanged(deployment.run())
    unchanged(deployment.run("--check", "--diff"))
    assert deployment.pid() == pid  # not restarted


def test_an_override_is_merged_and_restarts_the_router(deployment: RouterDeployment) -> None:
    pid = deployment.pid()
    output = deployment.run(overrides={"settings": {"hop_limit": 3}})
    assert changed(output) > 0
    config = yaml.safe_load((deployment.etc / "federation.yaml").read_text())
    assert config["settings"]["hop_limit"] == 3
    assert "TestOne" in config["clouds"]  # merged over, not replaced
    assert deployment.pid() != pid
    assert deployment.get("/v2/images")["backend"] == "TestOne-image"
    unchanged(deployment.run(overrides={"settings": {"hop_limit": 3}}))


def test_rendered_unit_passes_systemd_analyze(deployment: RouterDeployment) -> None:
    unit = deployment.etc / "scoperouter-testone.service"
    systemd_verify(unit)
    security = unit.read_text()
    for directive in ("NoNewPrivileges=yes", "ProtectSystem=strict", "User=scoperouter"):
        assert directive in security
