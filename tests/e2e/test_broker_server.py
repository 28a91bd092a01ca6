"""openstack-server against the lab, pass by pass: a server in CloudOne from CloudTwo's image
(through the routers), ``most-free`` choosing the emptier cloud, a refusal (quota) making the
broker use the next cloud, and deprovision leaving nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scoperouter.broker.identity import space_of
from scoperouter.broker.services.base import Done
from scoperouter.broker.services.server import METADATA_KEY, ServerService, instance_tag
from tests.broker.passes import MemoryOperation, after, drive, instance
from tests.e2e.broker_services import (
    RUN,
    broker_clouds,
    context,
    identity,
    instance_id,
    sweep,
)

pytestmark = pytest.mark.e2e

SETTINGS = {"networks": "none", "plans": [{"name": "tiny", "flavor": "m1.tiny"}]}


@pytest.fixture(scope="module")
def clouds(lab, fed) -> Iterator[Any]:
    clouds = broker_clouds(lab, fed)
    yield clouds
    sweep(clouds)


@pytest.fixture(scope="module")
def service(clouds) -> ServerService:
    return ServerService(SETTINGS, clouds)


def _op(service, kind: str, view, saved=None) -> MemoryOperation:
    plan = service.catalog().plans[0]
    return MemoryOperation(kind, view, plan, service.clouds, saved, identity=identity())


def _provision(service, clouds, label: str, space: str = "main", **params: Any):
    view = instance(instance_id(label), params, context=context(space))
    op = _op(service, "provision", view)
    return view, op, drive(service, op, timeout=300)


def _deprovision(service, clouds, view, op) -> None:
    gone = drive(service, _op(service, "deprovision", after(view, op.saved)), timeout=300)
    assert isinstance(gone, Done), gone
    for cloud in clouds.names():
        tagged = clouds.connect(cloud).compute.servers(
            all_projects=True, tags=instance_tag(view.id)
        )
        assert list(tagged) == [], cloud


def test_server_in_cloudone_from_an_image_of_cloudtwo(clouds, fed, service):
    one, two, tiny = fed
    view, op, outcome = _provision(
        service, clouds, "x", image=tiny[two.name], where={"cloud": one.name}
    )
    assert isinstance(outcome, Done), outcome
    res = op.saved.resources
    assert op.saved.cloud == one.name
    assert res["scope"] == f'{{"image":"{two.name}"}}' and res["image_cloud"] == two.name
    assert outcome.description == (
        f"server {res['server_id']} is ACTIVE in {one.name}, image {tiny[two.name]} from "
        f"{two.name} through the routers"
    )
    admin = clouds.connect(one.name)
    server = admin.compute.get_server(res["server_id"])
    assert server.status == "ACTIVE" and server.project_id == res["project_id"]
    assert server.image.id == tiny[two.name]  # CloudTwo's image, booted in CloudOne
    assert server.metadata[METADATA_KEY] == view.id
    assert {"osb", instance_tag(view.id)} <= set(server.tags)
    _deprovision(service, clouds, view, op)


def test_most_free_chooses_the_emptier_cloud_and_a_refusal_moves_on(clouds, fed, service):
    one, two, _ = fed
    # make CloudTwo the fuller cloud: one server taking 60 % of its free memory and disk (and
    # VCPUs up to placement's max_unit for one allocation: the fake hypervisor's 1000)
    free = clouds.capacity(two.name).free
    admin2 = clouds.connect(two.name)
    flavor = admin2.compute.create_flavor(
        name=f"osb-{RUN}-big",
        vcpus=int(min(free["VCPU"] * 0.6, 1000)),
        ram=int(free["MEMORY_MB"] * 0.6),
        disk=int(free["DISK_GB"] * 0.6),
    )
    filler_project = admin2.identity.create_project(name=f"osb-{RUN}-filler", domain_id="default")
    member = admin2.identity.find_role("member", ignore_missing=False)
    admin2.identity.assign_project_role_to_user(filler_project, admin2.current_user_id, member)
    admin2.set_compute_quotas(filler_project.id, instances=-1, cores=-1, ram=-1)
    filler = clouds.connect(two.name, project_id=filler_project.id).compute.create_server(
        name=f"osb-{RUN}-filler", flavor_id=flavor.id, image_id=fed[2][two.name],
        networks="none",
    )  # fmt: skip
    filler = admin2.compute.wait_for_server(filler, wait=300)
    assert filler.status == "ACTIVE"
    fuller, emptier = clouds.capacity(two.name), clouds.capacity(one.name)
    assert fuller.free["MEMORY_MB"] < 0.5 * emptier.free["MEMORY_MB"]

    # most-free: CloudOne (local image: no scope)
    view, op, outcome = _provision(service, clouds, "free", image="tiny")
    assert isinstance(outcome, Done), outcome
    assert op.saved.cloud == one.name and op.saved.resources["scope"] is None
    _deprovision(service, clouds, view, op)

    # a quota of 0 instances on the space's project in CloudOne: refused there, goes to CloudTwo
    admin1 = clouds.connect(one.name)
    project_id = identity().space_project(admin1, space_of(context("quota")))
    admin1.set_compute_quotas(project_id, instances=0)
    view, op, outcome = _provision(service, clouds, "quota", space="quota", image="tiny")
    assert isinstance(outcome, Done), outcome
    assert op.saved.cloud == two.name
    assert f"is ACTIVE in {two.name}; {one.name} refused it: 403: Quota exceeded for instances" in (
        outcome.description
    )
    assert list(clouds.connect(one.name).compute.servers(
        all_projects=True, tags=instance_tag(view.id))) == []  # fmt: skip
    _deprovision(service, clouds, view, op)
    admin2.compute.delete_server(filler.id)
    admin2.compute.wait_for_delete(filler, wait=300)
