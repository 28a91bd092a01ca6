"""Issue 22's acceptance on a TLS lab (`scoperouter lab up --tls`): every endpoint of every
cloud in https, the services calling each other through their router's forward proxy
(``HTTPS_PROXY``: ``CONNECT``, intercepted with the cloud's own CA), and the scope follows.

* every catalog URL and every backend answers https only, with a certificate of the lab's CA
  for its address; the services run with HTTPS_PROXY and the trust bundle;
* the headline: a server in CloudOne from CloudTwo's image (`openstack --os-scope`), nova's
  calls to glance arriving at CloudOne's forward proxy as ``https://`` (intercepted), routed to
  CloudTwo by the scope on the token;
* `image show` and `image list` with ``CloudOne & CloudTwo``;
* object storage (swift) over https: a container and an object made, read and deleted through
  CloudOne's router in CloudOne's swift, and with ``{"object-store": "CloudTwo"}`` in
  CloudTwo's (two routers, CloudTwo's swift validating the CloudOne token through its
  router's forward proxy), each router's access line naming the https backend;
* a ``CONNECT`` to a host the catalog does not publish: 403 (OpenStack error JSON), one line
  in the router's access log;
* the upstream's certificate is verified: CloudOne's endpoint
  :data:`scoperouter_lab.files.MISMATCH_SERVICE`, served here with a certificate of the lab's
  CA made for another address, is a 502 naming the TLS verification failure, through the
  router's frontend and through its forward proxy alike, and nothing reaches it.

On a plain lab these tests skip: `lab up --tls` first (.ci/run's step "e2e on a TLS lab").
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from scoperouter_lab.files import MISMATCH_SERVICE
from scoperouter_lab.layout import PROXY_PORT, SERVICE_PORTS, service_types

from scoperouter import pki
from scoperouter.merge import ORIGIN_KEY
from tests.ci import missing
from tests.e2e.access import access_lines
from tests.e2e.labservices import require_service, scoped_token, wait_until
from tests.e2e.osc import cli
from tests.integration.backends import EchoBackend
from tests.integration.routers import raw_exchange

# tls_lab: the plain e2e step of .ci/run deselects them (-m "e2e and not tls_lab"); its TLS
# step runs them on a lab up with --tls
pytestmark = [pytest.mark.e2e, pytest.mark.tls_lab]


@pytest.fixture(scope="module")
def tls(lab: Any, fed: Any) -> Any:
    if not lab.state.get("tls"):
        missing("needs a TLS lab: scoperouter lab up --tls")  # under CI=true: a failure
    return fed


def _scope(**services: str) -> str:
    return json.dumps(services)


def _context(cafile: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cafile))


def _access(
    lab: Any, router: Any, since: int, count: int = 1, **match: Any
) -> list[dict[str, Any]]:
    """The access lines the router of cloud `router` wrote after byte `since` of its log
    whose fields equal `match`, once there are `count` (written up to half a second late)."""
    return access_lines(
        lab.paths.log(router, "router"),
        since,
        lambda entry: all(entry.get(k) == v for k, v in match.items()),
        count,
    )


def _size(lab: Any, cloud: Any) -> int:
    path = lab.paths.log(cloud, "router")
    return path.stat().st_size if path.exists() else 0


def _token(lab: Any, cloud: Any) -> str:
    return str(lab.connect(cloud.slug).session.get_token())


def _error(body: bytes) -> str:
    """The message of an OpenStack error JSON (``{"error": {"code", "title", "message"}}``)."""
    data = json.loads(body)
    error = data["error"]
    assert {"code", "title", "message"} <= set(error), data
    return str(error["message"])


def _get(host: str, port: int, path: str, token: str, cafile: Path) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection(host, port, timeout=60, context=_context(cafile))
    return _exchange(conn, path, token)


def _via_proxy(
    proxy: tuple[str, int], target: tuple[str, int], path: str, token: str, cafile: Path
) -> tuple[int, bytes]:
    """GET https://target/path through a forward proxy (CONNECT, then TLS verified with
    `cafile`, as the cloud's services verify it)."""
    conn = http.client.HTTPSConnection(*proxy, timeout=60, context=_context(cafile))
    conn.set_tunnel(*target)
    return _exchange(conn, path, token)


