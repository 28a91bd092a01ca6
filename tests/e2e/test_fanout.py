"""``&`` and ``|`` through the lab's routers, as a user types them: ``openstack --os-scope
'{"image": "CloudOne & CloudTwo"}' image list`` (merged by CloudOne's router), the same for
``server list``, and ``CloudDown | CloudTwo`` (CloudDown: a cloud of the lab's federation
config whose router never runs, see ``scoperouter_lab.files.DOWN_CLOUD``) for a lookup by the
CLI and for nova's own image lookup through the forward proxy (a server create).

A refused connection costs nothing, so here a failover is fast with or without the breaker;
the breaker's part (a *hung* cloud costs one timeout, then is skipped) is measured in
tests/integration/test_combined.py."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from scoperouter_lab.files import DOWN_CLOUD

from scoperouter.client import scope_session
from scoperouter.merge import ORIGIN_KEY
from tests.e2e.access import access_lines
from tests.e2e.osc import cli

pytestmark = pytest.mark.e2e

PEER_CONNECT_TIMEOUT = 5.0  # the lab's (federation.yaml settings.connect_timeout)


def _scope(**services: str) -> str:
    return json.dumps(services)


def test_cli_image_list_across_two_clouds_shows_each_image_once(lab: Any, fed: Any) -> None:
    one, two, tiny = fed
    own = [i["ID"] for i in cli(lab, one.slug, "image", "list")]
    other = [i["ID"] for i in cli(lab, one.slug, "image", "list", scope=_scope(image=two.name))]
    merged = cli(lab, one.slug, "image", "list", scope=_scope(image=f"{one.name} & {two.name}"))
    ids = [i["ID"] for i in merged]
    assert sorted(ids) == sorted(own + other) and len(ids) == len(set(ids)), merged
    assert {tiny[one.name], tiny[two.name]} <= set(ids)


def test_sdk_pages_a_merged_image_list_through_the_router(lab: Any, fed: Any) -> None:
    one, two, tiny = fed
    conn = lab.connect(one.slug)
    scope_session(conn.session, _scope(image=f"{one.name} & {two.name}"), one.region)
    images = list(conn.image.images(limit=1))  # one image per page: follows the next links
    origins = [image.properties.get(ORIGIN_KEY) for image in images]
    assert len(images) == len({image.id for image in images}) >= 2
    # every image of CloudOne first, then CloudTwo's, each saying where it lives
    assert origins == sorted(origins, key=[one.name, two.name].index), origins
    assert {(tiny[one.name], one.name), (tiny[two.name], two.name)} <= {
        (image.id, origin) for image, origin in zip(images, origins, strict=True)
    }


def test_cli_server_list_across_two_clouds(lab: Any, fed: Any) -> None:
    """One server of CloudOne's user in each cloud; CloudOne's is booted from CloudTwo's
    image with the scope ``{"image": "CloudDown | CloudTwo"}``: nova-api looks the image up
    through CloudOne's forward proxy, which fails over from CloudDown to CloudTwo (swapping
    nova's service token for the router's own in CloudTwo)."""
    one, two, tiny = fed
    router_log = lab.paths.log(one, "router")
    since = router_log.stat().st_size
    name = f"e2e-fanout-{uuid.uuid4().hex[:8]}"
    conn_one = lab.connect(one.slug)
    scope_session(conn_one.session, _scope(image=f"{DOWN_CLOUD} | {two.name}"), one.region)
    # The user is CloudOne's everywhere (a merged list shows what this user sees in each
    # cloud): CloudTwo's server is made by the same user with the scope naming CloudTwo.
    conn_two = lab.connect(one.slug)
    scope_session(conn_two.session, _scope(compute=two.name, image=two.name), one.region)
    servers = []
    try:
        for conn, image in ((conn_one, tiny[two.name]), (conn_two, tiny[two.name])):
            flavor = conn.compute.find_flavor("m1.tiny", ignore_missing=False)
            servers.append(
                conn.compute.create_server(
                    name=name, image_id=image, flavor_id=flavor.id, networks="none"
                )
            )
        listed = cli(
            lab, one.slug, "server", "list", scope=_scope(compute=f"{one.name} & {two.name}")
        )
        ids = [s["ID"] for s in listed]
        assert len(ids) == len(set(ids)) and {s.id for s in servers} <= set(ids), listed
        plain = {s.id for s in lab.connect(one.slug).compute.servers()}
        plain |= {s.id for s in conn_two.compute.servers()}
        assert set(ids) == plain
        lookups = access_lines(
            router_log,
            since,
            lambda e: (
                e.get("path", "").endswith(f"/v2/images/{tiny[two.name]}")
                and e.get("decision") == "failover"
            ),
        )
        assert lookups, "nova's image lookup did not reach CloudOne's forward proxy"
        assert all(e["status"] == 200 and f"{two.name}: 200" in e["tried"] for e in lookups)
        assert lookups[0]["path"].startswith("http://"), lookups  # forward mode
    finally:
        for conn, server in zip((conn_one, conn_two), servers, strict=False):
            conn.compute.delete_server(server, ignore_missing=True)
        for conn, server in zip((conn_one, conn_two), servers, strict=False):
            conn.compute.wait_for_delete(server, wait=300)


def test_cli_lookup_with_a_down_cloud_first_answers_from_the_second(lab: Any, fed: Any) -> None:
    one, two, tiny = fed
    router_log = lab.paths.log(one, "router")
    since = router_log.stat().st_size
    scope = _scope(image=f"{DOWN_CLOUD} | {two.name}")
    elapsed = []
    for _ in range(2):
        started = time.monotonic()
        shown = cli(lab, one.slug, "image", "show", tiny[two.name], scope=scope)
        elapsed.append(time.monotonic() - started)
        assert shown["id"] == tiny[two.name] and shown["name"] == "tiny"
    assert max(elapsed) < PEER_CONNECT_TIMEOUT, elapsed  # no call waited for CloudDown
    lines = access_lines(
        router_log,
        since,
        lambda e: (
            e.get("path") == f"/v2/images/{tiny[two.name]}" and e.get("decision") == "failover"
        ),
        count=2,
    )
    assert len(lines) >= 2, lines
    for entry in lines:
        assert entry["cloud"] == f"{DOWN_CLOUD} | {two.name}" and entry["status"] == 200
        first, second = entry["tried"].split("; ")
        assert first in (
            f"{DOWN_CLOUD}: it refused the connection",
            f"{DOWN_CLOUD}: skipped, marked down",  # this worker's breaker already knew
        ), entry
        assert second == f"{two.name}: 200", entry
