"""Certificates of the router-to-router links (peer links): a federation's CA and, for each
router, a certificate for its peer-link address signed by it; and the forward proxy's
certificates for the hosts whose TLS it intercepts, signed in memory by its cloud's CA
(:func:`load_signing_ca`, :func:`host_certificate`).

One implementation for everyone who makes them: ``scoperouter pki`` (an operator, the Secrets
of deploy/kubernetes), the Ansible role ``scoperouter_federation`` (its module runs this file on
the controller, where the CA stays), the lab (its pki module) and the tests. So this
module imports nothing but the standard library and ``cryptography`` (a dependency of the
router, and of ansible-core on the controller): Ansible ships it to the controller's Python as
it is.

Rules, the same everywhere:

* keys are P-256 (ECDSA), PKCS#8 PEM, unencrypted (the router reads them at start), written
  mode 0600 through a new file renamed over the old one; never printed, never logged;
* a CA is kept while it is valid for more than ``renew_days``; a certificate is kept while it
  is signed by the CA given, made for exactly the addresses given (IPs or DNS names, in its
  subjectAltName), its key file matches it, and it is valid for more than ``renew_days``; else
  it is made anew (so a changed address, a new CA or the last ``renew_days`` re-issue it);
* a certificate is a TLS server certificate (serverAuth) with ``CA:FALSE``; a CA may sign
  certificates only (path length 0).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650  # a federation's CA: ten years (rotating it touches every router)
VALID_DAYS = 365  # a router's certificate
RENEW_DAYS = 30  # closer than this to its end, a certificate (or CA) is made again


class PkiError(ValueError):
    """A file that is not what it should be (not a PEM certificate or key, a CA key that does
    not match its certificate); the message says which and why, never the key."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _spki(public_key: CertificatePublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def load_certificate(pem: bytes, what: str = "certificate") -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise PkiError(f"the {what} is not a PEM certificate") from None


def load_key(pem: bytes, what: str = "key") -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise PkiError(f"the {what} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"the {what} is not an elliptic-curve key")
    return key


def general_names(addresses: Iterable[str]) -> list[x509.GeneralName]:
    """subjectAltName entries: an IP address entry for each IP, a DNS entry for each name."""
    names: list[x509.GeneralName] = []
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(address))
    return names


