"""The router of one cloud as several worker processes on the same ports.

The supervisor (this module; it never imports mitmproxy) binds every listener of the cloud once
per worker with ``SO_REUSEPORT`` (the kernel spreads new connections over the workers' sockets),
starts ``--workers`` worker processes (:mod:`scoperouter.proxy.worker`) that accept on them, and:

* **restarts** a worker that dies. Its listening sockets stay open in the supervisor, so the
  connections the kernel queued for it wait for the new worker instead of being reset: a
  SIGKILLed worker loses only the requests it had in flight;
* **reloads** on SIGHUP (or, with ``--watch``, when the file changes): the config is checked
  here first (a bad file is refused once, with its error, and nothing changes), then every
  worker reloads in place, keeping its connections;
* **drains** on SIGTERM/SIGINT: workers stop accepting, finish the requests in flight (up to the
  drain time) and exit; the supervisor exits 0 when they all did;
* keeps the router's facts (config generation, digest, certificates, workers:
  :mod:`scoperouter.router.facts`) and serves ``/metrics`` (Prometheus text format, every
  worker's metrics added up, then the facts), ``/healthz`` and the status page on the cloud's
  ``metrics.listen`` address, a separate (loopback by default) port
  (:mod:`scoperouter.proxy.statusserver`);
* chooses the workers' event loop once (``settings.event_loop``:
  :func:`~scoperouter.proxy.eventloop.choose`); it runs on asyncio's own.

A worker learns that the supervisor is gone from its control socket (end of file) and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scoperouter.catalog import Catalog
from scoperouter.config import parse_catalog, read_config
from scoperouter.errors import ConfigError
from scoperouter.proxy import eventloop
from scoperouter.proxy.forward.intercept import signing_ca
from scoperouter.proxy.statusserver import StatusServer
from scoperouter.router.facts import FactsCollector, RouterFacts, Workers
from scoperouter.router.listeners import listener_signature, listeners_for

logger = logging.getLogger("scoperouter")

READY_TIMEOUT = 60.0  # seconds a new worker may take to listen
BACKLOG = 1024
WATCH_INTERVAL = 1.0
MAX_BACKOFF = 10.0
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True, slots=True)
class Options:
    config_path: str
    cloud: str
    workers: int
    watch: bool = False
    drain: float = 10.0
    log_level: str = "INFO"
    log_format: str = "json"


@dataclass(slots=True)
class Slot:
    """One worker position: its listening sockets outlive the processes that fill it."""

    index: int
    sockets: dict[tuple[str, int], socket.socket]
    proc: asyncio.subprocess.Process | None = None
    control: asyncio.StreamWriter | None = None  # our end of the worker's control socket
    reader: asyncio.StreamReader | None = None
    ready: bool = False
    restarts: int = 0
    started: float = 0.0


class StartupError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def bind_listeners(
    addresses: Iterable[tuple[str, int]], copies: int
) -> list[dict[tuple[str, int], socket.socket]]:
    """`copies` listening sockets per address, with SO_REUSEPORT, one set per worker.

    Each address is first probed without SO_REUSEPORT: another process listening there (even
    another router with SO_REUSEPORT) makes that bind fail, so two routers never share a port
    by accident.
    """
    sets: list[dict[tuple[str, int], socket.socket]] = [{} for _ in range(copies)]
    try:
        for host, port in addresses:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(sockaddr)
            for copy in sets:
                sock = socket.socket(family, kind, proto)
                copy[(host, port)] = sock
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind(sockaddr)
                sock.listen(BACKLOG)
                sock.set_inheritable(True)
    except OSError as exc:
        for copy in sets:
            for sock in copy.values():
                sock.close()
        where = f"{host}:{port}"
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else str(exc)
        raise StartupError(1, f"cannot listen on {where}: {reason}") from None
    return sets


def listen_addresses(catalog: Catalog, cloud: str) -> list[tuple[str, int]]:
    """Where the router of `cloud` listens: its frontends, its forward proxy, its peer link."""
    spec = catalog.clouds[cloud]
    found = [(f.listen_host, f.listen_port) for f in spec.frontends]
    if spec.proxy_listen is not None:
        found.append(spec.proxy_listen)
    if spec.peer is not None:
        found.append((spec.peer.listen_host, spec.peer.listen_port))
    return list(dict.fromkeys(found))


def python_command() -> list[str]:
    """This interpreter with its optimisation flags (``python -O`` is passed on to workers)."""
    flags = ["-" + "O" * sys.flags.optimize] if sys.flags.optimize else []
    return [sys.executable, *flags]


class Supervisor:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.slots: list[Slot] = []
        self.stopping = False
        self.status_server: StatusServer | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._hup_pending = False
        self._workdir = tempfile.mkdtemp(prefix="scoperouter-")
        self._metrics_dir = os.path.join(self._workdir, "metrics")
        os.mkdir(self._metrics_dir)
        # Workers read the copy the supervisor checked, so a file being edited while a worker
        # starts or reloads never reaches one half-written.
        self._snapshot = os.path.join(self._workdir, "federation.yaml")
        try:
            self.catalog, text = self._read()
            self._commit(text)
        except ConfigError:
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        # The workers' loop, for the router's lifetime (a worker started again gets the same).
        self.event_loop, why = eventloop.choose(self.catalog.settings.event_loop)
        if why is not None:
            logger.warning("%s", why)
        self.facts = RouterFacts(options.cloud, self.event_loop)
        self.facts.loaded(self.catalog, text)

    def _read(self) -> tuple[Catalog, str]:
        """The config file's catalog and text (ConfigError when it cannot be used)."""
        path = self.options.config_path
        text = read_config(path)
        catalog = parse_catalog(text, path, Path(path).parent)
        if self.options.cloud not in catalog.clouds:
            known = ", ".join(sorted(catalog.clouds))
            cloud = self.options.cloud
            raise ConfigError(path, f"cloud {cloud!r} is not defined (clouds: {known})")
        # The forward proxy's CA, read as a worker will (its key mode 0600, else no start)
        signing_ca(catalog, self.options.cloud, path)
        return catalog, text

    def _commit(self, text: str) -> None:
        """Make `text` the config workers read (atomically)."""
        tmp = self._snapshot + ".tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(text)
        os.replace(tmp, self._snapshot)

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        cloud = self.options.cloud
        # Signals are ours from the start: a SIGHUP during start-up must not kill the
        # supervisor (its default action), it reloads once the workers are up.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)
        try:
            try:
                addresses = listen_addresses(self.catalog, cloud)
                sets = bind_listeners(addresses, self.options.workers)
                self.slots = [Slot(i, sockets) for i, sockets in enumerate(sets)]
                metrics_listen = self.catalog.clouds[cloud].metrics_listen
                if metrics_listen is not None:
                    try:
                        self.status_server = StatusServer(metrics_listen, self)
                    except OSError as exc:
                        where = "{}:{}".format(*metrics_listen)
                        raise StartupError(1, f"cannot serve metrics on {where}: {exc}") from None
                await self._start_all()
            except StartupError as exc:
                logger.error("could not start the listeners of %s: %s", cloud, exc)
                await self._shutdown()
                return exc.code
            logger.info(
                "router of %s: %d worker%s listening on %s%s",
                cloud,
                len(self.slots),
                "s" if len(self.slots) != 1 else "",
                ", ".join(f"{h}:{p}" for h, p in addresses),
                f"; metrics and health on {self.status_server.address}"
                if self.status_server
                else "",
            )
            self._started = True
            if self._hup_pending:
                self.reload()
            self._tasks = [asyncio.create_task(self._keep(slot)) for slot in self.slots]
            if self.options.watch:
                self._tasks.append(asyncio.create_task(self._watch()))
            await self._stop.wait()
            return await self._shutdown()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    def _hangup(self) -> None:
        if self._started:
            self.reload()
        else:
            self._hup_pending = True

    async def _start_all(self) -> None:
        await asyncio.gather(*(self._spawn(slot) for slot in self.slots))
        results = await asyncio.gather(
            *(self._ready(slot) for slot in self.slots), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _spawn(self, slot: Slot) -> None:
        ours, theirs = socket.socketpair()
        fds = {key: sock.fileno() for key, sock in slot.sockets.items()}
        argv = [
            *python_command(),
            "-m",
            "scoperouter.proxy.worker",
            "--config",
            self._snapshot,
            "--config-source",
            self.options.config_path,
            "--config-dir",
            str(Path(self.options.config_path).parent),
            "--cloud",
            self.options.cloud,
            "--control-fd",
            str(theirs.fileno()),
            "--drain",
            str(self.options.drain),
            "--log-level",
            self.options.log_level,
            "--log-format",
            self.options.log_format,
            "--worker",
            str(slot.index),
            "--event-loop",
            self.event_loop,
        ]
        for (host, port), fd in fds.items():
            argv += ["--listen-fd", f"{host}:{port}={fd}"]
        env = {**os.environ, MULTIPROC_ENV: self._metrics_dir}
        slot.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            pass_fds=[theirs.fileno(), *fds.values()],
            env=env,
        )
        theirs.close()
        reader, slot.control = await asyncio.open_connection(sock=ours)
        slot.ready, slot.started = False, time.monotonic()
        slot.reader = reader

    async def _ready(self, slot: Slot) -> None:
        """Until the worker says it listens; StartupError if it exits or takes too long."""
        assert slot.proc is not None and slot.reader is not None
        try:
            line = await asyncio.wait_for(slot.reader.readline(), READY_TIMEOUT)
        except TimeoutError:
            message = f"worker {slot.index} did not start within {READY_TIMEOUT:g}s"
            raise StartupError(1, message) from None
        if line.strip() != b"ready":
            code = await slot.proc.wait()
            raise StartupError(code if code > 0 else 1, f"worker {slot.index} exited ({code})")
        slot.ready = True

    async def _keep(self, slot: Slot) -> None:
        """Restart the worker of `slot` whenever it dies (not while stopping)."""
        backoff = 0.1
        while True:
            assert slot.proc is not None
            code = await slot.proc.wait()
            slot.ready = False
            self._forget(slot)
            if self.stopping:
                return
            lived = time.monotonic() - slot.started
            backoff = min(backoff * 2, MAX_BACKOFF) if lived < 10 else 0.1
            logger.error(
                "worker %d (pid %d) of %s exited with %s after %.1fs; starting a new one",
                slot.index,
                slot.proc.pid,
                self.options.cloud,
                _exit_text(code),
                lived,
            )
            await asyncio.sleep(backoff)
            if self.stopping:
                return
            slot.restarts += 1
            try:
                await self._spawn(slot)
                await self._ready(slot)
            except StartupError as exc:
                logger.error("worker %d of %s: %s", slot.index, self.options.cloud, exc)
            else:
                assert slot.proc is not None
                logger.info(
                    "worker %d (pid %d) of %s replaced and serving",
                    slot.index,
                    slot.proc.pid,
                    self.options.cloud,
                )

    def _forget(self, slot: Slot) -> None:
        """A worker process is gone: its live gauges stop counting, its control socket closes."""
        if slot.control is not None:
            slot.control.close()
            slot.control = slot.reader = None
        if slot.proc is not None:
            with contextlib.suppress(Exception):
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(slot.proc.pid, self._metrics_dir)

    def reload(self) -> None:
        """SIGHUP: check the config here, then have every worker reload it in place.

        A config that changes what the listening sockets are (addresses, frontend URLs,
        certificate files) cannot be applied in place: it is refused like an invalid one, and
        the router keeps its config whole (a worker started later reads the same)."""
        cloud = self.options.cloud
        try:
            catalog, text = self._read()
            old = listener_signature(listeners_for(self.catalog, cloud))
            new = listener_signature(listeners_for(catalog, cloud))
            if old != new:
                raise ConfigError(
                    self.options.config_path,
                    f"the listeners of {cloud} changed ("
                    + ", ".join(a for a, *_ in old)
                    + " -> "
                    + ", ".join(a for a, *_ in new)
                    + "); restart the router to apply a config that changes listen addresses "
                    "or certificates",
                )
        except ConfigError as exc:
            logger.error("reload refused, keeping the current config: %s", exc)
            return
        self._commit(text)
        self.facts.loaded(catalog, text)
        if catalog.settings.event_loop != self.catalog.settings.event_loop:
            logger.warning(
                "settings.event_loop is now %s: the workers keep theirs (%s) until the router "
                "restarts",
                catalog.settings.event_loop,
                self.event_loop,
            )
        self.catalog = catalog
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGHUP)

    async def _watch(self) -> None:
        """--watch: reload when the config file's mtime or size changes (checked every second)."""
        last = _stamp(self.options.config_path)
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = _stamp(self.options.config_path)
            if now != last:
                last = now
                self.reload()

    async def _shutdown(self) -> int:
        """Drain the workers, close everything; 0 when every worker stopped cleanly."""
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        procs = [slot.proc for slot in self.slots if slot.proc is not None]
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for slot in self.slots:  # no new connections; the workers finish what they hold
            for sock in slot.sockets.values():
                sock.close()
        codes: list[int] = []
        for proc in procs:
            try:
                codes.append(await asyncio.wait_for(proc.wait(), self.options.drain + 5))
            except TimeoutError:
                logger.error("worker pid %d did not stop; killing it", proc.pid)
                proc.kill()
                codes.append(await proc.wait())
        for slot in self.slots:
            self._forget(slot)
        if self.status_server is not None:
            self.status_server.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
        if any(codes):
            logger.error(
                "router of %s stopped; workers exited with %s",
                self.options.cloud,
                ", ".join(_exit_text(code) for code in codes),
            )
            return 1
        logger.info("router of %s stopped", self.options.cloud)
        return 0

    # ------------------------------------------------------------------ status

    def state(self) -> tuple[str, list[dict[str, Any]]]:
        """The router's state (ok, degraded, starting, stopping) and each worker's."""
        workers = [
            {
                "worker": slot.index,
                "pid": slot.proc.pid if slot.proc is not None else None,
                "ready": slot.ready,
                "restarts": slot.restarts,
            }
            for slot in self.slots
        ]
        ready = sum(1 for slot in self.slots if slot.ready)
        if self.stopping:
            status = "stopping"
        elif ready == len(self.slots):
            status = "ok"
        elif ready:
            status = "degraded"
        else:
            status = "starting"
        return status, workers

    def health(self) -> tuple[int, dict[str, Any]]:
        status, workers = self.state()
        body = {
            "status": status,
            "cloud": self.options.cloud,
            "event_loop": self.event_loop,
            "workers": workers,
            "upstreams_down": self._upstreams_down(),
        }
        ready = any(worker["ready"] for worker in workers)
        return (200 if ready and not self.stopping else 503), body

    def _upstreams_down(self) -> list[dict[str, str]]:
        down = []
        for metric in self.registry().collect():
            if metric.name != "scoperouter_upstream_up":
                continue
            for sample in metric.samples:
                if sample.value == 0:
                    down.append(dict(sample.labels))
        return down

    def registry(self) -> Any:
        """The workers' metrics, added up (prometheus-client's multiprocess collector)."""
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self._metrics_dir)
        return registry

    def workers(self) -> Workers:
        return Workers(
            running=sum(1 for slot in self.slots if slot.ready),
            wanted=self.options.workers,
            restarts=sum(slot.restarts for slot in self.slots),
        )

    def metrics_text(self) -> bytes:
        """``/metrics``: the workers' metrics added up, then the router's facts."""
        from prometheus_client import CollectorRegistry, generate_latest

        own = CollectorRegistry(auto_describe=False)
        own.register(FactsCollector(self.facts, self.workers))
        return generate_latest(self.registry()) + generate_latest(own)


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def serve(options: Options) -> int:
    """Run the router of `options.cloud` until SIGTERM/SIGINT; the process exit code."""
    try:
        supervisor = Supervisor(options)
    except ConfigError as exc:
        logger.error("cannot start the router of %s: invalid config: %s", options.cloud, exc)
        return 2
    try:
        return asyncio.run(supervisor.run())
    except KeyboardInterrupt:
        return 0
