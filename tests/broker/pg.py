"""A throwaway PostgreSQL cluster for the broker's tests.

`initdb` + `postgres` from Debian's ``postgresql`` package, as the ``postgres`` user when the
tests run as root (both refuse root), on a free port of 127.0.0.1 with its socket in the
cluster's own folder: never the lab's PostgreSQL on 5432, which must not be touched. Trust
authentication, loopback only. Each test gets its own database, copied from a migrated template
(``CREATE DATABASE ... TEMPLATE``: milliseconds).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from scoperouter.broker.parent import preexec_die_with_parent

HOST = "127.0.0.1"


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian layout), or one on PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


PREFIX = "scoperouter-broker-pg-"


def sweep_stale(tmp: Path | None = None) -> list[Path]:
    """Remove the cluster folders of test runs that died without their finalizer (a SIGKILLed
    pytest: its postmaster got SIGQUIT from the kernel then, see `Cluster.start`). A folder is
    stale when the process named in its `owner` file is gone and no postmaster runs in it;
    nothing is ever signalled here, and a live run's folder is never touched."""
    removed = []
    for root in Path(tmp or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            pid_text, started = (root / "owner").read_text().split()
        except (OSError, ValueError):
            continue  # not (yet) one of ours as far as we can tell: leave it
        if _alive(int(pid_text), float(started)) or _postmaster_alive(root / "data"):
            continue
        shutil.rmtree(root, ignore_errors=True)
        removed.append(root)
    return removed


def _alive(pid: int, started: float | None = None) -> bool:
    try:
        proc = psutil.Process(pid)
        return started is None or abs(proc.create_time() - started) < 1.0
    except psutil.Error:
        return False


def _postmaster_alive(data: Path) -> bool:
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return _alive(pid)


class Cluster:
    """A cluster that never outlives the test run: its postmaster runs as our child and gets
    SIGQUIT (immediate shutdown) from the kernel when the test process dies; `stop` (the
    session fixture's finalizer, and any failed `start`) stops it and removes its folder."""

    def __init__(self) -> None:
        bin_dir = pg_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        sweep_stale()
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        me = psutil.Process()
        (self.root / "owner").write_text(f"{me.pid} {me.create_time()}\n")
        self.data = self.root / "data"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        self._counter = itertools.count(1)
        self.user = "postgres" if self.as_postgres else os.environ.get("USER", "postgres")
        self.proc: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []  # the postmaster's, once initialised

    def _as_user(self) -> dict[str, Any]:
        """initdb and postgres refuse to run as root: as the ``postgres`` user then."""
        if self.as_postgres:
            return {"user": "postgres", "group": "postgres", "extra_groups": []}
        return {}

    def start(self, timeout: float = 120) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        initdb = [str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user]
        initdb += ["--auth=trust", "--no-sync", "-E", "UTF8"]
        subprocess.run(
            initdb, capture_output=True, check=True, timeout=timeout, cwd=self.root,
            **self._as_user(),
        )  # fmt: skip
        options = [
            f"listen_addresses={HOST}",
            f"port={self.port}",
            f"unix_socket_directories={self.root}",
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
            "max_connections=200",
        ]
        self.argv = [str(self.bin / "postgres"), "-D", str(self.data)]
        self.argv += [arg for option in options for arg in ("-c", option)]
        self._launch(timeout)

    def _launch(self, timeout: float) -> None:
        """The postmaster on the initialised cluster; returns once it takes connections."""
        with (self.root / "log").open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                preexec_fn=preexec_die_with_parent(signal.SIGQUIT),
                **self._as_user(),
            )
        import psycopg

        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self.proc.returncode}: {self._log_tail()}")
            try:
                psycopg.connect(
                    host=HOST, port=self.port, user=self.user, dbname="postgres", connect_timeout=2
                ).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise RuntimeError(f"postgres did not start: {self._log_tail()}") from None
                time.sleep(0.1)

    def restart(self, timeout: float = 120) -> None:
        """A restart as an operator's: fast shutdown (SIGINT: open connections are closed,
        running transactions rolled back), then the postmaster again on the same data and
        port. From the thread that started the cluster (its death signal is that thread's)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self._launch(timeout)

    def _log_tail(self) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT: the postmaster stops its backends, nothing is kept),
        SIGKILL if it does not go, then the folder is removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{HOST}:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(
            host=HOST, port=self.port, user=self.user, dbname=database, autocommit=True
        ) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def new_database(self, template: str | None = None) -> str:
        name = f"t{next(self._counter)}"
        self.sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        return name
