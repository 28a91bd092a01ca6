"""The listeners of one cloud's router, as mitmproxy mode specs (no mitmproxy import).

* one reverse-proxy listener per frontend: ``reverse:http://<frontend host:port>@<listen>``.
  The reverse target is the frontend's own address, so in the hooks ``flow.request`` already
  names the URL the client addressed; the router always rewrites it before mitmproxy connects
  anywhere (and mitmproxy refuses to connect to its own listeners). TLS on the client side is
  detected by mitmproxy (a ClientHello) and served with the frontend's certificate; the addon
  refuses plain HTTP on an https frontend and the other way round.
* one ``regular`` (forward proxy) listener when the cloud has ``proxy.listen``;
* the peer link (``clouds.<name>.peer``), where the other routers send their hops: always
  served by the lean server (:mod:`scoperouter.proxy.lean`), whatever ``settings.data_path``
  says; its spec (``peer@<listen>``) is never given to mitmproxy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from scoperouter.catalog import Catalog, Frontend

logger = logging.getLogger("scoperouter")


@dataclass(frozen=True, slots=True)
class Listener:
    spec: str  # mitmproxy mode spec; also how the addon recognises the listener of a flow
    host: str
    port: int
    frontend: Frontend | None = None  # reverse mode and the peer link; None: the forward proxy
    peer: bool = False  # the peer link (the other routers' hops; `frontend` is its address)

    @property
    def address(self) -> str:
        return _hostport(self.host, self.port)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listeners_for(catalog: Catalog, cloud: str) -> tuple[Listener, ...]:
    """The listeners of `cloud`'s router (KeyError if the catalog has no such cloud)."""
    spec = catalog.clouds[cloud]
    found: list[Listener] = []
    for frontend in spec.frontends:
        target = _hostport(frontend.url.host, frontend.url.port)
        listen = _hostport(frontend.listen_host, frontend.listen_port)
        found.append(
            Listener(
                f"reverse:http://{target}@{listen}",
                frontend.listen_host,
                frontend.listen_port,
                frontend,
            )
        )
    if spec.proxy_listen is not None:
        host, port = spec.proxy_listen
        found.append(Listener(f"regular@{_hostport(host, port)}", host, port))
    if spec.peer is not None:
        link = spec.peer
        listen = _hostport(link.listen_host, link.listen_port)
        spec_text = f"peer:{link.url.base}@{listen}"
        found.append(Listener(spec_text, link.listen_host, link.listen_port, link, peer=True))
    return tuple(found)


def listener_signature(
    listeners: tuple[Listener, ...],
) -> tuple[tuple[str, str | None, str | None], ...]:
    """What a reload cannot change without a restart: addresses and certificate files."""
    return tuple(
        (
            item.spec,
            item.frontend.cert if item.frontend else None,
            item.frontend.key if item.frontend else None,
        )
        for item in listeners
    )


def write_cert_bundles(listeners: tuple[Listener, ...], directory: Path) -> list[str]:
    """mitmproxy ``certs`` option entries for the TLS frontends.

    mitmproxy wants one PEM file holding certificate and key; the config names them apart, so
    they are concatenated into `directory` (a private temporary directory). The entry is keyed
    by the frontend's host name, which mitmproxy matches against the SNI or, without SNI, the
    reverse-proxy target (the frontend address).
    """
    entries: list[str] = []
    chosen: dict[str, tuple[str, str]] = {}
    for index, item in enumerate(listeners):
        frontend = item.frontend
        if frontend is None or frontend.cert is None or frontend.key is None or item.peer:
            continue
        previous = chosen.setdefault(frontend.url.host, (frontend.cert, frontend.key))
        if previous != (frontend.cert, frontend.key):
            logger.warning(
                "frontends of %s use different certificates; mitmproxy picks one per host name",
                frontend.url.host,
            )
        bundle = directory / f"frontend-{index}.pem"
        bundle.write_bytes(
            Path(frontend.cert).read_bytes() + b"\n" + Path(frontend.key).read_bytes()
        )
        bundle.chmod(0o600)
        entries.append(f"{frontend.url.host}={bundle}")
    return entries
