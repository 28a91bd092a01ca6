"""A broker running the test pack (tests/broker/packs/test-files) with real ansible-runner,
on clouds it never calls: in this process (the tests' API and worker), or as a worker process
of its own that a test SIGKILLs (``python -m tests.broker.ansible_harness CONFIG``)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from scoperouter.broker.config import config_from_dict
from scoperouter.broker.parent import preexec_die_with_parent
from scoperouter.broker.runtime import Broker
from scoperouter.broker.secrets import Secrets
from scoperouter.broker.worker import Worker

PACK = Path(__file__).resolve().parent / "packs" / "test-files"
ROOT = Path(__file__).resolve().parents[2]
NAME = "test-files"
# the run's token: a playbook that prints it must not get it into a log or a description
TOKEN = "gAAAAAB-fake-token-9f3c2d1e"
RUN_AS = "nobody"  # the user a root broker runs packs as by default


class PackClouds:
    """One cloud, FakeCloud; the pack's runs get a clouds.yaml with TOKEN (no call)."""

    def names(self) -> tuple[str, ...]:
        return ("FakeCloud",)

    def connect(self, cloud: str, **_: Any) -> Any:
        return SimpleNamespace(current_project_id="fake-project")

    def capacity(self, cloud: str) -> Any:
        raise AssertionError("the test pack places explicitly")

    def identity_url(self, cloud: str) -> str:
        return "http://127.0.0.9:5000/v3"

    def region(self, cloud: str) -> str:
        return cloud

    def endpoints(self, cloud: str, **_: Any) -> dict[str, str]:
        return {"object-store": "http://127.0.0.9:8080/v1/AUTH_p"}

    def session_entry(self, cloud: str, **_: Any) -> dict[str, Any]:
        return {
            "auth_type": "v3token",
            "auth": {"auth_url": self.identity_url(cloud), "token": TOKEN, "project_id": "p"},
            "region_name": cloud,
        }


def make_pack(tmp: Path, plan_vars: dict[str, Any] | None = None) -> Path:
    """The test pack, copied, its state_dir (the "cloud": a folder) under `tmp`, its plan's
    vars updated with `plan_vars`."""
    pack = tmp / "pack"
    shutil.copytree(PACK, pack)
    spec = yaml.safe_load((pack / "service.yml").read_text())
    spec["plans"][0]["vars"]["state_dir"] = str(tmp / "cloud")
    spec["plans"][0]["vars"].update(plan_vars or {})
    (pack / "service.yml").write_text(yaml.safe_dump(spec))
    (tmp / "cloud").mkdir(exist_ok=True)
    if os.geteuid() == 0:  # the runs' user (run_as: nobody, the default of a root broker)
        nobody = pwd.getpwnam(RUN_AS)
        os.chown(tmp / "cloud", nobody.pw_uid, nobody.pw_gid)
    return pack


def config_data(db_url: str, tmp: Path, *, lease: float = 5.0) -> dict[str, Any]:
    return {
        "database": {"url": db_url},
        "worker": {
            "threads": 0,
            "lease_seconds": lease,
            "heartbeat_seconds": lease / 3,
            "poll_seconds": 0.05,
            "max_retry_seconds": 2,
        },
        "services": {
            NAME: {
                "type": "ansible",
                "pack": str(tmp / "pack"),
                "work_dir": str(tmp / "work"),
                "synchronous_seconds": 0,
                # the "cloud" the test pack builds in: the one folder a run writes besides its own
                "sandbox_writable": [str(tmp / "cloud")],
            }
        },
    }


def pack_broker(data: dict[str, Any], key: str) -> Broker:
    return Broker(config_from_dict(data), secrets=Secrets([key]), clouds=PackClouds())  # type: ignore[arg-type]


class WorkerProcess:
    """A process running the broker's worker (one thread) on the tests' database: what a
    `serve` replica does with operations, without HTTP. SIGKILL it to crash it."""

    def __init__(self, data: dict[str, Any], key: str, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.broker.ansible_harness", json.dumps(data), key],
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=preexec_die_with_parent(signal.SIGKILL),
        )

    def kill(self) -> None:
        """SIGKILL the worker process alone (not its group): the broker crashing."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def main() -> None:
    import logging

    from scoperouter.broker.logs import setup_logging

    data, key = json.loads(sys.argv[1]), sys.argv[2]
    setup_logging("INFO")
    logging.getLogger("scoperouter").info("ansible test worker starting")
    broker = pack_broker(data, key)
    Worker(broker).start(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
