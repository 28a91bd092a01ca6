"""The forward proxy of one worker: an embedded mitmproxy with the minimal addon set.

mitmdump loads ~35 addons; dispatching every hook to all of them cost about half of the CPU of
a proxied request. A plain HTTP forward proxy needs only:

* ``Proxyserver`` - the listener, connection handling, the connection options;
* ``NextLayer``  - picks the protocol layers (HTTP) for each connection;
* ``TlsConfig``  - verification of HTTPS upstreams; when the cloud has ``proxy.ca``, the
  certificates of intercepted ``CONNECT`` tunnels (:mod:`~.intercept`);

plus the router's :class:`~scoperouter.proxy.forward.addon.ForwardAddon`. Nothing is printed
per flow by mitmproxy and no flow is stored. The worker (:mod:`scoperouter.proxy.worker`)
starts it, reloads it, drains and stops it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from pathlib import Path

from mitmproxy import master, options
from mitmproxy.addons import next_layer, proxyserver, tlsconfig

from scoperouter.catalog import Catalog, Settings
from scoperouter.proxy.forward import guard, mitm
from scoperouter.proxy.forward.addon import ForwardAddon
from scoperouter.proxy.forward.intercept import Certificates, Interception, signing_ca
from scoperouter.router.listeners import Listener
from scoperouter.router.pipeline import Pipeline

logger = logging.getLogger("scoperouter")

BASE_OPTIONS = {
    "connection_strategy": "lazy",  # connect upstream only once the router has chosen where
    "stream_large_bodies": "1m",  # bodies above 1 MiB stream through, both directions
    "keep_host_header": True,  # services see the Host the client used (links to the router)
    "validate_inbound_headers": True,  # request smuggling protection: keep it on
    "http2": False,  # HTTP/1.1 only: every error response goes through mitm.render_error
    "http3": False,
    "upstream_cert": False,  # an intercepted host's certificate is made without asking it
    "rawtcp": False,  # a tunnel carries TLS only (ForwardAddon.next_layer), never raw TCP
    "websocket": False,  # no protocol switch: an Upgrade is refused (400) before any hook
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


class ForwardProxy:
    """mitmproxy's master on the forward proxy's listener, with the router's adapter."""

    def __init__(
        self,
        pipeline: Pipeline,
        listener: Listener,
        workdir: Path,
        sockets: Mapping[tuple[str, int], socket.socket],
    ) -> None:
        mitm.install()
        mitm.use_listen_sockets(sockets)
        self.pipeline = pipeline
        self.workdir = workdir
        self.addon = ForwardAddon(pipeline)
        self.options = options.Options()
        self.master = master.Master(self.options, with_termlog=False)
        mitm.quiet_master(self.master)
        mitm.fast_hooks(self.master)
        self.proxyserver = proxyserver.Proxyserver()
        self.interception: Interception | None = None
        config = pipeline.config
        catalog = config.current()
        ca = signing_ca(catalog, config.cloud, config.source or config.path)
        tls: tlsconfig.TlsConfig = tlsconfig.TlsConfig()
        if ca is not None:  # CONNECT to catalog destinations: TLS intercepted
            certificates = Certificates(ca)
            self.interception = Interception(certificates, catalog, config.cloud)
            config.subscribe(self.interception.configure)
            tls = mitm.InterceptingTlsConfig(self.interception.certificate, certificates.key)
        # The adapter before NextLayer: its next_layer hook decides a tunnel's first layer.
        self.master.addons.add(self.proxyserver, self.addon, next_layer.NextLayer(), tls)
        # mitmproxy's CA (TlsConfig needs one) lives and dies in workdir, never in ~/.mitmproxy.
        self.options.update(confdir=str(workdir))
        settings = pipeline.config.current().settings
        self.options.update(
            **BASE_OPTIONS,
            **tls_options(settings, workdir),
            mode=[f"regular@{listener.address}"],
        )
        pipeline.config.subscribe(self._configure)

    def _configure(self, catalog: Catalog) -> None:
        guard.set_head_limits(catalog.settings.limits)

    def reload(self) -> None:
        """The config was swapped: the upstream trust follows."""
        self.options.update(**tls_options(self.pipeline.config.current().settings, self.workdir))

    async def start(self) -> bool:
        """Listen and start; False when the listener could not start."""
        if not await self.proxyserver.setup_servers():
            await self.proxyserver.servers.update([])  # the ones that did start
            return False
        await self.master.running()
        return True

    async def stop_listening(self) -> None:
        await self.proxyserver.servers.update([])

    def connections(self) -> int:
        return len(self.proxyserver.connections)

    def drain_step(self, late: bool) -> None:
        """Close idle client connections (all of them once `late`)."""
        busy = self.addon.busy()
        for client_id in mitm.client_ids():
            if late or client_id not in busy:
                mitm.close_client(client_id)

    def sweep(self, now: float) -> None:
        self.addon.sweep(now)

    async def done(self) -> None:
        await self.master.done()
