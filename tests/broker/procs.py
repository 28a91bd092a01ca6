"""Broker processes for the tests that kill them: `scoperouter broker serve` in a subprocess
on a free loopback port, with the fake service loaded by import path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from scoperouter.broker.secrets import generate_key
from tests.broker.conftest import PASSWORD
from tests.broker.pg import free_port

ROOT = Path(__file__).resolve().parents[2]


def write_config(
    path: Path, db_url: str, state_dir: Path, *, lease: float = 3.0, threads: int = 2, **fake: Any
) -> Path:
    data = {
        "listen": f"127.0.0.1:{free_port()}",
        "database": {"url": db_url},
        "worker": {
            "threads": threads,
            "lease_seconds": lease,
            "heartbeat_seconds": lease / 3,
            "poll_seconds": 0.1,
            "max_retry_seconds": 2,
        },
        "services": {
            "fake": {
                "plugin": "tests.broker.fakes:FakeService",
                "state_dir": str(state_dir),
                "synchronous_seconds": 10,
                **fake,
            }
        },
        "log_level": "INFO",
    }
    path.write_text(yaml.safe_dump(data))
    return path


class BrokerProcess:
    """One `serve` process; `url` answers once started."""

    keys = generate_key()

    def __init__(self, config: Path, log: Path, *, listen: str | None = None) -> None:
        self.config = config
        self.log = log
        data = yaml.safe_load(config.read_text())
        self.listen = listen or data["listen"]
        self.url = f"http://{self.listen}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> BrokerProcess:
        """Start and wait for the catalog. The bound is generous: how fast Python imports on
        a machine shared with the lab is not what these tests check."""
        env = {
            **os.environ,
            "SCOPEROUTER_BROKER_PASSWORD": PASSWORD,
            "SCOPEROUTER_BROKER_SECRET_KEYS": self.keys,
            "PYTHONPATH": str(ROOT),
        }
        argv = [sys.executable, "-m", "scoperouter.broker", "serve", "--config", str(self.config)]
        argv += ["--listen", self.listen]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"broker exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                r = httpx.get(
                    self.url + "/v2/catalog",
                    auth=("broker", PASSWORD),
                    headers={"X-Broker-API-Version": "2.17"},
                    timeout=1,
                )
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()  # never leave a half-started broker running behind a failed test
        raise RuntimeError(f"broker did not start:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
