"""TLS interception on the forward proxy: a service's ``https://`` call (``HTTPS_PROXY``,
``CONNECT``) to a destination of the catalog is answered with a certificate from its cloud's
``proxy.ca``, and the request inside is routed like a plain one.

    CloudOne router 127.0.0.70  image frontend https :P, forward proxy :X (proxy.ca: its own
                                interception CA), metrics :M, peer link https :L
             backends 127.0.1.70 image (TLS, the clouds' CA), 127.0.1.72 placement (TLS, a
                                certificate for 127.0.1.99: does not match), 127.0.1.73
                                identity (plain HTTP, records every byte), 127.0.0.1
                                compute (plain HTTP, records; the catalog names it localhost)
    CloudTwo router 127.0.0.71  image frontend https, peer link https
             backend  127.0.1.71 image (TLS, the clouds' CA)

Three CAs, as a deployment has them: the clouds' own (backends and frontends:
settings.ca_bundle), the federation's (peer links: settings.peers.ca), and CloudOne's
interception CA (proxy.ca: only CloudOne's services trust it).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from scoperouter import pki

from .backends import EchoBackend, RecordingBackend
from .certs import federation_ca
from .routers import (
    Reply,
    Router,
    cloud_entry,
    free_port,
    metric,
    raw_exchange,
    request,
    scoperouter_command,
    settled_metric,
    start_all,
    stop_all,
    wait_for_metric,
    write_config,
)
from .tunnel import connect, exchange, open_tunnel, send_request

pytestmark = pytest.mark.integration

ONE, TWO = "127.0.0.70", "127.0.0.71"
SCOPE_TWO = {"X-Auth-Token": 'tok!SCOPE!{"image": "CloudTwo"}'}


@dataclass
class Setup:
    routers: dict[str, Router]
    config: Path
    proxy: tuple[str, int]  # CloudOne's forward proxy
    metrics: str
    image: tuple[str, int]  # CloudOne's image backend (TLS): a catalog destination
    frontend: tuple[str, int]  # CloudOne's image frontend (https): a catalog destination
    mismatched: tuple[str, int]  # CloudOne's placement backend: a certificate for another IP
    plain: RecordingBackend  # CloudOne's identity backend (plain HTTP)
    named: RecordingBackend  # CloudOne's compute backend, http://localhost:port in the catalog
    backends: dict[str, EchoBackend]
    proxy_ca: Path  # what CloudOne's services trust for the forward proxy's certificates
    proxy_ca_key: Path

    def trusting(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.proxy_ca))

    def via_proxy(
        self, target: tuple[str, int], path: str = "/v2/images", headers: Any = None
    ) -> tuple[Reply, bytes]:
        """GET https://target/path through CloudOne's forward proxy (CONNECT, then TLS
        verified against CloudOne's interception CA): the answer and the certificate the
        proxy answered the handshake with (DER)."""
        conn = http.client.HTTPSConnection(*self.proxy, timeout=15, context=self.trusting())
        conn.set_tunnel(*target)
        try:
            conn.request("GET", path, headers=dict(headers or {}))
            assert conn.sock is not None
            der = conn.sock.getpeercert(binary_form=True)
            assert der is not None
            response = conn.getresponse()
            body = response.read()
            headers = {k.lower(): v for k, v in response.getheaders()}
            return Reply(response.status, headers, body), der
        finally:
            conn.close()

    def counter(self, labels: str) -> float:
        """scoperouter_requests_total{<labels>} once what was answered before is in it."""
        return settled_metric(self.metrics, "scoperouter_requests_total{" + labels + "}")

    def counted(self, labels: str, expected: float) -> float:
        """The same once it is `expected` (the workers hand counts over once per tick)."""
        return wait_for_metric(self.metrics, "scoperouter_requests_total{" + labels + "}", expected)


def tls_server(directory: Path, name: str, host: str, ca: tuple[Path, Path]) -> ssl.SSLContext:
    cert, key = pki.issue(ca, directory, name, [host])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("forward-tls")
    clouds_ca = pki.make_ca(tmp, "clouds-ca")  # the clouds' own: backends and frontends
    federation, peer_certs = federation_ca(tmp, {"one-peer": ONE, "two-peer": TWO})
    proxy_ca = pki.make_ca(tmp, "cloudone-proxy-ca")  # CloudOne's interception CA
    backends = {
        "CloudOne": EchoBackend(
            "127.0.1.70", name="CloudOne-image", tls=tls_server(tmp, "b1", "127.0.1.70", clouds_ca)
        ).start(),
        "CloudTwo": EchoBackend(
            "127.0.1.71", name="CloudTwo-image", tls=tls_server(tmp, "b2", "127.0.1.71", clouds_ca)
        ).start(),
        # A certificate of the clouds' CA, but for another address: it must not be accepted.
        "mismatched": EchoBackend(
            "127.0.1.72", name="mismatched", tls=tls_server(tmp, "b3", "127.0.1.99", clouds_ca)
        ).start(),
    }
    plain = RecordingBackend("127.0.1.73", name="CloudOne-identity").start()
    named = RecordingBackend("127.0.0.1", name="CloudOne-compute").start()
    ports = {
        host: {s: free_port(host) for s in ("image", "proxy", "metrics")} for host in (ONE, TWO)
    }
    clouds: dict[str, Any] = {}
    for name, host, peer in (("CloudOne", ONE, "one-peer"), ("CloudTwo", TWO, "two-peer")):
        cert, key = pki.issue(clouds_ca, tmp, f"{name.lower()}-front", [host])
        front = {"cert": str(cert), "key": str(key)}
        services: dict[str, tuple[int, str, str]] = {
            "image": (ports[host]["image"], "", backends[name].url)
        }
        if name == "CloudOne":
            services["placement"] = (free_port(host), "", backends["mismatched"].url)
            services["identity"] = (free_port(host), "/v3", plain.url + "/v3")
            services["compute"] = (free_port(host), "", f"http://localhost:{named.port}")
        entry = cloud_entry(host, services, scheme="https", tls=front)
        peer_port = free_port(host)
        peer_cert = peer_certs[peer]
        entry["peer"] = {
            "url": f"https://{host}:{peer_port}",
            "tls": {"cert": str(peer_cert), "key": str(peer_cert.with_suffix(".key"))},
        }
        clouds[name] = entry
    clouds["CloudOne"]["proxy"] = {
        "listen": f"{ONE}:{ports[ONE]['proxy']}",
        "ca": str(proxy_ca[0]),
        "ca_key": str(proxy_ca[1]),
    }
    clouds["CloudOne"]["metrics"] = {"listen": f"{ONE}:{ports[ONE]['metrics']}"}
    # The clouds' CA for backends and https frontends, the federation's for the peer links.
    config = write_config(
        tmp / "federation.yaml",
        clouds,
        ca_bundle=str(clouds_ca[0]),
        peers={"ca": str(federation)},
        connect_timeout=2.0,
        response_timeout=5.0,
        breaker={"failures": 1000},
    )
    one_addresses = [(ONE, ports[ONE]["image"]), (ONE, ports[ONE]["proxy"])]
    routers = {
        "CloudOne": Router("CloudOne", config, tmp / "one.log", one_addresses),
        "CloudTwo": Router("CloudTwo", config, tmp / "two.log", [(TWO, ports[TWO]["image"])]),
    }
    start_all(routers.values())
    try:
        yield Setup(
            routers,
            config,
            (ONE, ports[ONE]["proxy"]),
            f"http://{ONE}:{ports[ONE]['metrics']}",
            ("127.0.1.70", backends["CloudOne"].port),
            (ONE, ports[ONE]["image"]),
            ("127.0.1.72", backends["mismatched"].port),
            plain,
            named,
            backends,
            *proxy_ca,
        )
    finally:
        codes = stop_all(routers.values())
        plain.stop()
        named.stop()
        for backend in backends.values():
            backend.stop()
    assert codes == {"CloudOne": 0, "CloudTwo": 0}, routers["CloudOne"].log_text()[-3000:]


def raw(setup: Setup, data: bytes, then: bytes = b"") -> bytes:
    """`data` to the forward proxy; after its first answer, `then`; everything it answered
    until it closed (or 5 s)."""
    with socket.create_connection(setup.proxy, timeout=5) as sock:
        sock.sendall(data)
        got = sock.recv(65536)
        if then:
            sock.sendall(then)
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            pass
        return got


def test_https_to_a_tls_backend_of_the_catalog_is_routed_by_scope(setup: Setup) -> None:
    one, two = setup.routers["CloudOne"], setup.routers["CloudTwo"]
    remote = 'cloud="CloudTwo",decision="remote",service="image",status="200"'
    before = setup.counter(remote)
    # The scope sends it to CloudTwo, over the peer link: its router delivers it.
    reply, _ = setup.via_proxy(setup.image, headers=SCOPE_TWO)
    assert reply.status == 200, reply.body
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-image"
    assert seen["headers"]["x-scope-hops"] == "2"  # two routers crossed, as a plain request
    assert json.loads(seen["headers"]["x-scope"])["image"] == "CloudTwo"
    request_id = reply.headers["x-scope-request-id"]
    [entry] = one.wait_for_access(request_id=request_id)
    assert entry["path"] == "https://{}:{}/v2/images".format(*setup.image)
    assert (entry["cloud"], entry["decision"], entry["status"]) == ("CloudTwo", "remote", 200)
    two.wait_for_access(request_id=request_id, status=200)
    assert setup.counted(remote, before + 1) == before + 1
    # No scope: CloudOne's own TLS backend, verified against the clouds' CA.
    reply, _ = setup.via_proxy(setup.image)
    assert (reply.status, reply.json()["backend"]) == (200, "CloudOne-image")
    assert reply.json()["headers"]["x-scope-hops"] == "1"


def test_https_to_a_routers_frontend_is_routed_too(setup: Setup) -> None:
    """The catalog's URLs (the routers' https frontends) are destinations as well."""
    reply, _ = setup.via_proxy(setup.frontend, headers=SCOPE_TWO)
    assert (reply.status, reply.json()["backend"]) == (200, "CloudTwo-image")
    reply, _ = setup.via_proxy(setup.frontend)
    assert (reply.status, reply.json()["backend"]) == (200, "CloudOne-image")


def test_the_certificate_is_made_for_the_host_by_the_clouds_proxy_ca_and_kept(
    setup: Setup,
) -> None:
    _, der = setup.via_proxy(setup.image)
    cert = x509.load_der_x509_certificate(der)
    ca = x509.load_pem_x509_certificate(setup.proxy_ca.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
    assert pki.addresses_of(cert) == {setup.image[0]}
    # Kept: the next tunnel to that host gets the same certificate; another host its own.
    _, again = setup.via_proxy(setup.image)
    assert again == der
    _, other = setup.via_proxy(setup.frontend)
    assert pki.addresses_of(x509.load_der_x509_certificate(other)) == {setup.frontend[0]}


def test_a_backend_whose_certificate_does_not_match_is_a_clear_502(setup: Setup) -> None:
    reply, _ = setup.via_proxy(setup.mismatched)
    assert reply.status == 502, reply.body
    assert reply.headers["content-type"] == "application/json"
    message = reply.error_message()
    assert "the placement service of CloudOne" in message, message
    assert "TLS certificate verification failed: IP address mismatch" in message, message
    assert not setup.backends["mismatched"].seen  # nothing was sent to it


def test_connect_to_a_host_outside_the_catalog_is_403_and_logged_once(setup: Setup) -> None:
    target = f"127.0.1.74:{setup.image[1]}"  # the port of a catalog backend, another host
    connect = b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % ((target.encode(),) * 2)
    reply = raw_exchange(*setup.proxy, connect)
    assert reply.status == 403, reply
    assert "not a destination of the federation catalog" in reply.error_message()
    one = setup.routers["CloudOne"]
    one.wait_for_access(path=target, status=403)
    time.sleep(0.5)
    assert len([e for e in one.access() if e.get("path") == target]) == 1


def test_what_is_neither_tls_nor_http_in_a_tunnel_is_refused_not_passed_on(
    setup: Setup,
) -> None:
    target = b"%s:%d" % (setup.plain.host.encode(), setup.plain.port)
    setup.plain.clear()
    got = raw(
        setup,
        b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target),
        then=b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    )
    assert got.startswith(b"HTTP/1.1 200 "), got
    assert b"HTTP/1.1 400 " in got, got
    assert not setup.plain.raw and not setup.plain.connections


def in_tunnel(setup: Setup, target: tuple[str, int], data: bytes, **kwargs: Any) -> Reply:
    """One request's bytes inside an intercepted tunnel to `target`: the answer."""
    with open_tunnel(setup.proxy, target, setup.proxy_ca, **kwargs) as sock:
        return send_request(sock, data)


