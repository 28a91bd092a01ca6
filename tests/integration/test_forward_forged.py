"""Defence in depth on the forward proxy (issue 30), plain and inside intercepted TLS tunnels,
raw bytes against real routers in front of recording backends (``test_forward_tls``'s setup):
the frontends' rules of ``test_forged`` hold there too.

* identity fields only keystonemiddleware sets (CVE-2026-22797) are dropped, logged (names
  only) and counted, and never reach the backend;
* a path a backend could resolve elsewhere (``/network/../placement/...``, ``%2E``, ``%2F``, a
  backslash) is a 400 with the frontends' message, and nothing reaches the backend;
* on the plain forward proxy, ``Host`` is the absolute URL's authority (RFC 9112 3.2.2).
"""

from __future__ import annotations

import json
import time

import pytest

from .routers import raw_exchange, settled_metric, wait_for_metric
from .test_forged import assert_clean, forged_head, stripped_once
from .test_forward_tls import Setup, in_tunnel, setup
from .test_hostile import received

pytestmark = pytest.mark.integration

__all__ = ["setup"]  # the fixture, for pytest


STRIPPED = "scoperouter_identity_fields_stripped_total "


def test_forged_identity_fields_never_pass_the_plain_forward_proxy(setup: Setup) -> None:
    plain = setup.plain
    authority = f"{plain.host}:{plain.port}".encode()
    url = b"http://%s/v3/forged-plain" % authority
    before = settled_metric(setup.metrics, STRIPPED)
    reply = raw_exchange(*setup.proxy, forged_head(url, authority))
    assert reply.status == 200, reply
    assert_clean(plain, b"/v3/forged-plain")
    entry = stripped_once(setup.routers["CloudOne"], url.decode())
    assert entry["decision"] == "local" and entry["service"] == "identity"
    assert wait_for_metric(setup.metrics, STRIPPED, before + 1) == before + 1


def test_forged_identity_fields_never_pass_a_tunnel(setup: Setup) -> None:
    plain = setup.plain
    authority = f"{plain.host}:{plain.port}"
    reply = in_tunnel(
        setup, (plain.host, plain.port), forged_head(b"/v3/forged-tunnel", authority.encode())
    )
    assert reply.status == 200, reply
    assert_clean(plain, b"/v3/forged-tunnel")
    entry = stripped_once(setup.routers["CloudOne"], f"https://{authority}/v3/forged-tunnel")
    assert entry["decision"] == "local" and entry["service"] == "identity"


HOSTILE = [
    # routed as compute (the catalog's http://localhost:port); a backend resolving dot-segments
    # or decoding %2F would serve another path
    (b"/network/../placement/resource_providers", "'..' segment"),
    (b"/network/%2e%2E/placement/resource_providers", "'..' segment"),
    (b"/network/v2.0/./networks", "'..' segment"),
    (b"/network/..%2Fplacement/resource_providers", "encoded slash"),
    (b"/network/v2.0/networks%2fx", "encoded slash"),
    (b"/network\\..\\placement/resource_providers", "backslash"),
]


@pytest.mark.parametrize(("path", "fragment"), HOSTILE)
@pytest.mark.parametrize("where", ["plain", "tunnel"])
def test_a_path_a_backend_could_resolve_elsewhere_is_refused_by_the_forward_proxy(
    setup: Setup, path: bytes, fragment: str, where: str
) -> None:
    named = setup.named
    authority = b"localhost:%d" % named.port
    before = len(named.requests)
    if where == "plain":
        data = b"GET http://%s%s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, path, authority)
        reply = raw_exchange(*setup.proxy, data)
        logged = f"http://{authority.decode()}{path.decode()}"
    else:
        data = b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, authority)
        reply = in_tunnel(setup, ("localhost", named.port), data)
        logged = f"https://{authority.decode()}{path.decode()}"
    assert reply.status == 400, reply
    assert fragment in reply.error_message()
    assert json.loads(reply.body)["error"]["code"] == 400
    assert reply.headers["content-type"] == "application/json"
    [entry] = setup.routers["CloudOne"].wait_for_access(path=logged, status=400)
    assert entry["decision"] == "refused" and fragment in entry["reason"]
    time.sleep(0.2)
    assert len(named.requests) == before
    assert not received(named, b"placement") and not received(named, b"networks")


def test_the_plain_forward_proxy_sends_the_urls_authority_as_host(setup: Setup) -> None:
    """RFC 9112 3.2.2: a proxy replaces a Host that disagrees with the absolute-form target
    (it was passed on: the backend saw an authority nobody routed); one naming the target, in
    any spelling, is kept as written."""
    plain = setup.plain
    authority = f"{plain.host}:{plain.port}".encode()
    for host in (b"127.0.8.99", b"evil.example:443", b"%s:1" % plain.host.encode()):
        plain.clear()
        data = b"GET http://%s/v3/host-replaced HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, host)
        reply = raw_exchange(*setup.proxy, data)
        assert reply.status == 200, reply
        [got] = plain.requests
        assert got.values(b"host") == [authority], (host, got.fields)
    named = setup.named
    named.clear()
    data = b"GET http://localhost:%d/kept HTTP/1.1\r\nHost: LocalHost:%d\r\n\r\n" % (
        named.port,
        named.port,
    )
    reply = raw_exchange(*setup.proxy, data)
    assert reply.status == 200, reply
    [got] = named.requests
    assert got.values(b"host") == [b"LocalHost:%d" % named.port], got.fields


def test_no_traceback_in_the_routers_log(setup: Setup) -> None:
    """Every refusal and every stripped head above was the router's answer, not a failure."""
    log = setup.routers["CloudOne"].log_text()
    assert "Traceback" not in log and '"level":"ERROR"' not in log, log[-3000:]
