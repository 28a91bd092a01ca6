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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from openstack.exceptions import DuplicateResource, NotFoundException
from scoperouter_lab.files import DOWN_CLOUD

from scoperouter.client import scope_session
from scoperouter.merge import ORIGIN_KEY
from tests.e2e.access import access_lines
from tests.e2e.osc import cli

pytestmark = pytest.mark.e2e

PEER_CONNECT_TIMEOUT = 5.0  # the lab's (federation.yaml settings.connect_timeout)


def _scope(**services: str) -> str:
    return json.dumps(services)


@dataclass(frozen=True)
class Made:
    id: str
    name: str


@dataclass(frozen=True)
class Servers:
    one: Made  # CloudOne's server
    two: Made  # CloudTwo's, made by CloudOne's user
    conn_two: Any  # CloudOne's user scoped to CloudTwo
    since: int  # CloudOne's router log size before the servers were made


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


@pytest.fixture(scope="module")
def servers(lab: Any, fed: Any) -> Iterator[Servers]:
    """One server of CloudOne's user in each cloud, shared by the tests below (a boot is the
    slow part): CloudOne's is booted from CloudTwo's image with the scope ``{"image":
    "CloudDown | CloudTwo"}``, so nova-api looks the image up through CloudOne's forward proxy,
    which fails over from CloudDown to CloudTwo (swapping nova's service token for the
    router's own in CloudTwo); CloudTwo's is made by the same user with the scope naming
    CloudTwo (a merged list shows what this user sees in each cloud). Each has its own name,
    so that a lookup by name finds one server."""
    one, two, tiny = fed
    since = lab.paths.log(one, "router").stat().st_size
    name = f"e2e-fanout-{uuid.uuid4().hex[:8]}"
    conn_one = lab.connect(one.slug)
    scope_session(conn_one.session, _scope(image=f"{DOWN_CLOUD} | {two.name}"), one.region)
    conn_two = lab.connect(one.slug)
    scope_session(conn_two.session, _scope(compute=two.name, image=two.name), one.region)
    made: list[tuple[Any, Any]] = []
    names: list[Made] = []
    try:
        for conn, cloud in ((conn_one, one), (conn_two, two)):
            flavor = conn.compute.find_flavor("m1.tiny", ignore_missing=False)
            server = conn.compute.create_server(
                name=f"{name}-{cloud.slug}", image_id=tiny[two.name], flavor_id=flavor.id,
                networks="none",
            )  # fmt: skip
            made.append((conn, server))
            names.append(Made(server.id, f"{name}-{cloud.slug}"))
        yield Servers(one=names[0], two=names[1], conn_two=conn_two, since=since)
    finally:
        for conn, server in made:
            conn.compute.delete_server(server, ignore_missing=True)
        for conn, server in made:
            conn.compute.wait_for_delete(server, wait=300)


def test_cli_server_list_across_two_clouds(lab: Any, fed: Any, servers: Servers) -> None:
    """`server list` with ``CloudOne & CloudTwo`` lists both servers once each, exactly what
    the user sees in each cloud; CloudOne's server was booted through the failover."""
    one, two, tiny = fed
    listed = cli(lab, one.slug, "server", "list", scope=_scope(compute=f"{one.name} & {two.name}"))
    ids = [s["ID"] for s in listed]
    assert len(ids) == len(set(ids)) and {servers.one.id, servers.two.id} <= set(ids), listed
    plain = {s.id for s in lab.connect(one.slug).compute.servers()}
    plain |= {s.id for s in servers.conn_two.compute.servers()}
    assert set(ids) == plain
    lookups = access_lines(
        lab.paths.log(one, "router"),
        servers.since,
        lambda e: (
            e.get("path", "").endswith(f"/v2/images/{tiny[two.name]}")
            and e.get("decision") == "failover"
        ),
    )
    assert lookups, "nova's image lookup did not reach CloudOne's forward proxy"
    assert all(e["status"] == 200 and f"{two.name}: 200" in e["tried"] for e in lookups)
    assert lookups[0]["path"].startswith("http://"), lookups  # forward mode