def test_absolute_form_in_a_tunnel_is_reduced_or_refused_as_on_the_frontends(
    setup: Setup,
) -> None:
    """Issue 30, finding 3: inside a tunnel, an absolute-form target for another authority
    went upstream as it came (the access log showing only its path); a Host for another
    authority as well. Now: 421, nothing sent; one for the tunnel's own authority is reduced to
    origin-form, and the upstream gets the target the access log shows."""
    one = setup.routers["CloudOne"]
    plain = setup.plain
    authority = f"{plain.host}:{plain.port}"
    target = (plain.host, plain.port)
    plain.clear()
    connections = plain.connections
    for head in (
        b"GET http://127.0.8.99:80/v3/x HTTP/1.1\r\nHost: 127.0.8.99\r\n\r\n",
        b"GET http://127.0.8.99:80/v3/x HTTP/1.1\r\nHost: %s\r\n\r\n" % authority.encode(),
        b"GET /v3/x HTTP/1.1\r\nHost: 127.0.8.99\r\n\r\n",
        b"GET /v3/x HTTP/1.1\r\nHost: %s:1\r\n\r\n" % plain.host.encode(),
        b"GET https://%s:1/v3/x HTTP/1.1\r\nHost: %s\r\n\r\n"
        % (plain.host.encode(), authority.encode()),
    ):
        reply = in_tunnel(setup, target, head)
        assert reply.status == 421, (head, reply)
        assert f"this is a tunnel to {authority}" in reply.error_message(), head
        assert reply.headers["content-type"] == "application/json"
    one.wait_for_access(count=5, path=f"https://{authority}/v3/x", status=421)
    time.sleep(0.3)
    assert not plain.requests and plain.connections == connections, plain.requests
    # The tunnel's own authority (any case), with its Host or none: reduced to origin-form.
    for head, host in (
        (b"GET https://%s/v3/reduced HTTP/1.1\r\nHost: %s\r\n\r\n", authority),
        (b"GET HTTPS://%s/v3/reduced HTTP/1.1\r\n\r\n", authority),  # was a 502
        (b"GET /v3/reduced HTTP/1.1\r\nHost: %s\r\n\r\n", authority),
    ):
        plain.clear()
        data = head % ((authority.upper().encode(),) * head.count(b"%s"))
        reply = in_tunnel(setup, target, data)
        assert reply.status == 200, (data, reply)
        [got] = plain.requests
        assert got.target == b"/v3/reduced", got
        assert [v.lower() for v in got.values(b"host")] == [host.encode()], got
        [entry] = one.wait_for_access(request_id=reply.headers["x-scope-request-id"])
        assert entry["path"] == f"https://{authority}/v3/reduced"


