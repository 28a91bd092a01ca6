"""openstack-server's passes against a fake federation (the real clouds are in
tests/e2e/test_broker_server.py): placement, refusals and the next candidate, crash re-runs
that find the tagged server, cancellation, deprovision, parameters and the catalog."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from openstack import exceptions

from scoperouter.broker.clouds import CloudUnavailable
from scoperouter.broker.config import IdentityConfig
from scoperouter.broker.contract import (
    Capacity,
    Done,
    Failed,
    InvalidParameters,
    Pending,
)
from scoperouter.broker.identity import Space
from scoperouter.broker.openstack_helpers import METADATA_KEY, instance_tag
from scoperouter.broker.services.server import ServerService
from tests.broker.passes import MemoryOperation, Saved, after, drive, instance

SETTINGS = {
    "networks": "none",
    "plans": [
        {"name": "tiny", "description": "1 VCPU", "flavor": "m1.tiny"},
        {"name": "big", "id": "plan-big", "flavor": "m1.big", "bindable": False},
    ],
}
_ids = itertools.count(1)


def http_error(status: int, details: str) -> exceptions.HttpException:
    response = requests.models.Response()
    response.status_code = status
    cls = exceptions.ForbiddenException if status == 403 else exceptions.HttpException
    return cls(message=f"{status}", response=response, details=details)


@dataclass
class Obj:
    """An openstacksdk resource as far as the service reads it."""

    id: str
    name: str = ""
    status: str = "ACTIVE"
    fault: dict[str, Any] | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    task_state: str | None = None
    project_id: str | None = None
    vcpus: int = 1
    ram: int = 64
    disk: int = 1
    ephemeral: int = 0
    swap: int = 0


@dataclass
class FakeCloud:
    name: str
    free: float = 0.5  # fraction of everything free
    flavors: dict[str, Obj] = field(default_factory=dict)
    images: dict[str, Obj] = field(default_factory=dict)
    servers: dict[str, Obj] = field(default_factory=dict)
    create_error: BaseException | None = None  # raised by every create_server
    errors_left: int | None = None  # how many creates raise create_error (None: all)
    build_polls: int = 1  # gets while BUILD before the final status
    final: str = "ACTIVE"
    fault: str = "No valid host was found. There are not enough hosts available."
    unreadable: bool = False
    creates: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    polls: dict[str, int] = field(default_factory=dict)

    def capacity(self) -> Capacity:
        if self.unreadable:
            raise CloudUnavailable(f"capacity of {self.name} unreadable: 503")
        total = {"VCPU": 100.0, "MEMORY_MB": 10000.0, "DISK_GB": 100.0}
        return Capacity(
            cloud=self.name,
            total=total,
            free={k: v * self.free for k, v in total.items()},
            read_at=datetime.now(UTC),
        )


class FakeCompute:
    def __init__(self, cloud: FakeCloud, project_id: str | None, scope: str | None) -> None:
        self.cloud, self.project_id, self.scope = cloud, project_id, scope

    def find_flavor(self, name: str, ignore_missing: bool = True) -> Obj | None:
        return self.cloud.flavors.get(name)

    def servers(self, tags: str, all_projects: bool = False) -> Iterator[Obj]:
        for server in list(self.cloud.servers.values()):
            mine = all_projects or server.project_id == self.project_id
            if mine and tags in server.tags:
                yield server

    def create_server(self, **body: Any) -> Obj:
        self.cloud.creates.append({**body, "project_id": self.project_id, "scope": self.scope})
        left = self.cloud.errors_left
        if self.cloud.create_error is not None and (left is None or left > 0):
            if left is not None:
                self.cloud.errors_left = left - 1
            raise self.cloud.create_error
        server = Obj(
            id=f"srv-{next(_ids)}",
            name=body["name"],
            status="BUILD",
            tags=list(body["tags"]),
            metadata=dict(body["metadata"]),
            created_at=str(next(_ids)),
            project_id=self.project_id,
        )
        self.cloud.servers[server.id] = server
        return server

    def get_server(self, server_id: str) -> Obj:
        if server_id not in self.cloud.servers:
            raise exceptions.NotFoundException(f"no server {server_id}")
        server = self.cloud.servers[server_id]
        polls = self.cloud.polls[server_id] = self.cloud.polls.get(server_id, 0) + 1
        if server.status == "BUILD" and polls > self.cloud.build_polls:
            server.status = self.cloud.final
            if server.status == "ERROR":
                server.fault = {"code": 500, "message": self.cloud.fault}
        return server

    def delete_server(self, server_id: str, ignore_missing: bool = True) -> None:
        self.cloud.deletes.append(server_id)
        self.cloud.servers.pop(server_id, None)


class FakeImages:
    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud = cloud

    def find_image(self, ref: str, ignore_missing: bool = True) -> Obj | None:
        found = [i for i in self.cloud.images.values() if ref in (i.id, i.name)]
        if len(found) > 1:
            raise exceptions.DuplicateResource(f"more than one image {ref}")
        return found[0] if found else None


class FakeConn:
    def __init__(self, cloud: FakeCloud, project_id: str | None, scope: str | None) -> None:
        self.cloud_name = cloud.name
        self.compute = FakeCompute(cloud, project_id, scope)
        self.image = FakeImages(cloud)


class FakeClouds:
    def __init__(self, *clouds: FakeCloud) -> None:
        self.clouds = {c.name: c for c in clouds}
        self.connects: list[tuple[str, str | None, str | None]] = []

    def names(self) -> tuple[str, ...]:
        return tuple(self.clouds)

    def connect(self, cloud: str, *, project_id: str | None = None, scope: str | None = None):
        self.connects.append((cloud, project_id, scope))
        entry = self.clouds[cloud]
        # the routers: a scope naming another cloud for image sends image calls there
        image_cloud = json.loads(scope).get("image", cloud) if scope else cloud
        conn = FakeConn(entry, project_id, scope)
        conn.image = FakeImages(self.clouds[image_cloud])
        return conn

    def capacity(self, cloud: str) -> Capacity:
        return self.clouds[cloud].capacity()

    def identity_url(self, cloud: str) -> str:
        return f"http://{cloud}/v3"

    def region(self, cloud: str) -> str:
        return cloud


class FakeIdentity:
    """identity.Identity as the services use it: the space's project in each cloud."""

    config = IdentityConfig()

    def __init__(self) -> None:
        self.ensured: list[tuple[str, str]] = []

    def space_project(self, conn: FakeConn, space: Space) -> str:
        self.ensured.append((space.digest, conn.cloud_name))
        return f"project-{conn.cloud_name}"

    def grant_mapped(self, conn: FakeConn, cloud: str, project_id: str, who: Any) -> list[str]:
        return []


