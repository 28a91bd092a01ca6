"""One lab cloud: its config files, databases, processes and seed data."""

from __future__ import annotations

import contextlib
import grp
import hashlib
import os
import pwd
import shlex
import socket
import sqlite3
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from scoperouter_lab import templates as T
from scoperouter_lab.api import Keystone, http_status, port_open, request, wait_for
from scoperouter_lab.infra import run, tail
from scoperouter_lab.layout import (
    PROCESSES,
    STAND_INS,
    SWIFT_STORAGE_PORTS,
    CloudSpec,
    service_types,
    stand_ins,
)
from scoperouter_lab.procs import ProcessTable, fingerprint

# the keystone user of each service (service project, roles admin and service)
SERVICE_USERS = {s: s for s in ("glance", "placement", "nova", "cinder", "swift", "heat")}
# keystone's service name of each service type the lab registers
SERVICE_NAMES = {"identity": "keystone", "image": "glance", "placement": "placement",
                 "compute": "nova", "block-storage": "cinder", "object-store": "swift",
                 "orchestration": "heat", "network": "neutron"}  # fmt: skip
IMAGE_NAME = "tiny"
# The same few KB under the name OpenStack's functional tests look for (python-openstackclient's
# compute tests pick the first `cirros-*-disk` image; the virt driver is fake, the bytes never
# boot). A property says so.
CIRROS_NAME = "cirros-0.6.3-x86_64-disk"
IMAGES = {
    IMAGE_NAME: {},
    CIRROS_NAME: {"scoperouter_lab": "stand-in bytes named as the functional tests expect"},
}
IMAGE_SIZE = 64 * 1024
# devstack's flavors (lib/nova create_flavors): what the upstream suites expect by name and size
FLAVORS = (
    {"id": "1", "name": "m1.tiny", "ram": 512, "disk": 1, "vcpus": 1},
    {"id": "2", "name": "m1.small", "ram": 2048, "disk": 20, "vcpus": 1},
    {"id": "3", "name": "m1.medium", "ram": 4096, "disk": 40, "vcpus": 2},
    {"id": "4", "name": "m1.large", "ram": 8192, "disk": 80, "vcpus": 4},
    {"id": "5", "name": "m1.xlarge", "ram": 16384, "disk": 160, "vcpus": 8},
    {"id": "c1", "name": "cirros256", "ram": 256, "disk": 1, "vcpus": 1},
    {"id": "d1", "name": "ds512M", "ram": 512, "disk": 5, "vcpus": 1},
    {"id": "d2", "name": "ds1G", "ram": 1024, "disk": 10, "vcpus": 1},
    {"id": "d3", "name": "ds2G", "ram": 2048, "disk": 10, "vcpus": 2},
    {"id": "d4", "name": "ds4G", "ram": 4096, "disk": 20, "vcpus": 4},
)
# nova's default quotas (10 instances, 20 cores, 50 GB) raised for every project: set on the
# `default` quota class, so a project's quota reverts to these when its own is deleted (as
# openstacksdk's quota tests do with the demo project)
DEFAULT_QUOTA = {"instances": 100, "cores": 400, "ram": 2048000}

# API process -> (WSGI application, service type (port), uWSGI processes, threads per process).
# One keystone process: its in-process cache must be consistent (see templates.keystone_conf).
API_PROCESSES = {
    "keystone": ("keystone.wsgi.api:application", "identity", 1, 4),
    "glance": ("glance.wsgi.api:application", "image", 1, 4),
    "placement": ("placement.wsgi.api:application", "placement", 1, 1),
    "nova-api": ("nova.wsgi.osapi_compute:application", "compute", 1, 4),
    "cinder-api": ("cinder.wsgi.api:application", "block-storage", 1, 2),
    "heat-api": ("heat.wsgi.api:application", "orchestration", 1, 2),
}
NOVA_DAEMONS = ("nova-conductor", "nova-scheduler", "nova-compute")
# the daemons whose readiness is a service list of their API (not a port)
CINDER_DAEMONS = ("cinder-scheduler", "cinder-volume")
HEAT_DAEMONS = ("heat-engine",)
SWIFT_RING_PART_POWER = 8  # 256 partitions a ring: one device, one replica


def _utc(text: str | None) -> float:
    """Nova's naive UTC timestamps -> epoch seconds (0 when absent)."""
    if not text:
        return 0.0
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def tiny_image_bytes(size: int = IMAGE_SIZE) -> bytes:
    """A deterministic few-KB raw 'disk': a recognisable header then a hash stream."""
    head = b"scoperouter lab tiny raw image\n"
    out = bytearray(head)
    block = hashlib.sha256(head).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