UPGRADES = (
    b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
    b"Connection: keep-alive\r\nConnection: upgrade\r\nUpgrade: websocket\r\n",
)


def test_a_schemes_case_is_the_clients_choice_another_scheme_its_error(setup: Setup) -> None:
    """``HTTP://`` was answered 502 (mitmproxy's "Invalid request scheme: HTTP"): a scheme
    is case-insensitive (RFC 9110 4.2.3). One the proxy does not carry is a 400, not a 502."""
    plain = setup.plain
    authority = f"{plain.host}:{plain.port}".encode()
    plain.clear()
    reply = raw_exchange(
        *setup.proxy,
        b"GET HTTP://%s/v3/cased HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority),
    )
    assert reply.status == 200, reply
    [got] = plain.requests
    assert got.target == b"/v3/cased"
    reply = raw_exchange(
        *setup.proxy, b"GET ftp://%s/v3/x HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)
    )
    assert reply.status == 400, reply
    assert "http:// and https:// URLs only" in reply.error_message()
    assert len(plain.requests) == 1


def switching(router: Router) -> list[dict[str, Any]]:
    """The access entries of refused upgrades."""
    return [e for e in router.access() if "does not switch protocols" in e.get("reason", "")]


@pytest.mark.parametrize("fields", UPGRADES, ids=("websocket", "h2c", "two-connection-fields"))
def test_an_upgrade_through_the_forward_proxy_is_refused_as_on_the_frontends(
    setup: Setup, fields: bytes
) -> None:
    """Issue 30, finding 4: the forward proxy (plain and in a tunnel) passed Upgrade on and
    relayed the backend's 101. Now 400, the frontends' message, nothing sent upstream."""
    plain = setup.plain
    authority = f"{plain.host}:{plain.port}".encode()
    one = setup.routers["CloudOne"]
    before = len(switching(one))
    plain.clear()
    connections = plain.connections
    head = b"GET http://%s/v3/ws HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (authority, authority, fields)
    reply = raw_exchange(*setup.proxy, head)
    assert reply.status == 400, reply
    assert "the router does not switch protocols" in reply.error_message()
    head = b"GET /v3/ws HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (authority, fields)
    reply = in_tunnel(setup, (plain.host, plain.port), head)
    assert reply.status == 400, reply
    assert "the router does not switch protocols" in reply.error_message()
    deadline = time.monotonic() + 5
    while len(switching(one)) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(switching(one)) == before + 2  # one access line each
    time.sleep(0.3)
    assert not plain.requests and plain.connections == connections, plain.requests
    # Upgrade without "Connection: upgrade" asks for nothing: passed without the field.
    reply = raw_exchange(
        *setup.proxy,
        b"GET http://%s/v3/alone HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n\r\n"
        % (authority, authority),
    )
    assert reply.status == 200, reply
    [got] = plain.requests
    assert got.values(b"upgrade") == [], got


