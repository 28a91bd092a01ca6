"""openstack-server against the lab, through the broker's OSB API (a real `broker serve`
process, driven by the project's OSB client as Cloud Foundry would): a server in CloudOne from
CloudTwo's image with its whole lifecycle (bind, the binding's clouds.yaml with the `openstack`
CLI, unbind, deprovision), ``most-free`` choosing the emptier cloud, a refusal (a quota of
0 instances) making the broker use the next cloud and say why, a SIGKILL after the create
reached nova (one server, never two) and a DELETE during provisioning."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scoperouter.broker.identity import space_of
from scoperouter.broker.openstack_helpers import METADATA_KEY, instance_tag
from tests.e2e.broker_services import (
    RUN,
    OSBBroker,
    broker_clouds,
    context,
    identity,
    instance_id,
    sweep,
)

pytestmark = pytest.mark.e2e

SERVER = "openstack-server"


@pytest.fixture(scope="module")
def clouds(lab, fed) -> Iterator[Any]:
    clouds = broker_clouds(lab, fed)
    yield clouds
    sweep(clouds)


@pytest.fixture(scope="module")
def env(lab, clouds, tmp_path_factory) -> Iterator[OSBBroker]:
    broker = OSBBroker(lab, Path(tmp_path_factory.mktemp("osb-server")))
    yield broker
    broker.stop()


def _tagged(clouds, iid: str) -> dict[str, list[str]]:
    return {
        cloud: [
            s.id
            for s in clouds.connect(cloud).compute.servers(
                all_projects=True, tags=instance_tag(iid)
            )
        ]
        for cloud in clouds.names()
    }


def test_server_in_cloudone_from_cloudtwos_image_full_lifecycle(env, clouds, fed):
    one, two, tiny = fed
    params = {"image": tiny[two.name], "where": {"cloud": one.name}}
    iid, last = env.provision(SERVER, "x", params)
    assert last.body["state"] == "succeeded", last.body
    got = env.osb.get_instance(iid)
    assert got.status == 200, got.body
    attributes = got.body["metadata"]["attributes"]
    server_id = attributes["server_id"]
    assert attributes["cloud"] == one.name and attributes["image_cloud"] == two.name
    assert attributes["scope"] == f'{{"image":"{two.name}"}}'
    assert last.body["description"] == (
        f"server {server_id} is ACTIVE in {one.name}, image {tiny[two.name]} from {two.name} "
        "through the routers"
    )
    server = clouds.connect(one.name).compute.get_server(server_id)
    assert server.status == "ACTIVE" and server.image.id == tiny[two.name]
    assert server.project_id == attributes["project_id"]
    assert server.metadata[METADATA_KEY] == iid and instance_tag(iid) in server.tags
    space = identity().space_project(clouds.connect(one.name), space_of(context("osb")))
    assert server.project_id == space  # the platform space's project in CloudOne

    binding, creds = env.bind(SERVER, iid)
    assert creds["server_id"] == server_id and creds["cloud"] == one.name
    assert creds["router_url"] == f"http://{one.front_ip}:5000/v3"
    # the binding's credential with the openstack CLI, carrying the scope the server was built
    # with: the server, and through the scope the image it was booted from, in CloudTwo
    env.server_binding_works(creds, server_id, tiny[two.name], {"image": two.name})

    env.unbind(SERVER, iid, binding)
    assert env.revoked(creds, server_id)

    env.deprovision(SERVER, iid)
    assert _tagged(clouds, iid) == {one.name: [], two.name: []}


def test_most_free_chooses_the_emptier_cloud_and_a_refusal_moves_on(env, clouds, fed):
    one, two, tiny = fed
    filler = _fill(clouds, two.name, tiny[two.name])
    try:
        fuller, emptier = clouds.capacity(two.name), clouds.capacity(one.name)
        assert fuller.free["MEMORY_MB"] < 0.5 * emptier.free["MEMORY_MB"]

        # most-free (the default): CloudOne, with its own `tiny` (no scope needed)
        iid, last = env.provision(SERVER, "free", {"image": "tiny"})
        assert last.body["state"] == "succeeded", last.body
        assert last.body["description"].startswith("server ") and (
            last.body["description"].endswith(f"is ACTIVE in {one.name}")
        )
        attributes = env.osb.get_instance(iid).body["metadata"]["attributes"]
        assert attributes["cloud"] == one.name and attributes["scope"] is None
        env.deprovision(SERVER, iid)

        # a quota of 0 instances on the space's project in CloudOne: refused, CloudTwo takes it
        admin = clouds.connect(one.name)
        project_id = identity().space_project(admin, space_of(context("osb")))
        admin.set_compute_quotas(project_id, instances=0)
        try:
            iid, last = env.provision(SERVER, "quota", {"image": "tiny"})
        finally:
            admin.set_compute_quotas(project_id, instances=10)
        assert last.body["state"] == "succeeded", last.body
        assert (
            f"is ACTIVE in {two.name}; {one.name} refused it: 403: Quota exceeded for "
            in (last.body["description"])
        )
        assert _tagged(clouds, iid)[one.name] == []
        env.deprovision(SERVER, iid)
    finally:
        admin2 = clouds.connect(two.name)
        admin2.compute.delete_server(filler.id)
        admin2.compute.wait_for_delete(filler, wait=300)


def _fill(clouds, cloud: str, image_id: str) -> Any:
    """Make `cloud` the fuller one: a server taking 60 % of its free memory and disk (and VCPUs
    up to placement's max_unit for one allocation, the fake hypervisor's 1000)."""
    free = clouds.capacity(cloud).free
    admin = clouds.connect(cloud)
    flavor = admin.compute.create_flavor(
        name=f"osb-{RUN}-big",
        vcpus=int(min(free["VCPU"] * 0.6, 1000)),
        ram=int(free["MEMORY_MB"] * 0.6),
        disk=int(free["DISK_GB"] * 0.6),
    )
    project = admin.identity.create_project(name=f"osb-{RUN}-filler", domain_id="default")
    member = admin.identity.find_role("member", ignore_missing=False)
    admin.identity.assign_project_role_to_user(project, admin.current_user_id, member)
    admin.set_compute_quotas(project.id, instances=-1, cores=-1, ram=-1)
    server = clouds.connect(cloud, project_id=project.id).compute.create_server(
        name=f"osb-{RUN}-filler", flavor_id=flavor.id, image_id=image_id, networks="none"
    )
    server = admin.compute.wait_for_server(server, wait=300)
    assert server.status == "ACTIVE"
    return server


def _until(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_sigkill_mid_provision_and_delete_during_provisioning(lab, clouds, fed, tmp_path):
    """On the lab's nova: a broker SIGKILLed once its create reached nova is replaced by a
    restarted one that finds the server by its tag (never a second one); a DELETE while a
    server is being provisioned stops the provision and removes the server."""
    one, two, _ = fed
    env = OSBBroker(lab, tmp_path, space="osb-crash", lease=4.0)
    service_id, plan_id = env.ids[SERVER]
    params = {"image": "tiny", "where": {"cloud": one.name}}
    try:
        iid = instance_id("crash")
        answer = env.osb.provision(iid, service_id, plan_id, params)
        assert answer.status == 202, answer.body
        _until(lambda: _tagged(clouds, iid)[one.name], 120, "the create to reach nova")
        env.restart()
        last = env.wait(iid, answer.operation, "provision")
        assert last.body["state"] == "succeeded", last.body
        assert len(_tagged(clouds, iid)[one.name]) == 1 and _tagged(clouds, iid)[two.name] == []
        env.deprovision(SERVER, iid)
        assert _tagged(clouds, iid) == {one.name: [], two.name: []}

        iid = instance_id("cancel")
        answer = env.osb.provision(iid, service_id, plan_id, params)
        assert answer.status == 202, answer.body
        _until(lambda: _tagged(clouds, iid)[one.name], 120, "the create to reach nova")
        gone = env.osb.deprovision(iid, service_id, plan_id)
        assert gone.status == 202, gone.body
        assert env.wait(iid, gone.operation, "deprovision").status == 410
        assert _tagged(clouds, iid) == {one.name: [], two.name: []}  # nothing left anywhere
        final = env.osb.last_operation(iid, answer.operation)
        assert final.status == 200 and final.body["state"] != "in progress", final.body
        assert env.osb.deprovision(iid, service_id, plan_id).status == 410  # idempotent
    finally:
        env.stop()


def test_key_name_and_user_data_reach_nova_and_a_missing_key_pair_is_named(env, clouds, fed):
    """`key_name` and `user_data` as nova really records them (the fake driver keeps what it
    is given): the key pair, which must be the broker user's in the chosen cloud (nova key
    pairs belong to a user), shows on the server through the binding's own credential;
    the user data, which nova shows to admins only (microversion 2.3+), through the broker's
    account, byte for byte. A key pair that does not exist fails the operation, naming it."""
    one, _two, tiny = fed
    admin = clouds.connect(one.name)
    key = f"bk-key-{RUN}"
    admin.compute.create_keypair(name=key)
    user_data = "#cloud-config\nruncmd:\n  - echo bk-é\n"
    try:
        params = {
            "image": tiny[one.name],
            "where": {"cloud": one.name},
            "key_name": key,
            "user_data": user_data,
        }
        iid, last = env.provision(SERVER, "key", params)
        assert last.body["state"] == "succeeded", last.body
        server_id = env.osb.get_instance(iid).body["metadata"]["attributes"]["server_id"]
        server = admin.compute.get_server(server_id)
        assert server.key_name == key
        assert base64.b64decode(server.user_data).decode() == user_data

        binding, creds = env.bind(SERVER, iid)
        shown = env.openstack(creds["clouds_yaml"], "server", "show", server_id)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["key_name"] == key
        env.unbind(SERVER, iid, binding)
        env.deprovision(SERVER, iid)
    finally:
        admin.compute.delete_keypair(key, ignore_missing=True)

    missing = f"bk-nokey-{RUN}"
    params = {"image": tiny[one.name], "where": {"cloud": one.name}, "key_name": missing}
    iid, last = env.provision(SERVER, "nokey", params)
    assert last.body["state"] == "failed", last.body
    assert (
        f"key pair {missing!r} is not the broker user's in {one.name}" in (last.body["description"])
    )
    env.deprovision(SERVER, iid)
    assert _tagged(clouds, iid) == {c: [] for c in clouds.names()}
