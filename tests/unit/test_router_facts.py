"""The router's facts (scoperouter.router.facts, .certificates): the config digest, the
certificates' expiry, the supervisor's own /metrics series. Real routers:
tests/integration/test_status.py."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Any

from cryptography import x509
from prometheus_client import CollectorRegistry, generate_latest

from scoperouter.config import load_catalog
from scoperouter.router.certificates import SUBJECT_MAX, held_certificates
from scoperouter.router.facts import FactsCollector, RouterFacts, Workers, config_digest

from .conftest import SAMPLE

HOSTILE = '<script>alert("x")</script>'


def _facts() -> RouterFacts:
    facts = RouterFacts("CloudOne", "asyncio")
    facts.loaded(load_catalog(SAMPLE), SAMPLE.read_text(), now=1000.0)
    return facts


def test_the_digest_is_the_documents_not_its_layout(tmp_path: Path) -> None:
    text = SAMPLE.read_text()
    same = "# a comment\n" + text.replace("hop_limit: 8 ", "hop_limit:   8 ")
    assert config_digest(text) == config_digest(same)
    assert config_digest("{b: 1, a: 2}") == config_digest("a: 2\nb: 1\n")
    assert config_digest(text) != config_digest(text.replace("hop_limit: 8", "hop_limit: 9"))
    assert re.fullmatch(r"[0-9a-f]{12}", config_digest(text))


def _write_cert(path: Path, days: int, **names: str) -> None:
    """A self-signed certificate whose subject has `names` (OID name -> value)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(getattr(NameOID, oid), value) for oid, value in names.items()]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(Encoding.PEM))


def test_certificates_and_facts_reach_metrics(tmp_path: Path) -> None:
    catalog = load_catalog(SAMPLE)
    soon, later = tmp_path / "ca.pem", tmp_path / "proxy-ca.pem"
    _write_cert(soon, 3, COMMON_NAME=f"{HOSTILE}\nfederation")
    _write_cert(later, 400, ORGANIZATION_NAME="o" * 60, ORGANIZATIONAL_UNIT_NAME="u" * 60)
    settings = catalog.settings
    peers = _replace(settings.peers, ca=str(soon))
    catalog = _replace(catalog, settings=_replace(settings, peers=peers))
    one = _replace(catalog.clouds["CloudOne"], proxy_ca=str(later))
    catalog = _replace(catalog, clouds={**catalog.clouds, "CloudOne": one})
    certs = held_certificates(catalog, "CloudOne")
    assert [c.role for c in certs] == ["peer_ca", "interception_ca"]  # the soonest first
    assert certs[0].subject == f"{HOSTILE}federation"  # the newline dropped
    # no common name: the subject, shortened
    assert len(certs[1].subject) == SUBJECT_MAX and certs[1].subject.startswith("OU=uuu")
    now = datetime.datetime.now(datetime.UTC).timestamp()
    assert 2 * 86400 < certs[0].not_after - now <= 3 * 86400
    facts = _facts()
    facts.certificates = certs
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FactsCollector(facts, lambda: Workers(1, 2, 3)))
    text = generate_latest(registry).decode()
    assert 'scoperouter_workers{state="running"} 1.0' in text
    assert 'scoperouter_workers{state="wanted"} 2.0' in text
    assert "scoperouter_worker_restarts_total 3.0" in text
    assert "scoperouter_config_generation 1.0" in text
    assert f'scoperouter_config_info{{digest="{facts.digest}"}} 1.0' in text
    assert 'scoperouter_build_info{build="pure",event_loop="asyncio",version="' in text
    assert 'role="peer_ca",subject="<script>alert(\\"x\\")</script>federation"' in text
    assert "scoperouter_certificate_expiry_timestamp_seconds{" in text


def _replace(obj: Any, **changes: Any) -> Any:
    return dataclasses.replace(obj, **changes)


def test_a_certificate_file_that_cannot_be_read_is_left_out(tmp_path: Path) -> None:
    catalog = load_catalog(SAMPLE)
    settings = catalog.settings
    missing = str(tmp_path / "none.pem")
    catalog = _replace(catalog, settings=_replace(settings, ca_bundle=missing))
    assert held_certificates(catalog, "CloudOne") == []