def federation(**overrides: dict[str, Any]) -> FakeClouds:
    clouds = []
    for name in ("CloudOne", "CloudTwo"):
        cloud = FakeCloud(
            name=name,
            flavors={"m1.tiny": Obj(id=f"{name}-tiny"), "m1.big": Obj(id="big", vcpus=1000)},
            images={f"{name}-img": Obj(id=f"{name}-img", name="tiny", status="active")},
        )
        for key, value in overrides.get(name, {}).items():
            setattr(cloud, key, value)
        clouds.append(cloud)
    return FakeClouds(*clouds)


def make(clouds: FakeClouds) -> ServerService:
    return ServerService(SETTINGS, clouds)


def provision_op(service: ServerService, iid: str, saved: Saved | None = None, **params: Any):
    view = instance(iid, {"image": "tiny", **params})
    plan = service.catalog().plans[0]
    return MemoryOperation("provision", view, plan, service.clouds, saved, identity=FakeIdentity())


# ----------------------------------------------------------------------------- catalog


def test_catalog_plans_map_to_flavors_with_stable_ids():
    service = make(federation())
    entry = service.catalog()
    assert entry.name == "openstack-server" and entry.bindable
    assert [(p.name, p.settings) for p in entry.plans] == [
        ("tiny", {"flavor": "m1.tiny"}),
        ("big", {"flavor": "m1.big"}),
    ]
    assert entry.plans[1].id == "plan-big" and entry.plans[1].bindable is False
    again = make(federation()).catalog()
    assert (again.id, again.plans[0].id) == (entry.id, entry.plans[0].id)
    schema = entry.plans[0].schemas.instance_create
    assert schema is not None and schema["required"] == ["image"]
    where = schema["properties"]["where"]["properties"]
    assert where["cloud"]["enum"] == ["CloudOne", "CloudTwo"]


