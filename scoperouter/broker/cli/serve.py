"""``scoperouter broker serve``: the OSB HTTP API and the workers that carry out operations."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Iterable
from types import FrameType
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load
from scoperouter.broker.config import BrokerConfig, BrokerConfigError
from scoperouter.broker.parent import die_with_parent

if TYPE_CHECKING:
    from scoperouter.broker.metrics import MetricsServer
    from scoperouter.broker.store import Store
    from scoperouter.cli.common import Subparsers

log = logging.getLogger("scoperouter.broker")

DESCRIPTION = """\
Run the OSB HTTP API and the workers that carry out operations. Loopback by default
(`listen` in the config). Needs the basic-auth password ($SCOPEROUTER_BROKER_PASSWORD or
auth.password_file) and the secrets keys ($SCOPEROUTER_BROKER_SECRET_KEYS or
secrets.keys_file). An out-of-date database schema is upgraded first unless
database.auto_upgrade is false. Any number of `serve` processes may share one PostgreSQL
database: each operation is run by one worker at a time (leases).
"""

EPILOG = """\
example:
  scoperouter broker serve --config /etc/scoperouter/broker.yaml --processes 2
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    serve = sub.add_parser(
        "serve",
        help="run the OSB API and its workers",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(serve)
    serve.add_argument("--listen", metavar="HOST:PORT", help="override the config's listen")
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker threads per process (override; 0: API only)",
    )
    serve.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="processes sharing the listening socket (override of `processes`; each has its own "
        "workers: leases keep them from running one operation twice)",
    )
    serve.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="override"
    )
    serve.set_defaults(func=guard(run))
    return serve


def run(args: argparse.Namespace) -> int:
    from scoperouter.broker import logs, migrate

    config = load(args)
    logs.setup_logging(args.log_level or config.log_level)
    password = config.password()
    config.secret_keys()
    url = config.database_url()
    if not migrate.is_current(url):
        if not config.database.auto_upgrade:
            raise BrokerConfigError(
                "the database schema is not current and database.auto_upgrade is false: "
                "run `scoperouter broker db upgrade`"
            )
        before, after = migrate.upgrade(url)
        log.info("database schema upgraded from %s to %s", before or "(empty)", after)
    host, port = config.listen_address
    if args.listen:
        host, _, port_text = args.listen.rpartition(":")
        port = int(port_text)
    if not _loopback(host):
        log.warning("listening on %s: not loopback; put TLS in front of the broker", host)
    metrics_dir = _metrics_dir(config)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    processes = args.processes if args.processes is not None else config.processes
    workers = config.worker.threads if args.workers is None else args.workers
    if processes <= 1:
        try:
            return serve_process(
                config, password, sock, workers, host, port, metrics_dir, listener=True
            )
        finally:
            _remove(metrics_dir)
    # One listening socket, several processes accepting on it (the GIL makes one process use
    # one core); each builds its own engines and threads after the fork.
    children: list[int] = []
    parent = os.getpid()
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child exits here
            code = 1
            try:
                # a parent that dies (even SIGKILLed) takes its children along: none keeps
                # answering on the port that a restarted broker must bind again
                die_with_parent(signal.SIGTERM, parent)
                code = serve_process(config, password, sock, workers, host, port, metrics_dir)
            finally:
                os._exit(code)
        children.append(pid)
    sock.close()
    try:
        # the services' names as configured (the children's plug-ins are not loaded here)
        server = _serve_metrics(config, None, config.enabled_services(), metrics_dir)
    except BrokerConfigError as exc:
        log.error("%s", exc)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)
        server = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while children:
        pid, _status = os.wait()
        if pid in children:
            children.remove(pid)
    if server is not None:
        server.close()
    _remove(metrics_dir)
    return 0 if server is not None or metrics_dir is None else 1


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def _metrics_dir(config: BrokerConfig) -> str | None:
    """With metrics on: a fresh directory where every process of this `serve` writes its
    values (PROMETHEUS_MULTIPROC_DIR), set before prometheus-client is imported (it picks its
    mode then), so every metric of the broker is multiprocess."""
    if not config.metrics.enabled:
        return None
    import sys
    import tempfile

    if "prometheus_client" in sys.modules:  # a bug of ours: the values would stay per process
        raise RuntimeError("prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR")
    directory = tempfile.mkdtemp(prefix="scoperouter-broker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    return directory


def _remove(directory: str | None) -> None:
    if directory is not None:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def _serve_metrics(
    config: BrokerConfig, store: Store | None, services: Iterable[str], directory: str | None
) -> MetricsServer | None:
    """The metrics listener of this `serve` (None with metrics off); BrokerConfigError when its
    address cannot be bound. `store`: None, one of its own (the parent of several processes)."""
    if directory is None:
        return None
    from scoperouter.broker.metrics import MetricsServer
    from scoperouter.broker.store import Store

    host, port = config.metrics.address
    if not _loopback(host):
        log.warning("metrics on %s: not loopback; /metrics has no authentication", host)
    try:
        server = MetricsServer(
            (host, port),
            store or Store(config.database_url()),
            services,
            directory,
        )
    except OSError as exc:
        raise BrokerConfigError(f"metrics.listen: cannot listen on {host}:{port}: {exc}") from None
    log.info("broker metrics on http://%s:%d/metrics", host, port)
    return server


def serve_process(
    config: BrokerConfig,
    password: str,
    sock: socket.socket,
    workers: int,
    host: str,
    port: int,
    metrics_dir: str | None = None,
    *,
    listener: bool = False,
) -> int:
    """One process: the broker's state, its worker threads and the HTTP API on `sock`; and
    the metrics listener with `listener` (one process; several: their parent serves it)."""
    import uvicorn

    from scoperouter.broker.api import create_app
    from scoperouter.broker.runtime import Broker
    from scoperouter.broker.worker import Worker

    broker = Broker(config)
    if metrics_dir is not None:
        from scoperouter.broker import metrics

        metrics.prepare(s.name for s in broker.services.values())
    # the listener of a single process (several: their parent's)
    names = [s.name for s in broker.services.values()]
    server = _serve_metrics(config, broker.store, names, metrics_dir) if listener else None
    worker = Worker(broker)
    worker.start(workers)
    app = create_app(broker, worker=worker, password=password)
    log.info(
        "broker serving http://%s:%d (services: %s; database %s; %d worker thread(s); pid %d)",
        host,
        port,
        ", ".join(broker.services) or "none",
        broker.store.engine.url.render_as_string(hide_password=True),
        workers,
        os.getpid(),
    )
    uvicorn_server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
            # nothing here reads the client address, and no "server: uvicorn" on answers:
            # both cost per request on the polling routes
            proxy_headers=False,
            server_header=False,
        )
    )
    try:
        uvicorn_server.run(sockets=[sock])
    finally:
        worker.stop()
        if server is not None:
            server.close()
        broker.close()
    return 0
