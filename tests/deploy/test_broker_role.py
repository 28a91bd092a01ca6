"""playbooks/roles/scoperouter_broker applied for real to this machine (ansible_connection=local)
on SQLite, in its plain mode (PID 1 here is not systemd): the broker it installs, migrates and
starts answers `GET /v2/catalog` with the configured basic auth (and 401 without); a second run
changes nothing; --check --diff works; an override is merged and restarts the broker; the
secrets (password, Fernet key, a cloud's secret) never reach Ansible's output and sit in mode
0600 files; the rendered unit passes `systemd-analyze verify` and lets the packs' bubblewrap
sandbox start (its namespaces, its system calls, a /proc it may mount).

Slow (a virtualenv with the broker's dependencies is built, ~1-2 minutes) and root-only (a
system user is created): selected with `pytest -m deploy`. Ansible: tests/deploy/ansible.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.fernet import Fernet

from scoperouter import __version__
from scoperouter.broker.services.ansible.sandbox import Sandbox, bwrap_command
from tests.ci import missing
from tests.deploy.ansible import (
    Deployment,
    changed,
    free_port,
    local_role_vars,
    run_playbook,
    scratch_dir,
    systemd_verify,
    unchanged,
    wheelhouse,
)

pytestmark = pytest.mark.deploy

HOST = "127.0.7.2"
PASSWORD = f"osb-{uuid.uuid4().hex}"
FERNET_KEY = Fernet.generate_key().decode()
CLOUD_SECRET = f"s3cr3t-{uuid.uuid4().hex}"


@dataclass
class BrokerDeployment(Deployment):
    port: int = 0

    def catalog(self, password: str | None = PASSWORD) -> tuple[int, dict[str, Any]]:
        headers = {"X-Broker-API-Version": "2.17"}
        if password is not None:
            token = base64.b64encode(f"osb-admin:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        request = urllib.request.Request(f"http://{HOST}:{self.port}/v2/catalog", headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=30) as resp:
                return resp.status, dict(json.load(resp))
        except urllib.error.HTTPError as exc:
            return exc.code, dict(json.load(exc))


@pytest.fixture(scope="module")
def deployment() -> Iterator[BrokerDeployment]:
    if os.geteuid() != 0:
        missing("the role creates a system user: run as root")  # under CI=true: a failure
    base = scratch_dir("broker-role")
    wheels = wheelhouse(base)
    port = free_port(HOST)
    host_vars = {
        **local_role_vars("scoperouter_broker", base),
        "scoperouter_broker_package": f"scoperouter[broker]=={__version__}",
        "scoperouter_broker_pip_environment": {"PIP_FIND_LINKS": str(wheels)},
        "scoperouter_broker_venv": str(base / "venv"),
        "scoperouter_broker_service_name": "scoperouter-broker-test",
        "scoperouter_broker_password": PASSWORD,
        "scoperouter_broker_secret_keys": [FERNET_KEY],
        "scoperouter_broker_clouds": {
            "broker-at-testone": {
                "region_name": "TestOne",
                "auth_type": "password",
                "auth": {
                    "auth_url": "http://127.0.7.9:5000/v3",
                    "username": "broker",
                    "project_name": "admin",
                    "user_domain_name": "Default",
                    "project_domain_name": "Default",
                },
            }
        },
        "scoperouter_broker_secure": {"broker-at-testone": {"auth": {"password": CLOUD_SECRET}}},
        "scoperouter_broker_config_overrides": {
            "listen": f"{HOST}:{port}",
            "auth": {"username": "osb-admin"},
            "clouds": {"TestOne": {"entry": "broker-at-testone"}},
            "worker": {"threads": 1},
            "services": {
                "openstack-project": {
                    "default_cloud": "TestOne",
                    "plans": [{"name": "standard", "description": "A project in TestOne"}],
                }
            },
        },
    }
    inventory = base / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"children": {"scoperouter_broker": {"hosts": {"localhost": host_vars}}}}}
        )
    )
    deployment = BrokerDeployment(
        base,
        inventory,
        "broker.yml",
        "scoperouter-broker-test",
        "scoperouter_broker_config_overrides",
        port,
    )
    try:
        yield deployment
    finally:
        deployment.stop()
        shutil.rmtree(base, ignore_errors=True)


def _services(catalog: dict[str, Any]) -> dict[str, list[str]]:
    return {s["name"]: [p["name"] for p in s["plans"]] for s in catalog["services"]}


def test_first_run_installs_migrates_and_starts_a_working_broker(
    deployment: BrokerDeployment,
) -> None:
    output = deployment.run("--diff", "-v")
    assert changed(output) > 0
    for secret in (PASSWORD, FERNET_KEY, CLOUD_SECRET):
        assert secret not in output  # no_log, even with --diff -v
    status, catalog = deployment.catalog()
    assert status == 200
    assert _services(catalog) == {"openstack-project": ["standard"]}
    status, body = deployment.catalog(password="wrong")
    assert status == 401 and "description" in body
    # the role migrated the database (auto_upgrade is off): SQLite in the home, the user's
    database = deployment.base / "home" / "broker.db"
    assert database.owner() == "scoperouter-broker"
    config = yaml.safe_load((deployment.etc / "broker.yaml").read_text())
    assert config["database"] == {
        "url": f"sqlite:///{deployment.base / 'home'}/broker.db",
        "auto_upgrade": False,
    }
    assert config["clouds"] == {"TestOne": {"entry": "broker-at-testone"}}
    for name in ("scoperouter-broker-test.env", "secure.yaml", "clouds.yaml"):
        assert (deployment.etc / name).stat().st_mode & 0o777 == 0o600, name
    env = (deployment.etc / "scoperouter-broker-test.env").read_text()
    assert PASSWORD in env and FERNET_KEY in env
    assert (deployment.etc / "scoperouter-broker-test.env").owner() == "root"
    assert CLOUD_SECRET in (deployment.etc / "secure.yaml").read_text()
    for name in ("broker.yaml", "clouds.yaml", "scoperouter-broker-test.service"):
        text = (deployment.etc / name).read_text()
        assert PASSWORD not in text and FERNET_KEY not in text and CLOUD_SECRET not in text
    assert Path(f"/proc/{deployment.pid()}").owner() == "scoperouter-broker"
    # the process runs the unit's very command
    unit = (deployment.etc / "scoperouter-broker-test.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    cmdline = Path(f"/proc/{deployment.pid()}/cmdline").read_bytes().split(b"\0")
    words = exec_start.removeprefix("ExecStart=").split()
    assert [w.decode() for w in cmdline if w][-len(words) + 1 :] == words[1:]


def test_second_run_changes_nothing_and_check_mode_works(deployment: BrokerDeployment) -> None:
    pid = deployment.pid()
    unchanged(deployment.run())
    output = deployment.run("--check", "--diff")
    unchanged(output)
    assert PASSWORD not in output
    assert deployment.pid() == pid  # not restarted


def test_an_override_is_merged_and_restarts_the_broker(deployment: BrokerDeployment) -> None:
    pid = deployment.pid()
    plans = [
        {"name": "standard", "description": "A project in TestOne"},
        {"name": "small", "description": "Another plan"},
    ]
    inventory = yaml.safe_load(deployment.inventory.read_text())
    host_vars = inventory["all"]["children"]["scoperouter_broker"]["hosts"]["localhost"]
    overrides = host_vars["scoperouter_broker_config_overrides"]  # -e replaces, not merges
    overrides["services"]["openstack-project"]["plans"] = plans
    output = deployment.run(overrides=overrides)
    assert changed(output) > 0
    assert deployment.pid() != pid
    status, catalog = deployment.catalog()
    assert status == 200 and _services(catalog) == {"openstack-project": ["standard", "small"]}
    unchanged(deployment.run(overrides=overrides))


def test_a_config_the_broker_refuses_never_replaces_the_working_one(
    deployment: BrokerDeployment,
) -> None:
    before = (deployment.etc / "broker.yaml").read_text()
    overrides = {"scoperouter_broker_config_overrides": {"worker": {"threads": -1}}}
    output = run_playbook(
        "broker.yml", deployment.inventory, "-e", json.dumps(overrides), succeed=False
    )
    assert "failed to validate" in output
    assert (deployment.etc / "broker.yaml").read_text() == before
    assert deployment.catalog()[0] == 200


def test_rendered_unit_passes_systemd_analyze(deployment: BrokerDeployment) -> None:
    unit = deployment.etc / "scoperouter-broker-test.service"
    systemd_verify(unit)
    text = unit.read_text()
    for directive in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "User=scoperouter-broker",
        f"ReadWritePaths={deployment.base / 'home'}",
    ):
        assert directive in text


# What bwrap does as an unprivileged user besides what @system-service allows (strace -f of the
# broker's sandbox, bwrap 0.8): it mounts the sandbox's root and /proc, pivots into it, unmounts
# the old root and sets its capabilities inside its user namespace.
BWRAP_SYSCALLS = {"clone", "unshare", "mount", "umount2", "pivot_root", "capset"}
# systemd settings that hide part of /proc (mounts over /proc/sys, /proc/kmsg...; a pid-only
# /proc): the kernel then refuses the fresh /proc bwrap mounts in its user namespace
# (mount_too_revealing), so the sandbox cannot start (ProtectProc=invisible does not)
PROC_HIDING = ("ProtectKernelTunables=yes", "ProtectKernelLogs=yes", "ProcSubset=pid")
NAMESPACES = {"pid": "pid", "ipc": "ipc", "uts": "uts", "cgroup-try": "cgroup", "net": "net"}


def _syscall_group(name: str) -> set[str]:
    """The system calls of a systemd group (@name), its nested groups expanded."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        word = line.split("#")[0].strip()
        if word.startswith("@"):
            calls |= _syscall_group(word)
        elif word:
            calls.add(word)
    return calls


