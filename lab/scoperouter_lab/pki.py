"""The lab's own CA: TLS on the router-to-router links (each router's peer link).

``scoperouter lab up`` makes one CA per lab (``<dir>/pki/ca.crt``, its key beside it, mode 0600)
and, for each cloud's router, a certificate for its peer-link address signed by it
(``<dir>/pki/<cloud>-peer.crt`` / ``.key``). The federation config names the CA in
``settings.peers.ca`` and each certificate in ``clouds.<name>.peer.tls``, so every hop from one
router to another is TLS, verified, the peer's address checked against its certificate. Files
are made once and kept while they are valid for long enough (a lab re-run changes nothing);
no key is ever printed or logged.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
RENEW_DAYS = 30  # a certificate closer than this to its end is made again


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def _valid(path: Path, days: int = RENEW_DAYS) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left > datetime.timedelta(days=days)


def make_ca(directory: Path, name: str, days: int = VALID_DAYS) -> tuple[Path, Path]:
    """A CA (``<name>.crt``, ``<name>.key``) in `directory`, kept when already valid."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    if _valid(cert_path) and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(f"scoperouter {name}")
    cert = (
        _builder(subject, subject, key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def issue(
    ca: tuple[Path, Path],
    directory: Path,
    name: str,
    addresses: Iterable[str],
    days: int = VALID_DAYS,
) -> tuple[Path, Path]:
    """A server certificate for `addresses` (IPs or DNS names) signed by the CA `ca` (its
    cert and key files): ``<name>.crt`` and ``<name>.key`` in `directory`, kept when already
    valid for the same addresses and CA."""
    addresses = list(addresses)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    ca_cert = x509.load_pem_x509_certificate(ca[0].read_bytes())
    if _valid(cert_path) and key_path.exists() and _same(cert_path, ca_cert, addresses):
        return cert_path, key_path
    ca_key = serialization.load_pem_private_key(ca[1].read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    names: list[x509.GeneralName] = []
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(f"scoperouter {name}"), ca_cert.subject, key, days)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _same(path: Path, ca: x509.Certificate, addresses: list[str]) -> bool:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    if cert.issuer != ca.subject:
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    found = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    found |= set(san.get_values_for_type(x509.DNSName))
    return found == set(addresses)


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
