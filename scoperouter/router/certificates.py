"""The certificates a cloud's router holds or checks against, and when each one expires.

Read from the files the config names (certificates only: a key file is never opened), at
every config load: the peer link's certificate (``peer_cert``), each https frontend's
(``frontend_cert``), the federation's CA the peer links are verified with (``peer_ca``), the
forward proxy's interception CA (``interception_ca``) and the CA bundle upstreams are verified
with (``backend_ca``). A file holding several certificates (a chain, a bundle) gives each of
them, up to :data:`PER_FILE`. A certificate is named by its subject's common name (else the
whole subject), at most :data:`SUBJECT_MAX` characters; the path of its file is not shown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from scoperouter.catalog import Catalog

logger = logging.getLogger("scoperouter")

PER_FILE = 64  # certificates read from one file (a CA bundle); the soonest to expire first
SUBJECT_MAX = 64
ROLES = ("peer_cert", "frontend_cert", "peer_ca", "interception_ca", "backend_ca")


@dataclass(frozen=True, slots=True)
class Certificate:
    role: str  # one of ROLES
    subject: str  # the common name (else the subject), at most SUBJECT_MAX characters
    not_after: float  # unix time


def held_certificates(catalog: Catalog, cloud: str) -> list[Certificate]:
    """Every certificate of `cloud`'s router in `catalog` (a file that cannot be read is left
    out, with a warning: the router refuses to start on its own files already)."""
    spec = catalog.clouds[cloud]
    settings = catalog.settings
    files: list[tuple[str, str]] = []
    if spec.peer is not None and spec.peer.cert is not None:
        files.append(("peer_cert", spec.peer.cert))
    files += [("frontend_cert", f.cert) for f in spec.frontends if f.cert is not None]
    if settings.peers.ca is not None:
        files.append(("peer_ca", settings.peers.ca))
    if spec.proxy_ca is not None:
        files.append(("interception_ca", spec.proxy_ca))
    if settings.ca_bundle is not None:
        files.append(("backend_ca", settings.ca_bundle))
    found: dict[tuple[str, str], Certificate] = {}
    for role, path in dict.fromkeys(files):
        for cert in _read(path, role):
            key = (cert.role, cert.subject)
            if key not in found or cert.not_after < found[key].not_after:
                found[key] = cert
    return sorted(found.values(), key=lambda c: (c.not_after, c.role, c.subject))


def _read(path: str, role: str) -> list[Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        # never the file's content; the path is the config's own
        logger.warning("cannot read the %s certificate(s) for their expiry: %s", role, exc)
        return []
    made = [Certificate(role, subject(c), c.not_valid_after_utc.timestamp()) for c in certs]
    made.sort(key=lambda c: c.not_after)
    return made[:PER_FILE]


def subject(cert: x509.Certificate) -> str:
    """The certificate's common name, else its whole subject, at most SUBJECT_MAX characters
    (control characters dropped)."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    text = str(names[0].value) if names else cert.subject.rfc4514_string()
    text = "".join(ch for ch in text if ch.isprintable())
    return text[:SUBJECT_MAX] or "-"