def addresses_of(cert: x509.Certificate) -> set[str]:
    """The IPs and DNS names a certificate is for (its subjectAltName)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    found = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return found | set(san.get_values_for_type(x509.DNSName))


def new_ca(name: str, days: int = CA_DAYS) -> tuple[bytes, bytes]:
    """A new CA: (certificate PEM, key PEM), subject ``CN=scoperouter <name>``."""
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def new_certificate(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    name: str,
    addresses: Iterable[str],
    days: int = VALID_DAYS,
) -> tuple[bytes, bytes]:
    """A new key and a server certificate for `addresses` signed by the CA: (certificate PEM,
    key PEM)."""
    addresses = list(addresses)
    if not addresses:
        raise PkiError("a certificate needs at least one address (IP or DNS name)")
    ca_cert = load_certificate(ca_cert_pem, "CA certificate")
    ca_key = load_key(ca_key_pem, "CA key")
    try:
        is_ca = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise PkiError("the CA certificate is not a CA's (no basicConstraints CA:TRUE)")
    if _spki(ca_key.public_key()) != _spki(ca_cert.public_key()):
        raise PkiError("the CA key does not belong to the CA certificate")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(f"scoperouter {name}"), ca_cert.subject, key, days)
        .add_extension(x509.SubjectAlternativeName(general_names(addresses)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


# --- the forward proxy's certificates (TLS interception): made in memory, never written


SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True, slots=True)
class SigningCA:
    """A CA that signs certificates in memory (the forward proxy's): its certificate and key,
    read once from files the router's user alone may read."""

    cert: x509.Certificate
    key: SigningKey

    def __repr__(self) -> str:  # never the key, whoever prints it
        return f"SigningCA({self.cert.subject.rfc4514_string()})"


def private_file_problem(path: Path) -> str | None:
    """Why `path` may not hold a private key (others may read or write it), or None."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return (
            f"{path} is mode {mode:04o}: a private key must be readable by its owner only "
            f"(chmod 600 {path})"
        )
    return None


def load_signing_ca(cert_path: Path, key_path: Path) -> SigningCA:
    """The CA in these files, for signing; PkiError (saying which file and why, never the
    key) when the key file is readable by others than its owner, either file is not what it
    should be, or the key is not the certificate's."""
    try:
        problem = private_file_problem(key_path)
        if problem is not None:
            raise PkiError(problem)
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {exc.filename}: {exc.strerror}") from None
    cert = load_certificate(cert_pem, f"CA certificate {cert_path}")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise PkiError(f"the CA key {key_path} is not an unencrypted PEM private key") from None
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if not isinstance(key, SigningKey):
        raise PkiError(f"the CA key {key_path} is neither an elliptic-curve nor an RSA key")
    if constraints is None or not constraints.ca:
        raise PkiError(f"{cert_path} is not a CA's certificate (no basicConstraints CA:TRUE)")
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise PkiError(f"the key {key_path} does not belong to the CA certificate {cert_path}")
    return SigningCA(cert, key)


def host_certificate(
    ca: SigningCA, key: ec.EllipticCurvePrivateKey, host: str, days: int
) -> x509.Certificate:
    """A server certificate for `host` (an IP or a DNS name) and `key`, signed by `ca`: what
    the forward proxy answers a ``CONNECT`` to `host` with. In memory only."""
    return (
        _builder(_name(host), ca.cert.subject, key, days)
        .add_extension(x509.SubjectAlternativeName(general_names([host])), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )


def new_key() -> ec.EllipticCurvePrivateKey:
    """A P-256 key (in memory)."""
    return ec.generate_private_key(ec.SECP256R1())


def _expiring(cert: x509.Certificate, renew_days: int) -> str | None:
    end = cert.not_valid_after_utc
    if end - _now() <= datetime.timedelta(days=renew_days):
        return f"it expires on {end:%Y-%m-%d} (renewed {renew_days} days before)"
    return None


def ca_problem(cert_path: Path, key_path: Path, renew_days: int = RENEW_DAYS) -> str | None:
    """Why the CA in these files must be made (again), or None: keep it."""
    try:
        cert = load_certificate(cert_path.read_bytes(), "CA certificate")
    except FileNotFoundError:
        return "there is none"
    except (OSError, PkiError) as exc:
        return str(exc)
    if not key_path.exists():
        return "its key is missing"
    return _expiring(cert, renew_days)


def certificate_problem(
    cert_path: Path,
    key_path: Path,
    ca_cert_pem: bytes,
    addresses: Iterable[str],
    renew_days: int = RENEW_DAYS,
) -> str | None:
    """Why the certificate in these files must be made (again) for `addresses` with the CA
    `ca_cert_pem`, or None: keep it."""
    try:
        cert = load_certificate(cert_path.read_bytes())
    except FileNotFoundError:
        return "there is none"
    except (OSError, PkiError) as exc:
        return str(exc)
    ca = load_certificate(ca_cert_pem, "CA certificate")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "it is not signed by the CA"
    wanted = {a.strip("[]") for a in addresses}
    have = addresses_of(cert)
    if have != wanted:
        return f"it is for {', '.join(sorted(have)) or 'nothing'}, not {', '.join(sorted(wanted))}"
    try:
        key = load_key(key_path.read_bytes())
    except FileNotFoundError:
        return "its key is missing"
    except (OSError, PkiError) as exc:
        return str(exc)
    if _spki(key.public_key()) != _spki(cert.public_key()):
        return "its key does not match it"
    return _expiring(cert, renew_days)


def _write(path: Path, data: bytes, mode: int) -> None:
    """`data` to `path` with `mode` from its first byte, replacing the file at once."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def _store(cert_path: Path, cert: bytes, key_path: Path, key: bytes) -> None:
    """A key (mode 0600) and its certificate (public: 0644), the key first."""
    _write(key_path, key, 0o600)
    _write(cert_path, cert, 0o644)


def ensure_ca(
    cert_path: Path,
    key_path: Path,
    *,
    name: str = "federation CA",
    days: int = CA_DAYS,
    renew_days: int = RENEW_DAYS,
    dry_run: bool = False,
) -> str | None:
    """The CA in these files, made when :func:`ca_problem` says so (not with `dry_run`).
    Returns why it was made (or would be), None when it was kept."""
    problem = ca_problem(cert_path, key_path, renew_days)
    if problem is None or dry_run:
        return problem
    cert, key = new_ca(name, days)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    _store(cert_path, cert, key_path, key)
    return problem


def ensure_certificate(
    cert_path: Path,
    key_path: Path,
    *,
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    addresses: Iterable[str],
    name: str = "peer link",
    days: int = VALID_DAYS,
    renew_days: int = RENEW_DAYS,
    force: bool = False,
    dry_run: bool = False,
) -> str | None:
    """A certificate for `addresses` signed by the CA in these files, made (with a new key)
    when :func:`certificate_problem` says so, or `force` (not with `dry_run`). Returns why it
    was made (or would be), None when it was kept."""
    addresses = list(addresses)
    problem = certificate_problem(cert_path, key_path, ca_cert_pem, addresses, renew_days)
    if problem is None and force:
        problem = "asked to (--force)"
    if problem is None or dry_run:
        return problem
    cert, key = new_certificate(ca_cert_pem, ca_key_pem, name, addresses, days)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    key_path.parent.mkdir(parents=True, exist_ok=True)
    _store(cert_path, cert, key_path, key)
    return problem


def describe(pem: bytes) -> str:
    """One line about a certificate (no secret in it): subject, addresses, issuer, end."""
    cert = load_certificate(pem)
    subject = cert.subject.rfc4514_string()
    issuer = cert.issuer.rfc4514_string()
    addresses = ", ".join(sorted(addresses_of(cert)))
    text = f"{subject}"
    if addresses:
        text += f" for {addresses}"
    if issuer != subject:
        text += f", issued by {issuer}"
    return text + f", valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"


# The file layout of the lab and the tests: <directory>/<name>.crt and <name>.key.


def make_ca(directory: Path, name: str, days: int = CA_DAYS) -> tuple[Path, Path]:
    """A CA (``<name>.crt``, ``<name>.key``) in `directory`, kept when already valid."""
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    ensure_ca(cert_path, key_path, name=name, days=days)
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
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    ensure_certificate(
        cert_path,
        key_path,
        ca_cert_pem=ca[0].read_bytes(),
        ca_key_pem=ca[1].read_bytes(),
        addresses=addresses,
        name=name,
        days=days,
    )
    return cert_path, key_path
