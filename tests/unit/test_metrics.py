"""The router's metrics (scoperouter.router.metrics): tallied per worker, handed to
prometheus-client once per tick (:meth:`Metrics.flush`), with the values observing each request
directly would give. The same in real router processes: tests/integration/test_health.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from scoperouter.proxy.worker import Worker
from scoperouter.router import metrics
from scoperouter.router.config import RouterConfig
from scoperouter.router.health import UpstreamHealth
from scoperouter.router.metrics import BUCKETS, Metrics
from scoperouter.router.state import RequestState
from scoperouter.routing import Failover, Forward

from ..integration.routers import cloud_entry, write_config
from .conftest import SAMPLE

# Durations on each side of the bounds, on them, and past the last (the +Inf bucket).
DURATIONS = [0.0, 1e-9, 0.001, 0.0010001, 0.002, 0.0025, 0.007, 0.05, 0.3, 1.0, 1.5, 29.9]
DURATIONS += [30.0, 119.0, 120.0, 120.5, 9999.0, 0.001, 0.001, 0.3]


@pytest.fixture
def counted() -> Metrics:
    config = RouterConfig()
    config.load(str(SAMPLE), "CloudOne")
    return Metrics(config, UpstreamHealth(config))


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _state(decision: Forward | Failover | None) -> RequestState:
    state = RequestState(request_id="req-1", headers={}, method="GET", path="/", started=0.0)
    state.decision = decision
    return state


LOCAL = Forward(
    cloud="CloudOne", service_type="image", interface="public", remote=False,
    url="http://127.0.1.2:9292/v2/images",
)  # fmt: skip


def test_counts_reach_prometheus_at_the_flush_summed(counted: Metrics) -> None:
    local = {"service": "image", "cloud": "CloudOne", "decision": "local", "status": "200"}
    failover = {"service": "image", "cloud": "CloudTwo", "decision": "failover", "status": "200"}
    refused = {"service": "-", "cloud": "-", "decision": "refused", "status": "400"}

    def requests() -> list[float]:
        return [
            _sample("scoperouter_requests_total", **labels) for labels in (local, failover, refused)
        ]

    before = requests()
    durations = _sample("scoperouter_request_duration_seconds_count", service="image",
                        decision="local")  # fmt: skip
    for _ in range(7):
        counted.count(_state(LOCAL), 200)
    answered = _state(Failover("image", "CloudDown | CloudTwo", ()))
    answered.answered = "CloudTwo"  # the cloud whose answer the failover returned
    counted.count(answered, 200)
    counted.count(_state(None), 400)
    counted.count(_state(None), 400)
    # nothing per request reaches prometheus-client ...
    assert requests() == before
    counted.flush()  # ... until the flush, with every request of the tick
    assert requests() == [before[0] + 7, before[1] + 1, before[2] + 2]
    assert (
        _sample("scoperouter_request_duration_seconds_count", service="image", decision="local")
        == durations + 7
    )
    counted.flush()  # a flush with nothing new adds nothing
    assert requests() == [before[0] + 7, before[1] + 1, before[2] + 2]


def test_the_histogram_is_the_one_observing_each_request_would_make(counted: Metrics) -> None:
    """Bucket by bucket (the first bound >= the duration, as Histogram.observe picks), the
    count, and the sum; the key of a status the router never answered (0) included."""
    own = CollectorRegistry()
    direct = Histogram("direct_seconds", "reference", ["service", "decision"], registry=own,
                       buckets=BUCKETS).labels("x", "y")  # fmt: skip
    labels = {"service": "-", "decision": "refused"}
    name = "scoperouter_request_duration_seconds"
    bounds = [*(str(float(b)) for b in BUCKETS), "+Inf"]
    before = {le: _sample(name + "_bucket", le=le, **labels) for le in bounds}
    before_sum, before_count = _sample(name + "_sum", **labels), _sample(name + "_count", **labels)
    requests = _sample("scoperouter_requests_total", status="-", cloud="-", **labels)
    for seconds in DURATIONS:
        direct.observe(seconds)
        counted._observe(("-", "-", "refused", 0), seconds)
    counted.flush()
    for le in bounds:
        expected = own.get_sample_value("direct_seconds_bucket", {"le": le, "service": "x",
                                                                  "decision": "y"})  # fmt: skip
        assert _sample(name + "_bucket", le=le, **labels) - before[le] == expected, le
    assert _sample(name + "_count", **labels) - before_count == len(DURATIONS)
    assert _sample(name + "_sum", **labels) - before_sum == pytest.approx(sum(DURATIONS))
    assert _sample("scoperouter_requests_total", status="-", cloud="-", **labels) == (
        requests + len(DURATIONS)
    )


def test_connections_peer_connections_and_stripped_heads_are_flushed(counted: Metrics) -> None:
    open_before = _sample("scoperouter_open_connections")
    peer = {"upstream": "https://127.0.0.3:9443", "reason": "ahead"}
    peer_before = _sample("scoperouter_peer_connections_opened_total", **peer)
    stripped_before = _sample("scoperouter_identity_fields_stripped_total")
    for _ in range(5):
        counted.opened()
    counted.closed()
    counted.closed()
    for _ in range(3):
        counted.peer_connection("https://127.0.0.3:9443", "ahead")
    counted.stripped()
    assert _sample("scoperouter_open_connections") == open_before
    counted.flush()
    assert _sample("scoperouter_open_connections") == open_before + 3
    assert _sample("scoperouter_peer_connections_opened_total", **peer) == peer_before + 3
    assert _sample("scoperouter_identity_fields_stripped_total") == stripped_before + 1
    for _ in range(3):
        counted.closed()
    counted.flush()  # more closed than opened in a tick: the gauge goes down
    assert _sample("scoperouter_open_connections") == open_before


class _Broken:
    def inc(self, amount: float = 1) -> None:
        raise OSError(28, "No space left on device")


def test_a_failing_flush_never_raises_and_is_logged_once(
    counted: Metrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's tick flushes, then checks every deadline: a metrics file that cannot be
    written (a full disk) must not stop it, nor log at every tick."""
    monkeypatch.setattr(metrics, "OPEN_CONNECTIONS", _Broken())
    with caplog.at_level(logging.ERROR, logger="scoperouter"):
        for _ in range(3):
            counted.opened()
            counted.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "updating the metrics failed (the counts of a tick are lost)"
    ]
    monkeypatch.undo()
    caplog.clear()
    counted.opened()
    counted.closed()
    counted.flush()  # works again (a zero difference: nothing to write)
    counted.opened()
    monkeypatch.setattr(metrics, "OPEN_CONNECTIONS", _Broken())
    with caplog.at_level(logging.ERROR, logger="scoperouter"):
        counted.flush()  # a new failure after a success is logged again
    assert len(caplog.records) == 1


def test_a_worker_hands_its_last_counts_over_when_it_stops(tmp_path: Path) -> None:
    """What was answered after the last tick is not lost: the worker's close flushes (a real
    Worker of a one-cloud config, in this process; nothing listens)."""
    config = write_config(
        tmp_path / "f.yaml", {"CloudOne": cloud_entry("127.0.0.250", {"image": (9, "", _BACKEND)})}
    )
    labels = {"service": "-", "cloud": "-", "decision": "refused", "status": "400"}

    async def answer_then_stop() -> tuple[float, float]:
        worker = Worker(str(config), "CloudOne", tmp_path)
        state = RequestState(request_id="r", headers={}, method="GET", path="/", started=0.0)
        worker.pipeline.done(state, 400)  # after the last tick
        tallied = _sample("scoperouter_requests_total", **labels)
        await worker._close()
        return tallied, _sample("scoperouter_requests_total", **labels)

    before = _sample("scoperouter_requests_total", **labels)
    assert asyncio.run(answer_then_stop()) == (before, before + 1)


_BACKEND = "http://127.0.1.250:9"
