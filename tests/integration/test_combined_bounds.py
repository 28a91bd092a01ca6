"""What one ``&``/``|`` request may cost, through real routers (issue 30, finding 2).

    CloudOne    router 127.0.0.71 (image frontend)  ->  list backend 127.0.1.71
    CloudTwo    router 127.0.0.72 (image frontend)  ->  list backend 127.0.1.72
    CloudThree  router 127.0.0.73 (image frontend)  ->  list backend 127.0.1.73
    CloudDown   127.0.0.74  frontend on a closed port (its router is down: refused)

``settings.combine``: at most 4 cloud names and 3 distinct clouds per request, 48 MiB buffered
per worker. The backends count what they receive (``ListServer.seen``): the invariant is that
one client request makes at most one backend request per distinct cloud it names, and
``pad=N`` makes a backend's answer N bytes larger, so the budget can be filled on purpose.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

from .backends import ListServer
from .routers import (
    Reply,
    Router,
    cloud_entry,
    free_port,
    request,
    sample_rss,
    start_all,
    stop_all,
    token_headers,
    write_config,
)

pytestmark = pytest.mark.integration

NAMES = ("CloudOne", "CloudTwo", "CloudThree")
IDS = {name: [f"{name.lower()}-{n}" for n in range(3)] for name in NAMES}
HOSTS = {"CloudOne": "127.0.0.71", "CloudTwo": "127.0.0.72", "CloudThree": "127.0.0.73"}
BUDGET_MIB = 48
BUDGET = BUDGET_MIB * 1024 * 1024
ALL = "CloudOne & CloudTwo & CloudThree"


@dataclass
class Setup:
    routers: dict[str, Router]
    lists: dict[str, ListServer]
    image: str  # CloudOne's image frontend, http://host:port

    def get(self, expression: str, path: str = "/v2/images", timeout: float = 30.0) -> Reply:
        scope = json.dumps({"image": expression})
        headers = token_headers("secret-token", scope)
        return request("GET", self.image + path, headers=headers, timeout=timeout)

    def counts(self) -> dict[str, int]:
        return {name: len(server.seen) for name, server in self.lists.items()}

    def worker(self) -> psutil.Process:
        """CloudOne's worker process (the one that merges)."""
        [worker] = psutil.Process(self.routers["CloudOne"].pid).children()
        return worker


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("bounds")
    lists = {
        name: ListServer(HOSTS[name].replace(".0.0.", ".0.1."), name, IDS[name], 25)
        for name in NAMES
    }
    for server in lists.values():
        server.start()
    ports = {name: free_port(HOSTS[name]) for name in NAMES}
    clouds: dict[str, Any] = {
        name: cloud_entry(HOSTS[name], {"image": (ports[name], "", lists[name].url)})
        for name in NAMES
    }
    clouds["CloudDown"] = cloud_entry(
        "127.0.0.74", {"image": (free_port("127.0.0.74"), "", "http://127.0.1.74:9")}
    )
    config = write_config(
        tmp / "federation.yaml",
        clouds,
        peer_connect_timeout=2.0,
        peer_response_timeout=10.0,
        breaker={"failures": 1, "down_for": 60},
        combine={"max_parts": 4, "max_clouds": 3, "buffer_mib": BUDGET_MIB},
    )
    routers = {
        name: Router(name, config, tmp / f"{name}.log", [(HOSTS[name], ports[name])])
        for name in NAMES
    }
    start_all(routers.values())
    try:
        yield Setup(routers, lists, f"http://{HOSTS['CloudOne']}:{ports['CloudOne']}")
    finally:
        codes = stop_all(routers.values())
        for server in lists.values():
            server.stop()
    assert codes == dict.fromkeys(NAMES, 0), routers["CloudOne"].log_text()[-3000:]


def listed(reply: Reply) -> list[str]:
    assert reply.status == 200, reply.body[:500]
    return [image["id"] for image in reply.json()["images"]]


# ----------------------------------------------- each cloud asked once, listed once