def _allowed_syscalls(unit: str) -> set[str]:
    """The unit's SystemCallFilter= lines as systemd merges them: the first is an allow list,
    the next ones add to it, or remove from it when they start with ~."""
    allowed: set[str] = set()
    for line in unit.splitlines():
        if not line.startswith("SystemCallFilter="):
            continue
        value = line.removeprefix("SystemCallFilter=")
        deny = value.startswith("~")
        calls: set[str] = set()
        for word in value.removeprefix("~").split():
            calls |= _syscall_group(word) if word.startswith("@") else {word}
        allowed = allowed - calls if deny else allowed | calls
    return allowed


def test_rendered_unit_lets_the_packs_sandbox_start(deployment: BrokerDeployment) -> None:
    if shutil.which("systemd-analyze") is None:
        missing("systemd-analyze is not installed")
    unit = (deployment.etc / "scoperouter-broker-test.service").read_text()
    # the namespaces the broker's bwrap makes: user and mount always, and its --unshare-* ones
    args = bwrap_command(
        Sandbox("/usr/bin/bwrap"), pdd=deployment.base, readable=(), chdir="/", drop=False
    )
    needed = {"user", "mnt"} | {
        NAMESPACES[a.removeprefix("--unshare-")] for a in args if a.startswith("--unshare-")
    }
    restrict = re.search(r"^RestrictNamespaces=(.*)$", unit, re.M)
    assert restrict is not None
    assert needed <= set(restrict.group(1).split()), (needed, restrict.group(1))
    assert "net" not in restrict.group(1)  # the sandbox shares the host's network
    missed = BWRAP_SYSCALLS - _allowed_syscalls(unit)
    assert not missed, f"SystemCallFilter= forbids what bwrap needs: {sorted(missed)}"
    for setting in PROC_HIDING:
        assert not re.search(rf"^{setting}", unit, re.M), f"{setting} forbids bwrap's /proc"
    # still hardened: no capability, no new privileges, no privileged system call but those
    for directive in ("CapabilityBoundingSet=\n", "NoNewPrivileges=yes\n", "RestrictSUIDSGID=yes"):
        assert directive in unit
    assert not {"setuid", "chown", "bpf", "init_module", "reboot"} & _allowed_syscalls(unit)
    # and bwrap works here as the broker's user with no_new_privs, as the unit starts it
    probe = subprocess.run(
        ["setpriv", "--reuid=scoperouter-broker", "--regid=scoperouter-broker",
         "--clear-groups", "--no-new-privs", "--bounding-set=-all",
         "bwrap", "--unshare-pid", "--unshare-ipc", "--ro-bind", "/", "/", "--proc", "/proc",
         "--", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
