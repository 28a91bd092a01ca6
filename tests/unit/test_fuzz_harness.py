"""The fuzz harness's own logic (tests/fuzz): its gates must fail a run that checked nothing,
and its invariants must flag what they exist for (planted cases, no router needed)."""

from __future__ import annotations

import pytest

from tests.fuzz import families, osb, scopes, tunnel
from tests.integration.backends import Received


def test_a_family_that_sent_nothing_fails_the_run_with_the_reason() -> None:
    [family] = families.plan(["scope"], seconds=100, inputs=1_000_000, only=False).values()
    assert family.minimum == families.MINIMUM["scope"]
    reason = families.minimum_gate(family)  # 0 inputs sent
    assert reason is not None
    assert "[scope] sent 0 inputs" in reason and "a gate that ran nothing" in reason
    family.inputs = family.minimum - 1
    assert families.minimum_gate(family) is not None
    family.inputs = family.minimum
    assert families.minimum_gate(family) is None


def test_time_and_inputs_are_shared_and_a_small_run_lowers_the_minimum() -> None:
    plan = families.plan(families.FAMILIES, seconds=100, inputs=1_000_000, only=False)
    assert sum(f.seconds for f in plan.values()) == pytest.approx(100)
    assert sum(f.quota for f in plan.values()) <= 1_000_000
    small = families.plan(["raw", "osb"], seconds=10, inputs=50, only=False)
    assert all(f.minimum <= f.quota for f in small.values())
    one = families.plan(["tunnel"], seconds=10, inputs=50, only=True)["tunnel"]
    assert (one.quota, one.minimum) == (1, 0)


def test_family_selection() -> None:
    assert families.select("all") == list(families.FAMILIES)
    assert families.select("osb,raw") == ["raw", "osb"]
    with pytest.raises(ValueError, match="unknown family"):
        families.select("raw,nope")


def test_two_backend_requests_for_one_cloud_are_flagged() -> None:
    expression = "CloudOne & cloudone"
    named = {7: families.distinct_clouds(expression), 8: families.distinct_clouds("A & B")}
    assert named == {7: 1, 8: 2}
    found = families.amplification(named, {7: 2, 8: 2})
    assert found == [(7, "2 backend requests for one request naming 1 cloud(s)")]
    assert families.amplification(named, {7: 1, 8: 1}) == []


def test_backend_requests_are_attributed_to_their_scope_input() -> None:
    data, text = scopes.request(3, 41, b"127.0.0.64:1")
    assert b"GET /v2/images?fs=41 " in data and text
    received = Received(method="GET", target=b"/v2/images?limit=2&fs=41")
    assert scopes.input_of(received) == 41
    assert scopes.input_of(Received(method="GET", target=b"/v2/images/fz41")) is None


def test_rss_not_back_to_baseline_is_flagged() -> None:
    found = families.rss_back({"w1": 100.0, "w2": 100.0}, {"w1": 110.0, "w2": 300.0}, 16)
    assert found == ["w2: RSS 100.0 -> 300.0 MB (more than +16)"]


def test_a_tunnel_request_forwarded_in_absolute_form_or_another_host_is_flagged() -> None:
    rid = b"fz%d" % (tunnel.BASE + 5)
    access = {
        rid.decode(): [{"method": "GET", "path": "https://127.0.1.64:80/v2/images/" + rid.decode()}]
    }

    def received(target: bytes, host: bytes) -> Received:
        return Received(
            method="GET",
            target=target,
            fields=[(b"Host", host), (b"X-Scope-Request-Id", rid)],
        )

    good = received(b"/v2/images/" + rid, b"127.0.1.64:80")
    assert tunnel.owner(good) == 5
    assert tunnel.check_received(good, access) is None
    absolute = received(b"http://127.0.8.99:80/v2/images/" + rid, b"127.0.8.99")
    assert "not origin-form" in (tunnel.check_received(absolute, access) or "")
    other_host = received(b"/v2/images/" + rid, b"127.0.8.99")
    assert "where the access log has" in (tunnel.check_received(other_host, access) or "")
    unlogged = received(b"/v2/images/other", b"127.0.1.64:80")
    assert "does not show" in (tunnel.check_received(unlogged, access) or "")


def test_an_evaluated_template_is_recognised_and_answers_are_osb_json() -> None:
    item = osb.generate(11, 0, {"service_id": "s", "plan_id": "p"}, "/tmp/c", [])
    assert item.products  # every payload with arithmetic keeps its result
    product = item.products[0]
    assert osb.evaluated(f"Could not find image {product}", item.products, "/h") is not None
    assert osb.evaluated("No Network found for /h", [], "/h") is not None
    assert osb.evaluated("{{ 7*7 }}", item.products, "/h") is None
    assert osb.check_answer(202, '{"operation": "x"}') is None
    assert osb.check_answer(400, '{"error": "x"}') is not None  # no description
    assert osb.check_answer(500, '{"description": "x"}') is not None
    assert osb.check_answer(400, "<html>") is not None


def test_an_osb_input_is_the_same_request_replayed_alone() -> None:
    """--only N --show replays input N without the instances an earlier run had made: its
    request (method, target, body) must not depend on them, only its run flag may."""
    ids = {"service_id": "s", "plan_id": "p"}
    for n in range(200):
        alone = osb.generate(5, n, ids, "/c/c", [])
        in_run = osb.generate(5, n, ids, "/c/c", ["fo1", "fo2"])
        if "fo1" in in_run.path or "fo2" in in_run.path:
            continue  # an update or a binding of an earlier instance
        assert (alone.method, alone.path, alone.body) == (in_run.method, in_run.path, in_run.body)


def test_tunnel_inputs_are_reproducible_and_carry_their_id() -> None:
    targets = [b"127.0.0.64:1", b"127.0.1.64:2"]
    for n in range(50):
        item = tunnel.tunnel_input(9, n, targets)
        assert item == tunnel.tunnel_input(9, n, targets)
        assert item.target in targets


def test_a_stall_of_the_harness_is_seen_and_located() -> None:
    """The harness's own pauses (stalls.py) are measured, not guessed: a blocked loop is
    recorded with where it was, and only exchanges that overlapped it are excused."""
    import asyncio
    import time

    from tests.fuzz.stalls import STALL, StallWatch

    watch = StallWatch()

    async def go() -> tuple[float, float]:
        watch.start()
        await asyncio.sleep(0.1)
        blocked = time.monotonic()
        time.sleep(STALL + 0.2)  # the whole process stops, as a full GC over a big heap does
        await asyncio.sleep(0.1)
        await watch.stop()
        return blocked, time.monotonic()

    blocked, end = asyncio.run(go())
    assert len(watch.stalls) == 1
    assert watch.longest_during(blocked, end) >= STALL
    assert watch.longest_during(end, end + 1) == 0.0  # an exchange after it: not excused
    watch.settle()
    assert watch.figures()["heap_settles"] == 1