def test_what_is_not_tls_in_a_tunnel_is_answered_400_at_once(setup: Setup) -> None:
    """Issue 30, finding 8: bytes without a line end after a CONNECT 200 waited for a head,
    and got 408 after header_timeout (10 s). Now the first bytes of a tunnel must begin a TLS
    ClientHello: anything else is 400 at once, logged, never passed on (plain HTTP too: it
    goes to the proxy itself, in absolute-form)."""
    one = setup.routers["CloudOne"]
    target = f"{setup.plain.host}:{setup.plain.port}"
    setup.plain.clear()
    connections = setup.plain.connections
    for then in (
        b"\x00\x01\x02 not a ClientHello, no line end",
        b"GET /v3/x HTTP/1.1\r\nHost: %s\r\n\r\n" % target.encode(),
        b"\x16\x01",  # not TLS from its second byte
    ):
        sock, head = connect(setup.proxy, target)
        with sock:
            assert head.startswith(b"HTTP/1.1 200 "), head
            started = time.monotonic()
            got = exchange(sock, then, timeout=5)
            took = time.monotonic() - started
        assert got.startswith(b"HTTP/1.1 400 "), (then, got)
        assert b"carries TLS only" in got and b"application/json" in got, got
        assert took < 4, took  # at once, then closed after lingering (2 s)
    one.wait_for_access(count=3, path=target, status=400)
    assert not setup.plain.requests and setup.plain.connections == connections