@dataclass
class Step:
    """What the orchestrator passes down to report progress."""

    report: Callable[[str, str, float], None]

    def timed(self, label: str, fn: Callable[[], str | None]) -> str | None:
        t0 = time.monotonic()
        result = fn()
        self.report(label, result or "ok", time.monotonic() - t0)
        return result


class CloudRunner:
    def __init__(
        self,
        ctx: T.CloudContext,
        services: tuple[str, ...],
        procs: ProcessTable,
        step: Step,
        proxy_env: bool,
    ) -> None:
        self.ctx = ctx
        self.cloud: CloudSpec = ctx.cloud
        self.paths = ctx.paths
        self.services = services
        self.procs = procs
        self.step = step
        self.proxy_env = proxy_env
        self.setup_log = self.paths.log(self.cloud, "setup")

    # ------------------------------------------------------------------ naming

    def pname(self, what: str) -> str:
        return f"{self.cloud.slug}-{what}"

    def log(self, what: str) -> Path:
        return self.paths.log(self.cloud, what)

    def label(self, text: str) -> str:
        return f"{self.cloud.name}: {text}"

    def process_names(self) -> list[str]:
        names = ["keystone", *stand_ins(self.services)]
        for service in self.services:
            if service != "keystone":
                names += PROCESSES[service]
        return names

    def listen_port(self, what: str) -> int | None:
        """The backend port process `what` serves on (None: a daemon without one)."""
        if what in STAND_INS:
            return self.cloud.port(STAND_INS[what][0])
        if what in API_PROCESSES:
            return self.cloud.port(API_PROCESSES[what][1])
        if what == "swift-proxy":
            return self.cloud.port("object-store")
        if what.startswith("swift-"):
            return SWIFT_STORAGE_PORTS[what.removeprefix("swift-")]
        return None

    def health_url(self, what: str) -> str:
        """Where a process with a port answers once it serves (any status below 500)."""
        path = "/healthcheck" if what.startswith("swift-") else "/"
        # a TLS lab's storage servers of swift stay plain (only its proxy reaches them)
        plain = what.startswith("swift-") and what != "swift-proxy"
        scheme = "http" if plain else self.cloud.scheme
        return f"{scheme}://{self.cloud.back_ip}:{self.listen_port(what)}{path}"

    # ------------------------------------------------------------------ environment

    def env(self, what: str | None = None) -> dict[str, str]:
        """The environment of process `what`: the lab's, then the `Environment=` lines of its
        systemd-style drop-ins, `<dir>/systemd/<cloud>-<what>.service.d/*.conf` (the lab's
        stand-in for /etc/systemd/system: playbooks/federation.yml writes `HTTP_PROXY` there
        for clouds whose services are not systemd units, and `scoperouter lab restart`
        applies it)."""
        drop = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
        env = {
            k: v
            for k, v in os.environ.items()
            if k.lower() not in drop and not k.startswith(("OS_", "PYTHON", "VIRTUAL_ENV"))
        }
        env["PATH"] = f"{self.paths.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        if self.proxy_env:
            # the services' own outgoing HTTP calls go through this cloud's router
            proxy = f"http://{self.cloud.proxy_listen}"
            env.update(HTTP_PROXY=proxy, http_proxy=proxy)
            if self.cloud.tls:
                # and their https calls too (CONNECT, intercepted by the router: its CA is
                # in their trust bundle)
                env.update(HTTPS_PROXY=proxy, https_proxy=proxy)
        if self.cloud.tls:
            # what they trust: python-requests (keystoneauth, keystonemiddleware) reads
            # REQUESTS_CA_BUNDLE, Python's ssl module (urllib, the stand-ins) SSL_CERT_FILE.
            # Only the environment, no `cafile` in their configs (it would win over it): as in
            # production, a drop-in's REQUESTS_CA_BUNDLE (playbooks/federation.yml) decides
            bundle = str(self.paths.trust_bundle(self.cloud))
            env.update(REQUESTS_CA_BUNDLE=bundle, SSL_CERT_FILE=bundle)
        if what is not None and what.startswith("swift-"):
            # the log hook swift's configs name (templates.SWIFT_LOG_HOOK)
            env["PYTHONPATH"] = str(self.ctx.etc("swift"))
        if what in STAND_INS:
            # the stand-ins are modules of this package: the very copy running the lab (a
            # checkout's, when it is on PYTHONPATH in front of an installed one), as the
            # fingerprint of their source says (_spec)
            env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        if what is not None:
            env.update(dropin_environment(self.paths.dropins(self.pname(what))))
        return env

    # ------------------------------------------------------------------ config files

    def write_configs(self) -> None:
        ctx = self.ctx
        venv_etc = self.paths.venv / "etc"
        files: dict[Path, str] = {ctx.etc("keystone") / "keystone.conf": T.keystone_conf(ctx)}
        if "glance" in self.services:
            files[ctx.etc("glance") / "glance-api.conf"] = T.glance_conf(ctx)
            files[ctx.etc("glance") / "glance-api-paste.ini"] = (
                venv_etc / "glance" / "glance-api-paste.ini"
            ).read_text()
        if "placement" in self.services:
            files[ctx.etc("placement") / "placement.conf"] = T.placement_conf(ctx)
        if "nova" in self.services:
            files[ctx.etc("nova") / "nova.conf"] = T.nova_conf(ctx)
            files[ctx.etc("nova") / "nova-db.conf"] = T.nova_db_conf(ctx)
            files[ctx.etc("nova") / "api-paste.ini"] = (
                venv_etc / "nova" / "api-paste.ini"
            ).read_text()
        for service, conf in (("cinder", T.cinder_conf), ("heat", T.heat_conf)):
            if service in self.services:
                files[ctx.etc(service) / f"{service}.conf"] = conf(ctx)
                files[ctx.etc(service) / "api-paste.ini"] = (
                    venv_etc / service / "api-paste.ini"
                ).read_text()
        if "swift" in self.services:
            swift = ctx.etc("swift")
            files[swift / "swift.conf"] = T.swift_conf(ctx)
            files[swift / "proxy-server.conf"] = T.swift_proxy_conf(ctx)
            for kind in SWIFT_STORAGE_PORTS:
                files[swift / f"{kind}-server.conf"] = T.swift_storage_conf(ctx, kind)
            files[swift / f"{T.SWIFT_LOG_MODULE}.py"] = T.SWIFT_LOG_HOOK
        argv = {
            name: ("--config-file", str(ctx.etc(name.split("-")[0]) / f"{name.split('-')[0]}.conf"))
            for name in ("cinder-api", "heat-api")
        }
        envs = {
            "keystone": {"OS_KEYSTONE_CONFIG_DIR": str(ctx.etc("keystone"))},
            "glance": {"OS_GLANCE_CONFIG_DIR": str(ctx.etc("glance"))},
            "placement": {"OS_PLACEMENT_CONFIG_DIR": str(ctx.etc("placement"))},
            "nova-api": {
                "OS_NOVA_CONFIG_DIR": str(ctx.etc("nova")),
                "OS_NOVA_CONFIG_FILES": "api-paste.ini;nova.conf;nova-db.conf",
            },
            "cinder-api": {},
            "heat-api": {},
        }
        for name, (module, stype, processes, threads) in API_PROCESSES.items():
            service = name.split("-")[0]
            if service not in self.services:
                continue
            files[self.uwsgi_ini(name)] = T.uwsgi_ini(
                ctx, name, module, self.cloud.port(stype), envs[name], processes, threads,
                argv.get(name, ()),
            )  # fmt: skip
        for d in ("keystone-fernet", "keystone-credential", "glance-images", "glance-staging",
                  "glance-tasks", "nova", "placement", "locks", "cinder", "swift"):  # fmt: skip
            ctx.data(d).mkdir(parents=True, exist_ok=True)
            ctx.data(d).chmod(0o700)
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                path.chmod(0o600)

    def uwsgi_ini(self, name: str) -> Path:
        service = name.split("-")[0]
        return self.ctx.etc(service) / f"{name}-uwsgi.ini"

    # ------------------------------------------------------------------ databases

    def _once(self, key: str, label: str, fn: Callable[[], None]) -> None:
        """Run a one-time setup step unless its marker says it is done."""
        marker = self.paths.marker(self.cloud, key)
        if marker.exists():
            return
        self.step.timed(self.label(label), fn)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))

    def _manage(self, argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
        return run(
            argv, self.setup_log, what=self.label(what), env={**self.env(), **(env or {})},
            timeout=600,
        )  # fmt: skip

    def keystone_setup(self) -> None:
        conf = str(self.ctx.etc("keystone") / "keystone.conf")
        km = [str(self.paths.venv_bin("keystone-manage")), "--config-file", conf]
        user = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(os.getgid()).gr_name
        owner = ["--keystone-user", user, "--keystone-group", group]

        def sync() -> None:
            self._manage([*km, "db_sync"], "keystone db_sync")
            self._manage([*km, "fernet_setup", *owner], "keystone fernet_setup")
            self._manage([*km, "credential_setup", *owner], "keystone credential_setup")

        def bootstrap() -> None:
            # idempotent; run again when the admin password changes (bootstrap resets it)
            self._manage(
                [
                    *km, "bootstrap",
                    "--bootstrap-username", "admin",
                    "--bootstrap-project-name", "admin",
                    "--bootstrap-role-name", "admin",
                    "--bootstrap-service-name", "keystone",
                    "--bootstrap-region-id", self.cloud.region,
                    "--bootstrap-public-url", self.cloud.endpoint_url("identity", self.ctx.routed),
                ],
                "keystone bootstrap",
                # in the environment, not argv: the command line is logged (and ps shows it)
                env={"OS_BOOTSTRAP_PASSWORD": self.ctx.secrets.admin},
            )  # fmt: skip
            # A password reset revokes the user's tokens with one-second granularity: a token
            # issued in the same second would be refused. Let that second pass.
            time.sleep(1.1)

        self._once("keystone-db", "keystone db sync", sync)
        admin = hashlib.sha256(self.ctx.secrets.admin.encode()).hexdigest()[:12]
        self._once(f"keystone-bootstrap-{admin}", "keystone bootstrap", bootstrap)

    def glance_setup(self) -> None:
        conf = str(self.ctx.etc("glance") / "glance-api.conf")

        def sync() -> None:
            manage = str(self.paths.venv_bin("glance-manage"))
            self._manage([manage, "--config-file", conf, "db_sync"], "glance db_sync")

        self._once("glance-db", "glance db sync", sync)

    def placement_setup(self) -> None:
        conf = str(self.ctx.etc("placement") / "placement.conf")

        def sync() -> None:
            manage = str(self.paths.venv_bin("placement-manage"))
            self._manage([manage, "--config-file", conf, "db", "sync"], "placement db sync")
            # WAL: readers never wait for the writer; the mode is stored in the file
            with contextlib.closing(sqlite3.connect(self.ctx.placement_db)) as db:
                db.execute("PRAGMA journal_mode=WAL")

        self._once("placement-db-sqlite", "placement db sync (SQLite)", sync)

    def _db_sync_once(self, service: str, *args: str) -> None:
        """`<service>-manage --config-file <service>.conf ARGS`, once (cinder's, heat's)."""
        conf = str(self.ctx.etc(service) / f"{service}.conf")
        argv = [str(self.paths.venv_bin(f"{service}-manage")), "--config-file", conf, *args]
        what = f"{service}-manage {' '.join(args)}"

        def sync() -> None:
            self._manage(argv, what)

        self._once(f"{service}-db", f"{service} db sync", sync)

    def cinder_setup(self) -> None:
        self._db_sync_once("cinder", "db", "sync")

    def heat_setup(self) -> None:
        self._db_sync_once("heat", "db_sync")

    def swift_setup(self) -> None:
        """The rings (account, container, object: one device each, `d1` on this cloud's
        backend address, one replica) and the device's directory. The storage is a directory
        of the lab dir (mount_check is off): swift keeps object metadata in extended
        attributes, which the file system must take (ext4, xfs and tmpfs do)."""
        etc = self.ctx.etc("swift")
        (self.ctx.data("swift") / "d1").mkdir(parents=True, exist_ok=True)
        builder = str(self.paths.venv_bin("swift-ring-builder"))

        def rings() -> None:
            for kind, port in SWIFT_STORAGE_PORTS.items():
                path = str(etc / f"{kind}.builder")
                (etc / f"{kind}.builder").unlink(missing_ok=True)
                self._manage([builder, path, "create", str(SWIFT_RING_PART_POWER), "1", "1"],
                             f"swift-ring-builder {kind} create")  # fmt: skip
                device = f"r1z1-{self.cloud.back_ip}:{port}/d1"
                self._manage([builder, path, "add", device, "1"],
                             f"swift-ring-builder {kind} add")  # fmt: skip
                self._manage([builder, path, "rebalance"], f"swift-ring-builder {kind} rebalance")

        self._once("swift-rings", "swift rings (account, container, object)", rings)

    def nova_manage(self, *args: str, what: str, extra_conf: Path | None = None) -> str:
        confs = [self.ctx.etc("nova") / "nova.conf", self.ctx.etc("nova") / "nova-db.conf"]
        nm = [str(self.paths.venv_bin("nova-manage"))]
        for conf in [*confs, *([extra_conf] if extra_conf else [])]:
            nm += ["--config-file", str(conf)]
        return self._manage([*nm, *args], what)

    def map_cell0(self) -> None:
        """``nova-manage cell_v2 map_cell0`` without a database URL on its command line (the
        setup log records every command line): nova derives cell0's URL from ``[database]
        connection`` + ``_cell0``, so a short-lived config file names ``<cloud>_nova``."""
        conf = self.ctx.etc("nova") / "nova-cell0-map.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(T.nova_cell0_map_conf(self.ctx))
        try:
            self.nova_manage("cell_v2", "map_cell0", what="nova-manage cell_v2 map_cell0",
                             extra_conf=conf)  # fmt: skip
        finally:
            conf.unlink(missing_ok=True)

    def nova_setup(self) -> None:
        def sync() -> None:
            self.nova_manage("api_db", "sync", what="nova-manage api_db sync")
            self.map_cell0()
            cells = self.nova_manage("cell_v2", "list_cells", what="nova-manage list_cells")
            if " cell1 " not in cells:
                self.nova_manage(
                    "cell_v2", "create_cell", "--name", "cell1", "--verbose",
                    what="nova-manage cell_v2 create_cell",
                )  # fmt: skip
            self.nova_manage("db", "sync", what="nova-manage db sync")

        self._once("nova-db", "nova db sync (api, cell0, cell1)", sync)

    # ------------------------------------------------------------------ processes

    def _spec(self, what: str) -> tuple[list[str], str]:
        """argv and fingerprint of one process of this cloud."""
        nova_etc = self.ctx.etc("nova")
        if what in STAND_INS:
            stype, module, _ = STAND_INS[what]
            argv = [sys.executable, "-m", module, "--listen",
                    f"{self.cloud.back_ip}:{self.cloud.port(stype)}"]  # fmt: skip
            if stype == "network":  # the project of a token, for what a user creates
                argv += ["--keystone", self.ctx.keystone_url]  # as the services find it
            if self.cloud.tls:
                cert, key = self.paths.tls_files(self.cloud, "backend")
                argv += ["--tls-cert", str(cert), "--tls-key", str(key)]
            confs = [Path(__file__).with_name(module.rsplit(".", 1)[1] + ".py")]
        elif what in API_PROCESSES:
            service = what.split("-")[0]
            argv = [str(self.paths.venv_bin("uwsgi")), "--ini", str(self.uwsgi_ini(what))]
            confs = sorted(self.ctx.etc(service).glob("*.conf")) + sorted(
                self.ctx.etc(service).glob("*.ini")
            )
        elif what.startswith("swift-"):  # swift's own servers: eventlet, one process each
            kind = what.removeprefix("swift-")
            etc = self.ctx.etc("swift")
            conf = etc / f"{kind}-server.conf"
            argv = [str(self.paths.venv_bin(f"swift-{kind}-server")), str(conf), "--verbose"]
            confs = [conf, etc / "swift.conf", etc / f"{T.SWIFT_LOG_MODULE}.py",
                     *sorted(etc.glob("*.ring.gz"))]  # fmt: skip
        elif what in NOVA_DAEMONS:  # nova-compute must not see the database sections
            confs = [nova_etc / "nova.conf"]
            if what != "nova-compute":
                confs.append(nova_etc / "nova-db.conf")
            argv = [str(self.paths.venv_bin(what))]
            for c in confs:
                argv += ["--config-file", str(c)]
        else:  # cinder-scheduler, cinder-volume, heat-engine: their service's one config file
            service = what.split("-")[0]
            confs = [self.ctx.etc(service) / f"{service}.conf"]
            argv = [str(self.paths.venv_bin(what)), "--config-file", str(confs[0])]
        env = self.env(what)
        trust = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
        fp = fingerprint(
            argv, {k: v for k, v in env.items() if "PROXY" in k.upper() or k in trust}, *confs
        )
        return argv, fp

    def _stop_changed(self) -> None:
        """Stop (in parallel) the processes whose definition changed, before restarting them."""
        changed = []
        for what in self.process_names():
            rec = self.procs.get(self.pname(what))
            if rec is not None and rec.alive() and rec.fingerprint != self._spec(what)[1]:
                changed.append(self.pname(what))
        if changed:
            with ThreadPoolExecutor(max_workers=len(changed)) as pool:
                list(pool.map(self.procs.stop, changed))

    def _start(self, what: str) -> str:
        argv, fp = self._spec(what)
        name = self.pname(what)
        if self.procs.running(name, fp):
            return "running"
        stopped = self.procs.stop(name)
        port = self.listen_port(what)
        if stopped and port is not None:
            self._wait_port_free(what)
        self.procs.start(name, argv, log=self.log(what), env=self.env(what), fp=fp,
                         cwd=self.paths.root)  # fmt: skip
        if stopped and port is not None and self._lost_bind(name, what):
            # a uWSGI stuck in its graceful shutdown (SIGKILLed after the stop's timeout) was
            # seen to leave its port bound a moment longer than the probe saw (CI of stop 36:
            # "bind(): Address already in use", the restart dead): wait for it again, once
            self._wait_port_free(what)
            self.procs.start(name, argv, log=self.log(what), env=self.env(what), fp=fp,
                             cwd=self.paths.root)  # fmt: skip
        return "restarted (changed)" if stopped else "started"

    def _lost_bind(self, name: str, what: str, timeout: float = 10) -> bool:
        """Whether the process just started died on "Address already in use" (True), rather
        than listening on its port or still starting when `timeout` ends (False)."""
        address = (self.cloud.back_ip, self.listen_port(what) or 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.procs.get(name)
            if rec is None or not rec.alive():
                return "Address already in use" in tail(self.log(what))
            if port_open(*address, timeout=0.5):
                return False  # it listens
            time.sleep(0.2)
        return False

    def _wait_port_free(self, what: str, timeout: float = 30) -> None:
        """Until the stopped process's port can be bound again. A uWSGI killed in the middle
        of its graceful shutdown has been seen to hold its listening socket a moment after its
        process group was gone (a restart then failed: "bind(): Address already in use"), so
        the new process starts only once the kernel has released it; after `timeout` it starts
        anyway and fails with that error in its log."""
        address = (self.cloud.back_ip, self.listen_port(what) or 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uWSGI binds
                try:
                    probe.bind(address)
                except OSError:
                    pass
                else:
                    if not port_open(*address, timeout=0.5):  # and nothing accepts there
                        return
            time.sleep(0.2)

    def start_api(self, name: str) -> str:
        return self._start(name)

    def api_healthy(self, name: str) -> bool:
        status = http_status(self.health_url(name))
        return status is not None and status < 500

    def wait_api(self, name: str, timeout: float = 180) -> None:
        pname = self.pname(name)

        def died() -> str | None:
            rec = self.procs.get(pname)
            if rec is not None and rec.alive():
                return None
            return f"the process exited; last lines of {self.log(name)}:\n{tail(self.log(name))}"

        wait_for(self.label(f"{name} answering on {self.cloud.back_ip}"),
                 lambda: self.api_healthy(name), timeout, on_fail=died)  # fmt: skip

    def start_keystone(self) -> str:
        result = self.start_api("keystone")
        self.wait_api("keystone")
        return result

    # ------------------------------------------------------------------ keystone seed

    def admin(self) -> Keystone:
        """Admin session straight at the keystone backend (works before the router is up)."""
        return Keystone(
            self.cloud.backend_endpoint("identity"), "admin", self.ctx.secrets.admin
        ).login()

    def seed_keystone(self) -> str:
        ks = self.admin()
        routed = self.ctx.routed
        service_project = ks.ensure_project("service", "OpenStack service users")
        for service, user in SERVICE_USERS.items():
            if service not in self.services:
                continue
            uid = ks.ensure_user(user, self.ctx.secrets.service, service_project)
            ks.grant(service_project, uid, "admin")
            ks.grant(service_project, uid, "service")
        # the routers of the other clouds validate tokens of this cloud as this user
        router = ks.ensure_user("scoperouter", self.ctx.secrets.router, service_project)
        ks.grant(service_project, router, "service")
        demo_project = ks.ensure_project("demo", "the lab's demo project")
        demo = ks.ensure_user("demo", self.ctx.secrets.demo, demo_project)
        ks.grant(demo_project, demo, "member")
        # a second ordinary user in its own project, as devstack has (the suites' "alt" cloud)
        alt_project = ks.ensure_project("alt_demo", "the lab's second demo project")
        alt = ks.ensure_user("alt_demo", self.ctx.secrets.alt_demo, alt_project)
        ks.grant(alt_project, alt, "member")
        if "heat" in self.services:
            self._seed_heat_domain(ks)
        region = self.cloud.region
        for stype in self.service_types():
            sid = ks.ensure_service(stype, SERVICE_NAMES[stype])
            ks.ensure_endpoint(sid, "public", self.cloud.endpoint_url(stype, routed), region)
        self._align_endpoints(ks)
        return f"{len(self.service_types())} endpoints -> {'router' if routed else 'backends'}"

    def _align_endpoints(self, ks: Keystone) -> None:
        """The endpoints of services this cloud no longer runs (a lab that had more) stay in
        its catalog, as they always did, but follow the lab's mode like the others: on the
        router or on the backend address (`--no-router`), https or http (`--tls`), so the
        catalog is consistent (the catalog import reads every endpoint: one left on the
        router's address while the others are on the backends reads as a routing loop)."""
        host = self.cloud.front_ip if self.ctx.routed else self.cloud.back_ip
        for row in ks.call("GET", "/endpoints")["endpoints"]:
            scheme, _, rest = str(row["url"]).partition("://")
            where, slash, path = rest.partition("/")
            now, _, port = where.rpartition(":")
            url = f"{self.cloud.scheme}://{host}:{port}{slash}{path}"
            if (
                row.get("region_id") == self.cloud.region
                and now in (self.cloud.front_ip, self.cloud.back_ip)
                and scheme in ("http", "https")
                and url != row["url"]
            ):
                ks.call("PATCH", f"/endpoints/{row['id']}", {"endpoint": {"url": url}})

    def _seed_heat_domain(self, ks: Keystone) -> None:
        """What heat needs in keystone besides its user, as devstack makes it: the domain of the
        users and projects heat creates for stacks (`heat`, administered by
        `heat_domain_admin`), and the roles heat gives them (heat_stack_user) or looks for
        (heat_stack_owner)."""
        domain = ks.ensure_domain("heat", "users and projects heat creates for stacks")
        admin = ks.ensure_user("heat_domain_admin", self.ctx.secrets.service, domain_id=domain)
        ks.grant_domain(domain, admin, "admin")
        for role in ("heat_stack_user", "heat_stack_owner"):
            ks.role_id(role)

    def service_types(self) -> list[str]:
        return service_types(self.services)

    def endpoint_rows(self) -> list[dict[str, str]]:
        return self.admin().endpoint_rows()

    # ------------------------------------------------------------------ other services

    def start_services(self) -> str:
        self._stop_changed()
        results = [self._start(name) for name in self.process_names() if name != "keystone"]
        started = sum(1 for r in results if r != "running")
        return f"{started} started, {len(results) - started} already running"

    def wait_services(self) -> str:
        for name in self.process_names():
            if name != "keystone" and self.listen_port(name) is not None:
                self.wait_api(name)
        if "nova" in self.services:
            self.wait_compute()
        if "cinder" in self.services:
            self.wait_volume()
        if "heat" in self.services:
            self.wait_engine()
        return "healthy"

    def wait_ready(self, name: str) -> None:
        """Until process `name` (just started) serves: its port, or its service's list."""
        if self.listen_port(name) is not None:
            self.wait_api(name)
        elif name in NOVA_DAEMONS:
            self.wait_compute()
        elif name in CINDER_DAEMONS:
            self.wait_volume()
        elif name in HEAT_DAEMONS:
            self.wait_engine()

    def nova_url(self) -> str:
        return self.cloud.backend_endpoint("compute")

    def _started(self, daemons: tuple[str, ...]) -> dict[str, float]:
        """When each daemon's current process started (0 when it has none)."""
        started = {}
        for d in daemons:
            rec = self.procs.get(self.pname(d))
            started[d] = rec.when if rec else 0.0
        return started

    def _died(self, daemons: tuple[str, ...]) -> Callable[[], str | None]:
        def died() -> str | None:
            for d in daemons:
                rec = self.procs.get(self.pname(d))
                if rec is None or not rec.alive():
                    return f"{d} exited; last lines of {self.log(d)}:\n{tail(self.log(d))}"
            return None

        return died

    def _wait_service_list(
        self, what: str, url: str, daemons: tuple[str, ...], timeout: float
    ) -> None:
        """Until an os-services list (nova's, cinder's) shows each daemon up, and reporting
        since its current process started (a restarted service keeps its old "up" state in the
        database for a minute)."""
        ks = self.admin()
        started = self._started(daemons)

        def services_up() -> bool:
            found = ks.call("GET", url)["services"]
            fresh = {
                s["binary"]
                for s in found
                if s["state"] == "up"
                and s["status"] == "enabled"
                and s["binary"] in started
                and _utc(s.get("updated_at")) >= started[s["binary"]] - 2
            }
            return set(daemons) <= fresh

        wait_for(self.label(what), services_up, timeout, interval=1.0,
                 on_fail=self._died(daemons))  # fmt: skip

    def wait_volume(self, timeout: float = 120) -> None:
        project = self.admin().project_id
        url = f"{self.cloud.backend_url('block-storage')}/v3/{project}/os-services"
        self._wait_service_list("cinder scheduler and volume up", url, CINDER_DAEMONS, timeout)

    def wait_engine(self, timeout: float = 120) -> None:
        """Until heat-engine has registered since its process started: its service record is
        written once its RPC server listens (`heat-manage service list`, from the database: the
        API's service list is itself an RPC call, which would wait for an engine not there)."""
        started = self._started(HEAT_DAEMONS)["heat-engine"]
        conf = str(self.ctx.etc("heat") / "heat.conf")
        manage = [str(self.paths.venv_bin("heat-manage")), "--config-file", conf]

        def registered() -> bool:
            out = self._manage([*manage, "service", "list"], "heat-manage service list")
            for line in out.splitlines():
                fields = line.split()
                if "heat-engine" in fields and fields[-3] == "up":
                    stamp = " ".join(fields[-2:])
                    if stamp != "None None" and _utc(stamp) >= started - 2:
                        return True
            return False

        wait_for(self.label("heat-engine registered"), registered, timeout, interval=2.0,
                 on_fail=self._died(HEAT_DAEMONS))  # fmt: skip

    def wait_compute(self, timeout: float = 180) -> None:
        ks = self.admin()
        died = self._died(NOVA_DAEMONS)
        url = self.nova_url() + "/os-services"
        self._wait_service_list("nova conductor, scheduler and compute up", url, NOVA_DAEMONS,
                                timeout)  # fmt: skip

        def hypervisors() -> bool:
            return bool(ks.call("GET", self.nova_url() + "/os-hypervisors")["hypervisors"])

        placement = self.cloud.backend_url("placement")
        host = f"{self.cloud.slug}-compute"

        def in_placement() -> bool:
            found = ks.call("GET", f"{placement}/resource_providers?name={host}")
            return bool(found["resource_providers"])

        mapped = hypervisors()
        if mapped and in_placement():
            return
        if mapped:
            # placement's database is new (moved or purged) while nova-compute still caches
            # its resource provider: a restart registers the compute node again
            self.step.timed(self.label("nova-compute re-registers in placement"),
                            lambda: (self.procs.stop(self.pname("nova-compute")),
                                     self._start("nova-compute"))[1])  # fmt: skip
        wait_for(self.label("compute node in placement"), in_placement, 120, interval=1.0,
                 on_fail=died)  # fmt: skip
        if mapped:
            return
        self.step.timed(
            self.label("nova discover_hosts"),
            lambda: self.nova_manage("cell_v2", "discover_hosts", "--verbose",
                                     what="nova-manage cell_v2 discover_hosts") and None,
        )  # fmt: skip
        wait_for(self.label("compute node mapped"), hypervisors, 60, interval=1.0)

    # ------------------------------------------------------------------ seed data

    def seed_resources(self) -> str:
        ks = self.admin()
        done = []
        if "glance" in self.services:
            done.append(self._seed_image(ks))
        if "nova" in self.services:
            done.append(self._seed_nova(ks))
        return ", ".join(done) or "nothing to seed"

    def _seed_image(self, ks: Keystone) -> str:
        results = [self._ensure_image(ks, name, props) for name, props in IMAGES.items()]
        made = [name for name, uploaded in zip(IMAGES, results, strict=True) if uploaded]
        return f"images uploaded: {', '.join(made)}" if made else f"{len(IMAGES)} images present"

    def _ensure_image(self, ks: Keystone, name: str, properties: dict[str, str]) -> bool:
        """An active public image `name` with the tiny bytes; True when it was uploaded now."""
        glance = self.cloud.backend_url("image")
        found = ks.call("GET", f"{glance}/v2/images?name={name}")["images"]
        if any(i["status"] == "active" for i in found):
            return False
        for stale in found:
            ks.call("DELETE", f"{glance}/v2/images/{stale['id']}", ok=(404,))
        image = ks.call(
            "POST",
            f"{glance}/v2/images",
            {
                "name": name,
                "disk_format": "raw",
                "container_format": "bare",
                "visibility": "public",
                "min_disk": 0,
                "min_ram": 0,
                **properties,
            },
        )
        request(
            "PUT",
            f"{glance}/v2/images/{image['id']}/file",
            data=tiny_image_bytes(),
            headers={"X-Auth-Token": ks.token, "Content-Type": "application/octet-stream"},
        )
        wait_for(
            self.label(f"image {name} active"),
            lambda: ks.call("GET", f"{glance}/v2/images/{image['id']}")["status"] == "active",
            60,
        )
        return True

    def _seed_nova(self, ks: Keystone) -> str:
        nova = self.nova_url()
        flavors = ks.call("GET", f"{nova}/flavors/detail?is_public=None")["flavors"]
        made = 0
        for want in FLAVORS:
            same = [f for f in flavors if f["id"] == want["id"] or f["name"] == want["name"]]
            if any(all(f.get(k) == v for k, v in want.items()) for f in same):
                continue
            for old in same:  # flavors are immutable: replace one of another size
                ks.call("DELETE", f"{nova}/flavors/{old['id']}", ok=(404,))
            ks.call("POST", f"{nova}/flavors", {"flavor": dict(want)})
            made += 1
        ks.call("PUT", f"{nova}/os-quota-class-sets/default",
                {"quota_class_set": dict(DEFAULT_QUOTA)})  # fmt: skip
        return f"{len(FLAVORS)} flavors ({made} created), default quotas raised"


def dropin_environment(dropin_dir: Path) -> dict[str, str]:
    """The `Environment=` assignments of a systemd drop-in directory's `*.conf` files, in
    systemd's order (file name, then line); `Environment=` with no value resets them. Other
    directives are not the lab's business and are ignored."""
    env: dict[str, str] = {}
    if not dropin_dir.is_dir():
        return env
    for conf in sorted(dropin_dir.glob("*.conf")):
        for line in conf.read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if not sep or key.strip() != "Environment":
                continue
            if not value.strip():
                env.clear()
                continue
            for item in shlex.split(value):
                name, eq, val = item.partition("=")
                if eq:
                    env[name] = val
    return env
