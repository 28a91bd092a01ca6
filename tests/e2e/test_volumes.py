"""Block storage (cinder, its fake driver) through the routers, with the `openstack` CLI: a
volume's life beside a server of the fake virt driver (created, attached, detached, deleted),
and the scope rule: block storage follows compute (a server attaches volumes of its own cloud
only), so ``{"compute": "CloudTwo"}`` means CloudTwo's volumes, and a scope naming block
storage elsewhere than compute is refused on compute requests with a 400 saying why, while the
volume API honours it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.labservices import require_service, wait_until
from tests.e2e.osc import cli

pytestmark = pytest.mark.e2e

REFUSAL = "a server can only attach volumes of the cloud it runs in"


@pytest.fixture(scope="module")
def clouds(lab, fed):
    require_service(lab, "cinder")
    one, two, tiny = fed
    return one, two, tiny


@pytest.fixture(scope="module")
def server_one(lab, clouds) -> Iterator[dict[str, Any]]:
    """A server of CloudOne's user in CloudOne, from its own image, for the tests that attach
    (or try to attach) a volume there (a boot is the slow part): deleted after them."""
    one, _, tiny = clouds
    server = _server(lab, one.slug, tiny[one.name])
    yield server
    cli(lab, one.slug, "server", "delete", "--wait", server["id"], json_out=False)


def _volume(lab, cloud: str, volume_id: str, scope: str | None = None) -> dict[str, Any]:
    shown: dict[str, Any] = cli(lab, cloud, "volume", "show", volume_id, scope=scope)
    return shown


def _wait_status(lab, cloud: str, volume_id: str, status: str, scope: str | None = None) -> dict:
    def reached() -> dict[str, Any] | None:
        shown = _volume(lab, cloud, volume_id, scope)
        assert shown["status"] != "error", shown
        return shown if shown["status"] == status else None

    shown: dict[str, Any] = wait_until(f"volume {volume_id} {status}", reached)
    return shown


def _server(lab, cloud: str, image: str, scope: str | None = None) -> dict[str, Any]:
    name = f"e2e-vol-{uuid.uuid4().hex[:8]}"
    args = ("--image", image, "--flavor", "m1.tiny", "--nic", "none", "--wait", name)
    server: dict[str, Any] = cli(lab, cloud, "server", "create", *args, scope=scope)
    assert server["status"] == "ACTIVE", server
    return server


def _life(
    lab,
    cloud: str,
    image: str,
    scope: str | None,
    while_attached: Callable[[str, str], None] = lambda volume, server: None,
    server: dict[str, Any] | None = None,
) -> None:
    """Create, attach, detach, delete; `while_attached(volume id, server id)` checks where
    they live while the volume is attached. The server: `server`, else one made (and deleted)
    here."""
    volume = cli(lab, cloud, "volume", "create", "--size", "1",
                 f"e2e-vol-{uuid.uuid4().hex[:8]}", scope=scope)  # fmt: skip
    own = server is None
    if server is None:
        server = _server(lab, cloud, image, scope)
    try:
        _wait_status(lab, cloud, volume["id"], "available", scope)
        cli(lab, cloud, "server", "add", "volume", server["id"], volume["id"], scope=scope,
            json_out=False)  # fmt: skip
        attached = _wait_status(lab, cloud, volume["id"], "in-use", scope)
        assert [a["server_id"] for a in attached["attachments"]] == [server["id"]]
        shown = cli(lab, cloud, "server", "show", server["id"], scope=scope)
        assert volume["id"] in json.dumps(shown["volumes_attached"])
        while_attached(volume["id"], server["id"])
        cli(lab, cloud, "server", "remove", "volume", server["id"], volume["id"], scope=scope,
            json_out=False)  # fmt: skip
        detached = _wait_status(lab, cloud, volume["id"], "available", scope)
        assert detached["attachments"] == []
        cli(lab, cloud, "volume", "delete", volume["id"], scope=scope, json_out=False)

        def gone() -> bool:
            listed = cli(lab, cloud, "volume", "list", scope=scope)
            return volume["id"] not in {v["ID"] for v in listed}

        wait_until(f"volume {volume['id']} deleted", gone)
    finally:
        if own:
            cli(lab, cloud, "server", "delete", "--wait", server["id"], scope=scope,
                json_out=False)  # fmt: skip


def test_volume_created_attached_detached_deleted(lab, clouds, server_one):
    """In CloudOne, through its router: the volume becomes available, attaches to a server
    (in-use, listed on the server), detaches (available, no attachment) and is deleted."""
    one, _, tiny = clouds
    _life(lab, one.slug, tiny[one.name], scope=None, server=server_one)


def test_volumes_follow_compute_to_the_other_cloud(lab, clouds):
    """`{"compute": "CloudTwo"}` from CloudOne: the server is CloudTwo's, and so is the volume
    (block storage follows compute), which nova in CloudTwo attaches with the user's scoped
    token; CloudOne's cinder never sees it."""
    one, two, tiny = clouds
    scope = json.dumps({"compute": two.name})  # image: CloudOne's (the entry cloud's)

    def in_cloudtwo(volume: str, server: str) -> None:
        assert volume not in {v["ID"] for v in cli(lab, one.slug, "volume", "list")}
        assert server not in {s["ID"] for s in cli(lab, one.slug, "server", "list")}
        two_only = json.dumps({"block-storage": two.name, "compute": two.name})
        assert volume in {v["ID"] for v in cli(lab, one.slug, "volume", "list", scope=two_only)}

    _life(lab, one.slug, tiny[one.name], scope, in_cloudtwo)


def test_block_storage_named_apart_from_compute_is_refused(lab, clouds, server_one):
    """`{"block-storage": "CloudTwo"}` with compute CloudOne: attaching (and any other compute
    request) is a 400 that says why, before nova is asked anything; the volume API honours the
    scope (the volume is made in CloudTwo)."""
    one, two, _ = clouds
    scope = json.dumps({"block-storage": two.name})
    server = server_one
    volume = cli(lab, one.slug, "volume", "create", "--size", "1",
                 f"e2e-vol-{uuid.uuid4().hex[:8]}", scope=scope)  # fmt: skip
    try:
        _wait_status(lab, one.slug, volume["id"], "available", scope)
        assert volume["id"] not in {v["ID"] for v in cli(lab, one.slug, "volume", "list")}
        refused = cli(lab, one.slug, "server", "add", "volume", server["id"], volume["id"],
                      scope=scope, json_out=False, check=False)  # fmt: skip
        assert refused.returncode != 0
        assert "400" in refused.stderr and REFUSAL in refused.stderr, refused.stderr[-2000:]
        listing = cli(lab, one.slug, "server", "list", scope=scope, check=False)
        assert listing.returncode != 0 and REFUSAL in listing.stderr
        assert _volume(lab, one.slug, volume["id"], scope)["status"] == "available"
    finally:
        cli(lab, one.slug, "volume", "delete", volume["id"], scope=scope, json_out=False)