def test_a_tunnel_without_a_handshake_in_header_timeout_is_closed(setup: Setup) -> None:
    """A tunnel with no byte, or a ClientHello that stops half-way, stayed open for as long
    as the client liked (a connection held for nothing). Now, as a head not complete in
    time on the frontends: closed after header_timeout (10 s here), logged as a 408."""
    one = setup.routers["CloudOne"]
    target = f"{setup.plain.host}:{setup.plain.port}"
    hello = ssl.create_default_context().wrap_bio(
        ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=setup.plain.host
    )
    with pytest.raises(ssl.SSLWantReadError):
        hello.do_handshake()
    partial = outgoing.read()[:40]
    tunnels = []
    for first in (b"", partial):
        sock, head = connect(setup.proxy, target)
        assert head.startswith(b"HTTP/1.1 200 "), head
        sock.sendall(first)
        tunnels.append(sock)
    started = time.monotonic()
    for sock in tunnels:
        with sock:
            sock.settimeout(20)
            assert sock.recv(100) == b""  # closed, nothing passed on or answered
    took = time.monotonic() - started
    assert 8 < took < 14, took
    timed_out = one.wait_for_access(count=2, path=target, status=408)
    assert len(timed_out) == 2, timed_out
    assert "TLS handshake was not complete after 10s" in timed_out[0]["reason"]


def test_a_tls_clienthello_in_pieces_is_still_intercepted(setup: Setup) -> None:
    """The first byte of a ClientHello alone does not decide: the next ones do."""
    hello = ssl.create_default_context(cafile=str(setup.proxy_ca))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    host, port = setup.plain.host, setup.plain.port
    tls = hello.wrap_bio(incoming, outgoing, server_hostname=host)
    sock, head = connect(setup.proxy, f"{host}:{port}")
    with sock:
        assert head.startswith(b"HTTP/1.1 200 "), head
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        first = outgoing.read()
        sock.sendall(first[:1])
        time.sleep(0.3)
        sock.sendall(first[1:])
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if data := outgoing.read():
                    sock.sendall(data)
                chunk = sock.recv(65536)
                assert chunk, "the proxy closed the tunnel"
                incoming.write(chunk)
        if data := outgoing.read():
            sock.sendall(data)
        cert = tls.getpeercert(binary_form=True)
        assert cert is not None
        assert pki.addresses_of(x509.load_der_x509_certificate(cert)) == {host}


