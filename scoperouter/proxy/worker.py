"""One router worker process: the router's parts, its HTTP server, its forward proxy, signals.

    python -m scoperouter.proxy.worker --config F --cloud C --control-fd N \\
        --listen-fd HOST:PORT=FD ... [--drain S] [--worker I] [--event-loop uvloop|asyncio]

Started by the supervisor (:mod:`scoperouter.proxy.supervisor`), not by hand: the listening
sockets and the control socket are inherited file descriptors. The worker writes ``ready`` on
the control socket once it listens, and stops (draining) when the supervisor goes away.

A worker holds one of each of the router's parts (:mod:`scoperouter.router`: config, breaker,
token swap, access log, metrics, the combiner and the :class:`~scoperouter.router.pipeline.
Pipeline` they form), one upstream :class:`~scoperouter.http.pool.Pool`, the reverse server
(:mod:`scoperouter.proxy.reverse`: frontends and peer link) and, when the cloud has a forward
proxy, mitmproxy for it (:mod:`scoperouter.proxy.forward`, imported only then: a router
without a forward proxy never imports mitmproxy). One sweep every :data:`TICK` checks every
deadline. SIGHUP reloads the config in place (no connection is dropped); SIGTERM or SIGINT
drain: stop accepting, close idle connections, let requests in flight finish for up to the
drain time, then exit 0. It runs on the event loop its supervisor chose
(:mod:`scoperouter.proxy.eventloop`: uvloop unless ``settings.event_loop`` says asyncio).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from scoperouter.catalog import EVENT_LOOPS, Catalog, EventLoop
from scoperouter.errors import ConfigError
from scoperouter.http.pool import Pool
from scoperouter.proxy import eventloop
from scoperouter.proxy.busypoll import BusyPoll
from scoperouter.proxy.reverse import ReverseServer, configure_pool, transmit
from scoperouter.router import budget, logs, metrics
from scoperouter.router.accesslog import AccessLog
from scoperouter.router.combined import Combiner
from scoperouter.router.config import RouterConfig
from scoperouter.router.health import UpstreamHealth
from scoperouter.router.metrics import Metrics
from scoperouter.router.pipeline import Pipeline
from scoperouter.router.tokens import TokenSwap

if TYPE_CHECKING:
    from scoperouter.proxy.forward.engine import ForwardProxy
    from scoperouter.proxy.forward.intercept import Certificates

logger = logging.getLogger("scoperouter")

TICK = 0.1  # seconds between two sweeps of the response deadlines
CHECK_EVERY = 5  # ticks between two sweeps of the connections' own deadlines and idle pools
# The collector's threshold for its youngest generation (CPython's default: 700 container
# objects). Reference counting frees a request's objects; the collector is there for the rare
# cycle. At 700, with 1,000 client connections (a request's objects live ~35 ms), nearly every
# object was traced by young collections and promoted, and full collections followed: a
# tenth of a worker's CPU there, none at 50 connections where objects die young
# (docs/benchmarks.md, "The collector at 1,000 connections").
GC_YOUNG_THRESHOLD = 10_000
# Idle upstream connections closed in one tidy (a crowd's, at their idle time) after which the
# worker hands its free heap memory back to the system (budget.trim_soon): glibc keeps what
# their buffers and handles used inside its heap, between blocks still in use.
TRIM_AFTER_CLOSED = 64


class Worker:
    """One cloud's router process."""

    def __init__(
        self,
        config_path: str,
        cloud: str,
        workdir: Path,
        source: str | None = None,
        base_dir: Path | None = None,
        sockets: Mapping[tuple[str, int], socket.socket] | None = None,
    ) -> None:
        self.sockets = dict(sockets or {})
        self.config = config = RouterConfig(source, base_dir)
        config.load(config_path, cloud)  # ConfigError when it cannot be used
        health = UpstreamHealth(config)
        tokens = TokenSwap(config)
        metrics = Metrics(config, health)
        self.pool = Pool(on_peer_connect=metrics.peer_connection)
        config.subscribe(functools.partial(_configure_pool, self.pool, cloud))
        self.pipeline = Pipeline(
            config,
            health=health,
            tokens=tokens,
            log=AccessLog(config),
            metrics=metrics,
            combiner=Combiner(config, health, tokens, functools.partial(transmit, self.pool)),
        )
        self.reverse = ReverseServer(config, self.pipeline, self.pool)
        self.forward: ForwardProxy | None = None
        for listener in config.listeners:
            if listener.kind == "forward":
                from scoperouter.proxy.forward.engine import ForwardProxy  # mitmproxy

                self.forward = ForwardProxy(self.pipeline, listener, workdir, self.sockets)
        interception = self.forward.interception if self.forward is not None else None
        metrics.watch(
            connections=functools.partial(connection_counts, self.pool),
            minted=(
                None
                if interception is None
                else functools.partial(_minted, interception.certificates)
            ),
        )
        self.busy_poll: BusyPoll | None = None  # opened on the loop (_serve)
        config.subscribe(self._configure_busy_poll)
        self._stop = asyncio.Event()
        self._reloading: asyncio.Task[None] | None = None
        self._reload_again = False

    def _configure_busy_poll(self, catalog: Catalog) -> None:
        """``settings.busy_poll_us``: the window, and whether connections poke at all (0: no
        call per request)."""
        poll = self.busy_poll
        if poll is not None:
            poll.window = catalog.settings.busy_poll_us / 1e6
            self.reverse.state.on_io = poll.poke if poll.window > 0 else None

    def reload(self) -> None:
        """SIGHUP. The file is read and checked in a thread, so requests go on meanwhile (a
        10,000-cloud config takes seconds); the new catalog is swapped in here, on the loop.
        A SIGHUP during a reload reads the file once more after it."""
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True
            return
        self._reloading = asyncio.get_running_loop().create_task(self._reload())

    async def _reload(self) -> None:
        self._reload_again = True
        while self._reload_again:
            self._reload_again = False
            logger.info("reloading %s", self.config.source or self.config.path)
            try:
                catalog = await asyncio.to_thread(self.config.read)
                done = catalog is not None and self.config.apply(catalog)
                metrics.RELOADS.labels("ok" if done else "refused").inc()
                if done and self.forward is not None:
                    self.forward.reload()
            except Exception:  # a reload must never take the router down
                logger.exception("reload failed; the current config stays in use")
                continue
            if done:
                # The new catalog lives until the next reload: out of the collector's sight,
                # as what start-up made (a full collection would walk all of it).
                gc.freeze()

    async def run(self, control: socket.socket | None, drain: float) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            return await self._serve(control, drain)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    async def _serve(self, control: socket.socket | None, drain: float) -> int:
        cloud = self.config.cloud
        if self.forward is not None and not await self.forward.start():
            logger.error("could not start the forward proxy of %s; exiting", cloud)
            return 1
        try:
            reverse = [item for item in self.config.listeners if item.frontend is not None]
            await self.reverse.start(reverse, self.sockets)
        except OSError as exc:
            logger.error("could not start the listeners of %s (%s); exiting", cloud, exc)
            await self._close()
            return 1
        self.busy_poll = BusyPoll.open(asyncio.get_running_loop())
        self._configure_busy_poll(self.config.current())
        sweeper = asyncio.get_running_loop().create_task(self.sweep())
        for origin in self.pool.warm:  # the peer routers: connections opened ahead
            self.pool.refill(origin)
        watcher = None
        if control is not None:
            reader, writer = await asyncio.open_connection(sock=control)
            try:
                writer.write(b"ready\n")
                await writer.drain()
            except OSError:
                logger.error("the supervisor of %s is gone; exiting", cloud)
                sweeper.cancel()
                await self._close()
                return 1
            watcher = asyncio.create_task(self._watch_supervisor(reader))
        logger.info(
            "router of %s listening on %s (%s); event loop: %s",
            cloud,
            ", ".join(item.address for item in self.config.listeners),
            self.config.current().describe(),
            eventloop.running(),
        )
        try:
            await self._stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            try:
                await self._drain(drain)
            finally:
                sweeper.cancel()
                await self._close()
        logger.info("router of %s stopped", cloud)
        return 0

    async def _watch_supervisor(self, reader: asyncio.StreamReader) -> None:
        """The supervisor holds the other end: end of file means it is gone, so stop."""
        await reader.read()
        logger.warning("the supervisor is gone; stopping")
        self._stop.set()

    async def sweep(self) -> None:
        """Every deadline, every tick (runs until cancelled)."""
        ticks = 0
        while True:
            await asyncio.sleep(TICK)
            ticks += 1
            now = time.monotonic()
            self.pipeline.metrics.flush()  # the tick's requests, into prometheus-client
            self.pool.sweep(now)
            if self.forward is not None:
                self.forward.sweep(now)
            if ticks % CHECK_EVERY == 0:
                self.reverse.check(now)
                self.tidy(now)

    def tidy(self, now: float) -> None:
        """The idle upstream connections past their idle time closed; when a crowd's were
        (:data:`TRIM_AFTER_CLOSED` or more), the free heap memory handed back soon after."""
        if self.pool.tidy(now) >= TRIM_AFTER_CLOSED:
            budget.trim_soon()

    async def _drain(self, grace: float) -> None:
        """Stop listening, close idle client connections, give requests in flight `grace`
        seconds, then close what is left."""
        loop = asyncio.get_running_loop()
        self.reverse.stop_listening()
        forward = self.forward
        if forward is not None:
            await forward.stop_listening()
        deadline = loop.time() + grace
        while self.reverse.state.connections or (forward is not None and forward.connections()):
            late = loop.time() > deadline
            self.reverse.drain_step(late)
            if forward is not None:
                forward.drain_step(late)
            if loop.time() > deadline + 1.0:
                break
            await asyncio.sleep(0.02)

    async def _close(self) -> None:
        self.reverse.stop_listening()
        self.reverse.state.on_io = None
        if self.busy_poll is not None:
            self.busy_poll.close()
            self.busy_poll = None
        self.pool.close()
        if self.forward is not None:
            await self.forward.stop_listening()
            await self.forward.done()
        self.pipeline.metrics.flush()  # the last tick's counts


