"""Defence in depth on the frontends and the peer link (issue 30), raw bytes against real
routers in front of recording backends:

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
import time
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
