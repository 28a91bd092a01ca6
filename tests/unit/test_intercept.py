"""TLS interception on the forward proxy, without sockets: which ``CONNECT`` destinations are
intercepted (routing.tunnel, pure), the certificates (an LRU, catalog hosts only, made again
near their end), the CA read as the router reads it, the adapter's ``http_connect``, and a
reload that would change the CA (refused: a restart applies it)."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from mitmproxy import exceptions, options, tls
from mitmproxy.proxy import events, layer
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from scoperouter import pki
from scoperouter.catalog import Catalog
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError
from scoperouter.proxy.forward import guard, intercept
from scoperouter.proxy.forward.addon import ForwardAddon
from scoperouter.proxy.forward.intercept import Certificates, Interception, signing_ca
from scoperouter.router.config import RouterConfig
from scoperouter.router.listeners import listener_signature, listeners_for
from scoperouter.routing import tunnel

from .conftest import SAMPLE
from .test_router import pipeline


@pytest.fixture
def ca_files(tmp_path: Path) -> tuple[Path, Path]:
    return pki.make_ca(tmp_path, "proxy-ca")


def intercepting(ca_files: tuple[Path, Path]) -> dict[str, Any]:
    """The sample config, CloudOne's forward proxy intercepting with `ca_files`."""
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    data["clouds"]["CloudOne"]["proxy"].update(ca=str(ca_files[0]), ca_key=str(ca_files[1]))
    return data


def test_which_connect_destinations_are_intercepted(
    catalog: Catalog, ca_files: tuple[Path, Path]
) -> None:
    # Without proxy.ca, no tunnel at all (the refusal says what to do instead).
    refused = tunnel("127.0.0.2", 9292, catalog, "CloudOne")
    assert refused is not None and refused.status == 403
    assert "CONNECT tunnels are not supported by the forward proxy of CloudOne" in refused.message
    with_ca = build_catalog(intercepting(ca_files))
    # Intercepted: where the catalog publishes an endpoint URL (a router's frontend) or a
    # backend, of this cloud or another (a plain request there is routed the same way).
    for host, port in (("127.0.0.2", 9292), ("127.0.1.2", 9292), ("127.0.0.3", 5000)):
        assert tunnel(host, port, with_ca, "CloudOne") is None, (host, port)
    assert tunnel("127.0.1.3", 9292, with_ca, "CloudOne") is None
    # Anything else: 403, never a certificate.
    for host, port in (("127.0.0.2", 3128), ("127.0.0.2", 443), ("example.com", 443)):
        refused = tunnel(host, port, with_ca, "CloudOne")
        assert refused is not None and refused.status == 403
        assert "not a destination of the federation catalog" in refused.message
    # Another cloud's proxy has no CA of its own: it intercepts nothing.
    assert tunnel("127.0.0.2", 9292, with_ca, "CloudTwo") is not None


def test_certificates_are_an_lru_of_n_made_once_per_host(ca_files: tuple[Path, Path]) -> None:
    made = Certificates(pki.load_signing_ca(*ca_files), size=2)
    first = made.get("127.0.1.2")
    assert made.get("127.0.1.2") is first and made.made == 1
    made.get("127.0.1.3")
    made.get("127.0.1.2")  # used: 127.0.1.3 is now the least recently used
    made.get("127.0.1.4")  # one too many: 127.0.1.3 goes
    assert len(made) == 2 and made.made == 3
    assert made.get("127.0.1.2") is first and made.made == 3
    made.get("127.0.1.3")
    assert made.made == 4 and len(made) == 2
    # Every certificate has the worker's one key; the CA's key only signs.
    assert first.public_key() == made.key.public_key()
    assert first.public_key() != made.ca.cert.public_key()


def test_a_certificate_near_its_end_is_made_again(ca_files: tuple[Path, Path]) -> None:
    made = Certificates(pki.load_signing_ca(*ca_files), days=1)  # within RENEW at once
    first = made.get("127.0.1.2")
    assert first.not_valid_after_utc - datetime.datetime.now(datetime.UTC) <= intercept.RENEW
    assert made.get("127.0.1.2") is not first and made.made == 2