def _configure_pool(pool: Pool, cloud: str, catalog: Catalog) -> None:
    configure_pool(pool, catalog, cloud)


def connection_counts(pool: Pool) -> dict[str, tuple[int, int]]:
    """Upstream (scheme://host:port) -> (open, idle) connections of this worker's pool."""
    counts: dict[str, tuple[int, int]] = {}
    for origin in {*pool.idle, *pool.lent}:
        idle = pool.idle_count(origin)
        counts[str(origin)] = (pool.lent_count(origin) + idle, idle)
    return counts


def _minted(certificates: Certificates) -> tuple[int, int]:
    return certificates.made, len(certificates)


def tune_collector() -> None:
    """The worker's collector thresholds: :data:`GC_YOUNG_THRESHOLD` for the youngest
    generation, CPython's own for the older ones."""
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_worker(
    config_path: str,
    cloud: str,
    sockets: Mapping[tuple[str, int], socket.socket],
    control: socket.socket | None,
    drain: float,
    source: str | None = None,
    base_dir: Path | None = None,
    loop: EventLoop = "uvloop",
) -> int:
    """Run one worker on an event loop of the kind `loop` until it is told to stop; the process
    exit code. `config_path` may be a copy of the config (`source` names the original,
    `base_dir` is its directory)."""
    with tempfile.TemporaryDirectory(prefix="scoperouter-") as workdir:

        async def main() -> int:
            try:
                worker = Worker(config_path, cloud, Path(workdir), source, base_dir, sockets)
            except ConfigError as exc:
                logger.error("cannot start the router of %s: %s", cloud, exc)
                return 2
            # What start-up made (our modules, the config) lives as long as the worker: out of
            # the garbage collector's sight, full collections stay small.
            gc.freeze()
            tune_collector()
            return await worker.run(control, drain)

        try:
            return eventloop.run(main(), loop)
        except KeyboardInterrupt:
            return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scoperouter.proxy.worker")
    parser.add_argument("--config", required=True, help="the copy checked by the supervisor")
    parser.add_argument("--config-source", help="the original file (for messages)")
    parser.add_argument("--config-dir", help="the original's directory (for relative paths)")
    parser.add_argument("--cloud", required=True)
    parser.add_argument("--control-fd", type=int)
    parser.add_argument("--listen-fd", action="append", default=[], metavar="HOST:PORT=FD")
    parser.add_argument("--drain", type=float, default=10.0)
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, default="uvloop")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    args = parser.parse_args(argv)
    logs.setup(args.log_level, args.log_format, args.cloud, worker=args.worker)
    sockets: dict[tuple[str, int], socket.socket] = {}
    for item in args.listen_fd:
        address, _, fd = item.rpartition("=")
        host, _, port = address.rpartition(":")
        sockets[(host.strip("[]").lower(), int(port))] = socket.socket(fileno=int(fd))
    control = socket.socket(fileno=args.control_fd) if args.control_fd is not None else None
    base_dir = Path(args.config_dir) if args.config_dir else None
    return run_worker(
        args.config,
        args.cloud,
        sockets,
        control,
        args.drain,
        args.config_source,
        base_dir,
        args.event_loop,
    )


if __name__ == "__main__":
    sys.exit(main())