def test_a_plan_without_flavor_is_a_config_error():
    with pytest.raises(ValueError, match=r"plans\[0\] \(tiny\): flavor is required"):
        ServerService({"plans": [{"name": "tiny"}]}, federation())
    with pytest.raises(ValueError, match="networks"):
        ServerService({**SETTINGS, "networks": "some"}, federation())


def test_validate_names_the_field():
    service = make(federation())
    plan = service.catalog().plans[0]
    service.validate("provision", plan, {"image": "x", "where": {"cloud": "CloudTwo"}})
    with pytest.raises(InvalidParameters) as caught:
        service.validate("provision", plan, {"image": "x", "where": {"scope": {"image": "A"}}})
    assert caught.value.field == "parameters.where.scope"
    with pytest.raises(InvalidParameters) as caught:
        service.validate("provision", plan, {"image": "x", "user_data": "é" * 30000})
    assert caught.value.field == "parameters.user_data"


# --------------------------------------------------------------------------- provision


def test_most_free_places_in_the_freer_cloud_with_tags_and_polls_to_active():
    clouds = federation(CloudOne={"free": 0.2}, CloudTwo={"free": 0.9})
    service = make(clouds)
    op = provision_op(service, "i-1", user_data="#cloud-config", key_name="k")
    passes: list[Any] = []
    outcome = drive(service, op, max_sleep=0, passes=passes)
    assert isinstance(outcome, Done), outcome
    assert passes[0] == Pending(f"creating server {op.saved.progress['server_id']} in CloudTwo")
    assert isinstance(passes[1], Pending) and "BUILD in CloudTwo" in passes[1].description
    (body,) = clouds.clouds["CloudTwo"].creates
    assert body["tags"] == ["osb", "osb-instance-i-1"] and body["metadata"] == {METADATA_KEY: "i-1"}
    assert body["flavor_id"] == "CloudTwo-tiny" and body["image_id"] == "CloudTwo-img"
    assert body["networks"] == "none" and body["key_name"] == "k"
    assert body["user_data"] == "I2Nsb3VkLWNvbmZpZw=="  # base64 of the text
    assert body["project_id"] == "project-CloudTwo" and body["scope"] is None
    assert op.saved.cloud == "CloudTwo"
    server_id = op.saved.resources["server_id"]
    assert op.saved.resources == {"cloud": "CloudTwo", "project_id": "project-CloudTwo",
        "server_id": server_id, "image_id": "CloudTwo-img", "image_cloud": "CloudTwo",
        "scope": None}  # fmt: skip
    assert outcome.description == f"server {server_id} is ACTIVE in CloudTwo"
    assert [cloud for _, cloud in op.identity.ensured] == ["CloudTwo"]
    assert op.saved.progress["projects"] == {"CloudTwo": "project-CloudTwo"}


