"""The lab's own CA: TLS on the router-to-router links (each router's peer link).

``scoperouter lab up`` makes one CA per lab (``<dir>/pki/ca.crt``, its key beside it, mode 0600)
and, for each cloud's router, a certificate for its peer-link address signed by it
(``<dir>/pki/<cloud>-peer.crt`` / ``.key``). The federation config names the CA in
``settings.peers.ca`` and each certificate in ``clouds.<name>.peer.tls``, so every hop from one
router to another is TLS, verified, the peer's address checked against its certificate. Files
are made once and kept while they are valid for long enough (a lab re-run changes nothing);
no key is ever printed or logged.

A TLS lab (``lab up --tls``, :func:`tls_files`) has more, from the same CA: for each cloud a
certificate for its backend address (every service's https), one for its router's address
(the router's https frontends) and a CA of its own for its router's forward proxy to intercept
the services' https calls with (``proxy.ca``/``ca_key``; one per cloud, as production has it:
docs/router/tls-clouds.md), and the bundle its services trust (the lab's CA and that one).

The certificates are made by scoperouter's own PKI code (:mod:`scoperouter.pki`, also behind
``scoperouter pki`` and the Ansible roles) and the peer blocks by its catalog import
(:func:`scoperouter.catalog_import.add_peer_links`, behind ``import-catalog --peer-port``): the
lab only says where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scoperouter.catalog_import import PeerLinks, add_peer_links
from scoperouter.pki import issue, make_ca
from scoperouter_lab.layout import CloudSpec, LabPaths

__all__ = ["issue", "make_ca", "peer_links", "tls_files"]


def peer_links(config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """`config` (a federation config as a dict) with TLS on every router-to-router hop: the
    lab's CA in ``settings.peers.ca`` and, for every cloud, a peer link on its router's
    address at :data:`~scoperouter_lab.layout.PEER_PORT` with a certificate for that address
    (made here, or kept from a previous run)."""
    from scoperouter_lab.layout import PEER_PORT

    ca = make_ca(directory, "ca")
    links = PeerLinks(
        port=PEER_PORT,
        cert=str(directory / "{slug}-peer.crt"),
        key=str(directory / "{slug}-peer.key"),
        ca=str(ca[0]),
    )
    config = add_peer_links(config, links)
    for name, cloud in config["clouds"].items():
        host = urlsplit(cloud["peer"]["url"]).hostname
        assert host is not None
        issue(ca, directory, f"{name.lower()}-peer", [host])
    return config


def tls_files(paths: LabPaths, clouds: list[CloudSpec]) -> None:
    """The files of a TLS lab (made, or kept from a previous run while valid): the lab's CA,
    and for each cloud its backend and frontend certificates, its interception CA and its
    services' trust bundle (see the module's doc)."""
    directory = paths.pki
    ca = make_ca(directory, "ca")
    for cloud in clouds:
        issue(ca, directory, f"{cloud.slug}-backend", [cloud.back_ip])
        issue(ca, directory, f"{cloud.slug}-frontend", [cloud.front_ip])
        proxy_ca = make_ca(directory, f"{cloud.slug}-proxy-ca")
        bundle = ca[0].read_bytes() + proxy_ca[0].read_bytes()
        path = paths.trust_bundle(cloud)
        if not path.exists() or path.read_bytes() != bundle:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(bundle)
            tmp.chmod(0o644)
            tmp.replace(path)
