"""TLS interception on the forward proxy: the certificates it answers a ``CONNECT`` with.

A service of the cloud sends its ``https://`` calls through the forward proxy
(``HTTPS_PROXY``): ``CONNECT host:port``, then TLS. When the cloud has ``proxy.ca`` and
``host:port`` is a destination of the catalog (:func:`scoperouter.routing.tunnel`), the proxy
answers the handshake with a certificate for `host` signed by that CA (which the cloud's
services trust), reads the requests inside and routes each one like a plain request; its own
connection upstream is TLS again, verified with ``settings.ca_bundle``.

* **One key, many certificates**: the worker makes one P-256 key at start (in memory, never
  written) and signs a certificate for each host with it, on first use; the CA's key is read
  once from its file (mode 0600, else the router does not start:
  :func:`scoperouter.pki.load_signing_ca`) and only ever signs.
* **Bounded**: the certificates are kept in an LRU of :data:`CACHE_SIZE` hosts (a cloud's
  services call a handful); one past its renewal time is made again. A host is known by the
  catalog's spelling of it (:func:`catalog_host`: any case, a trailing dot, IPv6 brackets, an
  IDNA A-label for the catalog's U-label or the reverse), so every spelling of one catalog host
  shares its one certificate.
* **Only catalog hosts**: a certificate is made only for a host the catalog publishes, checked
  again at the handshake (the ``CONNECT`` was checked first): the router never signs a
  certificate for anything else (a TLS handshake sent to the proxy itself gets mitmproxy's
  own, from a CA nobody trusts, as without interception).

mitmproxy's side (its ``TlsConfig`` asking for the certificate) is item 7 of
:mod:`~scoperouter.proxy.forward.mitm`; this module imports no mitmproxy.
"""

from __future__ import annotations

import datetime
import logging
from collections import OrderedDict
from pathlib import Path

from cryptography import x509

from scoperouter import pki
from scoperouter.catalog import Catalog
from scoperouter.errors import ConfigError
from scoperouter.routing import tunnel

logger = logging.getLogger("scoperouter")
MADE_MESSAGE = "the forward proxy made an interception certificate for %s (%d by this worker)"

CACHE_SIZE = 256
"""Hosts whose certificate a worker keeps (least recently used first out)."""
VALID_DAYS = 7
"""How long a certificate made for a host is valid."""
RENEW = datetime.timedelta(days=1)
"""A kept certificate this close to its end is made again."""


def signing_ca(catalog: Catalog, cloud: str, source: str) -> pki.SigningCA | None:
    """The CA the forward proxy of `cloud` signs with (None: it intercepts nothing), read and
    checked; ConfigError naming the key and saying why (a key file others may read, a key
    that is not the certificate's...), never showing the key."""
    spec = catalog.clouds[cloud]
    if spec.proxy_ca is None or spec.proxy_ca_key is None:
        return None
    try:
        return pki.load_signing_ca(Path(spec.proxy_ca), Path(spec.proxy_ca_key))
    except pki.PkiError as exc:
        raise ConfigError(f"{source}: clouds.{cloud}.proxy.ca_key", str(exc)) from None


def normal_host(host: str) -> str:
    """`host` as the catalog writes hosts: lower case, without IPv6 brackets or one trailing
    dot (``KeyStone.Example.`` -> ``keystone.example``, ``[::1]`` -> ``::1``)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith(".") and len(host) > 1:
        host = host[:-1]
    return host.lower()


def idna_forms(host: str) -> list[str]:
    """The other IDNA spelling of `host`: its U-label for an A-label (``xn--...``) and its
    A-label for a U-label; nothing for a plain ASCII name or one IDNA refuses."""
    try:
        if host.isascii():
            if "xn--" not in host:
                return []
            other = host.encode("ascii").decode("idna")
        else:
            other = host.encode("idna").decode("ascii")
    except (UnicodeError, ValueError):
        return []
    return [other.lower()] if other.lower() != host else []


def catalog_host(host: str, port: int, catalog: Catalog) -> str:
    """The catalog's own spelling of `host` at `port` when the catalog publishes it in any
    spelling (:func:`normal_host`, then the other IDNA form), else :func:`normal_host`'s."""
    normal = normal_host(host)
    for candidate in (normal, *idna_forms(normal)):
        if catalog.published(candidate, port):
            return candidate
    return normal


def _ascii_name(host: str) -> str:
    """What a certificate names: the A-label of an internationalised name (subjectAltName
    holds ASCII), any other host as it is."""
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


class Certificates:
    """The certificates of the hosts a worker intercepts: made on first use, an LRU of
    `size`."""

    def __init__(self, ca: pki.SigningCA, size: int = CACHE_SIZE, days: int = VALID_DAYS) -> None:
        self.ca = ca
        self.key = pki.new_key()
        self.size = size
        self.days = days
        self.made = 0  # certificates signed so far
        self._kept: OrderedDict[str, x509.Certificate] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, host: str) -> x509.Certificate:
        """The certificate for `host` (kept, or made now), one for all its spellings: pass the
        catalog's (:func:`catalog_host`); any other is normalised first."""
        host = normal_host(host)
        kept = self._kept.get(host)
        now = datetime.datetime.now(datetime.UTC)
        if kept is not None and kept.not_valid_after_utc - now > RENEW:
            self._kept.move_to_end(host)
            return kept
        cert = pki.host_certificate(self.ca, self.key, _ascii_name(host), self.days)
        self.made += 1
        logger.info(MADE_MESSAGE, host[:200], self.made)
        self._kept[host] = cert
        self._kept.move_to_end(host)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return cert


class Interception:
    """What the forward proxy of one worker intercepts, and with which certificates."""

    def __init__(self, certificates: Certificates, catalog: Catalog, cloud: str) -> None:
        self.certificates = certificates
        self.catalog = catalog
        self.cloud = cloud

    def configure(self, catalog: Catalog) -> None:
        """A config subscriber: the catalog the destinations are checked against."""
        self.catalog = catalog

    def certificate(self, host: str | None, port: int | None) -> x509.Certificate | None:
        """The certificate to answer a client's handshake with, in a tunnel to host:port;
        None when that is not a catalog destination (mitmproxy then answers with a
        certificate nobody trusts). Every spelling of a catalog host gets that host's one
        certificate (:func:`catalog_host`)."""
        if host is not None and port is not None:
            host = catalog_host(host, port, self.catalog)
        if host is None or port is None or tunnel(host, port, self.catalog, self.cloud):
            where = f"{host}:{port}"[:200]
            logger.info("a TLS handshake not in a tunnel to a catalog destination (%s)", where)
            return None
        return self.certificates.get(host)
