"""The status page's data and HTML (scoperouter.router.status, .status_page) from fake samples.
Real routers:
tests/integration/test_status.py; in Chromium on the lab: tests/e2e/test_status.py."""

from __future__ import annotations

import math
import re

import pytest

from scoperouter.config import load_catalog
from scoperouter.router.facts import RouterFacts, Workers
from scoperouter.router.status import (
    Ring,
    Sample,
    quantile,
    sample_of,
    status_document,
)
from scoperouter.router.status_page import render

from .conftest import SAMPLE

HOSTILE = '<script>alert("x")</script>'


def _facts(cloud: str = "CloudOne") -> RouterFacts:
    facts = RouterFacts(cloud, "asyncio")
    facts.loaded(load_catalog(SAMPLE), SAMPLE.read_text(), now=1000.0)
    return facts


def _families(ok: float, errors: float, fast: float, down: bool) -> dict[str, list]:
    """The workers' metrics added up: `ok` 200s and `errors` 502s of image to CloudTwo,
    `fast` of them within 10 ms (the others within 100 ms)."""
    total = ok + errors
    buckets = [("0.01", fast), ("0.1", total), ("+Inf", total)]
    two = "http://127.0.0.3:9292"
    return {
        "scoperouter_requests_total": [
            ({"service": "image", "cloud": "CloudTwo", "status": "200"}, ok),
            ({"service": "image", "cloud": "CloudTwo", "status": "502"}, errors),
        ],
        "scoperouter_request_duration_seconds_bucket": [
            ({"service": "image", "decision": "remote", "le": le}, n) for le, n in buckets
        ],
        "scoperouter_upstream_up": [
            (
                {"cloud": "CloudTwo", "kind": "peer", "service": "image", "upstream": two},
                0.0 if down else 1.0,
            ),
        ],
        "scoperouter_breaker_open": [({"upstream": two}, 1.0 if down else 0.0)],
        "scoperouter_upstream_connections": [
            ({"upstream": two, "state": "open"}, 4.0),
            ({"upstream": two, "state": "idle"}, 3.0),
        ],
        "scoperouter_peer_connections_opened_total": [
            ({"upstream": two, "reason": "request"}, 2.0)
        ],
        "scoperouter_refusals_total": [
            ({"reason": "unknown_cloud"}, errors),
            ({"reason": "timeout"}, 0.0),
        ],
        "scoperouter_interception_certificates_minted_total": [({}, 3.0)],
        "scoperouter_interception_cache_size": [({}, 2.0)],
    }


def test_rates_ratios_and_quantiles_come_from_the_ring() -> None:
    ring = Ring(size=4)
    ring.add(sample_of(_families(100, 0, 100, False), at=1000.0))
    ring.add(sample_of(_families(200, 0, 150, False), at=1030.0))
    ring.add(sample_of(_families(690, 10, 550, True), at=1060.0))  # +500 ok, +10 errors
    doc = status_document(_facts(), Workers(2, 2, 1), [], "ok", ring.samples(), now=1061.0)
    traffic = doc["traffic"]
    # req/s over the last minute: 600 answers in 60 s
    assert traffic["requests_per_second"] == 10.0
    assert traffic["error_ratio"] == round(10 / 600, 4)
    # 450 of the 600 within 10 ms: p50 inside the first bucket, p99 inside the second
    assert 0 < traffic["p50_seconds"] <= 0.01 < traffic["p99_seconds"] <= 0.1
    assert doc["routes"] == [
        {"service": "image", "cloud": "CloudTwo", "requests_per_second": 10.0,
         "requests": 600.0, "errors": 10.0, "error_ratio": round(10 / 600, 4)},
    ]  # fmt: skip
    assert doc["refusals"] == [{"reason": "unknown_cloud", "count": 10.0, "total": 10.0}]
    link = next(u for u in doc["upstreams"] if u["upstream"] == "http://127.0.0.3:9292")
    assert link["up"] is False and link["breaker_open"] is True
    assert (link["open_connections"], link["idle_connections"]) == (4.0, 3.0)
    assert link["handshakes_on_request_path"] == 2.0
    assert doc["upstreams"][0] is link  # problems first
    assert doc["breakers_open"] == 1
    assert doc["peer_links"]["up"] == doc["peer_links"]["total"] - 1
    assert doc["workers"] == {"running": 2, "wanted": 2, "restarts": 1, "processes": []}
    assert doc["forward_proxy"]["certificates_minted"] == 3.0
    assert doc["config"]["generation"] == 1 and len(doc["config"]["digest"]) == 12


def test_one_sample_computes_nothing_and_says_so() -> None:
    ring = Ring()
    ring.add(sample_of(_families(1, 0, 1, False), at=1.0))
    doc = status_document(_facts(), Workers(1, 1, 0), [], "ok", ring.samples(), now=2.0)
    assert doc["traffic"]["requests_per_second"] is None
    assert doc["traffic"]["p99_seconds"] is None and doc["routes"] == []


def test_the_ring_is_bounded() -> None:
    ring = Ring(size=3)
    for at in range(10):
        ring.add(Sample(float(at), {}, {}, {}, {}, {}, {}, {}))
    assert [s.at for s in ring.samples()] == [7.0, 8.0, 9.0]


def test_quantile_interpolates_as_prometheus_does() -> None:
    buckets = {0.1: 50.0, 0.2: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.75, buckets) == pytest.approx(0.15)
    assert quantile(0.99, {0.1: 0.0, math.inf: 10.0}) == 0.1  # past the last bound
    assert quantile(0.5, {math.inf: 0.0}) is None


def test_hostile_names_are_text_in_the_page() -> None:
    facts = _facts()
    facts.cloud = HOSTILE
    doc = status_document(facts, Workers(1, 1, 0), [], HOSTILE, [], now=1.0)
    doc["certificates"] = [{"role": HOSTILE, "subject": HOSTILE, "not_after": 0, "days_left": 1}]
    doc["upstreams"][0]["upstream"] = HOSTILE
    page = render(doc)
    assert "<script>" not in page and "alert(" in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert '<meta name="viewport"' in page and 'http-equiv="refresh"' in page
    assert "max-width:600px" in page  # one column on a phone
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing from elsewhere
