"""A throwaway PostgreSQL cluster for the broker's tests.

`initdb` + `pg_ctl` from Debian's ``postgresql`` package, as the ``postgres`` user when the
tests run as root (initdb refuses root), on a free port of 127.0.0.1 with its socket in the
cluster's own folder: never the lab's PostgreSQL on 5432, which must not be touched. Trust
authentication, loopback only. Each test gets its own database, copied from a migrated template
(``CREATE DATABASE ... TEMPLATE``: milliseconds).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

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


class Cluster:
    def __init__(self) -> None:
        bin_dir = pg_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="scoperouter-broker-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        self._counter = itertools.count(1)
        self.user = "postgres" if self.as_postgres else os.environ.get("USER", "postgres")

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(
            cmd, capture_output=True, text=True, check=check, timeout=120, cwd=self.root
        )

    def start(self) -> None:
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        options = (
            f"-c listen_addresses={HOST} -c port={self.port} "
            f"-c unix_socket_directories={self.root} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", check=False
        )
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
