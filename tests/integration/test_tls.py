"""TLS: an https frontend serves its own certificate; routers verify HTTPS upstreams with
settings.ca_bundle, and refuse an upstream they cannot verify (502 naming the cloud)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .backends import EchoBackend
from .certs import issue
from .routers import Router, cloud_entry, free_port, request, start_all, stop_all, write_config

pytestmark = pytest.mark.integration

ONE, TWO, SKEPTIC = "127.0.0.12", "127.0.0.13", "127.0.0.14"


@dataclass
class TlsFederation:
    one: str  # CloudOne image frontend (http), its router trusts CloudTwo's certificate
    skeptic: str  # the same, but a router that trusts another CA
    two: str  # CloudTwo image frontend (https)
    ca: Path  # the CA of CloudTwo's certificate


@pytest.fixture(scope="module")
def tls_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsFederation]:
    tmp = tmp_path_factory.mktemp("tls")
    cert, key, ca = issue(tmp, TWO, name="cloudtwo")
    _, _, other_ca = issue(tmp, TWO, name="other")
    backend = EchoBackend("127.0.1.13", name="CloudTwo-image").start()
    p_one, p_two, p_skeptic = free_port(ONE), free_port(TWO), free_port(SKEPTIC)
    two = cloud_entry(
        TWO,
        {"image": (p_two, "", backend.url)},
        scheme="https",
        tls={"cert": str(cert), "key": str(key)},
    )
    one = cloud_entry(ONE, {"image": (p_one, "", "http://127.0.1.12:9")})
    skeptic = cloud_entry(SKEPTIC, {"image": (p_skeptic, "", "http://127.0.1.14:9")})
    trusting = write_config(
        tmp / "trusting.yaml", {"CloudOne": one, "CloudTwo": two}, ca_bundle=str(ca)
    )
    doubting = write_config(
        tmp / "doubting.yaml", {"CloudOne": skeptic, "CloudTwo": two}, ca_bundle=str(other_ca)
    )
    routers = start_all(
        [
            Router("CloudOne", trusting, tmp / "one.log", [(ONE, p_one)]),
            Router("CloudTwo", trusting, tmp / "two.log", [(TWO, p_two)]),
            Router("CloudOne", doubting, tmp / "skeptic.log", [(SKEPTIC, p_skeptic)]),
        ]
    )
    try:
        yield TlsFederation(
            f"http://{ONE}:{p_one}", f"http://{SKEPTIC}:{p_skeptic}", f"https://{TWO}:{p_two}", ca
        )
    finally:
        codes = stop_all(routers)
        backend.stop()
    assert set(codes.values()) == {0}


def test_https_frontend_serves_its_certificate(tls_federation: TlsFederation) -> None:
    context = ssl.create_default_context(cafile=str(tls_federation.ca))
    reply = request("GET", tls_federation.two + "/v2/images", context=context)
    assert reply.status == 200
    assert reply.json()["backend"] == "CloudTwo-image"


def test_plain_http_on_an_https_frontend_is_refused(tls_federation: TlsFederation) -> None:
    reply = request("GET", tls_federation.two.replace("https://", "http://") + "/v2/images")
    assert reply.status == 400
    assert "HTTPS only" in reply.error_message()


def test_cross_cloud_over_verified_https(tls_federation: TlsFederation) -> None:
    headers = {"X-Scope": '{"image": "CloudTwo"}'}
    reply = request("GET", tls_federation.one + "/v2/images", headers=headers)
    assert reply.status == 200
    assert reply.json()["backend"] == "CloudTwo-image"


def test_unverifiable_upstream_is_502(tls_federation: TlsFederation) -> None:
    headers = {"X-Scope": '{"image": "CloudTwo"}'}
    reply = request("GET", tls_federation.skeptic + "/v2/images", headers=headers)
    assert reply.status == 502
    message = reply.error_message()
    assert "CloudTwo" in message
    assert "certificate verif" in message.lower()  # "verify failed", "verification failed"
