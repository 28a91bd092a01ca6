"""Defence in depth on the frontends and the peer link (issue 30), raw bytes against real
routers in front of recording backends:

* identity fields only keystonemiddleware sets (``X-Roles``, ``X-User-Id``,
  ``X-Is-Admin-Project``...: CVE-2026-22797, OSSA-2026-001) are dropped from a client's head,
  any case, any spelling, every repeat, and the access log says which (names, never values);
* a path a backend could resolve to another service than the one the router routed it to
  (``/network/../placement/...``, ``%2E%2E``, ``%2F``, a backslash) is refused with 400 and
  never reaches a backend.

    CloudOne router 127.0.0.67  one frontend :P, network at /network, placement at /placement
                                (one backend 127.0.1.67 behind both, as an Apache would be:
                                /networking and /placement); peer link https :L
    CloudTwo router 127.0.0.68  frontend :P, network at /network; peer link https :L
                                backend 127.0.1.68 (recording)
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .backends import RecordingBackend
from .certs import federation_ca
from .routers import Router, free_port, start_all, stop_all, write_config
from .test_hostile import message, received, statuses, talk

pytestmark = pytest.mark.integration

ONE, TWO = "127.0.0.67", "127.0.0.68"
SCOPE_TWO = b'X-Scope: {"network": "CloudTwo"}\r\n'

# keystonemiddleware's own list (auth_token/_request.py, _all_auth_headers), written out here
# rather than taken from the router's code; with OpenStack-System-Scope, which it also sets.
KEYSTONEMIDDLEWARE = [
    "X-Service-Catalog",
    "X-Identity-Status",
    "X-Service-Identity-Status",
    "X-Is-Admin-Project",
    "X-Role",
    "X-User",
    "X-Tenant-Id",
    "X-Tenant-Name",
    "X-Tenant",
    *[
        f"X{prefix}-{name}"
        for prefix in ("", "-Service")
        for name in (
            "Domain-Id",
            "Domain-Name",
            "Project-Id",
            "Project-Name",
            "Project-Domain-Id",
            "Project-Domain-Name",
            "User-Id",
            "User-Name",
            "User-Domain-Id",
            "User-Domain-Name",
            "Roles",
        )
    ],
    "OpenStack-System-Scope",
]
# What a client does send and must keep sending (tokens, ids, microversions).
KEPT = [
    (b"X-Auth-Token", b"user-token"),
    (b"X-Service-Token", b"service-token"),
    (b"X-Openstack-Request-Id", b"req-client"),
    (b"OpenStack-API-Version", b"network 2.1"),
    (b"X-Roles-Wanted", b"not-an-identity-field"),
]


@dataclass
class Forged:
    one: Router
    two: Router
    backend_one: RecordingBackend
    backend_two: RecordingBackend
    front: tuple[str, int]  # CloudOne's frontend
    peer_two: tuple[str, int]  # CloudTwo's peer link
    front_two: str  # CloudTwo's frontend base URL (what the peer link's X-Scope-Frontend names)
    ca: Path
    metrics: str

    @property
    def host(self) -> bytes:
        return f"{self.front[0]}:{self.front[1]}".encode()


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forged]:
    tmp = tmp_path_factory.mktemp("forged")
    ca, certs = federation_ca(tmp, {"one": ONE, "two": TWO})
    backend_one = RecordingBackend("127.0.1.67", "CloudOne").start()
    backend_two = RecordingBackend("127.0.1.68", "CloudTwo-network").start()
    front_one, front_two = free_port(ONE), free_port(TWO)
    peer_one, peer_two, metrics = free_port(ONE), free_port(TWO), free_port(ONE)

    def cloud(host: str, name: str, port: int, peer: int, services: dict[str, Any]) -> Any:
        cert = certs[name]
        return {
            "frontends": [{"url": f"http://{host}:{port}"}],
            "services": {
                service: {"public": {"url": f"http://{host}:{port}{path}", "backend": backend}}
                for service, (path, backend) in services.items()
            },
            "peer": {
                "url": f"https://{host}:{peer}",
                "tls": {"cert": str(cert), "key": str(cert.with_suffix(".key"))},
            },
        }

    config = write_config(
        tmp / "federation.yaml",
        {
            "CloudOne": cloud(
                ONE,
                "one",
                front_one,
                peer_one,
                {
                    "network": ("/network", f"{backend_one.url}/networking"),
                    "placement": ("/placement", f"{backend_one.url}/placement"),
                },
            )
            | {"metrics": {"listen": f"{ONE}:{metrics}"}},
            "CloudTwo": cloud(
                TWO, "two", front_two, peer_two, {"network": ("/network", backend_two.url)}
            ),
        },
        peers={"ca": str(ca)},
        connect_timeout=2.0,
        response_timeout=5.0,
        breaker={"failures": 1000},
    )
    one = Router("CloudOne", config, tmp / "one.log", [(ONE, front_one)])
    two = Router("CloudTwo", config, tmp / "two.log", [(TWO, front_two)])
    start_all([one, two])
    try:
        yield Forged(
            one,
            two,
            backend_one,
            backend_two,
            (ONE, front_one),
            (TWO, peer_two),
            f"http://{TWO}:{front_two}",
            ca,
            f"http://{ONE}:{metrics}/metrics",
        )
    finally:
        codes = stop_all([one, two])
        backend_one.stop()
        backend_two.stop()
    for router in (one, two):
        log = router.log_text()
        assert "Traceback" not in log and '"level":"ERROR"' not in log, log[-3000:]
    assert set(codes.values()) == {0}


def _spelled(name: str, index: int) -> bytes:
    """`name` in another case, or with "_" for "-" (a WSGI server reads both as one key)."""
    spellings = (name, name.upper(), name.lower(), name.replace("-", "_"))
    return spellings[index % len(spellings)].encode()


def forged_head(
    path: bytes, host: bytes, extra: bytes = b"", kept: list[tuple[bytes, bytes]] = KEPT
) -> bytes:
    """A request carrying every identity field (some twice, in other spellings), each with a
    value that says it is forged, and the fields a client legitimately sends."""
    lines = [b"GET %s HTTP/1.1" % path, b"Host: " + host]
    for index, name in enumerate(KEYSTONEMIDDLEWARE):
        lines.append(b"%s: spoof%d" % (_spelled(name, index), index))
    lines += [b"x-roles: spoof-admin", b"X_IS_ADMIN_PROJECT: spoof-True"]  # repeats
    lines += [b"%s: %s" % field for field in kept]
    return b"\r\n".join(lines) + b"\r\n" + extra + b"Connection: close\r\n\r\n"


def assert_clean(
    backend: RecordingBackend, path: bytes, kept: list[tuple[bytes, bytes]] = KEPT
) -> None:
    """The one request for `path` reached `backend` without an identity field, with the rest."""
    [seen] = received(backend, path)
    names = {name.decode().lower().replace("_", "-") for name, _ in seen.fields}
    assert not names & {name.lower() for name in KEYSTONEMIDDLEWARE}, sorted(names)
    for name, value in kept:
        assert seen.values(name) == [value], (name, seen.fields)
    assert b"spoof" not in backend.raw


def stripped_once(router: Router, path: str) -> dict[str, Any]:
    """The request's one access line, naming the dropped fields; one warning, no values."""
    [entry] = router.wait_for_access(path=path, status=200)
    names = entry["stripped"].split(",")
    assert names == sorted({name.lower() for name in KEYSTONEMIDDLEWARE}), names
    log = router.wait_for_log(entry["request_id"], count=2)  # the warning and the access line
    [warning] = [
        line for line in log.splitlines() if "dropped the identity" in line and path in line
    ]
    assert "x-is-admin-project" in warning and entry["request_id"] in warning
    assert "spoof" not in log
    return entry