def test_image_of_another_cloud_is_used_through_a_scope():
    clouds = federation(CloudTwo={"images": {}})  # the image lives only in CloudOne
    service = make(clouds)
    op = provision_op(service, "i-2", where={"cloud": "CloudTwo"})
    outcome = drive(service, op, max_sleep=0)
    assert isinstance(outcome, Done), outcome
    (body,) = clouds.clouds["CloudTwo"].creates
    assert body["scope"] == '{"image":"CloudOne"}' and body["image_id"] == "CloudOne-img"
    assert "image CloudOne-img from CloudOne through the routers" in outcome.description
    assert op.saved.resources["scope"] == '{"image":"CloudOne"}'


def test_scope_strategy_enters_at_compute_with_the_given_scope():
    clouds = federation()
    service = make(clouds)
    where = {"scope": {"compute": "CloudOne", "image": "CloudTwo"}}
    op = provision_op(service, "i-3", where=where)
    outcome = drive(service, op, max_sleep=0)
    assert isinstance(outcome, Done), outcome
    (body,) = clouds.clouds["CloudOne"].creates
    assert body["scope"] == '{"compute":"CloudOne","image":"CloudTwo"}'
    assert body["image_id"] == "CloudTwo-img"


def test_quota_refusal_moves_to_the_next_candidate_and_says_why():
    quota = http_error(403, "Quota exceeded for instances: Requested 1, but already used 0 of 0")
    clouds = federation(CloudOne={"free": 0.9, "create_error": quota}, CloudTwo={"free": 0.1})
    service = make(clouds)
    op = provision_op(service, "i-4")
    outcome = drive(service, op, max_sleep=0)
    assert isinstance(outcome, Done), outcome
    assert op.saved.cloud == "CloudTwo"
    assert outcome.description.endswith(
        "ACTIVE in CloudTwo; CloudOne refused it: 403: Quota exceeded for instances: "
        "Requested 1, but already used 0 of 0"
    )


def test_no_valid_host_deletes_that_server_and_tries_the_next():
    clouds = federation(CloudOne={"free": 0.9, "final": "ERROR"}, CloudTwo={"free": 0.1})
    service = make(clouds)
    op = provision_op(service, "i-5")
    outcome = drive(service, op, max_sleep=0)
    assert isinstance(outcome, Done), outcome
    one = clouds.clouds["CloudOne"]
    assert len(one.creates) == 1 and one.deletes and one.servers == {}
    assert "CloudOne refused it: No valid host was found" in outcome.description


def test_every_cloud_refusing_fails_with_each_reason():
    clouds = federation(CloudOne={"final": "ERROR"}, CloudTwo={"final": "ERROR", "free": 0.1})
    service = make(clouds)
    outcome = drive(service, provision_op(service, "i-6"), max_sleep=0)
    assert isinstance(outcome, Failed)
    assert outcome.description.startswith("no cloud took the server: CloudOne refused it: No ")
    assert "; CloudTwo refused it: No valid host" in outcome.description
    assert all(not c.servers for c in clouds.clouds.values())


def test_clouds_that_cannot_take_it_fail_the_provision_with_each_reason():
    clouds = federation(CloudOne={"free": 0.0, "images": {}}, CloudTwo={"images": {}})
    service = make(clouds)
    outcome = drive(service, provision_op(service, "i-8"), max_sleep=0)
    assert outcome == Failed(
        "no cloud can take the server: CloudOne: too small: 0 VCPU free, 1 needed; "
        "CloudTwo: no active image 'tiny' visible from it (looked in CloudTwo, CloudOne)"
    )
    clouds = federation(CloudOne={"flavors": {}}, CloudTwo={"flavors": {}})
    outcome = drive(make(clouds), provision_op(make(clouds), "i-8b"), max_sleep=0)
    assert isinstance(outcome, Failed) and "CloudTwo: no flavor 'm1.tiny'" in outcome.description


