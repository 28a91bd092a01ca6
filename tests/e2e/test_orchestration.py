"""Orchestration (heat) through the routers, with openstacksdk (its orchestration proxy): a
HOT stack that boots a nova server from a glance image reaches CREATE_COMPLETE and is deleted,
in CloudOne with CloudOne's image, and in CloudOne with **CloudTwo's** image (scope
``{"image": "CloudTwo"}``): heat-engine validates the image and nova boots it with the user's
token, scope included, so both of their glance calls go through CloudOne's router
(HTTP_PROXY) to CloudTwo's glance. And the broker's example template
``broker-templates/volume.yaml`` on the lab's real heat and cinder: its volume made with the
size asked, its outputs, its deletion."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from scoperouter.broker.services.heat_templates import load_template
from scoperouter.client import scope_session
from tests.e2e.labservices import require_service, wait_until

pytestmark = pytest.mark.e2e

VOLUME_TEMPLATE = Path(__file__).resolve().parents[2] / "broker-templates" / "volume.yaml"

STACK_TIMEOUT = 300
TEMPLATE: dict[str, Any] = {
    "heat_template_version": "2018-08-31",
    "description": "a server from an image (scoperouter e2e)",
    "parameters": {"image": {"type": "string"}, "flavor": {"type": "string"}},
    "resources": {
        "server": {
            "type": "OS::Nova::Server",
            "properties": {
                "image": {"get_param": "image"},
                "flavor": {"get_param": "flavor"},
                "networks": [{"allocate_network": "none"}],
            },
        }
    },
    "outputs": {"server_id": {"value": {"get_resource": "server"}}},
}


@pytest.fixture(scope="module")
def clouds(lab, fed):
    require_service(lab, "heat")
    one, two, tiny = fed
    return one, two, tiny


def _wait_stack(conn, stack_id: str, status: str) -> Any:
    deadline = time.monotonic() + STACK_TIMEOUT
    while True:
        stack = conn.orchestration.get_stack(stack_id)
        if stack is None or not stack.status.endswith("_IN_PROGRESS"):
            break
        assert time.monotonic() < deadline, f"stack {stack_id} still {stack.status}"
        time.sleep(2)
    assert stack is not None and stack.status == status, (
        None if stack is None else (stack.status, stack.status_reason)
    )
    return stack


def _wait_stack_gone(conn, stack_id: str, name: str) -> None:
    deadline = time.monotonic() + STACK_TIMEOUT
    while (found := conn.orchestration.find_stack(stack_id)) is not None:
        assert found.status != "DELETE_FAILED", found.status_reason
        assert time.monotonic() < deadline, f"stack {name} still {found.status}"
        time.sleep(2)


def _stack_life(lab, conn, cloud, image: str) -> str:
    """Create the stack, check its server, delete it; returns the server's id."""
    name = f"e2e-stack-{uuid.uuid4().hex[:8]}"
    stack = conn.orchestration.create_stack(
        name=name, template=TEMPLATE, parameters={"image": image, "flavor": "m1.tiny"}
    )
    try:
        done = _wait_stack(conn, stack.id, "CREATE_COMPLETE")
        server_id = next(o["output_value"] for o in done.outputs if o["output_key"] == "server_id")
        server = lab.connect(cloud.slug).compute.get_server(server_id)
        assert server.status == "ACTIVE" and server.image.id == image
    finally:
        conn.orchestration.delete_stack(stack.id)
    _wait_stack_gone(conn, stack.id, name)
    # the stack is gone once nova shows its server DELETED, a moment before nova's list drops it
    servers = lab.connect(cloud.slug).compute
    wait_until(f"server {server_id} gone with its stack",
               lambda: server_id not in {s.id for s in servers.servers()}, 60)  # fmt: skip
    return str(server_id)


def test_stack_with_a_server_from_an_image(lab, clouds):
    one, _, tiny = clouds
    _stack_life(lab, lab.connect(one.slug), one, tiny[one.name])


def test_stack_in_cloudone_with_an_image_of_cloudtwo(lab, clouds):
    """The image exists in CloudTwo only; the stack and its server are CloudOne's. CloudTwo's
    router log shows the image fetched for the user (its id, status 200) while the stack was
    made."""
    one, two, tiny = clouds
    image = tiny[two.name]
    assert lab.connect(one.slug).image.find_image(image) is None  # not an image of CloudOne
    conn = lab.connect(one.slug)
    scope_session(conn.session, json.dumps({"image": two.name}), default_cloud=one.region)
    log = lab.paths.log(two, "router")
    since = log.stat().st_size
    _stack_life(lab, conn, one, image)
    with log.open("rb") as fh:
        fh.seek(since)
        lines = fh.read().decode(errors="replace").splitlines()
    fetched = [
        e
        for e in (json.loads(line) for line in lines if line[:1] == "{")
        if e.get("path") == f"/v2/images/{image}" and e.get("cloud") == two.name
    ]
    assert fetched and all(e["status"] == 200 for e in fetched), fetched


def test_the_broker_volume_template_on_the_labs_heat_and_cinder(lab, clouds):
    """`broker-templates/volume.yaml` (the broker's example heat plan) as a stack in CloudOne:
    CREATE_COMPLETE, its outputs the volume's id and the size asked, the volume in cinder with
    that size, named after the stack and the `name` parameter, available; the stack deleted,
    the volume with it."""
    require_service(lab, "cinder")
    one, _, _ = clouds
    conn = lab.connect(one.slug)
    name = f"e2e-volstack-{uuid.uuid4().hex[:8]}"
    size = 2  # not the template's default (1)
    stack = conn.orchestration.create_stack(
        name=name, template=load_template(VOLUME_TEMPLATE),
        parameters={"size": size, "name": "e2e"},
    )  # fmt: skip
    try:
        done = _wait_stack(conn, stack.id, "CREATE_COMPLETE")
        outputs = {o["output_key"]: o["output_value"] for o in done.outputs}
        assert set(outputs) == {"volume_id", "size"}, outputs
        assert int(outputs["size"]) == size, outputs
        volume = conn.block_storage.get_volume(outputs["volume_id"])
        assert (volume.size, volume.name, volume.status) == (size, f"{name}-e2e", "available")
    finally:
        conn.orchestration.delete_stack(stack.id)
    _wait_stack_gone(conn, stack.id, name)
    assert conn.block_storage.find_volume(outputs["volume_id"]) is None
