"""The upstreams of one cloud's router, as the config gives them (no I/O).

An upstream is where the router sends requests, named by its base URL
(``scheme://host:port``, as :func:`~scoperouter.router.targets.base_url` names a decision's):
each backend of this cloud, and each other cloud's router: its peer link when it has one (one
upstream for all its services), else each of its frontends. The metrics label their series
with these names, created at every config load; the status page lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from scoperouter.catalog import Catalog

Kind = Literal["peer", "backend"]


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    upstream: str  # scheme://host:port
    cloud: str
    kind: Kind
    services: tuple[str, ...]  # the service types it serves this router (sorted)


def config_upstreams(catalog: Catalog, cloud: str) -> list[UpstreamSpec]:
    """Every upstream of `cloud`'s router in `catalog`, by cloud then address."""
    found: dict[str, tuple[str, Kind, set[str]]] = {}
    for other in catalog.clouds.values():
        for ep in other.endpoints:
            kind: Kind
            if other.name == cloud:
                address, kind = ep.backend.base, "backend"
            elif other.peer is not None:
                address, kind = other.peer.url.base, "peer"
            else:
                address, kind = ep.url.base, "peer"
            entry = found.get(address)
            if entry is None:
                entry = found[address] = (other.name, kind, set())
            entry[2].add(ep.service_type)
    specs = [
        UpstreamSpec(address, name, kind, tuple(sorted(services)))
        for address, (name, kind, services) in found.items()
    ]
    specs.sort(key=lambda s: (s.cloud != cloud, s.cloud, s.upstream))
    return specs
