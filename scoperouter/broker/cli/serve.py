"""``scoperouter broker serve``: the OSB HTTP API and the workers that carry out operations."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
from types import FrameType
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load
from scoperouter.broker.config import BrokerConfig, BrokerConfigError
from scoperouter.broker.parent import die_with_parent

if TYPE_CHECKING:
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
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        log.warning("listening on %s: not loopback; put TLS in front of the broker", host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    processes = args.processes if args.processes is not None else config.processes
    workers = config.worker.threads if args.workers is None else args.workers
    if processes <= 1:
        return serve_process(config, password, sock, workers, host, port)
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
                code = serve_process(config, password, sock, workers, host, port)
            finally:
                os._exit(code)
        children.append(pid)
    sock.close()

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
    return 0


def serve_process(
    config: BrokerConfig, password: str, sock: socket.socket, workers: int, host: str, port: int
) -> int:
    """One process: the broker's state, its worker threads and the HTTP API on `sock`."""
    import uvicorn

    from scoperouter.broker.api import create_app
    from scoperouter.broker.runtime import Broker
    from scoperouter.broker.worker import Worker

    broker = Broker(config)
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
    server = uvicorn.Server(
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
        server.run(sockets=[sock])
    finally:
        worker.stop()
        broker.close()
    return 0
