"""``&`` and ``|`` decisions: decide(combined=True) on the sample federation, and the failover
plan (pure; no sockets)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from scoperouter.catalog import Catalog
from scoperouter.config import build_catalog
from scoperouter.errors import Reject
from scoperouter.failover import (
    Failure,
    all_down_message,
    candidates,
    classify,
    exhausted_message,
    moves_on,
)
from scoperouter.merge import ResourcePlan
from scoperouter.routing import Failover, FanOut, Forward, RequestFacts, decide
from scoperouter.scope import CloudName

from .conftest import SAMPLE


@pytest.fixture(scope="module")
def three() -> Catalog:
    """The sample federation and a CloudThree with an image service: '&' names each cloud in
    one of its parts only, so a failover inside a fan-out needs three."""
    doc = yaml.safe_load(SAMPLE.read_text())
    clouds = doc["clouds"]
    third = copy.deepcopy(clouds["CloudTwo"])
    third.update(
        region="CloudThree",
        frontends=[{"url": "http://127.0.0.4:9292"}],
        services={
            "image": {
                "public": {"url": "http://127.0.0.4:9292", "backend": "http://127.0.1.4:9292"}
            }
        },
    )
    for key in ("proxy", "metrics", "credentials"):
        third.pop(key, None)
    clouds["CloudThree"] = third
    return build_catalog(doc, base_dir=SAMPLE.parent)


def facts(
    scope: str, path: str = "/v2/images", method: str = "GET", port: int = 9292
) -> RequestFacts:
    return RequestFacts(
        method=method,
        scheme="http",
        host="127.0.0.2",
        port=port,
        path=path,
        headers={"x-auth-token": f"tok!SCOPE!{scope}"},
    )


def test_a_caller_that_does_not_combine_gets_501(catalog: Catalog) -> None:
    for expression in ("CloudOne & CloudTwo", "CloudOne | CloudTwo"):
        decision = decide(facts(f'{{"image": "{expression}"}}'), catalog, "CloudOne")
        assert isinstance(decision, Reject) and decision.status == 501
        assert "not supported here" in decision.message


def test_and_on_a_list_is_a_fan_out_with_one_forward_per_cloud(catalog: Catalog) -> None:
    f = facts('{"image": "CloudTwo & CloudOne"}', "/v2/images?limit=3")
    decision = decide(f, catalog, "CloudOne", combined=True)
    assert isinstance(decision, FanOut)
    assert decision.expression == "CloudTwo & CloudOne"
    assert [label for label, _ in decision.parts] == ["CloudTwo", "CloudOne"]
    two, one = (part for _, part in decision.parts)
    assert isinstance(two, Forward) and isinstance(one, Forward)
    # Each part is exactly what a single-cloud scope would decide for that cloud.
    for cloud, part in (("CloudTwo", two), ("CloudOne", one)):
        single = decide(facts(f'{{"image": "{cloud}"}}', "/v2/images?limit=3"), catalog, "CloudOne")
        assert isinstance(single, Forward)
        assert (part.cloud, part.remote, part.url) == (single.cloud, single.remote, single.url)
    assert two.url == "http://127.0.0.3:9292/v2/images?limit=3" and two.remote
    assert one.url == "http://127.0.1.2:9292/v2/images?limit=3" and not one.remote
    # Each part's scope names its cloud alone for image (the next router delivers, it does
    # not fan out again); the rest of the scope travels on.
    for cloud, part in (("CloudTwo", two), ("CloudOne", one)):
        carried = json.loads(part.set_headers["x-scope"])
        assert carried["image"] == cloud and carried["compute"] == "CloudOne"
        assert part.set_headers["x-auth-token"] == "tok!SCOPE!" + part.set_headers["x-scope"]
        assert part.scope is not None and part.scope["image"] == CloudName(cloud)
    assert decision.plan.clouds == ("CloudTwo", "CloudOne") and decision.plan.limit == 3


def test_a_part_narrows_the_services_that_follow_its_service(catalog: Catalog) -> None:
    # Completion made placement follow compute's "CloudOne & CloudTwo": each part names its
    # cloud for both, or the next router refuses compute (placement named elsewhere).
    f = facts('{"compute": "CloudOne & CloudTwo"}', "/v2.1/servers", port=8774)
    decision = decide(f, catalog, "CloudOne", combined=True)
    assert isinstance(decision, FanOut)
    for label, part in decision.parts:
        assert isinstance(part, Forward)
        carried = json.loads(part.set_headers["x-scope"])
        assert carried["compute"] == carried["placement"] == label
        again = decide(
            facts(part.set_headers["x-scope"], "/v2.1/servers", port=8774), catalog, label
        )
        assert isinstance(again, Forward) and again.cloud == label and not again.remote


def test_and_on_a_write_or_below_a_resource_is_a_400(catalog: Catalog) -> None:
    scope = '{"image": "CloudOne & CloudTwo"}'
    for method, path in (
        ("POST", "/v2/images"),
        ("DELETE", "/v2/images/x"),
        ("PUT", "/v2/images/x/file"),
        ("GET", "/v2/images/x/file"),  # image data: one cloud's transfer, streamed
    ):
        decision = decide(facts(scope, path, method), catalog, "CloudOne", combined=True)
        assert isinstance(decision, Reject) and decision.status == 400, decision
        assert "'&' only reads, a list" in decision.message and path in decision.message


def test_and_on_one_resource_asks_every_cloud_for_it_as_sent(catalog: Catalog) -> None:
    f = facts('{"image": "CloudTwo & CloudOne"}', "/v2/images/abc?x=1")
    decision = decide(f, catalog, "CloudOne", combined=True)
    assert isinstance(decision, FanOut) and isinstance(decision.plan, ResourcePlan)
    assert decision.plan.asked == ("CloudTwo", "CloudOne")
    two, one = (part for _, part in decision.parts)
    assert isinstance(two, Forward) and isinstance(one, Forward)
    assert two.url == "http://127.0.0.3:9292/v2/images/abc?x=1" and two.remote
    assert one.url == "http://127.0.1.2:9292/v2/images/abc?x=1" and not one.remote
    assert json.loads(two.set_headers["x-scope"])["image"] == "CloudTwo"
    assert decision.plan.query_for("CloudTwo") is None  # the request's own path and query


def test_and_on_one_resource_with_a_failover_inside(three: Catalog) -> None:
    f = facts('{"image": "CloudOne & (CloudTwo | CloudThree)"}', "/v2/images/abc")
    decision = decide(f, three, "CloudOne", combined=True)
    assert isinstance(decision, FanOut) and isinstance(decision.parts[1][1], Failover)


def test_or_is_a_failover_in_order_for_any_method(catalog: Catalog) -> None:
    decision = decide(
        facts('{"image": "CloudTwo | CloudOne"}', "/v2/images/x", "DELETE"),
        catalog,
        "CloudOne",
        combined=True,
    )
    assert isinstance(decision, Failover)
    assert [c.cloud for c in decision.candidates if isinstance(c, Forward)] == [
        "CloudTwo",
        "CloudOne",
    ]


def test_nested_expressions(catalog: Catalog, three: Catalog) -> None:
    decision = decide(
        facts('{"image": "(CloudTwo | CloudThree) & CloudOne"}'), three, "CloudOne", combined=True
    )
    assert isinstance(decision, FanOut)
    (label, inner), (_, last) = decision.parts
    assert label == "CloudTwo | CloudThree" and isinstance(inner, Failover)
    assert isinstance(last, Forward)
    decision = decide(
        facts('{"image": "CloudTwo | CloudOne & CloudTwo"}'), catalog, "CloudOne", combined=True
    )
    assert isinstance(decision, Failover)
    assert isinstance(decision.candidates[0], Forward)
    assert isinstance(decision.candidates[1], FanOut)


def test_unknown_cloud_in_an_expression_is_still_a_400(catalog: Catalog) -> None:
    decision = decide(facts('{"image": "CloudOne & Nowhere"}'), catalog, "CloudOne", combined=True)
    assert isinstance(decision, Reject) and decision.status == 400
    assert "unknown cloud 'Nowhere'" in decision.message


@pytest.mark.parametrize(
    ("method", "status", "failure", "expected"),
    [
        ("GET", 200, None, False),
        ("GET", 404, None, False),  # a 4xx is the answer
        ("GET", 409, None, False),
        ("GET", 500, None, True),
        ("GET", 503, None, True),
        ("GET", None, Failure.TIMEOUT, True),
        ("GET", None, Failure.NOT_SENT, True),
        ("DELETE", None, Failure.BROKEN, True),  # idempotent
        ("PUT", 502, None, True),
        ("POST", 500, None, False),  # may have taken effect
        ("POST", None, Failure.TIMEOUT, False),
        ("POST", None, Failure.BROKEN, False),
        ("POST", None, Failure.NOT_SENT, True),  # nothing was sent
        ("PATCH", None, Failure.NOT_SENT, True),
        ("PATCH", 500, None, False),
    ],
)
def test_which_failures_move_to_the_next_cloud(
    method: str, status: int | None, failure: Failure | None, expected: bool
) -> None:
    assert moves_on(method, classify(status, failure)) is expected


def test_clouds_marked_down_are_skipped_by_the_engines_predicate(catalog: Catalog) -> None:
    decision = decide(facts('{"image": "CloudTwo | CloudOne"}'), catalog, "CloudOne", combined=True)
    assert isinstance(decision, Failover)
    forwards = [c for c in decision.candidates if isinstance(c, Forward)]
    down = {"http://127.0.0.3:9292": "it refused the connection"}

    def is_down(forward: Forward) -> str | None:  # what the engine's peer health answers
        scheme, _, rest = forward.url.partition("://")
        return down.get(f"{scheme}://{rest.partition('/')[0]}")

    tried, skipped = candidates(forwards, is_down)
    assert [f.cloud for f in tried] == ["CloudOne"]
    assert [(s.candidate.cloud, s.reason) for s in skipped] == [
        ("CloudTwo", "it refused the connection")
    ]
    assert candidates(forwards) == (forwards, [])
    down["http://127.0.1.2:9292"] = "it did not answer in time"
    tried, skipped = candidates(forwards, is_down)
    assert tried == []
    assert all_down_message(skipped) == (
        "CloudTwo | CloudOne: every cloud is marked down (CloudTwo: it refused the connection; "
        "CloudOne: it did not answer in time); retry later"
    )
    assert (
        exhausted_message("image", [("CloudTwo", "x"), ("CloudOne", "y")])
    ) == "CloudTwo | CloudOne for 'image': no cloud answered (CloudTwo: x; CloudOne: y)"