def _exchange(conn: http.client.HTTPSConnection, path: str, token: str) -> tuple[int, bytes]:
    """One GET with the token on `conn`, then the connection closed."""
    try:
        conn.request("GET", path, headers={"X-Auth-Token": token, "Accept": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# ------------------------------------------------------------------ what the lab serves


def test_every_endpoint_is_https_with_a_certificate_of_the_labs_ca(lab: Any, tls: Any) -> None:
    ca = lab.paths.ca_cert
    for cloud in lab.clouds:
        endpoints = lab.osc(f"{cloud.slug}-admin", "endpoint", "list")
        assert endpoints, cloud.name
        for row in endpoints:
            assert row["URL"].startswith(f"https://{cloud.front_ip}:"), row
        # the services it runs (a lab that ran more keeps their endpoints: https too)
        for stype in service_types(tuple(lab.state["services"])):
            port = SERVICE_PORTS[stype][0]
            for host in (cloud.front_ip, cloud.back_ip):  # the router's frontend, the service
                with (
                    socket.create_connection((host, port), timeout=10) as raw,
                    _context(ca).wrap_socket(raw, server_hostname=host) as conn,
                ):
                    cert = conn.getpeercert()
                assert cert is not None
                assert cert["subjectAltName"] == (("IP Address", host),), (host, port)
                # and nothing in plain HTTP there
                with socket.create_connection((host, port), timeout=10) as raw:
                    raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    raw.settimeout(10)
                    try:
                        answer = raw.recv(64)
                    except OSError:
                        answer = b""
                assert not answer.startswith(b"HTTP/1.1 2"), (host, port, answer)


def test_services_call_through_the_forward_proxy_and_trust_the_labs_cas(lab: Any, tls: Any) -> None:
    """The environment of the stand-ins (uWSGI and nova's daemons write their process titles
    over theirs in /proc): HTTPS_PROXY and the bundle of the lab's CA and the cloud's
    interception CA."""
    table = lab.process_table()
    for cloud in lab.clouds:
        rec = table.get(f"{cloud.slug}-network")
        assert rec is not None and rec.alive()
        raw = Path(f"/proc/{rec.pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)
        proxy = f"http://{cloud.front_ip}:{PROXY_PORT}"
        assert env.get("HTTPS_PROXY") == proxy and env.get("HTTP_PROXY") == proxy, env
        bundle = lab.paths.trust_bundle(cloud)
        assert env.get("REQUESTS_CA_BUNDLE") == str(bundle) == env.get("SSL_CERT_FILE")
        ca, _ = lab.paths.tls_files(cloud, "proxy-ca")
        assert bundle.read_bytes() == lab.paths.ca_cert.read_bytes() + ca.read_bytes()
    entry = lab.cloud_entry(lab.clouds[0].slug)
    assert entry["cacert"] == str(lab.paths.ca_cert)


# ------------------------------------------------------------------ the headline


def test_server_in_cloudone_from_an_image_of_cloudtwo_over_https(lab: Any, tls: Any) -> None:
    one, two, tiny = tls
    image = tiny[two.name]
    since_one, since_two = _size(lab, one), _size(lab, two)
    name = f"e2e-tls-{uuid.uuid4().hex[:8]}"
    scope = _scope(image=two.name)
    server = cli(lab, one.slug, "server", "create", "--image", image, "--flavor", "m1.tiny",
                 "--nic", "none", "--wait", name, scope=scope)  # fmt: skip
    try:
        assert server["status"] == "ACTIVE", server
        assert image in server["image"], server["image"]
        # nova-api asked its glance for the image over https: the call reached CloudOne's
        # forward proxy as a CONNECT, was intercepted (its URL https://, on CloudOne's image
        # frontend as the catalog says) and routed to CloudTwo by the scope on the token
        intercepted = [
            e
            for e in _access(lab, one, since_one, method="GET", cloud=two.name)
            if e["path"] == f"https://{one.front_ip}:9292/v2/images/{image}"
        ]
        assert intercepted, "nova's image call did not reach the forward proxy over https"
        assert all(e["status"] == 200 and e["decision"] == "remote" for e in intercepted)
        # and CloudTwo's glance answered it
        fetched = _access(lab, two, since_two, path=f"/v2/images/{image}", service="image")
        assert fetched and all(e["status"] == 200 for e in fetched), fetched
        assert all(e["target"].startswith(f"https://{two.back_ip}:9292/") for e in fetched)
        # the server is CloudOne's: listed there without any scope
        listed = {s["ID"]: s for s in cli(lab, one.slug, "server", "list")}
        assert listed[server["id"]]["Status"] == "ACTIVE", listed.get(server["id"])
    finally:
        cli(lab, one.slug, "server", "delete", "--wait", server["id"], json_out=False)
    # `--wait` returns on status DELETED, a moment before nova drops the server from its list
    wait_until(
        f"server {server['id']} gone from {one.name}'s list",
        lambda: server["id"] not in {s["ID"] for s in cli(lab, one.slug, "server", "list")},
        120,
    )


def test_image_show_and_list_with_cloudone_and_cloudtwo(lab: Any, tls: Any) -> None:
    one, two, tiny = tls
    both = _scope(image=f"{one.name} & {two.name}")
    for cloud in (one, two):
        shown = cli(lab, one.slug, "image", "show", tiny[cloud.name], scope=both)
        assert shown["id"] == tiny[cloud.name]
        assert shown["properties"][ORIGIN_KEY] == cloud.name, shown["properties"]
    listed = [i["ID"] for i in cli(lab, one.slug, "image", "list", scope=both)]
    assert {tiny[one.name], tiny[two.name]} <= set(listed)
    assert len(listed) == len(set(listed)), listed


# ------------------------------------------------------------------ object storage


def test_object_store_round_trip_over_https(lab: Any, tls: Any) -> None:
    """A container and an object through CloudOne's https frontend: in CloudOne's swift, then
    with ``{"object-store": "CloudTwo"}`` in CloudTwo's (CloudOne's router to CloudTwo's, whose
    swift validates the CloudOne token through CloudTwo's forward proxy, intercepted): made,
    listed, read back byte for byte, deleted (404 after), each request's access line on the
    router that delivered it naming the swift proxy's https address."""
    require_service(lab, "swift")  # `lab up --tls --services ...,swift` (.ci/run's TLS step)
    one, two, _ = tls
    token = lab.osc(one.slug, "token", "issue")
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: straight to the router
    session.verify = str(lab.paths.ca_cert)
    account = f"{one.frontend_url('object-store')}/v1/AUTH_{token['project_id']}"
    assert account.startswith(f"https://{one.front_ip}:"), account
    data = os.urandom(256 * 1024)
    swift_port = SERVICE_PORTS["object-store"][0]
    to_two = scoped_token(token["id"], **{"object-store": two.name})
    for cloud, sent in ((one, token["id"]), (two, to_two)):
        headers = {"X-Auth-Token": sent}
        since = _size(lab, cloud)
        container = f"{account}/e2e-tls-{uuid.uuid4().hex[:8]}"
        obj = f"{container}/object.bin"
        made = session.put(container, headers=headers, timeout=60)
        assert made.status_code in (201, 202), (cloud.name, made.status_code, made.text[:500])
        try:
            put = session.put(obj, headers=headers, data=data, timeout=120)
            assert put.status_code == 201, (cloud.name, put.status_code, put.text[:500])
            assert put.headers["Etag"].strip('"') == hashlib.md5(data).hexdigest()
            listing = session.get(container, headers=headers, params={"format": "json"},
                                  timeout=60)  # fmt: skip
            assert [o["name"] for o in listing.json()] == ["object.bin"], listing.text[:500]
            got = session.get(obj, headers=headers, timeout=120)
            assert got.status_code == 200 and got.content == data, (cloud.name, got.status_code)
            deleted = session.delete(obj, headers=headers, timeout=60)
            assert deleted.status_code == 204, (cloud.name, deleted.status_code)
            assert session.get(obj, headers=headers, timeout=60).status_code == 404
        finally:
            session.delete(obj, headers=headers, timeout=60)
            gone = session.delete(container, headers=headers, timeout=60)
        assert gone.status_code == 204, (cloud.name, gone.status_code, gone.text[:500])
        # the router of the cloud whose swift holds them delivered each request over https
        path = obj.removeprefix(one.frontend_url("object-store"))
        delivered = _access(lab, cloud, since, count=4, path=path, decision="local")
        assert {(e["method"], e["status"]) for e in delivered} >= {
            ("PUT", 201),
            ("GET", 200),
            ("DELETE", 204),
            ("GET", 404),
        }, delivered
        assert all(
            e["target"].startswith(f"https://{cloud.back_ip}:{swift_port}/") for e in delivered
        )


# ------------------------------------------------------------------ the forward proxy


def test_connect_to_a_host_outside_the_catalog_is_refused_and_logged(lab: Any, tls: Any) -> None:
    one, _, _ = tls
    since = _size(lab, one)
    target = "198.51.100.7:443"  # TEST-NET-2: published by no catalog (and unreachable)
    connect = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
    reply = raw_exchange(one.front_ip, PROXY_PORT, connect)
    assert reply.status == 403, reply
    assert reply.headers["content-type"] == "application/json"
    assert "not a destination of the federation catalog" in _error(reply.body)
    logged = _access(lab, one, since, path=target)
    assert [e["status"] for e in logged] == [403], logged


@pytest.fixture
def mismatched(lab: Any, tls: Any, tmp_path: Path) -> Iterator[EchoBackend]:
    """CloudOne's :data:`MISMATCH_SERVICE` backend, served with a certificate of the lab's CA
    for another address."""
    one = lab.clouds[0]
    ca = (lab.paths.ca_cert, lab.paths.pki / "ca.key")
    cert, key = pki.issue(ca, tmp_path, "elsewhere", ["127.0.1.99"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    backend = EchoBackend(one.back_ip, MISMATCH_SERVICE[1], name="mismatched", tls=context)
    backend.start()
    try:
        yield backend
    finally:
        backend.stop()


def test_an_upstream_whose_certificate_does_not_match_is_a_clear_502(
    lab: Any, tls: Any, mismatched: EchoBackend
) -> None:
    one = lab.clouds[0]
    stype, port = MISMATCH_SERVICE
    token = _token(lab, one)
    want = f"the {stype} service of {one.name} is unreachable: TLS certificate verification failed"
    # a service's call through the forward proxy (CONNECT to the backend, as a configuration
    # file may name it), trusting what the cloud's services trust
    proxy = (one.front_ip, PROXY_PORT)
    bundle = lab.paths.trust_bundle(one)
    status, body = _via_proxy(proxy, (one.back_ip, port), "/", token, bundle)
    assert status == 502, body
    message = _error(body)
    assert want in message and "IP address mismatch" in message, message
    assert one.back_ip not in message  # a backend's address is never shown
    # a client at the router's https frontend: the same 502, or, from the router's worker
    # that just saw that failure, its breaker's 503 for the same service
    status, body = _get(one.front_ip, port, "/", token, lab.paths.ca_cert)
    message = _error(body)
    if status == 503:
        assert f"the {stype} service of {one.name} is marked down" in message, message
    else:
        assert status == 502 and want in message, body
    assert not mismatched.seen  # no request was ever sent to it