def test_cli_server_show_across_two_clouds(lab: Any, fed: Any, servers: Servers) -> None:
    """`openstack server show` from CloudOne's entry with ``{"compute": "CloudOne &
    CloudTwo"}``: CloudTwo's server and CloudOne's, by id and by name, each from the cloud
    that has it (the router's access line says which); a server in neither is the CLI's
    not-found, and without the scope CloudTwo's server is not CloudOne's."""
    one, two, tiny = fed
    both = _scope(compute=f"{one.name} & {two.name}")
    log = lab.paths.log(one, "router")
    for server, cloud, other in ((servers.two, two, one), (servers.one, one, two)):
        since = log.stat().st_size
        for key in (server.id, server.name):
            shown = cli(lab, one.slug, "server", "show", key, scope=both)
            assert (shown["id"], shown["name"]) == (server.id, server.name), shown
            assert tiny[two.name] in shown["image"], shown["image"]  # both from CloudTwo's
        # both clouds asked for it by id, the one that has it answered
        asked = access_lines(
            log,
            since,
            lambda e, server=server: (
                e.get("path", "").endswith(f"/servers/{server.id}")
                and e.get("cloud") == f"{one.name} & {two.name}"
            ),
        )
        assert asked and all(
            e["status"] == 200
            and f"{cloud.name}: 200" in e["tried"]
            and f"{other.name}: 404" in e["tried"]
            for e in asked
        ), asked
    absent = str(uuid.uuid4())
    proc = cli(lab, one.slug, "server", "show", absent, scope=both, check=False)
    assert proc.returncode != 0 and "No Server found" in proc.stderr, proc.stderr[-1000:]
    plain = cli(lab, one.slug, "server", "show", servers.two.id, check=False)
    assert plain.returncode != 0 and "No Server found" in plain.stderr, plain.stderr[-1000:]


def test_sdk_find_server_across_two_clouds(lab: Any, fed: Any, servers: Servers) -> None:
    """openstacksdk's ``find_server`` (a GET by id, then a list by name) with ``CloudOne &
    CloudTwo``: each server by id and by name, found in the cloud that has it; a name or an
    id in neither is None, or NotFoundException with ignore_missing=False."""
    one, two, _ = fed
    conn = lab.connect(one.slug)
    scope_session(conn.session, _scope(compute=f"{one.name} & {two.name}"), one.region)
    for server in (servers.one, servers.two):
        for key in (server.id, server.name):
            found = conn.compute.find_server(key)
            assert found is not None and (found.id, found.name) == (server.id, server.name)
    assert lab.connect(one.slug).compute.find_server(servers.two.name) is None  # not CloudOne's
    for key in (f"e2e-nowhere-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())):
        assert conn.compute.find_server(key) is None
        with pytest.raises(NotFoundException):
            conn.compute.find_server(key, ignore_missing=False)


@pytest.fixture(scope="module")
def images(lab: Any, fed: Any) -> Iterator[dict[str, Made]]:
    """A small private image of CloudOne's user in each cloud, each with its own name (the
    seeded `tiny` has the same name in both)."""
    one, two, _ = fed
    name = f"e2e-find-{uuid.uuid4().hex[:8]}"
    made: dict[str, Made] = {}
    conns = {}
    try:
        for cloud in (one, two):
            conn = conns[cloud.name] = lab.connect(one.slug)
            scope_session(conn.session, _scope(image=cloud.name), one.region)
            body = {"name": f"{name}-{cloud.slug}", "disk_format": "raw",
                    "container_format": "bare", "visibility": "private"}  # fmt: skip
            answer = conn.image.post("/images", json=body)  # queued: no data needed here
            assert answer.status_code == 201, answer.text[:500]
            made[cloud.name] = Made(answer.json()["id"], body["name"])
        yield made
    finally:
        for cloud_name, image in made.items():
            conns[cloud_name].image.delete_image(image.id, ignore_missing=True)


def test_sdk_find_image_across_two_clouds(lab: Any, fed: Any, images: dict[str, Made]) -> None:
    """``find_image`` with ``CloudOne & CloudTwo``: by id (each cloud's `tiny`, and an image
    of each cloud) and by name, the image comes from the cloud that has it, marked with it;
    a name or an id in neither is None, or NotFoundException with ignore_missing=False; a
    name both clouds have (`tiny`) is the SDK's DuplicateResource."""
    one, two, tiny = fed
    conn = lab.connect(one.slug)
    scope_session(conn.session, _scope(image=f"{one.name} & {two.name}"), one.region)
    for cloud in (one, two):
        image = images[cloud.name]
        for key, want in ((image.id, image.id), (image.name, image.id),
                          (tiny[cloud.name], tiny[cloud.name])):  # fmt: skip
            found = conn.image.find_image(key)
            assert found is not None and found.id == want, (cloud.name, key, found)
            assert found.properties[ORIGIN_KEY] == cloud.name, (key, found.properties)
    assert lab.connect(one.slug).image.find_image(images[two.name].name) is None
    for key in (f"e2e-nowhere-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())):
        assert conn.image.find_image(key) is None
        with pytest.raises(NotFoundException):
            conn.image.find_image(key, ignore_missing=False)
    with pytest.raises(DuplicateResource):
        conn.image.find_image("tiny")


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
