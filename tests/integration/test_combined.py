"""``A & B`` and ``A | B`` through real routers (each data path; the forward proxy too): a
merged list, one resource found in the cloud that has it, failover.

    CloudOne   router 127.0.0.41 (image frontend, forward proxy)  ->  list backend 127.0.1.41
    CloudTwo   router 127.0.0.42 (image frontend)                 ->  list backend 127.0.1.42
    CloudDown  127.0.0.43  frontend on a closed port (its router is down: refused)
    CloudGone  127.0.0.45  the same, for the merge tests (the breaker remembers each cloud)
    CloudHung  127.0.0.44  frontend on a server that accepts and never answers

Peer timeouts are short (PEER_TIMEOUT) and the breaker trips on the first failure, as in
production: the tests measure the second request of a failover relative to that timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from scoperouter.merge import ORIGIN_KEY

from .backends import ListServer, SilentServer
from .routers import (
    Reply,
    Router,
    cloud_entry,
    free_port,
    request,
    settled_metric,
    start_all,
    stop_all,
    token_headers,
    wait_for_metric,
    write_config,
)

pytestmark = pytest.mark.integration

PEER_TIMEOUT = 2.0
IDS = {"CloudOne": [f"one-{n}" for n in range(7)], "CloudTwo": [f"two-{n}" for n in range(5)]}
CAPS = {"CloudOne": 4, "CloudTwo": 3}  # each list's own page maximum
SHARED = "in-both"  # an image id both clouds have (found by id, not listed)
FANOUT_OK = 'cloud="-",decision="fanout",service="image",status="200"'


@dataclass
class Setup:
    routers: dict[str, Router]
    lists: dict[str, ListServer]
    image: str  # CloudOne's image frontend, http://host:port
    proxy: str  # CloudOne's forward proxy
    metrics: str  # CloudOne's /metrics

    def counter(self, labels: str) -> float:
        """scoperouter_requests_total{<labels>} of CloudOne's router once what was answered
        before is in it (0 before any)."""
        return settled_metric(self.metrics, "scoperouter_requests_total{" + labels + "}")

    def counted(self, labels: str, expected: float) -> float:
        """The same once it is `expected` (the workers hand counts over once per tick)."""
        return wait_for_metric(self.metrics, "scoperouter_requests_total{" + labels + "}", expected)

    def get(self, expression: str, path: str = "/v2/images", **headers: str) -> Reply:
        scope = json.dumps({"image": expression})
        return request(
            "GET", self.image + path, headers={**token_headers("secret-token", scope), **headers}
        )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("combined")
    lists = {
        "CloudOne": ListServer(
            "127.0.1.41", "CloudOne", IDS["CloudOne"], CAPS["CloudOne"], extra=(SHARED,)
        ),
        "CloudTwo": ListServer(
            "127.0.1.42", "CloudTwo", IDS["CloudTwo"], CAPS["CloudTwo"], extra=(SHARED,)
        ),
    }
    for server in lists.values():
        server.start()
    hung = SilentServer("127.0.0.44").start()
    metrics_port = free_port("127.0.0.41")
    one_port, two_port, proxy_port = (
        free_port("127.0.0.41"),
        free_port("127.0.0.42"),
        free_port("127.0.0.41"),
    )
    clouds: dict[str, Any] = {
        "CloudOne": cloud_entry(
            "127.0.0.41", {"image": (one_port, "", lists["CloudOne"].url)}, proxy_port=proxy_port
        )
        | {"metrics": {"listen": f"127.0.0.41:{metrics_port}"}},
        "CloudTwo": cloud_entry("127.0.0.42", {"image": (two_port, "", lists["CloudTwo"].url)}),
        "CloudDown": cloud_entry(
            "127.0.0.43", {"image": (free_port("127.0.0.43"), "", "http://127.0.1.43:9")}
        ),
        "CloudGone": cloud_entry(
            "127.0.0.45", {"image": (free_port("127.0.0.45"), "", "http://127.0.1.45:9")}
        ),
        "CloudHung": cloud_entry("127.0.0.44", {"image": (hung.port, "", "http://127.0.1.44:9")}),
    }
    config = write_config(
        tmp / "federation.yaml",
        clouds,
        connect_timeout=5.0,
        response_timeout=10.0,
        peer_connect_timeout=PEER_TIMEOUT,
        peer_response_timeout=PEER_TIMEOUT,
        breaker={"failures": 1, "down_for": 60},
    )
    routers = {
        "CloudOne": Router(
            "CloudOne",
            config,
            tmp / "one.log",
            [("127.0.0.41", one_port), ("127.0.0.41", proxy_port)],
        ),
        "CloudTwo": Router("CloudTwo", config, tmp / "two.log", [("127.0.0.42", two_port)]),
    }
    start_all(routers.values())
    try:
        yield Setup(
            routers,
            lists,
            f"http://127.0.0.41:{one_port}",
            f"http://127.0.0.41:{proxy_port}",
            f"http://127.0.0.41:{metrics_port}",
        )
    finally:
        codes = stop_all(routers.values())
        hung.stop()
        for server in lists.values():
            server.stop()
    assert codes == {"CloudOne": 0, "CloudTwo": 0}, routers["CloudOne"].log_text()[-3000:]


def access_of(router: Router, request_id: str) -> dict[str, Any]:
    [entry] = router.wait_for_access(request_id=request_id)
    return entry


@pytest.mark.parametrize("limit", [2, 5])
def test_a_merged_list_pages_through_both_clouds_once(setup: Setup, limit: int) -> None:
    path = f"/v2/images?limit={limit}"
    seen: list[tuple[str, str]] = []
    ids: list[str] = []
    before = setup.counter(FANOUT_OK)
    for _ in range(20):
        reply = setup.get("CloudOne & CloudTwo", path)
        assert reply.status == 200, reply.body
        body = reply.json()
        assert len(body["images"]) <= limit
        seen += [(image[ORIGIN_KEY], image["id"]) for image in body["images"]]
        ids.append(reply.headers["x-scope-request-id"])
        if "next" not in body:
            break
        path = body["next"]  # glance's style: a path on the router the client called
    assert seen == [(cloud, i) for cloud in ("CloudOne", "CloudTwo") for i in IDS[cloud]]
    # One access line per request, naming what each cloud did; CloudTwo's router logs the
    # same request id (delivered there, not combined again), one hop further.
    entry = access_of(setup.routers["CloudOne"], ids[0])
    assert entry["decision"] == "fanout" and entry["cloud"] == "CloudOne & CloudTwo"
    assert entry["status"] == 200 and entry["tried"] == "CloudOne: 200; CloudTwo: 200"
    # the last page asks only the cloud that still has items
    assert access_of(setup.routers["CloudOne"], ids[-1])["tried"] == "CloudTwo: 200"
    assert setup.counted(FANOUT_OK, before + len(ids)) == before + len(ids)
    two = access_of(setup.routers["CloudTwo"], ids[-1])
    assert two["decision"] == "local" and two["cloud"] == "CloudTwo"
    _, _, headers = setup.lists["CloudTwo"].seen[-1]
    assert headers["x-scope-hops"] == "2" and headers["x-scope-request-id"] == ids[-1]
    assert json.loads(headers["x-scope"])["image"] == "CloudTwo"
    assert headers["x-auth-token"].startswith("secret-token!SCOPE!")


def test_a_refusing_cloud_fails_the_merge_naming_it_unless_partial(setup: Setup) -> None:
    reply = setup.get("CloudOne & CloudGone", "/v2/images?limit=3")
    assert reply.status in (502, 503), reply.body  # 503 once the breaker has marked it down
    message = reply.error_message()
    assert "CloudGone" in message and "X-Scope-Partial: allow" in message
    assert "secret-token" not in message
    reply = setup.get("CloudOne & CloudGone", "/v2/images?limit=3", **{"X-Scope-Partial": "allow"})
    assert reply.status == 200, reply.body
    assert reply.headers["x-scope-missing"] == "CloudGone"
    assert [i["id"] for i in reply.json()["images"]] == IDS["CloudOne"][:3]


def test_one_resource_with_and_is_answered_by_the_cloud_that_has_it(setup: Setup) -> None:
    for image, cloud in (("two-3", "CloudTwo"), ("one-1", "CloudOne")):
        asked = {name: len(server.seen) for name, server in setup.lists.items()}
        reply = setup.get("CloudOne & CloudTwo", f"/v2/images/{image}")
        assert reply.status == 200, reply.body
        body = reply.json()
        # glance's own answer, marked with its cloud like a merged list's items
        assert (body["id"], body["owner"], body[ORIGIN_KEY]) == (image, cloud, cloud)
        assert reply.headers["x-scope-cloud"] == cloud
        # every cloud was asked, each its own request for that image
        for name, server in setup.lists.items():
            assert server.seen[asked[name] :][0][:2] == ("GET", f"/v2/images/{image}"), name
        entry = access_of(setup.routers["CloudOne"], reply.headers["x-scope-request-id"])
        assert entry["decision"] == "fanout" and entry["status"] == 200
        assert entry["tried"] == (
            "CloudOne: 200; CloudTwo: 404"
            if cloud == "CloudOne"
            else "CloudOne: 404; CloudTwo: 200"
        )
    reply = setup.get("CloudOne & CloudTwo", "/v2/images/nowhere")
    assert reply.status == 404, reply.body
    assert "not found in CloudOne or CloudTwo" in reply.error_message()
    reply = setup.get("CloudOne & CloudTwo", f"/v2/images/{SHARED}")
    assert reply.status == 409, reply.body
    assert "in more than one cloud (CloudOne, CloudTwo)" in reply.error_message()


def test_one_resource_with_a_failing_cloud_fails_naming_it_unless_partial(setup: Setup) -> None:
    reply = setup.get("CloudGone & CloudOne", "/v2/images/one-2")
    assert reply.status == 502, reply.body
    message = reply.error_message()
    assert "CloudGone" in message and "X-Scope-Partial: allow" in message, message
    reply = setup.get("CloudGone & CloudOne", "/v2/images/one-2", **{"X-Scope-Partial": "allow"})
    assert reply.status == 200, reply.body
    assert reply.json()[ORIGIN_KEY] == "CloudOne"
    assert reply.headers["x-scope-missing"] == "CloudGone"


def test_the_forward_proxy_finds_one_resource_too(setup: Setup) -> None:
    scope = json.dumps({"image": "CloudTwo & CloudOne"})
    headers = token_headers("secret-token", scope)
    reply = request("GET", setup.image + "/v2/images/one-4", headers, proxy=setup.proxy)
    assert reply.status == 200, reply.body
    assert reply.json()[ORIGIN_KEY] == "CloudOne" == reply.headers["x-scope-cloud"]
    reply = request("GET", setup.image + "/v2/images/nowhere", headers, proxy=setup.proxy)
    assert reply.status == 404 and "not found in CloudTwo or CloudOne" in reply.error_message()


def test_writes_with_and_are_refused_before_any_cloud(setup: Setup) -> None:
    before = {name: len(server.seen) for name, server in setup.lists.items()}
    scope = json.dumps({"image": "CloudOne & CloudTwo"})
    reply = request(
        "POST", setup.image + "/v2/images", token_headers("t", scope), body=b'{"name": "x"}'
    )
    assert reply.status == 400 and "'&' only reads" in reply.error_message()
    assert {name: len(server.seen) for name, server in setup.lists.items()} == before


def test_failover_past_a_refusing_cloud_then_skipping_it(setup: Setup) -> None:
    counted = 'cloud="CloudTwo",decision="failover",service="image",status="200"'
    before = setup.counter(counted)
    reply = setup.get("CloudDown | CloudTwo", "/v2/images?limit=1")
    assert reply.status == 200, reply.body
    assert [i["id"] for i in reply.json()["images"]] == ["two-0"]  # CloudTwo's own answer
    entry = access_of(setup.routers["CloudOne"], reply.headers["x-scope-request-id"])
    assert entry["decision"] == "failover" and entry["cloud"] == "CloudDown | CloudTwo"
    assert entry["tried"] == "CloudDown: it refused the connection; CloudTwo: 200"
    reply = setup.get("CloudDown | CloudTwo", "/v2/images?limit=1")
    assert reply.status == 200
    entry = access_of(setup.routers["CloudOne"], reply.headers["x-scope-request-id"])
    assert entry["tried"] == "CloudDown: skipped, marked down; CloudTwo: 200"
    # Counted by decision, with the cloud that answered (metrics are tallied by the workers,
    # handed over once per tick, read by the supervisor).
    assert setup.counted(counted, before + 2) == before + 2


def test_failover_past_a_hung_cloud_waits_once_then_never(setup: Setup) -> None:
    started = time.monotonic()
    reply = setup.get("CloudHung | CloudTwo")
    first = time.monotonic() - started
    assert reply.status == 200, reply.body
    assert first >= PEER_TIMEOUT - 0.1  # it waited for CloudHung's timeout, once
    entry = access_of(setup.routers["CloudOne"], reply.headers["x-scope-request-id"])
    assert entry["tried"] == f"CloudHung: it did not answer within {PEER_TIMEOUT:g}s; CloudTwo: 200"
    started = time.monotonic()
    reply = setup.get("CloudHung | CloudTwo")
    second = time.monotonic() - started
    assert reply.status == 200, reply.body
    assert second < PEER_TIMEOUT / 2, (first, second)  # the breaker skipped CloudHung at once
    # One breaker: a request naming CloudHung alone fails fast too, naming it.
    started = time.monotonic()
    reply = setup.get("CloudHung")
    assert reply.status == 503 and "CloudHung" in reply.error_message()
    assert time.monotonic() - started < PEER_TIMEOUT / 2


def test_the_forward_proxy_runs_combined_scopes(setup: Setup) -> None:
    def via_proxy(expression: str, path: str) -> Reply:
        scope = json.dumps({"image": expression})
        headers = token_headers("secret-token", scope)
        return request("GET", setup.image + path, headers, proxy=setup.proxy)

    reply = via_proxy("CloudDown | CloudTwo", "/v2/images?limit=2")
    assert reply.status == 200, reply.body
    assert [i["id"] for i in reply.json()["images"]] == ["two-0", "two-1"]
    reply = via_proxy("CloudTwo & CloudOne", "/v2/images?limit=100")
    assert reply.status == 200, reply.body
    body = reply.json()
    # CloudTwo pages by 3: the page ends there, in the expression's order, with a next link.
    assert [i[ORIGIN_KEY] for i in body["images"]] == ["CloudTwo"] * 3 and "next" in body
    entry = access_of(setup.routers["CloudOne"], reply.headers["x-scope-request-id"])
    assert entry["decision"] == "fanout" and entry["path"].startswith("http://127.0.0.41:")


def test_failover_carries_a_request_body(setup: Setup) -> None:
    scope = json.dumps({"image": "CloudDown | CloudTwo"})
    headers = {**token_headers("t", scope), "Content-Type": "application/json"}
    reply = request("POST", setup.image + "/v2/images", headers, body=b'{"name": "x"}')
    assert (reply.status, reply.json()) == (201, {"created": "CloudTwo"})
    method, path, seen = setup.lists["CloudTwo"].seen[-1]
    assert (method, path, seen["content-length"]) == ("POST", "/v2/images", "13")
    # The body is buffered for the next cloud, up to 32 MiB.
    big = b"x" * (2 * 1024 * 1024)
    reply = request("POST", setup.image + "/v2/images", headers, body=big)
    assert reply.status == 201, reply.body
    assert setup.lists["CloudTwo"].seen[-1][2]["content-length"] == str(len(big))