@pytest.mark.parametrize("cloud", ["CloudOne", "CloudTwo"])
def test_a_cloud_named_90_times_is_asked_once_and_listed_once(setup: Setup, cloud: str) -> None:
    """About 90 parts fit the 1,024 characters of an expression: they made 90 backend (or
    peer) requests and listed every image 90 times. A repeat is the same cloud: one request
    (CloudTwo: one peer request, delivered once by its router)."""
    expression = " & ".join([cloud] * 90)
    assert len(expression) <= 1024
    before = setup.counts()
    reply = setup.get(expression)
    assert listed(reply) == IDS[cloud]
    after = setup.counts()
    assert after[cloud] - before[cloud] == 1
    assert after == {**before, cloud: before[cloud] + 1}
    request_id = reply.headers["x-scope-request-id"]
    if cloud == "CloudTwo":
        entries = setup.routers["CloudTwo"].wait_for_access(request_id=request_id)
        assert len(entries) == 1 and entries[0]["cloud"] == "CloudTwo"
    [entry] = setup.routers["CloudOne"].wait_for_access(request_id=request_id)
    assert entry["cloud"] == cloud  # the canonical scope: one cloud


def test_repeats_across_clouds_ask_each_cloud_once(setup: Setup) -> None:
    expression = " & ".join(["CloudOne & CloudTwo"] * 40)
    before = setup.counts()
    reply = setup.get(expression)
    assert listed(reply) == IDS["CloudOne"] + IDS["CloudTwo"]
    after = setup.counts()
    assert after == {**before, **{name: before[name] + 1 for name in ("CloudOne", "CloudTwo")}}


def test_a_failover_reuses_the_answer_of_a_cloud_asked_already(setup: Setup) -> None:
    """``(A & B) | A``: every cloud, else A's alone; A is asked once, its answer serves both."""
    before = setup.counts()
    reply = setup.get("(CloudTwo & CloudDown) | CloudTwo")
    assert listed(reply) == IDS["CloudTwo"]
    assert setup.counts() == {**before, "CloudTwo": before["CloudTwo"] + 1}
    [entry] = setup.routers["CloudOne"].wait_for_access(
        request_id=reply.headers["x-scope-request-id"]
    )
    assert entry["decision"] == "failover"


# --------------------------------------------------------------------------- the caps


@pytest.mark.parametrize(
    ("expression", "names", "distinct"),
    [
        ("(CloudOne & CloudTwo) | (CloudTwo & CloudThree) | (CloudOne & CloudThree)", 6, 3),
        ("CloudOne & CloudTwo & CloudThree & CloudDown", 4, 4),
    ],
)
def test_an_expression_over_the_caps_is_a_400_sending_nothing(
    setup: Setup, expression: str, names: int, distinct: int
) -> None:
    before = setup.counts()
    reply = setup.get(expression)
    assert reply.status == 400 and reply.headers["content-type"] == "application/json"
    message = reply.error_message()
    assert message == (
        f"the scope for 'image' combines {names} cloud names ({distinct} distinct clouds) in "
        "one request; this router combines at most 4 names and 3 distinct clouds "
        "(settings.combine): name fewer"
    )
    assert setup.counts() == before
    router = setup.routers["CloudOne"]
    [entry] = router.wait_for_access(request_id=reply.headers["x-scope-request-id"])
    assert entry["status"] == 400 and entry["reason"].startswith(message[:80])
    # logged once (its access line), never the expression
    assert router.log_text().count(message[:80]) == 1
    assert "CloudTwo & CloudThree" not in entry["reason"]


# ------------------------------------------------------------------ the worker's budget


def _burst(setup: Setup, n: int, path: str) -> list[Reply]:
    """`n` requests sent together: each thread waits for the others before it sends (threads
    started one after another on a loaded machine sent them far enough apart that each could
    find the budget free, and none got the 503 the test expects)."""
    together = threading.Barrier(n)

    def send(_: int) -> Reply:
        together.wait(timeout=30)
        return setup.get(ALL, path, timeout=60)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(send, range(n)))