def test_a_cloud_that_cannot_be_asked_makes_the_choice_wait_not_fail():
    clouds = federation(CloudOne={"unreadable": True}, CloudTwo={"flavors": {}})
    service = make(clouds)
    op = provision_op(service, "i-7")
    assert service.provision(op) == Pending(
        "no cloud can take the server now (CloudOne: capacity of CloudOne unreadable: 503; "
        "CloudTwo: no flavor 'm1.tiny'); asking again",
        15.0,
    )
    assert "targets" not in op.progress  # nothing chosen yet: the next pass asks again
    clouds.clouds["CloudOne"].unreadable = False  # the cloud is back
    outcome = drive(service, op, max_sleep=0)
    assert isinstance(outcome, Done) and "ACTIVE in CloudOne" in outcome.description


def test_excluded_clouds_are_named_in_the_success_description():
    clouds = federation(CloudOne={"unreadable": True})
    service = make(clouds)
    outcome = drive(service, provision_op(service, "i-9"), max_sleep=0)
    assert isinstance(outcome, Done)
    assert outcome.description.endswith(
        "in CloudTwo; not candidates: CloudOne: capacity of CloudOne unreadable: 503"
    )


def test_spread_goes_where_the_broker_has_fewest_servers():
    clouds = federation(CloudOne={"free": 0.1}, CloudTwo={"free": 0.9})
    for i in range(2):
        clouds.clouds["CloudTwo"].servers[f"x{i}"] = Obj(id=f"x{i}", tags=["osb"])
    service = make(clouds)
    outcome = drive(service, provision_op(service, "i-10", where={"strategy": "spread"}),
                    max_sleep=0)  # fmt: skip
    assert isinstance(outcome, Done) and "ACTIVE in CloudOne" in outcome.description


def test_a_rerun_after_a_crash_finds_the_tagged_server_instead_of_creating_another():
    clouds = federation(CloudOne={"free": 0.9, "build_polls": 3})
    service = make(clouds)
    saved = Saved()
    op = provision_op(service, "i-11", saved)

    real_save = op.save

    def crash_after_create(**progress: Any) -> None:
        if "server_id" in progress:
            raise SystemExit("SIGKILL")  # the pass dies between the create and its save
        real_save(**progress)

    op.save = crash_after_create  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        service.provision(op)
    assert len(clouds.clouds["CloudOne"].servers) == 1 and "server_id" not in saved.progress
    outcome = drive(service, provision_op(service, "i-11", saved), max_sleep=0)
    assert isinstance(outcome, Done)
    assert len(clouds.clouds["CloudOne"].creates) == 1  # found by tag, not created again
    assert saved.resources["server_id"] in clouds.clouds["CloudOne"].servers


def test_a_rerun_finishes_a_refusal_a_dead_pass_started():
    clouds = federation(CloudOne={"free": 0.9, "final": "ERROR"})
    service = make(clouds)
    saved = Saved()
    op = provision_op(service, "i-12", saved)
    one = clouds.clouds["CloudOne"]
    original_delete = FakeCompute.delete_server

    def die(self: FakeCompute, server_id: str, ignore_missing: bool = True) -> None:
        raise SystemExit("SIGKILL")

    FakeCompute.delete_server = die  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            drive(service, op, max_sleep=0)
    finally:
        FakeCompute.delete_server = original_delete  # type: ignore[method-assign]
    assert saved.progress["refusing"]["server_id"] in one.servers
    outcome = drive(service, provision_op(service, "i-12", saved), max_sleep=0)
    assert isinstance(outcome, Done) and "ACTIVE in CloudTwo" in outcome.description
    assert one.servers == {} and len(one.creates) == 1


def test_transient_errors_are_retried_then_count_as_a_refusal():
    clouds = federation(CloudOne={"free": 0.9, "create_error": http_error(503, "busy"),
                                  "errors_left": 2})  # fmt: skip
    service = make(clouds)
    passes: list[Any] = []
    outcome = drive(service, provision_op(service, "i-13"), max_sleep=0, passes=passes)
    assert isinstance(outcome, Done) and "ACTIVE in CloudOne" in outcome.description
    assert [type(p).__name__ for p in passes[:2]] == ["Pending", "Pending"]
    assert passes[0].description == "CloudOne failed (503: busy); trying again"

    always = federation(CloudOne={"free": 0.9, "create_error": http_error(502, "down")})
    service = make(always)
    outcome = drive(service, provision_op(service, "i-14"), max_sleep=0)
    assert isinstance(outcome, Done) and "ACTIVE in CloudTwo" in outcome.description
    assert "CloudOne refused it: kept failing: 502: down" in outcome.description


