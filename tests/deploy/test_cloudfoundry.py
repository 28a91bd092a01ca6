"""deploy/cloudfoundry/register.sh against a stand-in `cf` (there is no Cloud Foundry here): it
records every call with its environment and answers `cf curl /v3/service_brokers?names=...` as
the v3 API does. Checked: the exact commands of a first and of a repeated registration (create,
then update: idempotent), that the password travels in CF_BROKER_PASSWORD and never in an
argument, clear refusals of missing settings; and, with `pytest -m deploy`, shellcheck.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "cloudfoundry" / "register.sh"
PASSWORD = "pa55-w0rd-that-must-stay-out-of-argv"

FAKE_CF = """#!/usr/bin/env python3
import json, os, sys
state = os.environ["FAKE_CF_STATE"]
with open(state + "/calls.jsonl", "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:],
                          "password": os.environ.get("CF_BROKER_PASSWORD")}) + "\\n")
brokers = state + "/brokers"
known = open(brokers).read().split() if os.path.exists(brokers) else []
if sys.argv[1] == "curl":
    name = sys.argv[2].split("names=", 1)[1]
    total = int(name in known)
    print(json.dumps({"pagination": {"total_results": total}, "resources": []}, indent=2))
elif sys.argv[1] == "create-service-broker":
    with open(brokers, "a") as f:
        f.write(sys.argv[2] + "\\n")
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


def _calls(state: Path) -> list[dict[str, object]]:
    path = state / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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
    (tmp_path / "calls.jsonl").unlink()
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
    brokers = [c for c in calls if str(c["argv"][0]).endswith("-service-broker")]  # type: ignore[index]
    assert len(brokers) == 2 and all(c["password"] == PASSWORD for c in brokers)
    assert not any(PASSWORD in " ".join(c["argv"]) for c in calls)  # type: ignore[arg-type]


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
    assert not any(a[0] == "enable-service-access" for a in argv)  # type: ignore[index]
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
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing (apt-get install shellcheck)", pytrace=False)
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
