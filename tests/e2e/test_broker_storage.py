"""The built-in storage services against the lab's swift and cinder, through the broker's OSB
API (a real `broker serve` process, driven by the project's OSB client as Cloud Foundry would):

- ``openstack-object-container``: a container in CloudOne; the binding's application
  credential (keystone access rules for that container's path) puts and gets an object
  through CloudOne's router with openstacksdk, and is refused on another container of the
  same project; after unbind keystone refuses it; deprovision deletes the container and its
  objects.
- ``openstack-volume``: a volume in CloudOne bound to an ``openstack-server`` instance of the
  same broker (attached: ``in-use`` on that server, seen with the `openstack` CLI and the
  binding's credential); unbind detaches it and revokes the credential; a volume in CloudTwo is
  refused a binding to CloudOne's server with 400; deprovision deletes it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.broker_services import (
    DEADLINES,
    OSBBroker,
    container_lifecycle,
    database,
    drift_of,
    swept_clouds,
)

pytestmark = pytest.mark.e2e

CONTAINER = "openstack-object-container"
VOLUME = "openstack-volume"
SERVER = "openstack-server"


@pytest.fixture(scope="module")
def clouds(lab, fed) -> Iterator[Any]:
    yield from swept_clouds(lab, fed, "swift", "cinder")


@pytest.fixture(scope="module")
def env(lab, clouds, tmp_path_factory, request) -> Iterator[OSBBroker]:
    services = {
        CONTAINER: {"default_cloud": lab.clouds[0].name, "deadlines": DEADLINES},
        VOLUME: {"default_cloud": lab.clouds[0].name, "max_size": 10, "deadlines": DEADLINES},
        SERVER: {
            "networks": "none",
            "deadlines": DEADLINES,
            "plans": [{"name": "tiny", "flavor": "m1.tiny"}],
        },
    }
    tmp = Path(tmp_path_factory.mktemp("osb-storage"))
    broker = OSBBroker(lab, tmp, services=services, db_url=database(request))
    yield broker
    broker.stop()


def test_object_container_full_lifecycle(env, clouds, fed, record_property):
    one, _two, _ = fed
    started = time.monotonic()
    params = {"where": {"cloud": one.name}}
    container_lifecycle(env, clouds, one, CONTAINER, "ct", params, repair=True)
    record_property("wall_seconds", round(time.monotonic() - started, 1))


def test_volume_attached_to_a_server_instance_full_lifecycle(env, clouds, fed, record_property):
    one, two, tiny = fed
    started = time.monotonic()
    server_iid, last = env.provision(
        SERVER, "vsrv", {"image": tiny[one.name], "where": {"cloud": one.name}}
    )
    assert last.body["state"] == "succeeded", last.body
    server_id = env.osb.get_instance(server_iid).body["metadata"]["attributes"]["server_id"]
    server_ready = time.monotonic()

    iid, last = env.provision(VOLUME, "vol", {"size": 2, "where": {"cloud": one.name}})
    assert last.body["state"] == "succeeded", last.body
    attributes = env.osb.get_instance(iid).body["metadata"]["attributes"]
    volume_id, project_id = attributes["volume_id"], attributes["project_id"]
    assert attributes["cloud"] == one.name and attributes["size"] == 2
    block = clouds.connect(one.name, project_id=project_id).block_storage
    volume = block.get_volume(volume_id)
    assert volume.name == f"osb-{iid}" and volume.status == "available"
    assert volume.metadata["osb_instance_id"] == iid

    # a volume in CloudTwo cannot be bound to CloudOne's server: 400, nothing written
    far, last = env.provision(VOLUME, "volfar", {"where": {"cloud": two.name}})
    assert last.body["state"] == "succeeded", last.body
    service_id, plan_id = env.plan(VOLUME)
    refused = env.osb.bind(far, f"{far}-b", service_id, plan_id, {"server_instance_id": server_iid})
    assert refused.status == 400, refused.body
    assert refused.body["description"] == (
        f"parameters.server_instance_id: server instance {server_iid} is in {one.name}, "
        f"this volume in {two.name}: nova attaches volumes of its own cloud only"
    ), refused.body
    assert env.osb.get_binding(far, f"{far}-b").status == 404
    env.deprovision(VOLUME, far)

    binding, creds = env.bind(VOLUME, iid, parameters={"server_instance_id": server_iid})
    assert creds["volume_id"] == volume_id and creds["server_id"] == server_id
    assert creds["device"], creds
    # the binding's credential with the openstack CLI: the volume, attached to the server
    shown = env.openstack(creds["clouds_yaml"], "volume", "show", volume_id)
    assert shown.returncode == 0, shown.stderr
    volume_json = json.loads(shown.stdout)
    assert volume_json["status"] == "in-use"
    assert [a["server_id"] for a in volume_json["attachments"]] == [server_id]
    attached = env.openstack(creds["clouds_yaml"], "server", "volume", "list", server_id)
    assert attached.returncode == 0, attached.stderr
    assert [a["Volume ID"] for a in json.loads(attached.stdout)] == [volume_id]
    report = env.repair()  # finds the volume, the server and the binding's credential
    assert drift_of(report, iid) == [] and drift_of(report, server_iid) == []

    env.unbind(VOLUME, iid, binding)
    assert block.get_volume(volume_id).status == "available"
    refused_cli = env.openstack(creds["clouds_yaml"], "volume", "show", volume_id)
    assert refused_cli.returncode != 0  # the credential was revoked

    env.deprovision(VOLUME, iid)
    assert [v.id for v in block.volumes() if v.id == volume_id] == []
    env.deprovision(SERVER, server_iid)
    record_property("wall_seconds", round(time.monotonic() - started, 1))
    record_property("volume_seconds", round(time.monotonic() - server_ready, 1))
