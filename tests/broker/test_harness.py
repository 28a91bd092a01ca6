"""The harness that starts `broker serve` processes and PostgreSQL clusters leaves nothing
running: not when a start times out or is interrupted, not when the test process itself is
SIGKILLed (the kernel's parent-death signal takes brokers, their forked processes and the
postmaster along; the next run sweeps the dead run's cluster folder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.broker.pg import PREFIX, sweep_stale
from tests.broker.procs import ROOT, RUNNING, BrokerProcess, write_config


def _config(tmp_path: Path, processes: int = 1) -> Path:
    config = write_config(
        tmp_path / "broker.yaml", f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "cloud"
    )
    data = yaml.safe_load(config.read_text())
    data["processes"] = processes
    config.write_text(yaml.safe_dump(data))
    return config


def _gone(pids: list[int], timeout: float) -> list[int]:
    """The pids among `pids` still running (zombies count as gone) after up to `timeout`."""
    end = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


def test_a_start_that_times_out_is_killed(tmp_path: Path) -> None:
    broker = BrokerProcess(_config(tmp_path, processes=2), tmp_path / "broker.log")
    with pytest.raises(RuntimeError, match="did not start"):
        broker.start(timeout=0.01)  # Python's start alone takes longer (0.5 s did not, once)
    assert broker.proc is not None and broker.proc.returncode == -signal.SIGKILL
    assert broker not in RUNNING
    assert not [p for p in psutil.process_iter() if _pgid(p.pid) == broker.pid]


def test_an_interrupted_start_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while the broker starts. Raised where the wait is, not by interrupt_main(): an
    asynchronous KeyboardInterrupt that lands in a finalizer (httpx's, the GC's) is printed as
    "Exception ignored" and lost, which made this test fail now and then on a busy machine."""
    broker = BrokerProcess(_config(tmp_path), tmp_path / "broker.log")
    waited = []

    def interrupted(timeout: float) -> None:
        assert broker.proc is not None and broker.proc.poll() is None  # it was started
        waited.append(timeout)
        raise KeyboardInterrupt

    monkeypatch.setattr(broker, "_wait_serving", interrupted)
    with pytest.raises(KeyboardInterrupt):
        broker.start(timeout=60)
    assert waited == [60]
    assert broker.proc is not None and broker.proc.returncode == -signal.SIGKILL
    assert broker not in RUNNING


def test_kill_takes_every_process_of_a_multiprocess_serve(tmp_path: Path) -> None:
    broker = BrokerProcess(_config(tmp_path, processes=2), tmp_path / "broker.log")
    try:
        broker.start()
        children = [c.pid for c in psutil.Process(broker.pid).children(recursive=True)]
        assert len(children) == 2, children
    finally:
        broker.kill()  # SIGKILL of the parent alone would leave both children serving
    assert _gone(children, timeout=20) == []


DRIVER = """
import json, sys, time
from pathlib import Path
from tests.broker.procs import BrokerProcess
from tests.broker.pg import Cluster, pg_bin

broker = BrokerProcess(Path(sys.argv[1]), Path(sys.argv[2])).start()
pids = {"broker": broker.pid, "pg": None, "pg_root": None}
if pg_bin() is not None:
    cluster = Cluster()
    cluster.start()
    pids["pg"], pids["pg_root"] = cluster.proc.pid, str(cluster.root)
print(json.dumps(pids), flush=True)
time.sleep(600)
"""


def test_a_killed_test_process_leaves_nothing(tmp_path: Path) -> None:
    """A process that uses the harness as a test does (a two-process broker and a cluster),
    then dies by SIGKILL, with no chance to clean up."""
    config, log = _config(tmp_path, processes=2), tmp_path / "broker.log"
    driver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(config), str(log)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line, f"the driver died first: {(tmp_path / 'broker.log').read_text()[-2000:]}"
        started = json.loads(line)
        spawned = [c.pid for c in psutil.Process(driver.pid).children(recursive=True)]
        assert started["broker"] in spawned
        if started["pg"] is not None:
            assert started["pg"] in spawned and len(spawned) > 4  # postmaster + its backends
    finally:
        driver.kill()
        driver.wait(30)
    assert _gone(spawned, timeout=30) == []
    if started["pg_root"] is not None:
        root = Path(started["pg_root"])
        assert root.exists()  # no finalizer ran: the next run's sweep removes it
        assert root in sweep_stale() and not root.exists()


def test_the_sweep_keeps_live_runs_folders(tmp_path: Path) -> None:
    mine = tmp_path / f"{PREFIX}live"
    mine.mkdir()
    me = psutil.Process()
    (mine / "owner").write_text(f"{me.pid} {me.create_time()}\n")
    dead = tmp_path / f"{PREFIX}dead"
    dead.mkdir()
    (dead / "owner").write_text(f"{me.pid} {me.create_time() - 3600}\n")  # pid reused since
    unknown = tmp_path / f"{PREFIX}unknown"
    unknown.mkdir()
    assert sweep_stale(tmp_path) == [dead]
    assert mine.exists() and unknown.exists() and not dead.exists()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
