"""Routing through real routers: local, cross-cloud, scope completion, identity stripping,
forward-proxy mode, combined scopes and the requests the router refuses itself (400, 403)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .backends import EchoBackend
from .conftest import Federation
from .routers import (
    Router,
    cloud_entry,
    free_port,
    raw_exchange,
    request,
    start_all,
    stop_all,
    token_headers,
    write_config,
)

pytestmark = pytest.mark.integration

# Every service type of the federation filled with the cloud where the request entered.
COMPLETE = json.dumps(
    {"identity": "CloudOne", "image": "CloudTwo", "placement": "CloudOne"}, separators=(",", ":")
)


def test_unscoped_request_goes_to_the_local_backend(federation: Federation) -> None:
    url = federation.url("CloudOne", "image", "/v2/images?limit=2")
    reply = request("GET", url, headers={"X-Auth-Token": "tok"})
    assert reply.status == 200
    seen = reply.json()
    assert seen["backend"] == "CloudOne-image"
    assert seen["path"] == "/v2/images?limit=2"
    # The client's Host header is kept: services build links that point at the router.
    assert seen["headers"]["host"] == url.split("/")[2]
    assert seen["headers"]["x-auth-token"] == "tok"
    assert seen["headers"]["x-scope-hops"] == "1"  # one router crossed (loop safety)


def test_identity_path_prefix_is_mapped_to_the_backend(federation: Federation) -> None:
    reply = request("POST", federation.url("CloudOne", "identity", "/auth/tokens"), body=b"{}")
    assert reply.status == 200
    assert reply.json()["backend"] == "CloudOne-identity"
    assert reply.json()["path"] == "/v3/auth/tokens"
    assert reply.json()["body_length"] == 2


def test_scope_sends_the_request_through_the_remote_router(
    federation: Federation, two: Router
) -> None:
    url = federation.url("CloudOne", "image", "/v2/images/abc")
    reply = request("GET", url, headers=token_headers("tok", '{"image": "CloudTwo"}'))
    assert reply.status == 200
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-image"
    assert seen["path"] == "/v2/images/abc"
    assert seen["headers"]["host"] == url.split("/")[2]
    # Two routers crossed; the count reaches the backend too (a backend that is a router).
    assert seen["headers"]["x-scope-hops"] == "2"
    # It went through CloudTwo's router (one log line there, with the same request id).
    [there] = two.wait_for_access(path="/v2/images/abc", service="image", cloud="CloudTwo")
    assert seen["headers"]["x-scope-request-id"] == there["request_id"]


def test_partial_scope_is_completed_on_token_and_x_scope(federation: Federation) -> None:
    url = federation.url("CloudOne", "image", "/v2/images")
    reply = request("GET", url, headers=token_headers("tok", '{"image":"CloudTwo"}'))
    headers = reply.json()["headers"]
    assert headers["x-auth-token"] == f"tok!SCOPE!{COMPLETE}"
    assert headers["x-scope"] == COMPLETE


def test_a_service_type_the_federation_does_not_route_is_carried_to_the_backend(
    federation: Federation,
) -> None:
    """A client that completed its scope from a keystone catalog listing an extra service
    (here ``dns``) is routed by the known types; the extra entry reaches the backend intact."""
    url = federation.url("CloudOne", "image", "/v2/images")
    reply = request(
        "GET", url, headers=token_headers("tok", '{"image":"CloudTwo","dns":"CloudOne"}')
    )
    assert reply.status == 200
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-image"
    assert json.loads(seen["headers"]["x-scope"])["dns"] == "CloudOne"


def test_x_scope_header_alone_routes(federation: Federation) -> None:
    url = federation.url("CloudTwo", "image", "/v2/images")
    reply = request("GET", url, headers={"X-Scope": '{"image": "CloudOne"}'})
    assert reply.status == 200
    assert reply.json()["backend"] == "CloudOne-image"
    # Completed with CloudTwo, where the request entered the federation.
    completed = json.loads(reply.json()["headers"]["x-scope"])
    assert completed["identity"] == "CloudTwo"
    assert completed["image"] == "CloudOne"


def test_identity_sees_bare_tokens(federation: Federation) -> None:
    # A client validating its own token in another cloud: no token of a local service leaves
    # the cloud, so nothing is swapped; keystone sees both tokens without the scope.
    headers = {
        **token_headers("usertoken", '{"identity": "CloudTwo"}'),
        "X-Subject-Token": 'usertoken!SCOPE!{"identity": "CloudTwo"}',
    }
    reply = request("GET", federation.url("CloudOne", "identity", "/auth/tokens"), headers=headers)
    assert reply.status == 200
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-identity"
    assert seen["path"] == "/v3/auth/tokens"
    assert seen["headers"]["x-auth-token"] == "usertoken"
    assert seen["headers"]["x-subject-token"] == "usertoken"


def test_foreign_token_validation_needs_a_local_service_token(federation: Federation) -> None:
    # A token validation leaving CloudOne with another token as X-Auth-Token: the router must
    # first check that token with CloudOne's keystone (here an echo backend, which cannot say
    # yes), so it refuses, and the remote keystone never sees the request.
    remote = federation.backends[("CloudTwo", "identity")]
    before = len(remote.seen)
    headers = {
        "X-Auth-Token": "not-a-service-token",
        "X-Subject-Token": 'subject!SCOPE!{"identity": "CloudTwo"}',
    }
    reply = request("GET", federation.url("CloudOne", "identity", "/auth/tokens"), headers=headers)
    assert reply.status == 502
    assert "could not check X-Auth-Token with its keystone" in reply.error_message()
    assert "not-a-service-token" not in reply.body.decode()
    assert len(remote.seen) == before


def test_subject_token_is_stripped_for_other_services(federation: Federation) -> None:
    headers = {
        **token_headers("tok", '{"image": "CloudOne"}'),
        "X-Subject-Token": 'subject!SCOPE!{"image": "CloudOne"}',
    }
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    seen = reply.json()
    assert seen["headers"]["x-subject-token"] == "subject"
    assert seen["headers"]["x-auth-token"].startswith("tok!SCOPE!")


def test_forward_proxy_reaches_a_catalog_url(federation: Federation) -> None:
    # What a service of CloudOne does with HTTP_PROXY set: absolute-form request to a URL of
    # the catalog; the scope on the token picks the cloud.
    url = federation.url("CloudOne", "image", "/v2/images")
    reply = request(
        "GET",
        url,
        headers=token_headers("tok", '{"image":"CloudTwo"}'),
        proxy=federation.proxies["CloudOne"],
    )
    assert reply.status == 200
    assert reply.json()["backend"] == "CloudTwo-image"


def test_forward_proxy_unscoped_to_another_clouds_frontend(federation: Federation) -> None:
    url = federation.url("CloudTwo", "image", "/v2/images")
    reply = request("GET", url, proxy=federation.proxies["CloudOne"])
    assert reply.status == 200
    assert reply.json()["backend"] == "CloudTwo-image"


def test_forward_proxy_refuses_destinations_outside_the_catalog(federation: Federation) -> None:
    closed_port_on_cloud_two = federation.frontends["CloudTwo"]["image"].rsplit(":", 1)[0] + ":1"
    for url in ("http://127.0.0.9:8080/anything", f"{closed_port_on_cloud_two}/v2/images"):
        reply = request("GET", url, proxy=federation.proxies["CloudOne"])
        assert reply.status == 403, url
        assert reply.headers["content-type"] == "application/json"
        assert "not an endpoint of the federation catalog" in reply.error_message()


def test_forward_proxy_refuses_connect_tunnels(federation: Federation) -> None:
    host, port = federation.proxies["CloudOne"].removeprefix("http://").split(":")
    reply = raw_exchange(
        host, int(port), b"CONNECT 127.0.0.3:443 HTTP/1.1\r\nHost: 127.0.0.3:443\r\n\r\n"
    )
    assert reply.status == 403
    assert "CONNECT tunnels are not supported" in reply.error_message()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (token_headers("tok", '{"image": '), "invalid scope in X-Auth-Token"),
        ({"X-Scope": "not json"}, "invalid scope in X-Scope"),
        ({"X-Scope": '{"image": "CloudNine"}'}, "unknown cloud 'CloudNine'"),
        ({"X-Scope": '{"dns": "CloudNine"}'}, "unknown cloud 'CloudNine' for 'dns'"),
        ({"X-Scope": '{"placement": "CloudSilent"}'}, "no 'placement' service"),
    ],
)
def test_bad_scopes_are_400(federation: Federation, headers: dict[str, str], expected: str) -> None:
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    assert reply.status == 400
    assert reply.headers["content-type"] == "application/json"
    assert expected in reply.error_message()


def test_operators_are_run_by_the_router(federation: Federation) -> None:
    headers = {"X-Scope": '{"image": "CloudDown | CloudTwo"}'}
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    assert reply.status == 200, reply.body
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-image"  # through CloudTwo's router, delivered there
    assert json.loads(seen["headers"]["x-scope"])["image"] == "CloudTwo"
    # The echo backends do not answer an image list: the merge fails, naming each cloud.
    headers = {"X-Scope": '{"image": "CloudOne & CloudTwo"}'}
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    assert reply.status == 502
    message = reply.error_message()
    assert "CloudOne & CloudTwo for 'image': CloudOne, CloudTwo failed" in message
    assert "its answer has no 'images' list" in message


def test_refusals_keep_the_connection_usable(federation: Federation) -> None:
    import http.client

    host, port = federation.frontends["CloudOne"]["image"].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/v2/images", headers={"X-Scope": "{"})
        first = conn.getresponse()
        first.read()
        conn.request("GET", "/v2/images")
        second = conn.getresponse()
        assert (first.status, second.status) == (400, 200)
        assert json.loads(second.read())["backend"] == "CloudOne-image"
    finally:
        conn.close()


def test_one_log_line_per_request_without_secrets(federation: Federation, one: Router) -> None:
    secret = "gAAAAA-secret-token-value"
    headers = {
        **token_headers(secret, '{"image": "CloudTwo"}'),
        "X-Subject-Token": f"{secret}-subject",
        "X-Scope": '{"image": "CloudTwo"}',
    }
    url = federation.url("CloudOne", "image", "/v2/images/log-check?password=hunter2")
    reply = request("GET", url, headers=headers)
    assert reply.status == 200
    [entry] = one.wait_for_access(path="/v2/images/log-check")
    assert entry["service"] == "image" and entry["cloud"] == "CloudTwo"
    assert entry["status"] == 200 and entry["decision"] == "remote" and entry["ms"] >= 0
    assert entry["target"].startswith("http://") and entry["request_id"].startswith("req-")
    assert reply.headers["x-scope-request-id"] == entry["request_id"]
    log = one.log_text()
    assert len([line for line in log.splitlines() if "/v2/images/log-check" in line]) == 1
    for secret_part in (secret, "hunter2", "password", "!SCOPE!"):
        assert secret_part not in log


@pytest.fixture
def asymmetric(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two clouds offering different services: Big has compute, Small does not."""
    big_host, small_host = "127.0.0.15", "127.0.0.16"
    backend = EchoBackend("127.0.1.15", name="Big-image").start()
    ports = {name: free_port(host) for name, host in (("big", big_host), ("small", small_host))}
    big = cloud_entry(
        big_host,
        {
            "image": (ports["big"], "", backend.url),
            "compute": (free_port(big_host), "/v2.1", "http://127.0.1.15:9/v2.1"),
        },
    )
    small = cloud_entry(small_host, {"image": (ports["small"], "", "http://127.0.1.16:9")})
    config = write_config(tmp_path / "asymmetric.yaml", {"Big": big, "Small": small})
    routers = start_all(
        [
            Router("Big", config, tmp_path / "big.log", [(big_host, ports["big"])]),
            Router("Small", config, tmp_path / "small.log", [(small_host, ports["small"])]),
        ]
    )
    try:
        yield {"small": f"http://{small_host}:{ports['small']}"}
    finally:
        stop_all(routers)
        backend.stop()


def test_scope_entering_a_cloud_without_every_service(asymmetric: dict[str, str]) -> None:
    # Regression: completion used to fill every service type of the federation with the
    # entry cloud ({"compute": "Small"}), which the next router refused with 400.
    reply = request(
        "GET", asymmetric["small"] + "/v2/images", headers={"X-Scope": '{"image": "Big"}'}
    )
    assert reply.status == 200, reply.body
    assert reply.json()["backend"] == "Big-image"
