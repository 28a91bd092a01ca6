"""Throw-away certificates for TLS frontends and peer links on loopback addresses (tests and
``bench.wan``), made by scoperouter's own CA code (:mod:`scoperouter.pki`: no lab needed)."""

from __future__ import annotations

from pathlib import Path

from scoperouter import pki


def issue(directory: Path, *ips: str, name: str = "frontend") -> tuple[Path, Path, Path]:
    """A private CA and a leaf certificate for `ips` signed by it.

    Writes ``<name>-ca.crt``, ``<name>.crt`` and ``<name>.key``; returns (cert, key, ca): the
    cert and key go to a frontend's ``tls``, the CA to ``ca_bundle`` or a client's trust store.
    """
    ca = pki.make_ca(directory, f"{name}-ca")
    cert, key = pki.issue(ca, directory, name, ips)
    return cert, key, ca[0]


def federation_ca(directory: Path, routers: dict[str, str]) -> tuple[Path, dict[str, Path]]:
    """One CA and, for each router name -> address, a certificate signed by it:
    ``ca.crt``, ``<name>.crt`` and ``<name>.key``; returns (ca, {name: cert}), each key beside
    its cert."""
    ca = pki.make_ca(directory, "ca")
    return ca[0], {name: pki.issue(ca, directory, name, [ip])[0] for name, ip in routers.items()}
