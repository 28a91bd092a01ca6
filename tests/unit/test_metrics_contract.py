"""The router metrics of issue 34's contract (docs/operations.md), per worker: refusals by a
bounded reason, the breaker of each upstream, connections per upstream, interception; every
series there from the config load. Real routers: tests/integration/test_status.py."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from scoperouter.router.config import RouterConfig
from scoperouter.router.health import UpstreamHealth
from scoperouter.router.metrics import Metrics
from scoperouter.router.refusals import REASONS, refusal_reason
from scoperouter.router.state import RequestState
from scoperouter.routing import Forward

from .conftest import SAMPLE

TWO = "http://127.0.0.3:5000"  # CloudTwo's identity frontend: an upstream of CloudOne's router
BACKEND = "http://127.0.1.2:9292"  # CloudOne's image backend

REMOTE = Forward(
    cloud="CloudTwo", service_type="identity", interface="public", remote=True,
    url=TWO + "/v3/auth/tokens",
)  # fmt: skip


@pytest.fixture
def parts() -> tuple[Metrics, UpstreamHealth]:
    config = RouterConfig()
    config.load(str(SAMPLE), "CloudOne")
    health = UpstreamHealth(config)
    return Metrics(config, health), health


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_every_series_exists_from_the_config_load(parts: tuple[Metrics, UpstreamHealth]) -> None:
    for reason in REASONS:
        assert _value("scoperouter_refusals_total", reason=reason) is not None
    for upstream in (TWO, BACKEND):
        assert _value("scoperouter_breaker_open", upstream=upstream) == 0
        for state in ("open", "idle"):
            assert _value("scoperouter_upstream_connections", upstream=upstream, state=state) == 0
    assert _value("scoperouter_interception_certificates_minted_total") is not None
    assert _value("scoperouter_interception_cache_size") is not None


def test_the_breaker_gauge_follows_the_upstream(parts: tuple[Metrics, UpstreamHealth]) -> None:
    _, health = parts
    health.failed(REMOTE, None, "Connect call failed")  # breaker.failures is 1
    assert _value("scoperouter_breaker_open", upstream=TWO) == 1
    health.succeeded(REMOTE)
    assert _value("scoperouter_breaker_open", upstream=TWO) == 0


def _answered(status: int, message: str) -> RequestState:
    state = RequestState(request_id="r", headers={}, method="GET", path="/", started=0.0)
    state.status, state.message = status, message
    return state


def test_refusals_are_counted_by_reason_at_the_flush(
    parts: tuple[Metrics, UpstreamHealth],
) -> None:
    metrics, _ = parts
    before = {r: _value("scoperouter_refusals_total", reason=r) or 0 for r in REASONS}
    metrics.count(_answered(400, "invalid scope in X-Scope: unknown cloud 'Nowhere'"), 400)
    metrics.count(_answered(503, "the router of CloudTwo is marked down (...)"), 503)
    metrics.count(_answered(499, "the client went away"), 499)  # no answer: no refusal
    ok = RequestState(request_id="r", headers={}, method="GET", path="/", started=0.0)
    metrics.count(ok, 200)  # relayed from upstream: not the router's own
    assert (_value("scoperouter_refusals_total", reason="unknown_cloud") or 0) == before[
        "unknown_cloud"
    ]
    metrics.flush()
    after = {r: _value("scoperouter_refusals_total", reason=r) or 0 for r in REASONS}
    added = {r: after[r] - before[r] for r in REASONS if after[r] != before[r]}
    assert added == {"unknown_cloud": 1, "upstream_down": 1}


def test_connections_and_interception_are_read_once_a_second(
    parts: tuple[Metrics, UpstreamHealth],
) -> None:
    metrics, _ = parts
    counts = {BACKEND: (3, 1), "http://not.in.the.config:1": (9, 9)}
    minted = [5, 2]
    metrics.watch(connections=lambda: counts, minted=lambda: (minted[0], minted[1]))
    before = _value("scoperouter_interception_certificates_minted_total") or 0
    for _ in range(10):  # SLOW_EVERY ticks
        metrics.flush()
    assert _value("scoperouter_upstream_connections", upstream=BACKEND, state="open") == 3
    assert _value("scoperouter_upstream_connections", upstream=BACKEND, state="idle") == 1
    # only the config's upstreams: a bounded label set
    assert _value("scoperouter_upstream_connections", upstream="http://not.in.the.config:1",
                  state="open") is None  # fmt: skip
    assert _value("scoperouter_interception_certificates_minted_total") == before + 5
    assert _value("scoperouter_interception_cache_size") == 2
    counts[BACKEND] = (0, 0)
    minted[0] = 7
    for _ in range(10):
        metrics.flush()
    assert _value("scoperouter_upstream_connections", upstream=BACKEND, state="open") == 0
    assert _value("scoperouter_interception_certificates_minted_total") == before + 7


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (400, "invalid scope in X-Auth-Token: unknown cloud 'X' for 'image'", "unknown_cloud"),
        (400, "invalid scope in X-Scope: expected a JSON object", "bad_scope"),
        (400, "CloudTwo has no orchestration service", "unknown_service"),
        (400, "the scope names 'A' for network but 'B' for compute: ...", "bad_scope"),
        (400, "malformed request", "bad_request"),
        (404, "no service of CloudOne is published at /x", "not_in_catalog"),
        (403, "http://h:1/x is not an endpoint of the federation catalog; ...", "not_in_catalog"),
        (403, "CONNECT h:1: not a destination of the federation catalog; ...", "not_in_catalog"),
        (413, "the request body is larger than ...", "too_large"),
        (431, "too many header fields", "too_large"),
        (408, "the request head took longer than 10s", "timeout"),
        (504, "the router of CloudTwo did not answer within 120s", "timeout"),
        (503, "the router of CloudTwo (x) is marked down (it refused); ...", "upstream_down"),
        (503, "the combined requests' buffer is full", "overloaded"),
        (502, "the image service of CloudOne is unreachable: refused", "upstream_failed"),
        (508, "routing loop: ...", "loop"),
        (418, "<script>anything a client could make the router say</script>", "other"),
    ],
)  # fmt: skip
def test_a_refusal_reason_is_one_of_a_fixed_set(status: int, message: str, reason: str) -> None:
    assert refusal_reason(status, message) == reason
    assert reason in REASONS
