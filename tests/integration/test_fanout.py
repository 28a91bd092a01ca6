"""The ``&``/``|`` executor against real local HTTP servers: decisions from ``decide(...,
combined=True)`` on a federation whose clouds are list servers (glance-like paging), a hung
server, a closed port and a server answering 500; requests over httpx (the default sender).

    CloudOne    backend 127.0.1.2:P     (this router's cloud: its backend)
    CloudTwo    "router" 127.0.0.3:P    a list server standing in for CloudTwo's router
    CloudThree  "router" 127.0.0.7:P    a list server
    CloudHung   127.0.0.5:P  accepts and never answers
    CloudDown   127.0.0.4:P  closed port (refuses)
    CloudBroken 127.0.0.17:P answers 500
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from scoperouter.catalog import Catalog
from scoperouter.config import build_catalog
from scoperouter.errors import Reject
from scoperouter.merge import MISSING_HEADER, ORIGIN_KEY
from scoperouter.router.fanout import Reply, Request, execute, httpx_sender
from scoperouter.routing import Failover, FanOut, Forward, RequestFacts, decide

from .backends import ListServer, RawServer, SilentServer
from .routers import cloud_entry, free_port

FRONT = ("127.0.0.2", 0)  # CloudOne's router frontend (never bound: decide only matches it)
TIMEOUT = 0.8


@dataclass
class Clouds:
    catalog: Catalog
    lists: dict[str, ListServer]
    hung: SilentServer
    port: int  # CloudOne's image frontend
    threads: list[threading.Thread] = field(default_factory=list)


IDS = {
    "CloudOne": [f"one-{n}" for n in range(7)],
    "CloudTwo": [f"two-{n}" for n in range(5)],
    "CloudThree": [f"three-{n}" for n in range(3)],
}
CAPS = {"CloudOne": 4, "CloudTwo": 3, "CloudThree": 25}  # each service's own page maximum


@pytest.fixture(scope="module")
def clouds() -> Iterator[Clouds]:
    hosts = {"CloudOne": "127.0.1.2", "CloudTwo": "127.0.0.3", "CloudThree": "127.0.0.7"}
    lists = {name: ListServer(hosts[name], name, IDS[name], CAPS[name]) for name in IDS}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in lists.values()]
    for thread in threads:
        thread.start()
    hung = SilentServer("127.0.0.5").start()
    broken = RawServer(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        b'Content-Length: 30\r\nConnection: close\r\n\r\n{"error": {"message": "boom"}}',
        "127.0.0.17",
    ).start()
    port = free_port(FRONT[0])

    def remote(url: str) -> dict[str, Any]:
        host, _, p = url.removeprefix("http://").partition(":")
        return cloud_entry(host, {"image": (int(p), "", f"http://127.0.1.9:{int(p)}")})

    data = {
        "version": 1,
        "clouds": {
            "CloudOne": cloud_entry(FRONT[0], {"image": (port, "", lists["CloudOne"].url)}),
            "CloudTwo": remote(lists["CloudTwo"].url),
            "CloudThree": remote(lists["CloudThree"].url),
            "CloudHung": remote(hung.url),
            "CloudDown": remote(f"http://127.0.0.4:{free_port('127.0.0.4')}"),
            "CloudBroken": remote(broken.url),
        },
    }
    yield Clouds(build_catalog(data), lists, hung, port, threads)
    for server in lists.values():
        server.shutdown()
        server.server_close()
    hung.stop()
    broken.stop()


def decision_for(
    clouds: Clouds, expression: str, path: str = "/v2/images", method: str = "GET", **headers: str
) -> FanOut | Failover:
    scope = json.dumps({"image": expression})
    facts = RequestFacts(
        method=method,
        scheme="http",
        host=FRONT[0],
        port=clouds.port,
        path=path,
        headers={"x-auth-token": f"secret-token!SCOPE!{scope}", **headers},
    )
    decision = decide(facts, clouds.catalog, "CloudOne", combined=True)
    assert isinstance(decision, FanOut | Failover), decision
    return decision


def run(
    clouds: Clouds,
    expression: str,
    path: str = "/v2/images",
    method: str = "GET",
    body: bytes = b"",
    down: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    asked: list[str] | None = None,
    timeout: float = TIMEOUT,
) -> Reply:
    headers = headers or {}
    decision = decision_for(clouds, expression, path, method, **headers)
    client_headers = {"x-auth-token": "secret-token", "accept": "application/json", **headers}

    def is_down(forward: Forward) -> str | None:
        if asked is not None:
            asked.append(forward.cloud)
        return None if down is None else down.get(forward.cloud)

    def report(forward: Forward, failure: str | None) -> None:
        if down is not None and failure is not None:
            down[forward.cloud] = failure  # a breaker that trips on the first failure

    async def go() -> Reply:
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout)) as client:
            return await execute(
                decision,
                Request(method, client_headers, body),
                httpx_sender(client),
                base_url=f"http://{FRONT[0]}:{clouds.port}",
                timeout=timeout,
                is_down=is_down,
                report=report,
            )

    return asyncio.run(go())


def message(reply: Reply) -> str:
    assert reply.headers["content-type"] == "application/json"
    text = json.loads(reply.body)["error"]["message"]
    assert isinstance(text, str) and "secret-token" not in text
    return text


@pytest.mark.parametrize("limit", [None, 1, 2, 5, 100])
def test_pages_of_a_merged_list_hold_every_image_once(clouds: Clouds, limit: int | None) -> None:
    path = "/v2/images" if limit is None else f"/v2/images?limit={limit}"
    seen: list[tuple[str, str]] = []
    for _ in range(40):
        # merging pages, not timeouts: 0.8 s for three answers failed once at load 7+
        reply = run(clouds, "CloudOne & CloudTwo & CloudThree", path, timeout=10)
        assert reply.status == 200, reply.body
        body = json.loads(reply.body)
        seen += [(i[ORIGIN_KEY], i["id"]) for i in body["images"]]
        if "next" not in body:
            break
        path = body["next"]
    assert seen == [(c, i) for c in ("CloudOne", "CloudTwo", "CloudThree") for i in IDS[c]]


def test_each_cloud_gets_its_own_marker_and_the_scope_travels_on(clouds: Clouds) -> None:
    reply = run(clouds, "CloudTwo & CloudThree", "/v2/images?limit=2")
    nxt = json.loads(reply.body)["next"]
    for server in clouds.lists.values():
        server.seen.clear()
    run(clouds, "CloudTwo & CloudThree", nxt)
    [(_, path, headers)] = clouds.lists["CloudTwo"].seen
    assert dict(parse_qsl(urlsplit(path).query)) == {"limit": "2", "marker": "two-1"}
    assert headers["x-auth-token"].startswith("secret-token!SCOPE!")
    assert json.loads(headers["x-scope"])["image"] == "CloudTwo"  # delivered, not re-combined
    assert headers["x-scope-hops"] == "1"
    assert clouds.lists["CloudThree"].seen[0][1] == "/v2/images?limit=2"


def test_a_hung_cloud_fails_the_merge_after_its_timeout_naming_it(clouds: Clouds) -> None:
    start = time.monotonic()
    reply = run(clouds, "CloudTwo & CloudHung")
    elapsed = time.monotonic() - start
    assert reply.status == 504
    assert "CloudHung failed (CloudHung: it did not answer" in message(reply)
    assert elapsed < TIMEOUT + 2.0  # its own timeout, not a sum of waits


def test_partial_results_leave_out_the_hung_and_the_refusing_cloud(clouds: Clouds) -> None:
    reply = run(clouds, "CloudTwo & CloudHung & CloudDown", headers={"x-scope-partial": "allow"})
    assert reply.status == 200
    assert reply.headers[MISSING_HEADER.lower()] == "CloudHung, CloudDown"
    body = json.loads(reply.body)
    assert [i["id"] for i in body["images"]] == IDS["CloudTwo"][: CAPS["CloudTwo"]]


def test_a_refusing_or_failing_cloud_fails_the_merge_naming_it(clouds: Clouds) -> None:
    reply = run(clouds, "CloudTwo & CloudDown")
    assert reply.status == 502
    assert "CloudDown failed (CloudDown: it refused the connection)" in message(reply)
    reply = run(clouds, "CloudBroken & CloudTwo")
    assert reply.status == 502
    assert "CloudBroken failed (CloudBroken: it answered 500: boom)" in message(reply)


def test_failover_moves_past_refusing_hung_and_failing_clouds(clouds: Clouds) -> None:
    for first in ("CloudDown", "CloudHung", "CloudBroken"):
        reply = run(clouds, f"{first} | CloudTwo", "/v2/images?limit=1")
        assert reply.status == 200, (first, reply.body)
        assert [i["id"] for i in json.loads(reply.body)["images"]] == ["two-0"]


def test_failover_skips_a_cloud_marked_down_so_the_second_call_is_fast(clouds: Clouds) -> None:
    down: dict[str, str] = {}  # the engine's peer health, fed by report()
    start = time.monotonic()
    assert run(clouds, "CloudHung | CloudTwo", down=down).status == 200
    first = time.monotonic() - start
    assert first >= TIMEOUT and "CloudHung" in down
    start = time.monotonic()
    assert run(clouds, "CloudHung | CloudTwo", down=down).status == 200
    assert time.monotonic() - start < first / 2
    # Every candidate down: 503 at once, naming each.
    down["CloudTwo"] = "it refused the connection"
    reply = run(clouds, "CloudHung | CloudTwo", down=down)
    assert reply.status == 503 and "every cloud is marked down" in message(reply)


def test_failover_asks_peer_health_only_about_the_clouds_it_tries(clouds: Clouds) -> None:
    # CloudDown is marked down, but CloudTwo answers first: CloudDown is not asked about (a
    # breaker past its down period would otherwise count that as its probe).
    asked: list[str] = []
    reply = run(clouds, "CloudTwo | CloudDown", down={"CloudDown": "refused"}, asked=asked)
    assert reply.status == 200 and asked == ["CloudTwo"]


def test_failover_never_repeats_a_write_that_may_have_taken_effect(clouds: Clouds) -> None:
    clouds.lists["CloudTwo"].seen.clear()
    reply = run(clouds, "CloudBroken | CloudTwo", "/v2/images", "POST", b"{}")
    assert reply.status == 500  # the first cloud's answer: it may have created the image
    assert clouds.lists["CloudTwo"].seen == []
    # Nothing was sent to a refusing cloud: the write moves on.
    reply = run(clouds, "CloudDown | CloudTwo", "/v2/images", "POST", b"{}")
    assert reply.status == 201 and json.loads(reply.body) == {"created": "CloudTwo"}
    # Every candidate failing: one error naming each, with why.
    reply = run(clouds, "CloudDown | CloudHung", "/v2/images/x", "DELETE")
    assert reply.status == 504
    assert message(reply).startswith("CloudDown | CloudHung for 'image': no cloud answered")


def test_and_inside_or_and_or_inside_and(clouds: Clouds) -> None:
    reply = run(clouds, "CloudDown | CloudTwo & CloudThree", "/v2/images?limit=100")
    assert reply.status == 200
    body = json.loads(reply.body)
    # CloudTwo pages by 3 (its own maximum) and has 5: the page stops there, in order.
    assert [i["id"] for i in body["images"]] == IDS["CloudTwo"][:3] and "next" in body
    reply = run(clouds, "(CloudHung | CloudThree) & CloudTwo", "/v2/images?limit=100")
    assert reply.status == 200
    origins = [i[ORIGIN_KEY] for i in json.loads(reply.body)["images"]]
    # A part that is itself 'A | B' is labelled with its expression.
    assert origins == ["CloudHung | CloudThree"] * 3 + ["CloudTwo"] * 3


def test_writes_with_and_never_reach_a_cloud(clouds: Clouds) -> None:
    scope = json.dumps({"image": "CloudOne & CloudTwo"})
    facts = RequestFacts(
        method="POST",
        scheme="http",
        host=FRONT[0],
        port=clouds.port,
        path="/v2/images",
        headers={"x-auth-token": f"t!SCOPE!{scope}"},
    )
    decision = decide(facts, clouds.catalog, "CloudOne", combined=True)
    assert isinstance(decision, Reject) and decision.status == 400


@pytest.mark.parametrize(
    "expression",
    [
        "(CloudTwo & CloudBroken) | CloudTwo",
        "(CloudTwo & CloudBroken) | (CloudTwo & CloudThree) | CloudThree",
        "CloudBroken | (CloudBroken & CloudTwo) | CloudTwo",
        "CloudDown | CloudDown & CloudTwo | CloudTwo & CloudThree | CloudThree",
    ],
)
@pytest.mark.parametrize("query", ["", "?limit=2&foo=bar"])
def test_each_cloud_is_asked_once_per_request(clouds: Clouds, expression: str, query: str) -> None:
    """Backend requests per client request <= distinct clouds named (issue 30): a failover
    candidate naming a cloud asked already reuses its outcome (``(A & B) | A``: every cloud,
    else A's answer alone), whatever the order of the query's parameters."""
    for server in clouds.lists.values():
        server.seen.clear()
    reply = run(clouds, expression, "/v2/images" + query)
    assert all(len(server.seen) <= 1 for server in clouds.lists.values())
    if expression.endswith("| CloudTwo"):
        assert reply.status == 200
        ids = [image["id"] for image in json.loads(reply.body)["images"]]
        assert ids == IDS["CloudTwo"][: 2 if query else CAPS["CloudTwo"]]
