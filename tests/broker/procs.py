"""Broker processes for the tests that kill them: `scoperouter broker serve` in a subprocess
on a free loopback port, with the fake service loaded by import path."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from scoperouter.broker.parent import preexec_die_with_parent
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
    """One `serve` process; `url` answers once started.

    It never outlives the test run: it runs in its own process group (so a multi-process
    `serve` goes as a whole), the kernel SIGKILLs it when the test process dies (even
    SIGKILLed: PR_SET_PDEATHSIG, so start it from the main thread), a start that fails or is
    interrupted kills it before raising, and whatever is still running at interpreter exit is
    killed (`kill_all`, an atexit hook)."""

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
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,
                preexec_fn=preexec_die_with_parent(signal.SIGKILL),
            )
        RUNNING.add(self)
        try:
            self._wait_serving(timeout)
        except BaseException:  # a timeout, an early exit, a Ctrl-C: nothing left running
            self.kill()
            raise
        return self

    def _wait_serving(self, timeout: float) -> None:
        assert self.proc is not None
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
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            f"broker did not start in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}"
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL to the whole process group: no cleanup of any kind, as a crash."""
        if self.proc is not None:
            self._end(signal.SIGKILL, 0)

    def stop(self) -> None:
        """SIGTERM (a `serve` parent forwards it to its processes), SIGKILL after 15 s."""
        if self.proc is not None:
            self._end(signal.SIGTERM, 15)

    def _end(self, signum: int, grace: float) -> None:
        """Signal the process, wait up to `grace`, then SIGKILL its group; reap it last, so
        its pid (= the group id) cannot have been reused by then."""
        assert self.proc is not None
        pid = self.proc.pid
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            end = time.monotonic() + grace
            while time.monotonic() < end and not _exited(pid):
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # the group: forked `serve` processes too
            self.proc.wait(30)
        RUNNING.discard(self)


def _exited(pid: int) -> bool:
    """Whether our child `pid` has exited, without reaping it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


RUNNING: set[BrokerProcess] = set()


@atexit.register
def kill_all() -> None:
    """Kill every broker the harness started and did not stop (pytest exiting on an error)."""
    for broker in list(RUNNING):
        with contextlib.suppress(Exception):
            broker.kill()