def _whole_budget(setup: Setup) -> None:
    """The budget is back to exactly 0: a request whose answers need all but 0.5 MB of it
    succeeds, again and again (a leak of more would make it a 503), and one that needs 0.5 MB
    more than it is refused (bytes given back twice would let it through)."""
    pad = (BUDGET - 512 * 1024) // 3
    for _ in range(2):
        assert len(listed(setup.get(ALL, f"/v2/images?pad={pad}"))) == 9
    over = setup.get(ALL, f"/v2/images?pad={(BUDGET + 512 * 1024) // 3}")
    assert over.status == 503 and "retry-after" not in over.headers, over.body[:300]


def test_concurrent_merges_past_the_budget_get_503_and_it_returns_to_zero(setup: Setup) -> None:
    """Five concurrent merges of three 30 MB answers took a worker from 233 to 1,593 MiB.
    Twelve of three 10 MB answers against 48 MiB: those that do not fit get a 503 JSON with
    Retry-After, the worker's peak stays near the budget, the budget comes back whole and the
    worker's memory near its baseline."""
    _whole_budget(setup)
    worker = setup.worker()
    baseline = worker.memory_info().rss
    peaks: dict[int, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=([worker.pid], stop, peaks))
    sampler.start()
    try:
        replies = _burst(setup, 12, f"/v2/images?pad={10_000_000}")
    finally:
        stop.set()
        sampler.join()
    statuses = sorted(reply.status for reply in replies)
    # one fits at a time (arriving together, every one may be refused)
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    for reply in replies:
        if reply.status == 503:
            assert reply.headers["content-type"] == "application/json"
            assert reply.headers["retry-after"] == "5"
            assert reply.error_message() == (
                f"the router's buffer for combined requests ({BUDGET_MIB} MiB per worker, "
                "settings.combine.buffer_mib) is in use by other requests: retry later"
            )
        else:
            assert len(reply.body) > 30_000_000
    # 12 x 30 MB answers, each also parsed and merged: over 1 GB unbounded
    grown = (peaks[worker.pid] - baseline) / 2**20
    assert grown < 8 * BUDGET_MIB, f"worker grew {grown:.0f} MiB"
    _whole_budget(setup)
    time.sleep(1.5)  # the worker hands the memory back a second after a large merge
    back = (worker.memory_info().rss - baseline) / 2**20
    assert back < BUDGET_MIB, f"worker still {back:.0f} MiB above its baseline"


def test_a_request_alone_past_the_budget_is_a_503_without_retry_after(setup: Setup) -> None:
    reply = setup.get(ALL, f"/v2/images?pad={BUDGET // 2}")
    assert reply.status == 503 and "retry-after" not in reply.headers
    assert reply.error_message() == (
        f"the clouds' answers to this request are larger than the router's buffer for combined "
        f"requests ({BUDGET_MIB} MiB per worker, settings.combine.buffer_mib): ask for fewer "
        "items (limit) or name fewer clouds"
    )
    _whole_budget(setup)


def test_the_budget_is_released_when_the_client_goes(setup: Setup) -> None:
    """A client that leaves while its merge waits for a late cloud: what the others' answers
    took is given back."""
    pad = (BUDGET - 512 * 1024) // 3
    scope = json.dumps({"image": ALL})
    head = (
        f"GET /v2/images?pad={pad}&slow=CloudThree&delay=2 HTTP/1.1\r\n"
        f"Host: {setup.image.removeprefix('http://')}\r\n"
        f"X-Auth-Token: secret-token!SCOPE!{scope}\r\n\r\n"
    ).encode()
    host, port = setup.image.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(head)
            time.sleep(0.7)  # CloudOne's and CloudTwo's answers are in, CloudThree's is not
    time.sleep(2.5)  # CloudThree answers (into a request whose client is gone)
    _whole_budget(setup)