def test_forged_identity_fields_never_reach_a_local_backend(forged: Forged) -> None:
    path = b"/network/v2.0/networks/forged-local"
    got = talk(forged.front, forged_head(path, forged.host))
    assert statuses(got) == [200], got[:500]
    assert_clean(forged.backend_one, path.removeprefix(b"/network"))
    entry = stripped_once(forged.one, path.decode())
    assert entry["decision"] == "local" and entry["service"] == "network"


def test_forged_identity_fields_never_cross_to_another_cloud(forged: Forged) -> None:
    """Scoped to CloudTwo: the hop goes over CloudTwo's peer link, without them."""
    path = b"/network/v2.0/networks/forged-remote"
    kept = KEPT[2:]  # the tokens carry the scope, or are swapped, on a hop: not compared here
    got = talk(forged.front, forged_head(path, forged.host, SCOPE_TWO, kept))
    assert statuses(got) == [200], got[:500]
    assert_clean(forged.backend_two, path.removeprefix(b"/network"), kept)
    entry = stripped_once(forged.one, path.decode())
    assert entry["decision"] == "remote" and entry["cloud"] == "CloudTwo"
    # CloudTwo's router got none of them: nothing to drop there.
    [hop] = forged.two.wait_for_access(request_id=entry["request_id"], status=200)
    assert "stripped" not in hop