def test_a_cancelled_provision_creates_nothing():
    clouds = federation()
    service = make(clouds)
    op = provision_op(service, "i-15")
    op.cancel = True
    outcome = service.provision(op)
    assert isinstance(outcome, Failed) and "deprovision" in outcome.description
    assert all(not c.creates for c in clouds.clouds.values())


# ------------------------------------------------------------------------ deprovision


def test_deprovision_removes_tagged_servers_everywhere_and_waits_for_them():
    clouds = federation()
    service = make(clouds)
    tag = instance_tag("i-16")
    clouds.clouds["CloudOne"].servers["a"] = Obj(id="a", tags=["osb", tag], project_id="p")
    clouds.clouds["CloudTwo"].servers["b"] = Obj(id="b", tags=["osb", tag], status="ERROR")
    clouds.clouds["CloudTwo"].servers["c"] = Obj(id="c", tags=["osb", "osb-other"])
    saved = Saved()
    view = instance("i-16", {"image": "tiny"})
    plan = service.catalog().plans[0]
    op = MemoryOperation("deprovision", after(view, saved), plan, clouds, identity=FakeIdentity())
    outcome = drive(service, op, max_sleep=0)
    assert outcome == Done("no server of this instance is left in any cloud")
    assert clouds.clouds["CloudOne"].deletes == ["a"] and clouds.clouds["CloudTwo"].deletes == ["b"]
    assert list(clouds.clouds["CloudTwo"].servers) == ["c"]
    assert {f.id for c in service.inventory_clouds() for f in service.inventory(c)} == {"c"}


def test_instance_tags_fit_nova():
    assert instance_tag("6f1c0a4e-4b39-4c0e-9a8e-0d2f1b7c9e11") == (
        "osb-instance-6f1c0a4e-4b39-4c0e-9a8e-0d2f1b7c9e11"
    )
    long_tag = instance_tag("x" * 80)
    assert long_tag.startswith("osb-instance-") and len(long_tag) <= 60
    assert instance_tag("a/b,c") != instance_tag("a/b,d") and "/" not in instance_tag("a/b,c")


def test_the_sample_config_sections_build_catalogs_with_valid_schemas():
    from pathlib import Path

    from scoperouter.broker.config import load_config
    from scoperouter.broker.runtime import compile_schema, make_clouds, service_classes

    config = load_config(Path(__file__).resolve().parents[2] / "config" / "broker.yaml")
    classes = service_classes()  # the entry points of setup.cfg
    clouds = make_clouds(config)  # reads no file and calls no cloud until used
    for name in ("openstack-server", "openstack-image"):
        service = classes[name](config.services[name].service_settings(), clouds)
        entry = service.catalog()
        assert entry.name == name and entry.plans
        for plan in entry.plans:
            assert plan.schemas.instance_create is not None
            validator = compile_schema(plan.schemas.instance_create, name)
            assert not validator.is_valid({})  # image is required
    server = classes["openstack-server"](config.services["openstack-server"].service_settings(),
                                         clouds)  # fmt: skip
    validator = compile_schema(server.catalog().plans[0].schemas.instance_create or {}, "s")
    assert validator.is_valid({"image": "tiny", "where": {"strategy": "spread"}})
    assert not validator.is_valid({"image": "tiny", "where": {"cloud": "Elsewhere"}})
    assert not validator.is_valid({"image": "tiny", "where": {"cloud": "CloudOne", "scope": {}}})
