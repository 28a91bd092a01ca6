"""The built-in storage services against fake clouds (their end-to-end tests wait for the
lab's swift and cinder): ``openstack-object-container`` (a container per instance, each
binding a credential whose access rules name only that container) and ``openstack-volume``
(a volume per instance, grown by updates, attached by a binding to a server instance of the
same cloud and project, refused otherwise)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from openstack import exceptions

from scoperouter.broker.contract import (
    BindingView,
    Done,
    Failed,
    InstanceView,
    InvalidParameters,
    Pending,
)
from scoperouter.broker.services.container import (
    ObjectContainerService,
    access_rules,
    container_name,
)
from scoperouter.broker.services.volume import VolumeService
from tests.broker.passes import MemoryOperation, Saved, after, drive, instance
from tests.broker.test_server import FakeIdentity

_ids = itertools.count(1)


@dataclass
class FakeKeystone:
    credentials: dict[str, Any] = field(default_factory=dict)
    made: list[dict[str, Any]] = field(default_factory=list)
    project: str | None = None  # of the connection used last (a credential is its token's)

    def application_credentials(self, user: str, name: str | None = None) -> list[Any]:
        return [c for c in self.credentials.values() if name in (None, c.name)]

    def create_application_credential(self, user: str, **attrs: Any) -> Any:
        self.made.append(attrs)
        ident = f"ac-{next(_ids)}"
        credential = SimpleNamespace(
            id=ident, secret=f"secret-{ident}", project_id=self.project, **attrs
        )
        self.credentials[ident] = credential
        return credential

    def delete_application_credential(
        self, user: str, ident: str, ignore_missing: bool = True
    ) -> None:
        self.credentials.pop(ident, None)


@dataclass
class FakeSwift:
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    objects: dict[str, list[str]] = field(default_factory=dict)
    puts: int = 0

    def get_endpoint(self) -> str:
        return "http://127.0.0.2:8080/v1/AUTH_project-CloudOne"

    def create_container(self, name: str, **attrs: Any) -> None:
        self.puts += 1
        self.containers.setdefault(name, {}).update(attrs)
        self.objects.setdefault(name, [])

    def set_container_metadata(self, name: str, **meta: Any) -> None:
        self.containers[name].update(meta)

    def objects_of(self, name: str) -> list[Any]:
        if name not in self.containers:
            raise exceptions.NotFoundException(message="404")
        return [SimpleNamespace(name=o) for o in self.objects[name]]

    def delete_object(self, obj: str, container: str, ignore_missing: bool = True) -> None:
        self.objects[container].remove(obj)

    def delete_container(self, name: str, ignore_missing: bool = True) -> None:
        self.containers.pop(name, None)


@dataclass
class FakeCinder:
    volumes: dict[str, Any] = field(default_factory=dict)
    creates: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[tuple[str, str]] = field(default_factory=list)

    def volumes_named(self, name: str) -> list[Any]:
        return [v for v in self.volumes.values() if v.name == name]

    def create_volume(self, **attrs: Any) -> Any:
        self.creates.append(attrs)
        volume = SimpleNamespace(
            id=f"vol-{next(_ids)}", status="creating", attachments=[], volume_type="default",
            **attrs,
        )  # fmt: skip
        self.volumes[volume.id] = volume
        return volume

    def get_volume(self, ident: str) -> Any:
        if ident not in self.volumes:
            raise exceptions.NotFoundException(message="404")
        volume = self.volumes[ident]
        volume.status = {"creating": "available", "extending": "available"}.get(
            volume.status, volume.status
        )
        if volume.status == "attaching":
            volume.status = "in-use"
        if volume.status == "detaching":
            volume.status, volume.attachments = "available", []
        return volume

    def extend_volume(self, volume: Any, size: int) -> None:
        volume.size, volume.status = size, "extending"

    def delete_volume(self, volume: Any, ignore_missing: bool = True) -> None:
        self.volumes.pop(volume.id, None)


class FakeNova:
    def __init__(self, cinder: FakeCinder) -> None:
        self.cinder = cinder

    def create_volume_attachment(self, server_id: str, volume_id: str) -> None:
        volume = self.cinder.volumes[volume_id]
        volume.status = "attaching"
        volume.attachments = [{"server_id": server_id, "device": "/dev/vdb"}]

    def delete_volume_attachment(
        self, server_id: str, volume_id: str, ignore_missing: bool = True
    ) -> None:
        self.cinder.volumes[volume_id].status = "detaching"


class StorageClouds:
    """Two clouds; CloudOne has swift, cinder and keystone fakes."""

    def __init__(self) -> None:
        self.swift, self.cinder, self.keystone = FakeSwift(), FakeCinder(), FakeKeystone()
        self.connects: list[tuple[str, str | None]] = []

    def names(self) -> tuple[str, ...]:
        return ("CloudOne", "CloudTwo")

    def connect(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> Any:
        self.connects.append((cloud, project_id))
        if project_id is not None:
            self.keystone.project = project_id
        swift = self.swift
        store = SimpleNamespace(
            get_endpoint=swift.get_endpoint, create_container=swift.create_container,
            set_container_metadata=swift.set_container_metadata, objects=swift.objects_of,
            delete_object=swift.delete_object, delete_container=swift.delete_container,
        )  # fmt: skip
        block = SimpleNamespace(
            volumes=lambda name=None: self.cinder.volumes_named(name),
            create_volume=self.cinder.create_volume, get_volume=self.cinder.get_volume,
            extend_volume=self.cinder.extend_volume, delete_volume=self.cinder.delete_volume,
        )  # fmt: skip
        return SimpleNamespace(
            cloud_name=cloud, object_store=store, block_storage=block,
            compute=FakeNova(self.cinder), identity=self.keystone, current_user_id="broker",
        )  # fmt: skip

    def identity_url(self, cloud: str) -> str:
        return f"http://{cloud}:5000/v3"

    def region(self, cloud: str) -> str:
        return cloud


def _op(service: Any, kind: Any, view: Any, saved: Saved, **binding: Any) -> MemoryOperation:
    op = MemoryOperation(
        kind, view, service.catalog().plans[0], service.clouds, saved, identity=FakeIdentity()
    )
    if binding:
        op.binding = BindingView(
            id=binding["id"], instance_id=view.id, parameters=binding.get("parameters", {}),
            context={}, predecessor_binding_id=None, resources=binding.get("resources", {}),
        )  # fmt: skip
        op.parameters = op.binding.parameters
    return op


# ----------------------------------------------------------------- object container


def test_access_rules_name_only_the_container() -> None:
    rules = access_rules("http://r:8080/v1/AUTH_p/osb-i")
    assert {r["path"] for r in rules} == {"/v1/AUTH_p/osb-i", "/v1/AUTH_p/osb-i/**"}
    assert {r["method"] for r in rules} == {"GET", "HEAD", "PUT", "POST", "DELETE"}
    assert {r["service"] for r in rules} == {"object-store"}
    assert container_name("i-1") == "osb-i-1" and "/" not in container_name("a/b")


def test_a_container_per_instance_and_a_binding_limited_to_it() -> None:
    clouds = StorageClouds()
    service = ObjectContainerService({}, clouds)  # type: ignore[arg-type]
    create = service.catalog().plans[0].schemas.instance_create
    assert create is not None and set(create["properties"]) == {"public_read", "where"}
    saved = Saved()
    view = instance("i-1", {"public_read": True})
    assert isinstance(service.provision(_op(service, "provision", view, saved)), Done)
    # a pass re-run (a crash before its outcome was stored): the PUT again, one container
    outcome = service.provision(_op(service, "provision", view, saved))
    assert outcome.description == "container osb-i-1 in CloudOne"
    assert list(clouds.swift.containers) == ["osb-i-1"] and clouds.swift.puts == 2
    assert clouds.swift.containers["osb-i-1"] == {
        "read_ACL": ".r:*,.rlistings",
        "osb-instance-id": "i-1",
    }
    url = "http://127.0.0.2:8080/v1/AUTH_project-CloudOne/osb-i-1"
    assert saved.resources == {
        "cloud": "CloudOne", "project_id": "project-CloudOne", "scope": None,
        "container": "osb-i-1", "storage_url": url, "public_read": True,
    }  # fmt: skip
    bound = service.bind(_op(service, "bind", after(view, saved), Saved(), id="b-1"))
    assert isinstance(bound, Done)
    [made] = clouds.keystone.made
    assert made["name"] == "osb-b-1" and made["unrestricted"] is False
    assert made["access_rules"] == [dict(r) for r in access_rules(url)]
    creds = (bound.result or {})["credentials"]
    assert creds["container"] == "osb-i-1" and creds["storage_url"] == url
    assert creds["application_credential_secret"].startswith("secret-")
    # deprovision: the objects (a batch a pass), the container, the credential left
    clouds.swift.objects["osb-i-1"] = ["a", "b", "c"]
    import scoperouter.broker.services.container as container

    batch, container.DELETE_BATCH = container.DELETE_BATCH, 2
    try:
        gone = _op(service, "deprovision", after(view, saved), saved)
        assert isinstance(service.deprovision(gone), Pending)
        assert clouds.swift.objects["osb-i-1"] == ["c"]
        done = drive(service, gone, max_sleep=0)
    finally:
        container.DELETE_BATCH = batch
    assert isinstance(done, Done) and "1 binding credential(s) revoked" in done.description
    assert clouds.swift.containers == {} and clouds.keystone.credentials == {}


# --------------------------------------------------------------------------- volume


def _server(cloud: str = "CloudOne", project: str = "project-CloudOne", **kw: Any) -> InstanceView:
    return InstanceView(
        id="srv-1", service_id="s", plan_id="p", parameters={}, context={}, cloud=cloud,
        resources={"project_id": project, "server_id": "nova-1"},
        service_name=kw.get("service_name", "openstack-server"),
    )  # fmt: skip


def test_a_volume_s_server_must_be_a_server_instance_of_its_cloud_and_project() -> None:
    service = VolumeService({}, StorageClouds())  # type: ignore[arg-type]
    plan = service.catalog().plans[0]
    volume = InstanceView(
        id="v-1", service_id="v", plan_id="p", parameters={"size": 2}, context={},
        cloud="CloudOne", resources={"project_id": "project-CloudOne", "size": 2},
    )  # fmt: skip

    def check(kind: Any, parameters: dict[str, Any], server: InstanceView | None) -> None:
        service.check_references(kind, plan, parameters, instance=volume, lookup=lambda _id: server)

    check("bind", {"server_instance_id": "srv-1"}, _server())  # same cloud and project: fine
    cases = [
        (_server("CloudTwo"), "server instance srv-1 is in CloudTwo, this volume in CloudOne"),
        (_server(project="other"), "in another platform space's project"),
        (_server(service_name="openstack-image"), "not a provisioned openstack-server instance"),
        (None, "not a provisioned openstack-server instance"),
    ]
    for server, message in cases:
        with pytest.raises(InvalidParameters) as caught:
            check("bind", {"server_instance_id": "srv-1"}, server)
        assert caught.value.field == "parameters.server_instance_id"
        assert message in caught.value.message
    with pytest.raises(InvalidParameters, match="a volume only grows: at least 2"):
        check("update", {"size": 1}, None)


def test_a_volume_is_made_once_grown_attached_by_a_binding_and_removed() -> None:
    clouds = StorageClouds()
    service = VolumeService({"plans": [{"name": "s", "description": "s", "size": 3}]}, clouds)  # type: ignore[arg-type]
    saved = Saved()
    view = instance("v-1", {})
    first = service.provision(_op(service, "provision", view, saved))
    assert isinstance(first, Pending)
    [made] = clouds.cinder.creates
    assert made == {"name": "osb-v-1", "size": 3, "metadata": {"osb_instance_id": "v-1"}}
    saved.progress.pop("volume_id")  # a crash before the id was saved: found by name
    done = drive(service, _op(service, "provision", view, saved), max_sleep=0)
    assert isinstance(done, Done) and "(3 GB) is available in CloudOne" in done.description
    assert len(clouds.cinder.creates) == 1
    grown = drive(
        service,
        _op(service, "update", after(instance("v-1", {"size": 5}), saved), saved),
        max_sleep=0,
    )
    assert grown == Done(f"volume {saved.resources['volume_id']} has 5 GB")
    # a binding attaches the volume to the server of a server instance
    bind = _op(
        service,
        "bind",
        after(view, saved),
        Saved(),
        id="b-1",
        parameters={"server_instance_id": "srv-1"},
    )
    bind.others["srv-1"] = _server()
    bound = drive(service, bind, max_sleep=0)
    assert isinstance(bound, Done), bound
    creds = (bound.result or {})["credentials"]
    assert (creds["server_id"], creds["device"], creds["volume_id"]) == (
        "nova-1", "/dev/vdb", saved.resources["volume_id"],
    )  # fmt: skip
    # deprovision with the binding left: detach, delete, revoke
    gone = drive(service, _op(service, "deprovision", after(view, saved), saved), max_sleep=0)
    assert isinstance(gone, Done) and "1 binding credential(s) revoked" in gone.description
    assert clouds.cinder.volumes == {}


def test_a_bound_server_gone_since_the_request_fails_the_bind() -> None:
    clouds = StorageClouds()
    service = VolumeService({}, clouds)  # type: ignore[arg-type]
    saved = Saved()
    drive(service, _op(service, "provision", instance("v-2", {}), saved), max_sleep=0)
    bind = _op(service, "bind", after(instance("v-2", {}), saved), Saved(), id="b-2",
               parameters={"server_instance_id": "srv-9"})  # fmt: skip
    outcome = service.bind(bind)
    assert isinstance(outcome, Failed) and "srv-9 has no server in CloudOne" in outcome.description
