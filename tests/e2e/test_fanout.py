"""``&`` and ``|`` against the lab's real services, with this checkout's executor in the test
process standing in for CloudOne's router (whose engine does not call it yet): the decision
comes from ``decide(..., combined=True)`` on the lab's federation config, CloudOne's part goes
to CloudOne's glance directly and CloudTwo's through CloudTwo's router, as a router would send
them. Read-only: image and server lists, nothing is created."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx
import pytest

from scoperouter.config import load_catalog
from scoperouter.merge import ORIGIN_KEY
from scoperouter.proxy.fanout import Reply, Request, execute, httpx_sender
from scoperouter.routing import Failover, FanOut, RequestFacts, decide

pytestmark = pytest.mark.e2e


def _token(lab: Any, slug: str) -> str:
    from keystoneauth1 import session as ks_session
    from keystoneauth1.identity import v3

    auth = lab.cloud_entry(slug)["auth"]
    sess = ks_session.Session(
        auth=v3.Password(
            auth_url=auth["auth_url"], username=auth["username"], password=auth["password"],
            project_name=auth["project_name"], user_domain_name="Default",
            project_domain_name="Default",
        )
    )  # fmt: skip
    token = sess.get_token()
    assert isinstance(token, str)
    return token


def _run(lab: Any, expression: str, port: int, path: str) -> Reply:
    one = lab.clouds[0]
    catalog = load_catalog(lab.paths.federation_yaml)
    token = _token(lab, one.slug)
    scope = json.dumps({"image": expression, "compute": expression})
    facts = RequestFacts(
        method="GET",
        scheme="http",
        host=one.front_ip,
        port=port,
        path=path,
        headers={"x-auth-token": f"{token}!SCOPE!{scope}"},
    )
    decision = decide(facts, catalog, one.name, combined=True)
    assert isinstance(decision, FanOut | Failover), decision

    async def go() -> Reply:
        # CloudTwo's part goes to its router's TLS peer link, verified as a router does.
        verify = ssl.create_default_context(cafile=catalog.settings.peers.ca)
        async with httpx.AsyncClient(timeout=30.0, verify=verify) as client:
            return await execute(
                decision,
                Request("GET", {"x-auth-token": f"{token}!SCOPE!{scope}"}),
                httpx_sender(client),
                base_url=f"http://{one.front_ip}:{port}",
                timeout=30.0,
            )

    return asyncio.run(go())


def _listing(lab: Any, slug: str, what: str) -> list[str]:
    from openstack import config as os_config
    from openstack import connection

    cfg = os_config.OpenStackConfig(config_files=[str(lab.clouds_yaml)], load_envvars=False)
    conn = connection.Connection(config=cfg.get_one(cloud=slug))
    if what == "images":
        return [i.id for i in conn.image.images()]
    return [s.id for s in conn.compute.servers()]


def test_image_list_across_two_clouds_pages_through_every_image_once(lab: Any) -> None:
    pytest.importorskip("openstack")
    one, two = lab.clouds[0], lab.clouds[1]
    expected = [(one.name, i) for i in _listing(lab, one.slug, "images")]
    expected += [(two.name, i) for i in _listing(lab, two.slug, "images")]
    assert {c for c, _ in expected} == {one.name, two.name}, "each cloud needs an image"
    path = "/v2/images?limit=2"
    seen: list[tuple[str, str]] = []
    for _ in range(len(expected) + 2):
        reply = _run(lab, f"{one.name} & {two.name}", 9292, path)
        assert reply.status == 200, reply.body[:800]
        body = json.loads(reply.body)
        assert len(body["images"]) <= 2
        seen += [(i[ORIGIN_KEY], i["id"]) for i in body["images"]]
        if "next" not in body:
            break
        path = body["next"]
    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
    assert [c for c, _ in seen] == sorted((c for c, _ in seen), key=[one.name, two.name].index)


def test_server_list_across_two_clouds(lab: Any) -> None:
    pytest.importorskip("openstack")
    one, two = lab.clouds[0], lab.clouds[1]
    expected = {(one.name, s) for s in _listing(lab, one.slug, "servers")}
    expected |= {(two.name, s) for s in _listing(lab, two.slug, "servers")}
    reply = _run(lab, f"{one.name} & {two.name}", 8774, "/v2.1/servers?limit=1000")
    assert reply.status == 200, reply.body[:800]
    body = json.loads(reply.body)
    assert {(s[ORIGIN_KEY], s["id"]) for s in body["servers"]} == expected
