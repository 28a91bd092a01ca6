"""deploy/cloudfoundry/register.sh against a stand-in `cf` (there is no Cloud Foundry here): it
records every call with the password it saw and answers `cf curl /v3/service_brokers?names=...` as
the v3 API does. Checked: the exact commands of a first and of a repeated registration (create,
then update: idempotent), that the password travels in CF_BROKER_PASSWORD and never in an
argument, clear refusals of missing settings; and, with `pytest -m deploy`, shellcheck.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.ci import missing

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "cloudfoundry" / "register.sh"
PASSWORD = "pa55-w0rd-that-must-stay-out-of-argv"

# A shell script, not Python: it starts in milliseconds even on a loaded machine. One line per
# call: the CF_BROKER_PASSWORD it saw, then each argument, separated by \x1f.
FAKE_CF = r"""#!/bin/bash
set -eu
state=$FAKE_CF_STATE
{
    printf '%s' "${CF_BROKER_PASSWORD-}"
    for arg in "$@"; do printf '\x1f%s' "$arg"; done
    printf '\n'
} >>"$state/calls"
case "$1" in
    curl)
        total=0
        if grep -qx -- "${2#*names=}" "$state/brokers" 2>/dev/null; then total=1; fi
        # as cf curl prints it: indented JSON, one key a line
        printf '{\n  "pagination": {\n    "total_results": %s\n  }\n}\n' "$total"
        ;;
    create-service-broker) echo "$2" >>"$state/brokers" ;;
esac
"""


def _register(
    state: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    bin_dir = state / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        cf = bin_dir / "cf"
        cf.write_text(FAKE_CF)
        cf.chmod(0o755)
    environ = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_CF_STATE": str(state),
        "SCOPEROUTER_BROKER_URL": "https://osb.example.org",
        "CF_BROKER_PASSWORD": PASSWORD,
        **(env or {}),
    }
    environ = {k: v for k, v in environ.items() if v}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=environ, timeout=60
    )


def _calls(state: Path) -> list[dict[str, Any]]:
    path = state / "calls"
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        password, *argv = line.split("\x1f")
        calls.append({"argv": argv, "password": password})
    return calls


SERVICES = ["openstack-project", "openstack-server", "openstack-image"]


def test_first_run_creates_then_a_second_run_updates(tmp_path: Path) -> None:
    first = _register(tmp_path)
    assert first.returncode == 0, first.stderr
    assert [c["argv"] for c in _calls(tmp_path)] == [
        ["curl", "/v3/service_brokers?names=scoperouter"],
        ["create-service-broker", "scoperouter", "broker", "https://osb.example.org"],
        *[["enable-service-access", s, "-b", "scoperouter"] for s in SERVICES],
        ["service-access", "-b", "scoperouter"],
    ]
    (tmp_path / "calls").unlink()
    second = _register(tmp_path)
    assert second.returncode == 0, second.stderr
    assert [c["argv"] for c in _calls(tmp_path)][:2] == [
        ["curl", "/v3/service_brokers?names=scoperouter"],
        ["update-service-broker", "scoperouter", "broker", "https://osb.example.org"],
    ]
    assert "updating service broker scoperouter" in second.stdout


def test_the_password_is_in_the_environment_never_in_an_argument(tmp_path: Path) -> None:
    assert _register(tmp_path).returncode == 0
    assert _register(tmp_path).returncode == 0
    calls = _calls(tmp_path)
    brokers = [c for c in calls if str(c["argv"][0]).endswith("-service-broker")]
    assert len(brokers) == 2 and all(c["password"] == PASSWORD for c in brokers)
    assert not any(PASSWORD in " ".join(c["argv"]) for c in calls)


def test_space_scoped_and_org_options(tmp_path: Path) -> None:
    scoped = tmp_path / "scoped"
    scoped.mkdir()
    assert _register(scoped, "--space-scoped", "--name", "sr").returncode == 0
    argv = [c["argv"] for c in _calls(scoped)]
    assert [
        "create-service-broker",
        "sr",
        "broker",
        "https://osb.example.org",
        "--space-scoped",
    ] in argv
    assert not any(a[0] == "enable-service-access" for a in argv)
    org = tmp_path / "org"
    org.mkdir()
    assert _register(org, "--org", "team-a").returncode == 0
    argv = [c["argv"] for c in _calls(org)]
    for service in SERVICES:
        assert ["enable-service-access", service, "-b", "scoperouter", "-o", "team-a"] in argv


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"CF_BROKER_PASSWORD": ""}, (), "set CF_BROKER_PASSWORD"),
        ({"SCOPEROUTER_BROKER_URL": ""}, (), "set SCOPEROUTER_BROKER_URL"),
        ({}, ("--bogus",), "unknown argument: --bogus"),
    ],
)
def test_missing_settings_are_refused_before_cf_runs(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    proc = _register(tmp_path, *args, env=env)
    assert proc.returncode != 0 and message in proc.stderr
    assert _calls(tmp_path) == []


@pytest.mark.deploy
def test_shellcheck_is_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        missing("shellcheck is not installed (apt-get install shellcheck)")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
