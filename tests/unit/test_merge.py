"""``A & B`` merged lists: planning, merging and paging, on list answers captured from the lab's
services (tests/unit/fixtures/merge, no tokens) and on simulated clouds (property tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter.errors import Reject
from scoperouter.merge import (
    COLLECTIONS,
    MARKER_PREFIX,
    MISSING_HEADER,
    ORIGIN_KEY,
    CloudAnswer,
    CloudFailure,
    ListPlan,
    Merged,
    collection_of,
    decode_marker,
    encode_marker,
    max_marker_length,
    merge_list,
    plan_list,
)

FIXTURES = Path(__file__).parent / "fixtures" / "merge"
BASE = "http://127.0.0.2:8774"
CLOUDS = ("CloudOne", "CloudTwo")


def captured(cloud: str, name: str) -> tuple[dict[str, Any], CloudAnswer]:
    data = json.loads((FIXTURES / f"{cloud.lower()}-{name}.json").read_text())
    headers = {k.lower(): v for k, v in data["headers"].items()}
    return data, CloudAnswer(data["status"], headers, json.dumps(data["body"]).encode())


def plan(
    service_type: str, path: str, clouds: tuple[str, ...] = CLOUDS, **headers: str
) -> ListPlan:
    result = plan_list(service_type, "GET", path, clouds, headers)
    assert isinstance(result, ListPlan), result
    return result


def body_of(merged: Merged) -> dict[str, Any]:
    assert merged.headers["content-type"].startswith("application/json")
    result = json.loads(merged.body)
    assert isinstance(result, dict)
    return result


def query_of(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query))


# --- captured answers ----------------------------------------------------------------------


def test_image_list_has_each_clouds_images_once_in_order_with_their_origin() -> None:
    one, answer_one = captured("CloudOne", "image-v2_images")
    two, answer_two = captured("CloudTwo", "image-v2_images")
    p = plan("image", "/v2/images")
    assert p.target("CloudOne") == "/v2/images"
    merged = merge_list(p, {"CloudOne": answer_one, "CloudTwo": answer_two}, BASE)
    assert merged.status == 200
    body = body_of(merged)
    expected = [i["id"] for i in one["body"]["images"]] + [i["id"] for i in two["body"]["images"]]
    assert [i["id"] for i in body["images"]] == expected
    assert len(set(expected)) == len(expected) > 2
    origins = [i[ORIGIN_KEY] for i in body["images"]]
    assert origins == ["CloudOne"] * len(one["body"]["images"]) + ["CloudTwo"] * len(
        two["body"]["images"]
    )
    # The rest of each item is the cloud's, untouched.
    assert {k: v for k, v in body["images"][0].items() if k != ORIGIN_KEY} == one["body"]["images"][
        0
    ]
    assert body["first"] == "/v2/images" and "next" not in body


def test_glance_pages_follow_the_merged_marker_to_each_cloud() -> None:
    one, answer_one = captured("CloudOne", "image-v2_images-limit1")
    _, answer_two = captured("CloudTwo", "image-v2_images-limit1")
    p = plan("image", "/v2/images?limit=1&visibility=all")
    assert query_of(p.target("CloudOne")) == {"limit": "1", "visibility": "all"}
    body = body_of(merge_list(p, {"CloudOne": answer_one, "CloudTwo": answer_two}, BASE))
    # One item: CloudOne's; CloudOne has more, so CloudTwo's first image waits its turn.
    assert [i[ORIGIN_KEY] for i in body["images"]] == ["CloudOne"]
    assert body["first"] == "/v2/images?visibility=all&limit=1"
    nxt = body["next"]
    assert nxt.startswith("/v2/images?") and query_of(nxt)["visibility"] == "all"
    # The client follows the link: each cloud gets its own marker.
    second = plan("image", nxt)
    first_id = one["body"]["images"][0]["id"]
    assert query_of(second.target("CloudOne")) == {
        "limit": "1",
        "marker": first_id,
        "visibility": "all",
    }
    assert "marker" not in query_of(second.target("CloudTwo"))


def test_nova_next_link_is_absolute_at_the_router() -> None:
    _, answer_one = captured("CloudOne", "compute-servers_detail-limit1")
    _, answer_two = captured("CloudTwo", "compute-servers_detail-limit1")
    p = plan("compute", "/v2.1/servers/detail?limit=1")
    body = body_of(merge_list(p, {"CloudOne": answer_one, "CloudTwo": answer_two}, BASE))
    assert len(body["servers"]) == 1
    [link] = body["servers_links"]
    assert link["rel"] == "next"
    assert link["href"].startswith(BASE + "/v2.1/servers/detail?limit=1&marker=" + MARKER_PREFIX)


def test_keystone_links_object() -> None:
    _, answer_one = captured("CloudOne", "identity-v3_regions")
    _, answer_two = captured("CloudTwo", "identity-v3_regions")
    p = plan("identity", "/v3/regions")
    body = body_of(merge_list(p, {"CloudOne": answer_one, "CloudTwo": answer_two}, BASE))
    assert [r[ORIGIN_KEY] for r in body["regions"]] == ["CloudOne", "CloudTwo"]
    assert body["links"] == {"self": BASE + "/v3/regions", "previous": None, "next": None}


def test_a_failing_cloud_fails_the_request_naming_it() -> None:
    _, answer_one = captured("CloudOne", "image-v2_images")
    _, forbidden = captured("CloudTwo", "placement-resource_providers")  # a real 403
    merged = merge_list(
        plan("placement", "/resource_providers"),
        {
            "CloudOne": captured("CloudOne", "placement-resource_providers")[1],
            "CloudTwo": forbidden,
        },
        BASE,
    )
    error = body_of(merged)["error"]
    assert merged.status == error["code"] == 403
    assert "CloudOne, CloudTwo failed" in error["message"]
    assert "it answered 403: Access was denied" in error["message"]
    # An image list where CloudTwo does not answer in time: 504, naming it, and how to get the rest.
    p = plan("image", "/v2/images")
    merged = merge_list(
        p,
        {"CloudOne": answer_one, "CloudTwo": CloudFailure(504, "it did not answer in time")},
        BASE,
    )
    message = body_of(merged)["error"]["message"]
    assert merged.status == 504
    assert "CloudTwo failed (CloudTwo: it did not answer in time)" in message
    assert "X-Scope-Partial: allow" in message


def test_partial_results_name_the_missing_clouds_and_keep_their_place() -> None:
    one, answer_one = captured("CloudOne", "image-v2_images-limit1")
    p = plan("image", "/v2/images?limit=5", **{"x-scope-partial": "allow"})
    merged = merge_list(
        p,
        {"CloudOne": answer_one, "CloudTwo": CloudFailure(502, "it refused the connection")},
        BASE,
    )
    assert merged.status == 200 and merged.headers[MISSING_HEADER] == "CloudTwo"
    body = body_of(merged)
    assert [i[ORIGIN_KEY] for i in body["images"]] == ["CloudOne"]
    states = decode_marker(query_of(body["next"])["marker"], CLOUDS)
    assert states == {"CloudOne": one["body"]["images"][0]["id"], "CloudTwo": ""}
    # Every cloud failing is a failure even with partial results allowed.
    everyone = {c: CloudFailure(502, "it refused the connection") for c in CLOUDS}
    assert merge_list(p, everyone, BASE).status == 502


def test_a_cloud_answer_that_is_not_the_list_is_a_502_naming_it() -> None:
    _, answer_one = captured("CloudOne", "image-v2_images")
    p = plan("image", "/v2/images")
    for bad in (b"<html>", b'{"images": {"not": "a list"}}', b'{"images": [1, 2]}'):
        merged = merge_list(
            p, {"CloudOne": answer_one, "CloudTwo": CloudAnswer(200, {}, bad)}, BASE
        )
        assert merged.status == 502 and "CloudTwo" in body_of(merged)["error"]["message"]
    merged = merge_list(
        p,
        {
            "CloudOne": answer_one,
            "CloudTwo": CloudAnswer(500, {}, b'{"error": {"message": "boom"}}'),
        },
        BASE,
    )
    assert merged.status == 502 and "it answered 500: boom" in body_of(merged)["error"]["message"]


# --- what '&' serves -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service_type", "method", "path", "collection"),
    [
        ("compute", "GET", "/v2.1/servers/detail?limit=2", "servers"),
        ("compute", "GET", "/v2.1/servers", "servers"),
        ("compute", "GET", "/v2.1/0123abcd/flavors/detail", "flavors"),  # project in the URL
        ("image", "GET", "/v2/images?visibility=public", "images"),
        ("identity", "GET", "/v3/auth/projects", "projects"),
        ("network", "GET", "/v2.0/networks", "networks"),
        ("compute", "GET", "/v2.1/servers/some-id", None),  # one resource
        ("compute", "POST", "/v2.1/servers", None),  # a write
        ("image", "DELETE", "/v2/images", None),
        ("image", "GET", "/v2/images/some-id/file", None),
        ("object-store", "GET", "/v1/AUTH_x", None),  # no table entry
    ],
)
def test_which_requests_are_reads_of_a_list(
    service_type: str, method: str, path: str, collection: str | None
) -> None:
    found = collection_of(service_type, method, path)
    assert (found.key if found else None) == collection


def test_every_collection_of_the_table_is_found_by_its_own_path() -> None:
    for service_type, collections in COLLECTIONS.items():
        for collection in collections:
            path = "/prefix/" + "/".join(collection.suffix)
            assert collection_of(service_type, "GET", path) == collection


def test_writes_and_single_resources_are_refused_with_a_400() -> None:
    for method, path in (
        ("POST", "/v2/images"),
        ("GET", "/v2/images/abc"),
        ("PATCH", "/v2/images"),
    ):
        refused = plan_list("image", method, path, CLOUDS, {})
        assert isinstance(refused, Reject) and refused.status == 400
        assert "'&' only merges reads of a list" in refused.message
        assert "CloudOne & CloudTwo" in refused.message


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        ("743cee04-d306-482d-9cdc-32acf9a6a341", "not made by a merged list"),  # a cloud's own
        (MARKER_PREFIX + "!!!not base64", "garbled"),
        (MARKER_PREFIX + "bm90IGpzb24", "garbled"),  # "not json"
        (encode_marker({"CloudOne": "", "CloudThree": ""}), "made for other clouds"),
        (encode_marker({"CloudTwo": "", "CloudOne": ""}), "made for other clouds"),  # order
        (encode_marker({"CloudOne": "x" * 300, "CloudTwo": ""}), "not a marker"),
        (MARKER_PREFIX + "A" * max_marker_length(CLOUDS), "longer than"),
    ],
)
def test_a_forged_or_garbled_marker_is_a_400(marker: str, why: str) -> None:
    refused = plan_list("image", "GET", f"/v2/images?marker={marker}", CLOUDS, {})
    assert isinstance(refused, Reject) and refused.status == 400
    assert why in refused.message and "invalid marker" in refused.message


def test_the_longest_marker_of_any_clouds_is_accepted() -> None:
    clouds = tuple(f"Cl\u00f6ud{n}" for n in range(40))
    longest = encode_marker({c: "\u00e9" * 255 for c in clouds})
    assert len(longest) <= max_marker_length(clouds)
    assert decode_marker(longest, clouds) == {c: "\u00e9" * 255 for c in clouds}


def test_a_bad_limit_is_a_400() -> None:
    for limit in ("-1", "ten", "9" * 20):
        refused = plan_list("image", "GET", f"/v2/images?limit={limit}", CLOUDS, {})
        assert isinstance(refused, Reject) and refused.status == 400


def test_a_marker_with_every_cloud_done_is_an_empty_last_page() -> None:
    marker = encode_marker({"CloudOne": None, "CloudTwo": None})
    p = plan("image", f"/v2/images?marker={marker}")
    assert p.asked == ()
    assert body_of(merge_list(p, {}, BASE)) == {"images": [], "first": "/v2/images"}


def test_a_finished_cloud_is_not_asked_again() -> None:
    marker = encode_marker({"CloudOne": None, "CloudTwo": "abc"})
    p = plan("image", f"/v2/images?marker={marker}")
    assert p.asked == ("CloudTwo",)
    assert query_of(p.target("CloudTwo")) == {"marker": "abc"}


# --- every item exactly once, whatever the page sizes (simulated clouds) --------------------


def simulated_cloud(ids: list[str], cap: int, query: dict[str, str]) -> CloudAnswer:
    """A glance-like cloud: items after `marker`, at most min(limit, cap) of them, and a next
    link when more remain (cap plays the service's own maximum page size)."""
    start = ids.index(query["marker"]) + 1 if "marker" in query else 0
    size = min(int(query["limit"]), cap) if "limit" in query else cap
    page = ids[start : start + size]
    body: dict[str, Any] = {"images": [{"id": i, "name": i} for i in page]}
    if start + size < len(ids):
        body["next"] = f"/v2/images?marker={page[-1]}"
    return CloudAnswer(200, {"content-type": "application/json"}, json.dumps(body).encode())


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    caps=st.lists(st.integers(1, 6), min_size=4, max_size=4),
    limit=st.one_of(st.none(), st.integers(1, 8)),
)
def test_every_item_exactly_once_in_order_for_any_page_sizes(
    sizes: list[int], caps: list[int], limit: int | None
) -> None:
    clouds = tuple(f"Cloud{n}" for n in range(len(sizes)))
    ids = {c: [f"{c}-{i}" for i in range(n)] for c, n in zip(clouds, sizes, strict=True)}
    path = "/v2/images" if limit is None else f"/v2/images?limit={limit}"
    seen: list[tuple[str, str]] = []
    pages = 0
    while True:
        p = plan("image", path, clouds)
        answers = {
            c: simulated_cloud(ids[c], caps[n], query_of(p.target(c)))
            for n, c in enumerate(clouds)
            if c in p.asked
        }
        body = body_of(merge_list(p, answers, BASE))
        if limit is not None:
            assert len(body["images"]) <= limit
        seen.extend((i[ORIGIN_KEY], i["id"]) for i in body["images"])
        marker = query_of(body.get("next", ""))
        if "marker" in marker:
            assert len(marker["marker"]) < 200 * len(clouds)  # bounded by the clouds, not items
        pages += 1
        assert pages <= sum(sizes) + len(clouds) + 1, "paging does not end"
        if "next" not in body:
            break
        path = body["next"]
    assert seen == [(c, i) for c in clouds for i in ids[c]]


