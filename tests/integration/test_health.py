"""Peer health: a frozen or refusing peer costs at most one timeout, then requests for it fail
fast naming the cloud, while /metrics and /healthz show it down; a local cloud is unaffected."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .backends import EchoBackend, SilentServer
from .routers import (
    Router,
    cloud_entry,
    free_port,
    request,
    settled_metric,
    start_all,
    stop_all,
    wait_for_metric,
    write_config,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.22"
PEER_TIMEOUT = 1.0
REQUESTS = 25  # counted requests, exactly


@dataclass
class Setup:
    router: Router
    url: str
    status: str  # http://host:port of /metrics and /healthz


@pytest.fixture(scope="module")
def one_with_a_frozen_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp_path = tmp_path_factory.mktemp("health")
    backend = EchoBackend("127.0.1.22", name="One-image").start()
    frozen = SilentServer("127.0.0.23").start()  # CloudTwo's router: accepts, never answers
    refusing_port = free_port("127.0.0.24")  # CloudThree's router: nothing listens
    port, metrics_port = free_port(HOST), free_port(HOST)
    one = cloud_entry(HOST, {"image": (port, "", backend.url)})
    one["metrics"] = {"listen": f"{HOST}:{metrics_port}"}
    config = write_config(
        tmp_path / "f.yaml",
        {
            "CloudOne": one,
            "CloudTwo": cloud_entry(
                "127.0.0.23", {"image": (frozen.port, "", "http://127.0.1.23:9")}
            ),
            "CloudThree": cloud_entry(
                "127.0.0.24", {"image": (refusing_port, "", "http://127.0.1.24:9")}
            ),
        },
        response_timeout=30,
        peer_response_timeout=PEER_TIMEOUT,
        breaker={"failures": 1, "down_for": 30},
    )
    router = Router("CloudOne", config, tmp_path / "one.log", [(HOST, port)])
    start_all([router])
    try:
        yield Setup(router, f"http://{HOST}:{port}", f"http://{HOST}:{metrics_port}")
    finally:
        codes = stop_all([router])
        frozen.stop()
        backend.stop()
        assert codes == {"CloudOne": 0}, router.log_text()[-3000:]


def scoped(setup: Setup, cloud: str) -> tuple[int, str, float]:
    started = time.monotonic()
    reply = request("GET", setup.url + "/v2/images", headers={"X-Scope": f'{{"image": "{cloud}"}}'})
    elapsed = time.monotonic() - started
    message = reply.error_message() if reply.status >= 400 else ""
    return reply.status, message, elapsed


def test_a_frozen_peer_costs_one_timeout_then_fails_fast(one_with_a_frozen_peer: Setup) -> None:
    setup = one_with_a_frozen_peer
    status, message, elapsed = scoped(setup, "CloudTwo")
    assert status == 504 and "CloudTwo" in message and "did not answer" in message
    assert PEER_TIMEOUT - 0.1 <= elapsed < PEER_TIMEOUT + 3
    for _ in range(5):
        status, message, elapsed = scoped(setup, "CloudTwo")
        assert status == 503, message
        assert "router of CloudTwo" in message and "marked down" in message
        assert "fail fast" in message
        assert elapsed < 0.5  # no second timeout
    # The local cloud is not affected.
    assert scoped(setup, "CloudOne")[0] == 200
    # The health of each upstream is visible.
    health = request("GET", setup.status + "/healthz")
    assert health.status == 200
    down = health.json()["upstreams_down"]
    assert [(u["cloud"], u["kind"]) for u in down] == [("CloudTwo", "peer")]
    metrics = request("GET", setup.status + "/metrics").body.decode()
    assert 'scoperouter_upstream_up{cloud="CloudTwo",kind="peer"' in metrics
    line = next(
        m for m in metrics.splitlines() if m.startswith('scoperouter_upstream_up{cloud="CloudTwo"')
    )
    assert line.endswith(" 0.0")
    line = next(
        m for m in metrics.splitlines() if m.startswith('scoperouter_upstream_up{cloud="CloudOne"')
    )
    assert line.endswith(" 1.0")


def test_a_refusing_peer_is_marked_down_too(one_with_a_frozen_peer: Setup) -> None:
    setup = one_with_a_frozen_peer
    status, message, _ = scoped(setup, "CloudThree")
    assert status == 502 and "CloudThree" in message
    status, message, elapsed = scoped(setup, "CloudThree")
    assert status == 503 and "refused the connection" in message and elapsed < 0.5


def test_metrics_count_requests_by_service_cloud_decision_status(
    one_with_a_frozen_peer: Setup,
) -> None:
    """Each request counted exactly once, by its labels, in the counter and the duration
    histogram: the worker tallies them and hands them to /metrics once per tick."""
    setup = one_with_a_frozen_peer
    ok = (
        'scoperouter_requests_total{cloud="CloudOne",decision="local",service="image",status="200"}'
    )
    refused = 'scoperouter_requests_total{cloud="-",decision="refused",service="-",status="400"}'
    durations = 'scoperouter_request_duration_seconds_count{decision="local",service="image"}'
    before = {name: settled_metric(setup.status, name) for name in (ok, refused, durations)}
    for _ in range(REQUESTS):
        assert scoped(setup, "CloudOne")[0] == 200
    assert scoped(setup, "Nowhere")[0] == 400
    for name, added in ((ok, REQUESTS), (refused, 1), (durations, REQUESTS)):
        assert wait_for_metric(setup.status, name, before[name] + added) == before[name] + added
    # every client connection closed: none open (opened less closed, per tick)
    assert wait_for_metric(setup.status, "scoperouter_open_connections ", 0) == 0
    text = request("GET", setup.status + "/metrics").body.decode()
    assert "scoperouter_request_duration_seconds_bucket" in text
    assert "scoperouter_open_connections" in text
    assert 'scoperouter_workers{state="running"} 1.0' in text
    assert request("GET", setup.status + "/nothing").status == 404
