"""The listeners of one cloud's router (no I/O).

* one per frontend (``kind="frontend"``): the router's HTTP server answers there;
* the forward proxy (``kind="forward"``) when the cloud has ``proxy.listen``: mitmproxy's;
* the peer link (``clouds.<name>.peer``, ``kind="peer"``), where the other routers send their
  hops: the router's HTTP server, like the frontends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from scoperouter.catalog import Catalog, Frontend

Kind = Literal["frontend", "forward", "peer"]


@dataclass(frozen=True, slots=True)
class Listener:
    kind: Kind
    host: str
    port: int
    frontend: Frontend | None = None  # a frontend and the peer link (its address); not forward
    ca: tuple[str, str] | None = None  # the forward proxy's: proxy.ca and proxy.ca_key

    @property
    def address(self) -> str:
        return hostport(self.host, self.port)

    @property
    def peer(self) -> bool:
        return self.kind == "peer"


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listeners_for(catalog: Catalog, cloud: str) -> tuple[Listener, ...]:
    """The listeners of `cloud`'s router (KeyError if the catalog has no such cloud)."""
    spec = catalog.clouds[cloud]
    found = [
        Listener("frontend", frontend.listen_host, frontend.listen_port, frontend)
        for frontend in spec.frontends
    ]
    if spec.proxy_listen is not None:
        host, port = spec.proxy_listen
        ca = None
        if spec.proxy_ca is not None and spec.proxy_ca_key is not None:
            ca = (spec.proxy_ca, spec.proxy_ca_key)
        found.append(Listener("forward", host, port, ca=ca))
    if spec.peer is not None:
        link = spec.peer
        found.append(Listener("peer", link.listen_host, link.listen_port, link))
    return tuple(found)


def listener_signature(
    listeners: tuple[Listener, ...],
) -> tuple[tuple[str, str, str | None, str | None], ...]:
    """What a reload cannot change without a restart: addresses and certificate files (the
    forward proxy's CA among them)."""
    return tuple(
        (
            item.kind,
            item.address if item.frontend is None else f"{item.address} {item.frontend.url}",
            item.frontend.cert if item.frontend else item.ca and item.ca[0],
            item.frontend.key if item.frontend else item.ca and item.ca[1],
        )
        for item in listeners
    )