def test_openstacksdk_reads_merged_pages_and_follows_their_next_links() -> None:
    """What the `openstack` CLI does with a merged page: openstacksdk's own resource classes
    parse the items (an image keeps its origin as a property, a server ignores it) and its own
    pagination finds the merged marker in the next link, in each service's format."""
    import requests
    from openstack.compute.v2.server import Server
    from openstack.image.v2.image import Image

    _, one = captured("CloudOne", "image-v2_images-limit1")
    _, two = captured("CloudTwo", "image-v2_images-limit1")
    body = body_of(
        merge_list(plan("image", "/v2/images?limit=1"), {"CloudOne": one, "CloudTwo": two}, BASE)
    )
    item = dict(body["images"][0])
    item.pop("self")  # as openstacksdk's list() does
    image = Image.existing(**item)
    assert image.properties[ORIGIN_KEY] == "CloudOne"
    link, params = Image._get_next_link("/images", requests.Response(), body, None, 1, 1)
    assert link is not None and params["marker"] == [query_of(body["next"])["marker"]]

    _, one = captured("CloudOne", "compute-servers_detail-limit1")
    _, two = captured("CloudTwo", "compute-servers_detail-limit1")
    p = plan("compute", "/v2.1/servers/detail?limit=1")
    body = body_of(merge_list(p, {"CloudOne": one, "CloudTwo": two}, BASE))
    server = Server.existing(**body["servers"][0])
    assert server.id == body["servers"][0]["id"] and ORIGIN_KEY not in server.to_dict()
    link, params = Server._get_next_link("/servers/detail", requests.Response(), body, None, 1, 1)
    assert link is not None and link.startswith(BASE + "/v2.1/servers/detail")
    assert params["marker"] == [query_of(body["servers_links"][0]["href"])["marker"]]
