"""What the clouds share: the OpenStack virtualenv, Debian packages, PostgreSQL, RabbitMQ."""

from __future__ import annotations

import base64
import contextlib
import glob
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from scoperouter_lab.api import port_open, wait_for
from scoperouter_lab.layout import (
    EPMD_PORT,
    POSTGRES_PORT,
    RABBIT_DIST_PORT,
    RABBIT_PORT,
    SHARED_HOST,
    CloudSpec,
    LabPaths,
)
from scoperouter_lab.procs import ProcessTable, fingerprint


class LabError(RuntimeError):
    """A step failed; the message says which and where to look."""


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join("    " + line for line in text[-lines:])


def run(
    argv: Sequence[str],
    log: Path,
    *,
    what: str,
    env: dict[str, str] | None = None,
    user: str | None = None,
    timeout: float = 900,
    input_text: str | None = None,
) -> str:
    """Run a one-shot command, appending its output to `log`; LabError naming `what` on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%H:%M:%S')} {what}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                input=input_text.encode() if input_text is not None else None,
                stdin=None if input_text is not None else subprocess.DEVNULL,
                env=env,
                user=user,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out.write(exc.output or b"")
            raise LabError(f"{what}: timed out after {timeout:.0f} s; log: {log}") from None
        except FileNotFoundError as exc:
            raise LabError(f"{what}: {exc}") from None
        out.write(proc.stdout)
    if proc.returncode != 0:
        raise LabError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{tail(log)}")
    return proc.stdout.decode(errors="replace")


# --------------------------------------------------------------------------- virtualenv


def pins_text() -> str:
    return resources.files("scoperouter_lab").joinpath("pins.txt").read_text()


def venv_state(paths: LabPaths) -> str:
    """What the venv marker must say for the venv to count as installed: the pin list, the
    Python the venv runs on (its pyvenv.cfg) and its place. Not the Python running the lab: a
    lab started from another virtualenv (a Python 3.12 one beside Debian's 3.11) uses the same
    OpenStack venv, which must not be pip-installed again at each switch."""
    try:
        python = (paths.venv / "pyvenv.cfg").read_text()
    except OSError:
        python = ""  # no venv: no marker either
    return hashlib.sha256((pins_text() + python + str(paths.venv)).encode()).hexdigest()


def venv_ready(paths: LabPaths) -> bool:
    marker = paths.venv / ".scoperouter-lab"
    try:
        return (
            marker.read_text().strip() == venv_state(paths)
            and paths.venv_bin("python").exists()
            and paths.venv_bin("uwsgi").exists()
        )
    except OSError:
        return False


def ensure_venv(paths: LabPaths) -> str:
    """Create `<dir>/venv` with the pinned OpenStack releases; fast no-op when up to date."""
    if venv_ready(paths):
        return "up to date"
    log = paths.log(None, "pip")
    if not paths.venv_bin("python").exists():
        base = getattr(sys, "_base_executable", sys.executable)
        run([base, "-m", "venv", str(paths.venv)], log, what="creating the OpenStack venv")
    pins = paths.venv / "pins.txt"
    pins.write_text(pins_text())
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    run(
        [str(paths.venv_bin("python")), "-m", "pip", "install", "-q", "-r", str(pins)],
        log,
        what="pip install of the OpenStack pin list (about 2 minutes on a fresh machine)",
        env=env,
        timeout=1800,
    )
    (paths.venv / ".scoperouter-lab").write_text(venv_state(paths) + "\n")
    return "installed"


# --------------------------------------------------------------------------- Debian packages


def postgres_bindir() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[4]) if Path(p).parts[4].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


RABBIT_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBIT_CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")


def missing_packages(need_rabbit: bool) -> list[str]:
    missing = []
    if postgres_bindir() is None:
        missing.append("postgresql")
    if need_rabbit and not (RABBIT_SERVER.exists() and shutil.which("epmd")):
        missing.append("rabbitmq-server")
    return missing


def ensure_packages(paths: LabPaths, need_rabbit: bool) -> str:
    missing = missing_packages(need_rabbit)
    if not missing:
        return "present"
    if os.geteuid() != 0:
        raise LabError(
            f"missing Debian packages: {' '.join(missing)}; install them with "
            f"`sudo apt-get install -y {' '.join(missing)}` and run again"
        )
    log = paths.log(None, "apt")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Keep the packages' maintainer scripts from starting system-wide services (they would
    # listen on all interfaces and hold the ports the lab uses): policy-rc.d exit 101.
    policy = Path("/usr/sbin/policy-rc.d")
    created = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# scoperouter lab: no service starts now\nexit 101\n")
        policy.chmod(0o755)
        created = True
    try:
        # another apt (a second lab's, CI's) may hold dpkg's lock: wait for it, not fail
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
        run([*apt, "update", "-q"], log, what="apt-get update", env=env, timeout=900)
        run(
            [*apt, "install", "-y", "-q", "--no-install-recommends", *missing],
            log,
            what=f"apt-get install {' '.join(missing)}",
            env=env,
            timeout=900,
        )
    finally:
        if created:
            with contextlib.suppress(OSError):
                policy.unlink()
    still = missing_packages(need_rabbit)
    if still:
        raise LabError(f"apt-get install did not provide {' '.join(still)}; see {log}")
    return "installed " + " ".join(missing)


# --------------------------------------------------------------------------- PostgreSQL


class Postgres:
    """One PostgreSQL server on 127.0.0.1 for every cloud of the lab."""

    name = "postgres"

    def __init__(self, paths: LabPaths, procs: ProcessTable) -> None:
        self.paths = paths
        self.procs = procs
        self.bindir = postgres_bindir()
        self.as_root = os.geteuid() == 0
        self.user = "postgres" if self.as_root else None
        if self.as_root:
            # The postgres user cannot enter a lab dir under /root: keep the cluster in its home.
            tag = hashlib.sha256(str(paths.root).encode()).hexdigest()[:10]
            self.base = Path(f"/var/lib/postgresql/scoperouter-lab-{tag}")
        else:
            self.base = paths.data / "postgres"
        self.datadir = self.base / "data"
        self.sockdir = self.base / "run"
        self.log = paths.log(None, "postgres")

    def _bin(self, name: str) -> str:
        assert self.bindir is not None
        return str(self.bindir / name)

    def _own(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)
        path.chmod(0o700)

    def argv(self) -> list[str]:
        return [
            self._bin("postgres"),
            "-D", str(self.datadir),
            "-c", f"listen_addresses={SHARED_HOST}",
            "-c", f"port={POSTGRES_PORT}",
            "-c", f"unix_socket_directories={self.sockdir}",
            # a throw-away test lab: durability off, much faster schema migrations
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=600",
            "-c", "shared_buffers=64MB",
            "-c", "logging_collector=off",
            "-c", "log_min_messages=warning",
            # never log the statement of a failed query: nova's cell mappings carry database
            # URLs with their passwords (a re-run map_cell0 logged one as a duplicate key)
            "-c", "log_min_error_statement=panic",
        ]  # fmt: skip

    def healthy(self) -> bool:
        return self.procs.running(self.name) is not None and port_open(SHARED_HOST, POSTGRES_PORT)

    def ensure(self, password: str) -> str:
        if self.bindir is None:
            raise LabError("PostgreSQL is not installed (apt-get install postgresql)")
        fp = fingerprint(self.argv())
        if self.procs.running(self.name, fp) and port_open(SHARED_HOST, POSTGRES_PORT):
            return "running"
        self.procs.stop(self.name)
        status = "started"
        if not (self.datadir / "PG_VERSION").exists():
            self._own(self.base)
            self._own(self.datadir)
            pwfile = self.base / "pwfile"
            pwfile.write_text(password + "\n")
            if self.as_root:
                pw = pwd.getpwnam("postgres")
                os.chown(pwfile, pw.pw_uid, pw.pw_gid)
            try:
                run(
                    [
                        self._bin("initdb"), "-D", str(self.datadir), "-U", "postgres",
                        "--auth-local=trust", "--auth-host=scram-sha-256",
                        f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C", "--no-sync",
                    ],
                    self.log,
                    what="initdb",
                    user=self.user,
                )  # fmt: skip
            finally:
                pwfile.unlink(missing_ok=True)
            status = "initialised and started"
        self._own(self.sockdir)
        if port_open(SHARED_HOST, POSTGRES_PORT):
            raise LabError(
                f"{SHARED_HOST}:{POSTGRES_PORT} is already in use by a process this lab did not "
                "start (a system PostgreSQL?); stop it and run again"
            )
        rec = self.procs.start(
            self.name, self.argv(), log=self.log, fp=fp, user=self.user, cwd=self.base
        )
        wait_for(
            "PostgreSQL on 127.0.0.1:5432",
            lambda: port_open(SHARED_HOST, POSTGRES_PORT) and self._ready(),
            timeout=60,
            on_fail=lambda: (
                None if rec.alive() else f"exited; last lines of {self.log}:\n" + tail(self.log)
            ),
        )
        return status

    def _ready(self) -> bool:
        return (
            subprocess.run(
                [self._bin("pg_isready"), "-q", "-h", str(self.sockdir), "-p", str(POSTGRES_PORT)],
                check=False,
            ).returncode
            == 0
        )

    def psql(self, sql: str, what: str) -> str:
        return run(
            [
                self._bin("psql"), "-h", str(self.sockdir), "-p", str(POSTGRES_PORT),
                "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-At", "-f", "-",
            ],
            self.log,
            what=what,
            input_text=sql,
        )  # fmt: skip

    def ensure_databases(self, password: str, names: Sequence[str]) -> list[str]:
        """Role `openstack` (with `password`) and one database per name; returns created ones."""
        quoted = password.replace("'", "''")
        self.psql(
            "DO $$ BEGIN\n"
            "  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'openstack') THEN\n"
            f"    CREATE ROLE openstack LOGIN PASSWORD '{quoted}';\n"
            "  ELSE\n"
            f"    ALTER ROLE openstack LOGIN PASSWORD '{quoted}';\n"
            "  END IF;\n"
            "END $$;\n",
            "creating the openstack database role",
        )
        existing = set(self.psql("SELECT datname FROM pg_database;", "listing databases").split())
        created = [n for n in names if n not in existing]
        if created:
            self.psql(
                "".join(f'CREATE DATABASE "{n}" OWNER openstack;\n' for n in created),
                "creating databases",
            )
        return created

    def purge(self) -> None:
        if self.base.exists():
            shutil.rmtree(self.base)


# --------------------------------------------------------------------------- RabbitMQ


def rabbit_password_hash(password: str, salt: bytes | None = None) -> str:
    """rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    salt = salt if salt is not None else os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class Rabbit:
    """One RabbitMQ node on 127.0.0.1 (and its epmd), one vhost per cloud."""

    name = "rabbitmq"

    def __init__(self, paths: LabPaths, procs: ProcessTable) -> None:
        self.paths = paths
        self.procs = procs
        self.etc = paths.etc / "rabbitmq"
        self.home = paths.data / "rabbitmq"
        self.log = paths.log(None, "rabbitmq")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.home),
            RABBITMQ_NODENAME="scoperouter-lab@localhost",
            RABBITMQ_NODE_IP_ADDRESS=SHARED_HOST,
            RABBITMQ_NODE_PORT=str(RABBIT_PORT),
            RABBITMQ_DIST_PORT=str(RABBIT_DIST_PORT),
            RABBITMQ_MNESIA_BASE=str(self.home / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.paths.logs / "rabbitmq"),
            RABBITMQ_LOGS="-",
            RABBITMQ_CONFIG_FILE=str(self.etc / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.etc / "enabled_plugins"),
            RABBITMQ_CONF_ENV_FILE=str(self.etc / "rabbitmq-env.conf"),
            RABBITMQ_PID_FILE=str(self.home / "rabbit.pid"),
            # Erlang distribution and epmd on loopback only
            ERL_EPMD_ADDRESS=SHARED_HOST,
            ERL_EPMD_PORT=str(EPMD_PORT),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )
        return env

    def write_config(self, clouds: Sequence[CloudSpec], password: str) -> str:
        """Config and boot definitions; returns a hash of the definitions' content."""
        self.etc.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.etc / "rabbitmq-env.conf").write_text("# scoperouter lab: see the environment\n")
        (self.etc / "enabled_plugins").write_text("[].\n")
        defs_path = self.etc / "definitions.json"
        (self.etc / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {SHARED_HOST}:{RABBIT_PORT}\n"
            f"load_definitions = {defs_path}\n"
            "log.console = true\n"
            "log.console.level = warning\n"
            "log.file = false\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        # Keep the password hash stable across runs (same salt from the password) so the
        # definitions change only when the clouds change.
        salt = hashlib.sha256(b"scoperouter-lab" + password.encode()).digest()[:4]
        vhosts = [c.slug for c in clouds]
        defs = {
            "users": [
                {
                    "name": "openstack",
                    "password_hash": rabbit_password_hash(password, salt),
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": [],
                }
            ],
            "vhosts": [{"name": v} for v in vhosts],
            "permissions": [
                {"user": "openstack", "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
                for v in vhosts
            ],
        }
        text = json.dumps(defs, indent=1)
        defs_path.write_text(text)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def healthy(self) -> bool:
        return self.procs.running(self.name) is not None and port_open(SHARED_HOST, RABBIT_PORT)

    def ensure(self, clouds: Sequence[CloudSpec], password: str) -> str:
        if not RABBIT_SERVER.exists():
            raise LabError("RabbitMQ is not installed (apt-get install rabbitmq-server)")
        defs_hash = self.write_config(clouds, password)
        marker = self.paths.marker(None, "rabbit-definitions")
        env = self.env()
        fp = fingerprint([str(RABBIT_SERVER)], {k: env[k] for k in sorted(env) if "RABBIT" in k},
                         self.etc / "rabbitmq.conf")  # fmt: skip
        if self.procs.running(self.name, fp) and port_open(SHARED_HOST, RABBIT_PORT):
            if marker.exists() and marker.read_text() == defs_hash:
                return "running"
            run(
                [str(RABBIT_CTL), "import_definitions", str(self.etc / "definitions.json")],
                self.log,
                what="rabbitmqctl import_definitions",
                env=env,
                timeout=120,
            )
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(defs_hash)
            return "running, vhosts updated"
        self.procs.stop(self.name)
        self._ensure_epmd(env)
        if port_open(SHARED_HOST, RABBIT_PORT):
            raise LabError(
                f"{SHARED_HOST}:{RABBIT_PORT} is already in use by a process this lab did not "
                "start (a system RabbitMQ?); stop it and run again"
            )
        rec = self.procs.start(
            self.name, [str(RABBIT_SERVER)], log=self.log, env=env, fp=fp, cwd=self.home
        )
        wait_for(
            "RabbitMQ on 127.0.0.1:5672",
            lambda: port_open(SHARED_HOST, RABBIT_PORT),
            timeout=120,
            on_fail=lambda: (
                None if rec.alive() else f"exited; last lines of {self.log}:\n" + tail(self.log)
            ),
        )
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(defs_hash)
        return "started"

    def _ensure_epmd(self, env: dict[str, str]) -> None:
        if self.procs.running("epmd"):
            return
        if port_open(SHARED_HOST, EPMD_PORT):
            return  # an epmd of the system; RabbitMQ registers with it
        epmd = shutil.which("epmd") or "/usr/bin/epmd"
        self.procs.start(
            "epmd",
            [epmd, "-address", SHARED_HOST, "-port", str(EPMD_PORT)],
            log=self.paths.log(None, "epmd"),
            env=env,
        )
        wait_for("epmd on 127.0.0.1:4369", lambda: port_open(SHARED_HOST, EPMD_PORT), 20)

    def purge(self) -> None:
        for p in (self.home, self.etc):
            if p.exists():
                shutil.rmtree(p)