def test_certificates_only_for_catalog_destinations(
    ca_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    catalog = build_catalog(intercepting(ca_files))
    ca = signing_ca(catalog, "CloudOne", "f.yaml")
    assert ca is not None
    interception = Interception(Certificates(ca), catalog, "CloudOne")
    cert = interception.certificate("127.0.1.2", 9292)
    assert cert is not None and pki.addresses_of(cert) == {"127.0.1.2"}
    with caplog.at_level(logging.INFO, logger="scoperouter"):
        assert interception.certificate("example.com", 443) is None
        assert interception.certificate(None, None) is None  # TLS sent to the proxy itself
    assert len(interception.certificates) == 1
    # A reload that drops the destination: no certificate for it from then on.
    data = intercepting(ca_files)
    del data["clouds"]["CloudOne"]["services"]["image"]
    interception.configure(build_catalog(data))
    assert interception.certificate("127.0.1.2", 9292) is None


def test_the_ca_is_read_as_the_router_reads_it(ca_files: tuple[Path, Path]) -> None:
    catalog = build_catalog(intercepting(ca_files))
    assert signing_ca(catalog, "CloudTwo", "f.yaml") is None  # no proxy.ca
    ca_files[1].chmod(0o644)
    with pytest.raises(ConfigError) as info:
        signing_ca(catalog, "CloudOne", "f.yaml")
    assert info.value.location == "f.yaml: clouds.CloudOne.proxy.ca_key"
    assert "mode 0644" in info.value.message and "chmod 600" in info.value.message
    ca_files[1].unlink()  # not on this router's host: the loader let it be, the router does not
    with pytest.raises(ConfigError, match=r"cannot read .*proxy-ca\.key: No such file"):
        signing_ca(catalog, "CloudOne", "f.yaml")


def test_connect_to_a_catalog_destination_is_let_through_to_interception(
    ca_files: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(intercepting(ca_files)))
    config = RouterConfig()
    config.load(str(path), "CloudOne")
    addon = ForwardAddon(pipeline(config))

    def connect(host: str, port: int) -> Any:
        flow = tflow.tflow()
        flow.client_conn.proxy_mode = ProxyMode.parse("regular@127.0.0.2:3128")
        flow.request.method = "CONNECT"
        flow.request.host, flow.request.port = host, port
        with caplog.at_level(logging.INFO, logger="scoperouter.access"):
            addon.http_connect(flow)
        return flow.response

    caplog.clear()
    assert connect("127.0.1.2", 9292) is None  # mitmproxy answers 200; TLS is intercepted
    assert not caplog.records  # the requests inside are logged, each on its own line
    response = connect("127.0.1.9", 443)
    assert response is not None and response.status_code == 403
    [record] = caplog.records
    assert record.__dict__["fields"]["path"] == "127.0.1.9:443"


def test_a_reload_that_changes_the_ca_needs_a_restart(ca_files: tuple[Path, Path]) -> None:
    plain = yaml.safe_load(SAMPLE.read_text())
    before = listener_signature(listeners_for(build_catalog(plain), "CloudOne"))
    after = listener_signature(listeners_for(build_catalog(intercepting(ca_files)), "CloudOne"))
    assert before != after


# ------------------------------------------------------------- issue 30: hosts and tunnels


@pytest.mark.parametrize(
    ("typed", "normal"),
    [
        ("KeyStone.Example.", "keystone.example"),
        ("[::1]", "::1"),
        ("[FE80::1]", "fe80::1"),
        ("127.0.1.2", "127.0.1.2"),
        ("BÜCHER.example", "bücher.example"),
        (".", "."),
    ],
)
def test_hosts_are_known_as_the_catalog_writes_them(typed: str, normal: str) -> None:
    assert intercept.normal_host(typed) == normal


def test_the_catalogs_own_spelling_of_an_internationalised_name() -> None:
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    image = data["clouds"]["CloudOne"]["services"]["image"]["public"]
    image["backend"] = "http://bücher.example:9292"
    catalog = build_catalog(data)
    for typed in ("XN--BCHER-KVA.example.", "bücher.example", "BÜCHER.EXAMPLE"):
        assert intercept.catalog_host(typed, 9292, catalog) == "bücher.example", typed
    data["clouds"]["CloudOne"]["services"]["image"]["public"]["backend"] = (
        "http://xn--bcher-kva.example:9292"
    )
    catalog = build_catalog(data)
    assert intercept.catalog_host("Bücher.example", 9292, catalog) == "xn--bcher-kva.example"
    assert intercept.catalog_host("Other.Example.", 1, catalog) == "other.example"


def test_every_spelling_of_a_host_shares_one_certificate(
    ca_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30, finding 6: 3,000 case spellings of one catalog name made 3,000 certificates."""
    data = intercepting(ca_files)
    data["clouds"]["CloudOne"]["services"]["image"]["public"]["backend"] = (
        "http://glance.cloudone.example:9292"
    )
    catalog = build_catalog(data)
    ca = signing_ca(catalog, "CloudOne", "f.yaml")
    assert ca is not None
    interception = Interception(Certificates(ca), catalog, "CloudOne")
    name = "glance.cloudone.example"
    letters = [n for n, c in enumerate(name) if c.isalpha()]
    spellings = {
        "".join(
            name[n].upper() if n in letters and i >> letters.index(n) & 1 else name[n]
            for n in range(len(name))
        )
        for i in range(3000)
    }
    assert len(spellings) == 3000
    with caplog.at_level(logging.INFO, logger="scoperouter"):
        certs = {id(interception.certificate(s, 9292)) for s in spellings}
        certs.add(id(interception.certificate(name.upper() + ".", 9292)))
    assert len(certs) == 1 and interception.certificates.made == 1
    assert len(interception.certificates) == 1
    cert = interception.certificate(name, 9292)
    assert cert is not None
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [name]
    made = [r for r in caplog.records if "made an interception certificate" in r.getMessage()]
    assert [r.getMessage() for r in made] == [intercept.MADE_MESSAGE % (name, 1)]


def test_an_internationalised_name_is_certified_as_its_a_label(
    ca_files: tuple[Path, Path],
) -> None:
    made = Certificates(pki.load_signing_ca(*ca_files))
    cert = made.get("Bücher.Example")
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["xn--bcher-kva.example"]
    assert made.get("bücher.example.") is cert


def tunnel_addon(ca_files: tuple[Path, Path], tmp_path: Path) -> ForwardAddon:
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(intercepting(ca_files)))
    config = RouterConfig()
    config.load(str(path), "CloudOne")
    return ForwardAddon(pipeline(config))


def connected(addon: ForwardAddon, host: str, port: int) -> Any:
    flow = tflow.tflow()
    flow.client_conn.proxy_mode = ProxyMode.parse("regular@127.0.0.2:3128")
    flow.request.method = "CONNECT"
    flow.request.data.host, flow.request.port = host, port
    addon.http_connect(flow)
    return flow


def test_a_tunnel_is_known_by_the_catalogs_spelling(
    ca_files: tuple[Path, Path], tmp_path: Path
) -> None:
    addon = tunnel_addon(ca_files, tmp_path)
    flow = connected(addon, "[127.0.1.2]", 9292)
    assert flow.response is None and flow.request.host == "127.0.1.2"
    assert addon.tunnels[flow.client_conn.id] == ("127.0.1.2", 9292)
    addon.client_disconnected(flow.client_conn)
    assert not addon.tunnels
    refused = connected(addon, "127.0.1.9", 443)
    assert refused.response.status_code == 403 and not addon.tunnels


def in_tunnel(addon: ForwardAddon, tunnel_flow: Any, head: dict[str, Any]) -> Any:
    """A request inside the tunnel of `tunnel_flow`, as mitmproxy's transparent HTTP layer
    makes it (host and port the tunnel's, an absolute-form target's authority kept)."""
    flow = tflow.tflow()
    flow.client_conn = tunnel_flow.client_conn
    request = flow.request
    request.scheme, request.data.host, request.port = "https", *addon.tunnels[flow.client_conn.id]
    request.path = head.get("path", "/v2/images")
    request.data.authority = head.get("authority", b"")
    request.headers.clear()
    if "host" in head:
        request.headers["Host"] = head["host"]
    asyncio.run(addon.requestheaders(flow))
    return flow


@pytest.mark.parametrize(
    ("head", "status"),
    [
        ({"authority": b"127.0.8.99:80", "host": "127.0.8.99"}, 421),
        ({"authority": b"127.0.8.99:80", "host": "127.0.1.2:9292"}, 421),
        ({"authority": b"127.0.1.2", "host": "127.0.1.2:9292"}, 421),  # 443 implied
        ({"authority": b"127.0.1.2:9292x"}, 421),
        ({"host": "127.0.8.99"}, 421),
        ({"host": "127.0.1.2:9293"}, 421),
        ({"host": "127.0.1.2"}, 421),
        ({"authority": b"127.0.1.2:9292", "host": "127.0.1.2:9292"}, None),
        ({"authority": b"127.0.1.2:9292"}, None),
        ({"host": "127.0.1.2:9292"}, None),
        ({}, None),
    ],
)
def test_the_frontends_target_rule_holds_in_a_tunnel(
    ca_files: tuple[Path, Path], tmp_path: Path, head: dict[str, Any], status: int | None
) -> None:
    """Issue 30, finding 3: reduced to origin-form when it names the tunnel, 421 otherwise."""
    addon = tunnel_addon(ca_files, tmp_path)
    flow = in_tunnel(addon, connected(addon, "127.0.1.2", 9292), head)
    if status is None:
        assert flow.response is None
        assert flow.request.data.authority == b""  # origin-form upstream
        assert flow.request.headers["host"] == "127.0.1.2:9292"
        assert flow.request.port == 9292 and flow.request.path == "/v2/images"
    else:
        assert flow.response is not None and flow.response.status_code == status
        assert (
            "this is a tunnel to 127.0.1.2:9292"
            in json.loads(flow.response.content or b"")["error"]["message"]
        )


def test_no_tunnel_rule_outside_a_tunnel(ca_files: tuple[Path, Path], tmp_path: Path) -> None:
    """A plain forward-proxy request is not in a tunnel: the rule is not applied."""
    addon = tunnel_addon(ca_files, tmp_path)
    flow = tflow.tflow()
    flow.client_conn.proxy_mode = ProxyMode.parse("regular@127.0.0.2:3128")
    flow.request.scheme, flow.request.host, flow.request.port = "http", "127.0.1.3", 9292
    flow.request.path = "/v2/images"
    flow.request.headers.clear()
    flow.request.headers["Host"] = "127.0.1.3:9292"
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is None


def test_the_first_bytes_of_a_tunnel_decide(ca_files: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 30, finding 8: TLS is left to mitmproxy; anything else gets the refusing layer."""
    addon = tunnel_addon(ca_files, tmp_path)
    tunnel_flow = connected(addon, "127.0.1.2", 9292)
    tunnel_flow.client_conn.tls = False  # no handshake yet

    def decided(data: bytes, client: Any = tunnel_flow.client_conn) -> Any:
        nextlayer = layer.NextLayer(Context(client, options.Options()))
        nextlayer.events.append(events.DataReceived(client, data))
        addon.next_layer(nextlayer)
        return nextlayer.layer

    assert decided(b"\x16\x03\x01\x02\x00") is None  # a ClientHello: mitmproxy's NextLayer
    with pytest.raises(exceptions.AddonHalt):
        decided(b"\x16")  # not enough to tell: nobody decides yet
    for data in (b"GET / HTTP/1.1\r\n", b"\x00\x01", b"SSH-2.0-x"):
        refusing = decided(data)
        assert refusing is not None and type(refusing).__name__ == "_Refusing"
        assert refusing.where == "127.0.1.2:9292" and refusing.status == 400
    other = tflow.tclient_conn()
    other.tls = False
    assert decided(b"GET / HTTP/1.1\r\n", other) is None  # not a tunnel: mitmproxy decides


def test_a_tunnel_must_finish_its_handshake_in_header_timeout(
    ca_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """A tunnel with no handshake (or half of one) was held open for ever; now the sweep
    closes it after header_timeout, reported as a 408."""
    addon = tunnel_addon(ca_files, tmp_path)
    refusals: list[guard.Refusal] = []
    guard.set_refusal_handler(refusals.append)
    try:
        slow = connected(addon, "127.0.1.2", 9292)
        done = connected(addon, "127.0.1.2", 9292)
        assert set(addon.handshakes) == {slow.client_conn.id, done.client_conn.id}
        context = Context(done.client_conn, options.Options())
        addon.tls_established_client(tls.TlsData(done.client_conn, context))
        assert set(addon.handshakes) == {slow.client_conn.id}
        addon.sweep(time.monotonic() + 9)  # not yet
        assert not refusals
        addon.sweep(time.monotonic() + 11)  # closed (no master here: the report shows it)
        [refusal] = refusals
        assert (refusal.status, refusal.path, refusal.client) == (
            408,
            "127.0.1.2:9292",
            slow.client_conn,
        )
        assert "TLS handshake was not complete after 10s" in refusal.message
        assert not addon.handshakes
    finally:
        guard.set_refusal_handler(None)
