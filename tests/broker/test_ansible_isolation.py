"""Packs run with least privilege (issue 30): a real run of the test pack through the OSB API,
as the broker's tests run it (root in CI: run_as defaults to ``nobody``, bwrap installed),
looks at the host from inside: its uid is the configured user's, and the broker's secret-key
file and its SQLite database, world-readable on purpose here so that only the sandbox can hide
them, can neither be read nor listed. The config errors of ``run_as`` and ``isolation``."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from scoperouter import client
from scoperouter.broker.config import BrokerConfigError
from scoperouter.broker.services.ansible import sandbox
from tests.broker.ansible_harness import RUN_AS
from tests.broker.test_ansible import PackHarness


def _need_bwrap() -> None:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: bwrap not found (.ci/run installs Debian's bubblewrap)")
        pytest.skip("bwrap (bubblewrap) is not installed")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_is_the_configured_user_and_cannot_read_the_broker_s_secrets(
    db_url: str, tmp_path: Path
) -> None:
    _need_bwrap()
    keys = tmp_path / "secret-keys"
    keys.write_text("the broker's secret keys\n")
    database = Path(db_url.removeprefix("sqlite:///"))
    assert database.is_file(), db_url
    for path in (keys, database):
        os.chmod(path, 0o644)  # readable by anyone on the host: only the sandbox hides them
    # what a run needs: the pack, and scoperouter's client (a scoped run's connection hook)
    needed = [str(tmp_path / "pack" / "service.yml"), str(Path(client.__file__).resolve())]
    probes = [str(keys), str(database), *needed]
    h = PackHarness(db_url, tmp_path, plan_vars={"probe_paths": probes})
    try:
        response = h.provision("probe-1", {"content": "x"})
        assert response.status_code == 202, response.text
        h.drain()
        done = h.last_operation("probe-1").json()
        assert done["state"] == "succeeded", done
        seen = h.client.get("/v2/service_instances/probe-1").json()["metadata"]["attributes"]
        expected = pwd.getpwnam(RUN_AS).pw_uid if os.geteuid() == 0 else os.geteuid()
        assert seen["run_uid"] == expected, seen
        # what it needs is readable; the key file and the database are not there, nor
        # anything of their folder but what the run was given
        assert seen["read"] == needed, seen
        listed = seen["listed"]
        assert str(keys) not in listed and str(database) not in listed, listed
        # the file the run made in its writable folder is the run's user's
        assert (h.state_dir / "osb-probe-1").stat().st_uid == expected
    finally:
        h.close()


def test_run_as_is_checked_when_the_broker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BrokerConfigError, match=r"services\.p\.run_as: packs never run as root"):
        sandbox.run_as("root", "services.p")
    with pytest.raises(BrokerConfigError, match=r"run_as: no user 'no-such-user-x'"):
        sandbox.run_as("no-such-user-x", "services.p")
    nobody = pwd.getpwnam("nobody")
    if os.geteuid() == 0:
        assert sandbox.run_as(None, "s") == sandbox.RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
        assert sandbox.run_as(str(nobody.pw_uid), "s") == sandbox.run_as("nobody", "s")
    # a broker that is not root cannot switch: another user is a config error, its own is
    # no switch
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: nobody.pw_uid)
    with pytest.raises(BrokerConfigError, match=r"the broker runs as uid \d+, not root"):
        sandbox.run_as("daemon", "services.p")
    assert sandbox.run_as("nobody", "s") is None and sandbox.run_as(None, "s") is None


def test_isolation_is_checked_when_the_broker_starts(tmp_path: Path) -> None:
    with pytest.raises(BrokerConfigError, match=r"isolation: bwrap not found"):
        sandbox.sandbox({"isolation": "bwrap", "bwrap": str(tmp_path / "nope")}, "services.p")
    with pytest.raises(BrokerConfigError, match=r"isolation: one of auto, bwrap, none"):
        sandbox.sandbox({"isolation": "chroot"}, "services.p")
    with pytest.raises(BrokerConfigError, match=r"sandbox_writable: 'rel' is not an absolute"):
        sandbox.sandbox({"sandbox_writable": ["rel"]}, "services.p")
    # a bwrap that cannot make a sandbox (a service manager forbidding namespaces): the same
    with pytest.raises(BrokerConfigError, match=r"isolation: bwrap cannot make a sandbox here"):
        sandbox.sandbox({"isolation": "bwrap", "bwrap": "/bin/false"}, "services.p")
    assert sandbox.sandbox({"isolation": "none"}, "s") is None
    # auto without bwrap: no sandbox (a warning), the run still switches user
    assert sandbox.sandbox({"bwrap": str(tmp_path / "nope")}, "s") is None
