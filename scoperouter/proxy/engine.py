"""The embedded mitmproxy: a minimal `Master`, the router's listeners, signals and reload.

mitmdump loads ~35 addons; dispatching every hook to all of them cost about half of the CPU of
a proxied request. A plain HTTP(S) reverse/forward proxy needs only:

* ``Proxyserver`` - listeners, connection handling, the connection options;
* ``NextLayer``  - picks the protocol layers (TLS, HTTP) for each connection;
* ``TlsConfig``  - certificates for TLS frontends, verification of HTTPS upstreams;

plus :class:`~scoperouter.proxy.addon.ScopeRouter`. No termlog, dumper (flow_detail) or save
addon is loaded: nothing is printed per flow by mitmproxy and no flow is stored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import tempfile
from pathlib import Path

from mitmproxy import exceptions, master, options
from mitmproxy.addons import next_layer, proxyserver, tlsconfig
from mitmproxy.utils import asyncio_utils

from scoperouter.catalog import Settings
from scoperouter.proxy import upstream
from scoperouter.proxy.addon import ScopeRouter
from scoperouter.proxy.listeners import write_cert_bundles

logger = logging.getLogger("scoperouter")

WATCH_INTERVAL = 1.0
DRAIN_GRACE = 5.0  # seconds requests in flight get to finish on SIGTERM

BASE_OPTIONS = {
    "connection_strategy": "lazy",  # connect upstream only once the router has chosen where
    "stream_large_bodies": "1m",  # bodies above 1 MiB stream through, both directions
    "keep_host_header": True,  # services see the Host the client used (links to the router)
    "validate_inbound_headers": True,  # request smuggling protection: keep it on
    "http2": False,  # HTTP/1.1 only: every error response goes through upstream.render_error
    "http3": False,
    "upstream_cert": False,  # a TLS frontend presents its own certificate, never a copy
}


def tls_options(settings: Settings) -> dict[str, object]:
    """mitmproxy options for verifying HTTPS upstreams (remote frontends, backends)."""
    return {
        "ssl_insecure": not settings.verify,
        "ssl_verify_upstream_trusted_ca": settings.ca_bundle,
    }


class Router:
    """One cloud's router: a mitmproxy Master with the minimal addon set and ScopeRouter."""

    def __init__(self, config_path: str, cloud: str, workdir: Path) -> None:
        self.addon = ScopeRouter()
        self.options = options.Options()
        self.master = master.Master(self.options, with_termlog=False)
        # mitmproxy copies every log record into a deprecated "add_log" event for addons that
        # no addon here uses: ~18 us per log line (bench/README.md). Our log lines go straight
        # to Python logging.
        legacy = getattr(self.master, "_legacy_log_events", None)
        if legacy is not None:
            legacy.uninstall()
        self.master.addons.add(
            proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig(), self.addon
        )
        # mitmproxy's CA (TlsConfig needs one) lives and dies in workdir, never in ~/.mitmproxy.
        self.options.update(confdir=str(workdir))
        # Loads and validates the config (OptionsError when it is unusable).
        self.options.update(scoperouter_config=config_path, scoperouter_cloud=cloud)
        catalog = self.addon.catalog
        assert catalog is not None
        listeners = self.addon.listeners
        self.options.update(
            **BASE_OPTIONS,
            **tls_options(catalog.settings),
            certs=write_cert_bundles(listeners, workdir),
            mode=[item.spec for item in listeners],
        )

    def reload(self) -> None:
        try:
            swapped = self.addon.reload()
            if swapped and self.addon.catalog is not None:
                self.options.update(**tls_options(self.addon.catalog.settings))
        except Exception:  # a reload must never take the router down
            logger.exception("reload failed; the current config stays in use")

    async def run(self, watch: bool) -> int:
        loop = asyncio.get_running_loop()
        ps = self.master.addons.get("proxyserver")
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        with asyncio_utils.install_exception_handler(self.master._asyncio_exception_handler):
            for sig in signals[:2]:
                loop.add_signal_handler(sig, self.master.shutdown)
            loop.add_signal_handler(signal.SIGHUP, self.reload)
            try:
                return await self._serve(ps, watch)
            finally:
                for sig in signals:
                    loop.remove_signal_handler(sig)

    async def _serve(self, ps: proxyserver.Proxyserver, watch: bool) -> int:
        if not await ps.setup_servers():
            logger.error("could not start the listeners of %s; exiting", self.addon.cloud)
            await ps.servers.update([])  # the ones that did start
            return 1
        addresses = ", ".join(item.address for item in self.addon.listeners)
        logger.info(
            "router of %s listening on %s (%s)",
            self.addon.cloud,
            addresses,
            self.addon.catalog.describe() if self.addon.catalog else "-",
        )
        watcher = asyncio.create_task(self._watch()) if watch else None
        try:
            await self.master.running()
            await self.master.should_exit.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            try:
                await self._drain(ps)
            finally:
                await self.master.done()
        logger.info("router of %s stopped", self.addon.cloud)
        return 0

    async def _drain(self, ps: proxyserver.Proxyserver) -> None:
        """Stop listening, close idle client connections, give requests in flight a moment."""
        loop = asyncio.get_running_loop()
        await ps.servers.update([])
        deadline = loop.time() + DRAIN_GRACE
        while ps.connections:
            busy = self.addon.busy_clients()
            for client_id, handler in list(ps.connections.items()):
                if client_id not in busy or loop.time() > deadline:
                    io = handler.transports.get(handler.client)
                    if io is not None and io.writer is not None and not io.writer.is_closing():
                        io.writer.close()
            if loop.time() > deadline + 1.0:
                break
            await asyncio.sleep(0.02)

    async def _watch(self) -> None:
        """Reload when the config file's mtime (or size) changes; checked every second."""
        path = self.addon.config_path
        last = _stamp(path)
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = _stamp(path)
            if now != last:
                last = now
                self.reload()


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def serve(config_path: str, cloud: str, watch: bool = False) -> int:
    """Run the router of `cloud` until SIGINT/SIGTERM; the process exit code."""
    if logger.getEffectiveLevel() >= logging.INFO:
        # One line per request is ours; mitmproxy's connection chatter only with DEBUG.
        logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    upstream.install()
    with tempfile.TemporaryDirectory(prefix="scoperouter-") as workdir:

        async def main() -> int:
            try:
                router = Router(config_path, cloud, Path(workdir))
            except exceptions.OptionsError as exc:
                logger.error("cannot start the router of %s: %s", cloud, exc)
                return 2
            return await router.run(watch)

        try:
            return asyncio.run(main())
        except KeyboardInterrupt:
            return 0
