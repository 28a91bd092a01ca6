"""The lab of real OpenStack clouds behind scoperouters, for the e2e tests.

The session fixture `lab` runs `scoperouter lab up` on the lab directory ($SCOPEROUTER_LAB_DIR,
default ~/.local/share/scoperouter/lab): a lab that is already up is only checked (seconds), a
missing one is installed and started (minutes). A lab this session brought up is stopped at the
end unless SCOPEROUTER_LAB_KEEP=1; its logs stay in <dir>/logs either way.
SCOPEROUTER_LAB_REUSE=1 uses the running lab as it is (no `up`, which would restart what this
checkout's lab code renders differently): for a checkout that shares a lab it does not own.

These tests are slow and need root or the Debian packages, so they only run when asked for:
`pytest -m e2e` (or SCOPEROUTER_E2E=1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from scoperouter_lab import api
from scoperouter_lab.layout import CloudSpec, LabPaths, default_dir
from scoperouter_lab.procs import ProcessTable

# the session's throwaway PostgreSQL (tests/broker/pg.py), one for every e2e module that asks
from tests.broker.conftest import pg_cluster  # noqa: F401  (a fixture)
from tests.ci import missing

UP_TIMEOUT = 1800  # a cold first run (pip install of OpenStack) takes ~5 minutes


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "tls_lab: needs a lab up with --tls (.ci/run's TLS step; the plain one deselects them)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = "e2e" in (config.getoption("-m") or "") or os.environ.get("SCOPEROUTER_E2E") == "1"
    if wanted:
        return
    skip = pytest.mark.skip(reason="e2e: run with `pytest -m e2e` (brings up the OpenStack lab)")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


@dataclass
class Lab:
    root: Path
    paths: LabPaths
    clouds: list[CloudSpec]
    routed: bool
    state: dict[str, Any]

    clouds_override: Path | None = None

    @property
    def clouds_yaml(self) -> Path:
        return self.clouds_override or self.paths.clouds_yaml

    @property
    def openstack(self) -> str:
        return str(self.paths.venv_bin("openstack"))

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OS_") and "proxy" not in k.lower()
        }
        env["OS_CLIENT_CONFIG_FILE"] = str(self.clouds_yaml)
        return env

    def osc(self, cloud: str, *args: str, json_out: bool = True, timeout: float = 300) -> Any:
        """Run the lab's `openstack` CLI; fail the test with its stderr when it fails."""
        argv = [self.openstack, "--os-cloud", cloud, *args]
        if json_out:
            argv += ["-f", "json"]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
        )
        if proc.returncode != 0:
            pytest.fail(
                f"`openstack --os-cloud {cloud} {' '.join(args)}` failed "
                f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}\nlogs: {self.paths.logs}"
            )
        return json.loads(proc.stdout) if json_out and proc.stdout.strip() else proc.stdout

    def cloud_entry(self, name: str) -> dict[str, Any]:
        return yaml.safe_load(self.clouds_yaml.read_text())["clouds"][name]

    def process_table(self) -> ProcessTable:
        return ProcessTable(self.paths.run)

    def connect(self, cloud: str) -> Any:
        """An openstacksdk Connection for a clouds.yaml entry of the lab (no env, no hook)."""
        from openstack import config as os_config
        from openstack import connection

        cfg = os_config.OpenStackConfig(config_files=[str(self.clouds_yaml)], load_envvars=False)
        return connection.Connection(config=cfg.get_one(cloud=cloud))


def _lab_root() -> Path:
    return default_dir()


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    root = _lab_root()
    paths = LabPaths(root)
    was_up = _status_ok(root)
    if os.environ.get("SCOPEROUTER_LAB_REUSE") == "1":
        if not was_up:
            pytest.fail(f"SCOPEROUTER_LAB_REUSE=1 but the lab in {root} is not up", pytrace=False)
        yield _lab_info(root, paths)
        return
    cmd = [sys.executable, "-m", "scoperouter_lab", "up", "--dir", str(root)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=UP_TIMEOUT, check=False, stdin=None
    )
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        pytest.fail(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}\nlogs: {paths.logs}",
            pytrace=False,
        )
    yield _lab_info(root, paths)
    if not was_up and os.environ.get("SCOPEROUTER_LAB_KEEP") != "1":
        subprocess.run(
            [sys.executable, "-m", "scoperouter_lab", "down", "--dir", str(root)],
            check=False,
            timeout=300,
        )


@pytest.fixture(scope="session")
def fed(lab: Lab) -> tuple[CloudSpec, CloudSpec, dict[str, str]]:
    """Names, addresses and the seeded `tiny` image id of the first two clouds."""
    if len(lab.clouds) < 2 or not lab.routed:
        missing("needs a routed lab of at least two clouds")  # under CI=true: a failure
    one, two = lab.clouds[0], lab.clouds[1]
    tiny = {}
    for cloud in (one, two):
        found = [i.id for i in lab.connect(cloud.slug).image.images(name="tiny")]
        assert len(found) == 1, f"{cloud.name}: images named tiny: {found}"
        tiny[cloud.name] = found[0]
    return one, two, tiny


def _lab_info(root: Path, paths: LabPaths) -> Lab:
    """The lab as its state file describes it; SCOPEROUTER_E2E_CLOUDS_YAML names the clouds.yaml
    of a federation built on the lab's clouds otherwise (tests/deploy/test_federation.py: by
    playbooks/federation.yml, on a lab started with --no-router): the tests then run against
    those routers."""
    state = json.loads(paths.state_file.read_text())
    override = os.environ.get("SCOPEROUTER_E2E_CLOUDS_YAML")
    tls = bool(state.get("tls"))
    if tls:  # a TLS lab (`lab up --tls`): the lab's helpers verify its https with its CA
        api.trust(paths.ca_cert)
    return Lab(
        root=root,
        paths=paths,
        clouds=[CloudSpec(i, tls=tls) for i in range(1, state["clouds"] + 1)],
        routed=bool(state.get("routed")) or bool(override),
        state=state,
        clouds_override=Path(override) if override else None,
    )


def _status_ok(root: Path) -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "scoperouter_lab", "status", "--dir", str(root)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return proc.returncode == 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """On failure, add the tail of each router log (and where all the logs are) to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "e2e" not in item.keywords:
        return
    logs = LabPaths(_lab_root()).logs
    parts = [f"all logs: {logs}/<cloud>/<service>.log"]
    for router_log in sorted(logs.glob("*/router.log")):
        lines = router_log.read_text(errors="replace").splitlines()[-15:]
        parts.append(f"--- {router_log} (last 15 lines)\n" + "\n".join(lines))
    report.sections.append(("lab logs", "\n".join(parts)))