def spellings(name: str, count: int) -> list[str]:
    """`count` different upper/lower case spellings of `name` (bits of i pick the case)."""
    found = []
    for i in range(count):
        found.append("".join(c.upper() if i >> n & 1 else c for n, c in enumerate(name)))
    return found


def test_every_spelling_of_a_catalog_host_gets_its_one_certificate(setup: Setup) -> None:
    """Issue 30, finding 6: the certificates were kept by the host as typed: 3,000 case
    spellings of one catalog name made 3,000 certificates. Now one per catalog host, whatever
    the spelling (case, a trailing dot), and a request in such a tunnel is routed."""
    one = setup.routers["CloudOne"]
    port = setup.named.port
    names = spellings("localhost", 40)

    def certificates(names: list[str]) -> set[bytes]:
        ders = set()
        for name in names:
            with open_tunnel(
                setup.proxy, (name, port), setup.proxy_ca, server_hostname=name.rstrip(".")
            ) as sock:
                der = sock.getpeercert(binary_form=True)
                assert der is not None
                ders.add(der)
        return ders

    ders = certificates(names)
    assert len(ders) == 1, len(ders)  # d265555: 40
    made = "the forward proxy made an interception certificate for localhost "
    assert one.wait_for_log(made).count(made) == 1  # (the log is written a moment later)
    # A trailing dot is the same host (it was a 403: not the catalog's spelling).
    assert certificates(["localhost.", "LOCALHOST."]) == ders
    time.sleep(0.3)
    assert one.log_text().count(made) == 1
    cert = x509.load_der_x509_certificate(ders.pop())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    # Routed as the catalog's host: the request reaches the compute backend.
    setup.named.clear()
    reply = in_tunnel(
        setup,
        ("LocalHost.", port),
        b"GET /spelled HTTP/1.1\r\nHost: LOCALHOST:%d\r\n\r\n" % port,
        server_hostname="localhost",
    )
    assert reply.status == 200, reply
    [got] = setup.named.requests
    assert got.target == b"/spelled"


def test_a_ca_key_others_may_read_stops_the_router_with_a_clear_error(
    setup: Setup, tmp_path: Path
) -> None:
    key = tmp_path / "loose.key"
    shutil.copy(setup.proxy_ca_key, key)
    os.chmod(key, 0o644)
    text = setup.config.read_text().replace(str(setup.proxy_ca_key), str(key))
    config = tmp_path / "federation.yaml"
    config.write_text(text)
    checked = subprocess.run(
        [*scoperouter_command(), "check-config", str(config), "--cloud", "CloudOne"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1
    assert f"clouds.CloudOne.proxy.ca_key: {key} is mode 0644" in checked.stderr
    router = Router("CloudOne", config, tmp_path / "loose.log", []).start()
    assert router.proc is not None
    assert router.proc.wait(60) == 2
    log = router.log_text()
    assert "mode 0644" in log and f"chmod 600 {key}" in log, log
    assert "PRIVATE KEY" not in log + checked.stderr + checked.stdout


def test_status_shows_every_certificate_and_the_interception(setup: Setup) -> None:
    """Issue 34: every certificate CloudOne's router holds or checks, with its expiry (the
    metric and the status page: no key path anywhere), and the certificates the forward
    proxy made (a worker's count, read once a second)."""
    setup.via_proxy(setup.image)  # one certificate made, at least (kept after)
    status = request("GET", setup.metrics + "/status.json").json()
    roles = {(c["role"], c["subject"]) for c in status["certificates"]}
    assert {"peer_cert", "frontend_cert", "peer_ca", "interception_ca", "backend_ca"} == {
        role for role, _ in roles
    }
    assert ("interception_ca", "scoperouter cloudone-proxy-ca") in roles
    assert all(300 < c["days_left"] < 5000 for c in status["certificates"])
    assert status["forward_proxy"]["enabled"] and status["forward_proxy"]["intercepts"]
    text = request("GET", setup.metrics + "/status").body.decode()
    assert "scoperouter cloudone-proxy-ca" in text
    assert ".key" not in text and ".key" not in json.dumps(status)  # no key path shown
    expiry = 'scoperouter_certificate_expiry_timestamp_seconds{role="interception_ca"'
    assert metric(setup.metrics, expiry) > time.time() + 300 * 86400
    minted = "scoperouter_interception_certificates_minted_total "
    deadline = time.monotonic() + 5  # read once a second
    while metric(setup.metrics, minted) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(setup.metrics, minted) >= 1
    assert metric(setup.metrics, "scoperouter_interception_cache_size ") >= 1
