"""One router worker: an embedded mitmproxy with the minimal addon set, signals and draining.

mitmdump loads ~35 addons; dispatching every hook to all of them cost about half of the CPU of
a proxied request. A plain HTTP(S) reverse/forward proxy needs only:

* ``Proxyserver`` - listeners, connection handling, the connection options;
* ``NextLayer``  - picks the protocol layers (TLS, HTTP) for each connection;
* ``TlsConfig``  - certificates for TLS frontends, verification of HTTPS upstreams;

plus the router's own addons in one :class:`~scoperouter.proxy.addons.chain.Chain`. Nothing is
printed per flow by mitmproxy and no flow is stored.

A worker is started by the supervisor (:mod:`scoperouter.proxy.supervisor`) with the listening
sockets it must accept on and a control socket: it writes ``ready`` there once it listens, and
stops (draining) when the supervisor goes away. SIGHUP reloads the config in place (no
connection is dropped); SIGTERM or SIGINT drain: stop accepting, close idle connections, let
requests in flight finish for up to the drain time, then exit 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mitmproxy import exceptions, master, options
from mitmproxy.addons import next_layer, proxyserver, tlsconfig
from mitmproxy.utils import asyncio_utils

from scoperouter.catalog import Settings
from scoperouter.proxy import mitm
from scoperouter.proxy.addons import (
    AccessLog,
    Combining,
    HeadGuard,
    InFlight,
    Metrics,
    RouterConfig,
    TokenSwap,
    UpstreamHealth,
    router_addons,
)
from scoperouter.proxy.addons.chain import Chain
from scoperouter.proxy.lean import LeanServer
from scoperouter.proxy.listeners import Listener, write_cert_bundles

logger = logging.getLogger("scoperouter")

BASE_OPTIONS = {
    "connection_strategy": "lazy",  # connect upstream only once the router has chosen where
    "stream_large_bodies": "1m",  # bodies above 1 MiB stream through, both directions
    "keep_host_header": True,  # services see the Host the client used (links to the router)
    "validate_inbound_headers": True,  # request smuggling protection: keep it on
    "http2": False,  # HTTP/1.1 only: every error response goes through mitm.render_error
    "http3": False,
    "upstream_cert": False,  # a TLS frontend presents its own certificate, never a copy
}


def tls_options(settings: Settings, workdir: Path) -> dict[str, object]:
    """mitmproxy options for verifying HTTPS upstreams (remote frontends, backends, peer
    links). mitmproxy takes one CA file: with both ``ca_bundle`` and ``peers.ca`` it gets the
    two in one file (in the worker's private `workdir`)."""
    cafile = settings.ca_bundle
    if settings.peers.ca is not None:
        cafile = settings.peers.ca
        if settings.ca_bundle is not None:
            both = workdir / "upstream-ca.pem"
            both.write_bytes(
                Path(settings.ca_bundle).read_bytes() + b"\n" + Path(settings.peers.ca).read_bytes()
            )
            cafile = str(both)
    return {"ssl_insecure": not settings.verify, "ssl_verify_upstream_trusted_ca": cafile}


class Worker:
    """One cloud's router process: a mitmproxy Master with the minimal addon set and ours."""

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
        self.config = RouterConfig(source, base_dir)
        self.chain = Chain(router_addons(self.config))
        self.options = options.Options()
        self.master = master.Master(self.options, with_termlog=False)
        mitm.quiet_master(self.master)
        mitm.fast_hooks(self.master)
        self.master.addons.add(
            proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig(), self.chain
        )
        # mitmproxy's CA (TlsConfig needs one) lives and dies in workdir, never in ~/.mitmproxy.
        self.options.update(confdir=str(workdir))
        # Loads and validates the config (OptionsError when it is unusable).
        self.options.update(scoperouter_config=config_path, scoperouter_cloud=cloud)
        catalog = self.config.current()
        listeners = self.config.listeners
        # data_path lean: the frontends are the lean server's, mitmproxy keeps the forward proxy.
        # The peer link is the lean server's on either data path.
        self.lean: LeanServer | None = None
        self.reverse: tuple[Listener, ...] = ()
        if catalog.settings.data_path == "lean":
            self.reverse = tuple(item for item in listeners if item.frontend is not None)
        else:
            self.reverse = tuple(item for item in listeners if item.peer)
        listeners = tuple(item for item in listeners if item not in self.reverse)
        if self.reverse:
            chain = self.chain
            self.lean = LeanServer(
                self.config,
                guard=chain.get(HeadGuard),
                health=chain.get(UpstreamHealth),
                swap=chain.get(TokenSwap),
                log=chain.get(AccessLog),
                metrics=chain.get(Metrics),
                combiner=chain.get(Combining).combiner,
            )
        self.workdir = workdir
        self.options.update(
            **BASE_OPTIONS,
            **tls_options(catalog.settings, workdir),
            certs=write_cert_bundles(listeners, workdir),
            mode=[item.spec for item in listeners],
        )

    def reload(self) -> None:
        try:
            if self.config.reload():
                self.options.update(**tls_options(self.config.current().settings, self.workdir))
        except Exception:  # a reload must never take the router down
            logger.exception("reload failed; the current config stays in use")

    async def run(self, control: socket.socket | None, drain: float) -> int:
        loop = asyncio.get_running_loop()
        ps = self.master.addons.get("proxyserver")
        with asyncio_utils.install_exception_handler(self.master._asyncio_exception_handler):
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.master.shutdown)
            loop.add_signal_handler(signal.SIGHUP, self.reload)
            try:
                return await self._serve(ps, control, drain)
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    loop.remove_signal_handler(sig)

    async def _serve(
        self, ps: proxyserver.Proxyserver, control: socket.socket | None, drain: float
    ) -> int:
        cloud = self.config.cloud
        if not await ps.setup_servers():
            logger.error("could not start the listeners of %s; exiting", cloud)
            await ps.servers.update([])  # the ones that did start
            return 1
        if self.lean is not None:
            try:
                await self.lean.start(self.reverse, self.sockets)
            except OSError as exc:
                logger.error("could not start the listeners of %s (%s); exiting", cloud, exc)
                self.lean.stop_listening()
                await ps.servers.update([])
                return 1
        watcher = None
        if control is not None:
            reader, writer = await asyncio.open_connection(sock=control)
            try:
                writer.write(b"ready\n")
                await writer.drain()
            except OSError:
                logger.error("the supervisor of %s is gone; exiting", cloud)
                await ps.servers.update([])
                return 1
            watcher = asyncio.create_task(self._watch_supervisor(reader))
        logger.info(
            "router of %s listening on %s (%s)",
            cloud,
            ", ".join(item.address for item in self.config.listeners),
            self.config.current().describe(),
        )
        try:
            await self.master.running()
            await self.master.should_exit.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            try:
                await self._drain(ps, drain)
            finally:
                await self.master.done()
        logger.info("router of %s stopped", cloud)
        return 0

    async def _watch_supervisor(self, reader: asyncio.StreamReader) -> None:
        """The supervisor holds the other end: end of file means it is gone, so stop."""
        await reader.read()
        logger.warning("the supervisor is gone; stopping")
        self.master.shutdown()

    async def _drain(self, ps: proxyserver.Proxyserver, grace: float) -> None:
        """Stop listening, close idle client connections, give requests in flight `grace`
        seconds, then close what is left."""
        loop = asyncio.get_running_loop()
        await ps.servers.update([])
        lean = self.lean
        if lean is not None:
            lean.stop_listening()
        inflight = self.chain.get(InFlight)
        deadline = loop.time() + grace
        while ps.connections or (lean is not None and lean.connections):
            busy = inflight.busy()
            late = loop.time() > deadline
            for client_id in mitm.client_ids():
                if late or client_id not in busy:
                    mitm.close_client(client_id)
            if lean is not None:
                lean.drain_step(late)
            if loop.time() > deadline + 1.0:
                break
            await asyncio.sleep(0.02)
        if lean is not None:
            lean.close()


def run_worker(
    config_path: str,
    cloud: str,
    sockets: Mapping[tuple[str, int], socket.socket],
    control: socket.socket | None,
    drain: float,
    source: str | None = None,
    base_dir: Path | None = None,
) -> int:
    """Run one worker until it is told to stop; the process exit code. `config_path` may be a
    copy of the config (`source` names the original, `base_dir` is its directory)."""
    mitm.install()
    mitm.use_listen_sockets(sockets)
    with tempfile.TemporaryDirectory(prefix="scoperouter-") as workdir:

        async def main() -> int:
            try:
                worker = Worker(config_path, cloud, Path(workdir), source, base_dir, sockets)
            except exceptions.OptionsError as exc:
                logger.error("cannot start the router of %s: %s", cloud, exc)
                return 2
            # What start-up made (mitmproxy's and our modules, the config) lives as long as
            # the worker: out of the garbage collector's sight, full collections stay small.
            gc.freeze()
            return await worker.run(control, drain)

        try:
            return asyncio.run(main())
        except KeyboardInterrupt:
            return 0