def test_forged_identity_fields_are_dropped_on_the_peer_link(forged: Forged) -> None:
    """Straight to CloudTwo's peer link (as another router, or anyone holding the CA's trust,
    could send): dropped there too."""
    path = b"/network/v2.0/networks/forged-peer"
    extra = b"X-Scope-Frontend: %s\r\n" % forged.front_two.encode()
    context = ssl.create_default_context(cafile=str(forged.ca))
    with (
        socket.create_connection(forged.peer_two, timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=forged.peer_two[0]) as sock,
    ):
        sock.sendall(forged_head(path, f"{TWO}:{forged.peer_two[1]}".encode(), extra))
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert statuses(got) == [200], got[:500]
    assert_clean(forged.backend_two, path.removeprefix(b"/network"))
    stripped_once(forged.two, path.decode())


def test_the_stripped_requests_are_counted(forged: Forged) -> None:
    talk(forged.front, forged_head(b"/network/v2.0/networks/forged-count", forged.host))
    forged.one.wait_for_access(path="/network/v2.0/networks/forged-count", status=200)
    deadline = time.monotonic() + 5
    while True:
        with urllib.request.urlopen(forged.metrics, timeout=5) as answer:
            text = answer.read().decode()
        counts = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("scoperouter_identity_fields_stripped_total ")
        ]
        if (counts and counts[0] >= 1) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert counts and counts[0] >= 1, text[-2000:]


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        # routed as network; an Apache (or any backend resolving dot-segments) serves placement
        (b"/network/../placement/resource_providers", "'..' segment"),
        (b"/network/%2e%2e/placement/resource_providers", "'..' segment"),
        (b"/network/.%2E/placement/resource_providers", "'..' segment"),
        (b"/network/%2E./placement/resource_providers", "'..' segment"),
        (b"/network/v2.0/./networks", "'..' segment"),
        (b"/network/v2.0/networks/..", "'..' segment"),
        (b"/network/v2.0/%2e", "'..' segment"),
        (b"/network/..%2Fplacement/resource_providers", "encoded slash"),
        (b"/network/v2.0/networks%2fx", "encoded slash"),
        (b"/network\\..\\placement/resource_providers", "backslash"),
        (b"http://%(host)s/network/../placement/resource_providers", "'..' segment"),
    ],
)
def test_a_path_a_backend_could_resolve_elsewhere_is_refused(
    forged: Forged, target: bytes, fragment: str
) -> None:
    target = target.replace(b"%(host)s", forged.host)
    before = len(forged.backend_one.requests)
    got = talk(forged.front, b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, forged.host))
    assert statuses(got) == [400], got[:500]
    assert fragment in message(got)
    assert json.loads(got.partition(b"\r\n\r\n")[2])["error"]["code"] == 400
    time.sleep(0.2)
    assert len(forged.backend_one.requests) == before
    assert not received(forged.backend_one, b"placement")
    # one access line: refused, with the reason
    [entry] = forged.one.wait_for_access(path=target.decode(), status=400)
    assert entry["decision"] == "refused" and fragment in entry["reason"]


@pytest.mark.parametrize(
    "target",
    [
        b"/network/v2.0/objects/a%5Cb",  # a backslash in a name, encoded: passed on
        b"/network/v2.0/objects/.hidden/a...b",  # dots inside a segment
        b"/network/v2.1/networks?name=/../x%2F",  # the query is not the path
        b"/network/v2.0/objects/a%252Fb",  # an encoded percent sign
    ],
)
def test_paths_that_only_look_alike_are_forwarded_as_sent(forged: Forged, target: bytes) -> None:
    got = talk(
        forged.front,
        b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (target, forged.host),
    )
    assert statuses(got) == [200], got[:500]
    [seen] = received(forged.backend_one, target.removeprefix(b"/network"))
    assert seen.target == b"/networking" + target.removeprefix(b"/network")
