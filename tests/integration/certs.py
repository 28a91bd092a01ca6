"""Throw-away certificates for TLS frontends on loopback addresses (tests only)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def issue(directory: Path, *ips: str, name: str = "frontend") -> tuple[Path, Path, Path]:
    """A private CA and a leaf certificate for `ips` signed by it.

    Writes ``<name>-ca.crt``, ``<name>.crt`` and ``<name>.key``; returns (cert, key, ca): the
    cert and key go to a frontend's ``tls``, the CA to ``ca_bundle`` or a client's trust store.
    """
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"scoperouter test CA {name}")
    ca = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        _builder(_name(f"scoperouter test {name}"), ca_name, key)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / f"{name}-ca.crt",
        directory / f"{name}.crt",
        directory / f"{name}.key",
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path, ca_path


def federation_ca(directory: Path, routers: dict[str, str]) -> tuple[Path, dict[str, Path]]:
    """One CA and, for each router name -> address, a certificate signed by it (the lab's
    own CA code, :mod:`scoperouter_lab.pki`): ``ca.crt``, ``<name>.crt`` and ``<name>.key``;
    returns (ca, {name: cert}), each key beside its cert."""
    from scoperouter_lab import pki

    ca = pki.make_ca(directory, "ca")
    return ca[0], {name: pki.issue(ca, directory, name, [ip])[0] for name, ip in routers.items()}
