"""The lab's own CA: TLS on the router-to-router links (each router's peer link).

``scoperouter lab up`` makes one CA per lab (``<dir>/pki/ca.crt``, its key beside it, mode 0600)
and, for each cloud's router, a certificate for its peer-link address signed by it
(``<dir>/pki/<cloud>-peer.crt`` / ``.key``). The federation config names the CA in
``settings.peers.ca`` and each certificate in ``clouds.<name>.peer.tls``, so every hop from one
router to another is TLS, verified, the peer's address checked against its certificate. Files
are made once and kept while they are valid for long enough (a lab re-run changes nothing);
no key is ever printed or logged.

The certificates are made by scoperouter's own PKI code (:mod:`scoperouter.pki`, also behind
``scoperouter pki`` and the Ansible roles): the lab only says where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scoperouter.pki import issue, make_ca

__all__ = ["issue", "make_ca", "peer_links"]


def peer_links(config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """`config` (a federation config as a dict) with TLS on every router-to-router hop: the
    lab's CA in ``settings.peers.ca`` and, for every cloud, a peer link on its router's
    address at :data:`~scoperouter_lab.layout.PEER_PORT` with a certificate for that address
    (made here, or kept from a previous run)."""
    from urllib.parse import urlsplit

    from scoperouter_lab.layout import PEER_PORT

    ca = make_ca(directory, "ca")
    for name, cloud in config["clouds"].items():
        host = urlsplit(cloud["frontends"][0]["url"]).hostname
        assert host is not None
        cert, key = issue(ca, directory, f"{name.lower()}-peer", [host])
        cloud["peer"] = {
            "url": f"https://{host}:{PEER_PORT}",
            "tls": {"cert": str(cert), "key": str(key)},
        }
    config.setdefault("settings", {})["peers"] = {"ca": str(ca[0])}
    return config
