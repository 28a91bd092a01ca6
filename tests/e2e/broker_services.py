"""Helpers for the e2e tests of the broker's services against the lab (test_broker_server.py,
test_broker_image.py, test_broker_storage.py, test_broker_heat.py, test_broker_packs.py): a
broker process and its OSB client, the broker's view of the lab, what a binding is checked
with, and a sweep of what a test left.

Everything these tests create in the lab has a name or tag starting with ``osb`` and carries a
per-run id, so a sweep removes exactly what this run made and never another helper's resources.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from scoperouter.broker.clouds import CloudAccess, FederationClouds
from scoperouter.broker.config import IdentityConfig
from scoperouter.broker.identity import Identity
from scoperouter.broker.osbclient import OSBClient
from tests.broker.conftest import PASSWORD
from tests.broker.pg import free_port
from tests.broker.procs import BrokerProcess

RUN = uuid.uuid4().hex[:8]  # this test run: in every name and instance id


def broker_clouds(lab: Any, fed: Any) -> FederationClouds:
    """The broker's federation: the lab's admin entries, through the routers."""
    one, two, _ = fed
    return FederationClouds(
        [CloudAccess(name=c.name, entry=f"{c.slug}-admin") for c in (one, two)],
        config_files=[lab.clouds_yaml],
        capacity_ttl=0.0,  # these tests change capacity on purpose
    )


def instance_id(label: str) -> str:
    return f"osb-{RUN}-{label}-{uuid.uuid4().hex[:6]}"


def context(space: str) -> dict[str, str]:
    """A Cloud Foundry context whose space project's name carries this run's id (the sweep
    finds it: ``osb-cloudfoundry-osb-<run>-<space>-<digest>``)."""
    return {"platform": "cloudfoundry", "organization_guid": f"osb-{RUN}", "space_guid": space}


def identity() -> Identity:
    """The broker's identity component with the sample config's defaults."""
    return Identity(IdentityConfig())


def sweep(clouds: FederationClouds, timeout: float = 120.0) -> list[str]:
    """Delete every server, image, flavor and project of this run in every cloud; what was
    deleted, for the test log."""
    gone: list[str] = []
    for cloud in clouds.names():
        admin = clouds.connect(cloud)
        servers = [
            s for s in admin.compute.servers(all_projects=True) if f"osb-{RUN}" in (s.name or "")
        ]
        for server in servers:
            admin.compute.delete_server(server.id, ignore_missing=True)
            gone.append(f"{cloud} server {server.id}")
        _wait_gone(admin, servers, timeout)
        for image in admin.image.images():
            if f"osb-{RUN}" in (image.name or "") or _tagged_run(image.tags or []):
                admin.image.delete_image(image.id, ignore_missing=True)
                gone.append(f"{cloud} image {image.id}")
        for flavor in admin.compute.flavors(is_public=None):
            if flavor.name.startswith(f"osb-{RUN}"):
                admin.compute.delete_flavor(flavor.id, ignore_missing=True)
                gone.append(f"{cloud} flavor {flavor.name}")
        for project in admin.identity.projects():
            if f"osb-{RUN}" in project.name:
                admin.identity.delete_project(project.id, ignore_missing=True)
                gone.append(f"{cloud} project {project.name}")
    return gone


def _tagged_run(tags: Iterable[str]) -> bool:
    return any(tag.startswith(f"osb-osb-{RUN}") or tag == f"osb-{RUN}" for tag in tags)


def _wait_gone(admin: Any, servers: list[Any], timeout: float) -> None:
    end = time.monotonic() + timeout
    pending = {s.id for s in servers}
    while pending and time.monotonic() < end:
        listed = {s.id for s in admin.compute.servers(all_projects=True)}
        pending &= listed
        if pending:
            time.sleep(1)


OPENSTACK = Path(sys.executable).with_name("openstack")  # this venv's: it has --os-scope


# The broker's operation deadlines here; a wait lasts the deadline plus what a worker takes to
# get to an operation (a lease, a retry's backoff, a poll), as in test_broker.py.
DEADLINES = {"provision": 600.0, "deprovision": 600.0, "bind": 120.0, "unbind": 120.0}
LEASE, MAX_RETRY, POLL = 30.0, 10.0, 5.0


SERVER_AND_IMAGE: dict[str, Any] = {
    "openstack-server": {
        "networks": "none",
        "deadlines": DEADLINES,
        "plans": [{"name": "tiny", "flavor": "m1.tiny"}],
    },
    "openstack-image": {"deadlines": DEADLINES, "plans": [{"name": "copy"}]},
}


class OSBBroker:
    """`scoperouter broker serve` (a real process; SQLite, or the database of `db_url`) with
    the server and image services on the lab's clouds (or the `services` given), and the
    project's OSB client sending what Cloud Foundry sends, for the space `space` of this
    run."""

    def __init__(
        self,
        lab: Any,
        tmp: Path,
        space: str = "osb",
        lease: float = LEASE,
        services: dict[str, Any] | None = None,
        deadlines: dict[str, float] | None = None,
        db_url: str | None = None,
    ) -> None:
        self.lab = lab
        self.tmp = tmp
        self.lease = lease
        self.deadlines = {**DEADLINES, **(deadlines or {})}
        config = {
            "listen": f"127.0.0.1:{free_port()}",
            "database": {"url": db_url or f"sqlite:///{tmp / 'broker.db'}"},
            "clouds_yaml": [str(lab.clouds_yaml)],
            "clouds": {c.name: {"entry": f"{c.slug}-admin"} for c in lab.clouds[:2]},
            "worker": {
                "threads": 4,
                "lease_seconds": lease,
                "heartbeat_seconds": lease / 4,
                "poll_seconds": 0.2,
                "max_retry_seconds": MAX_RETRY,
            },
            "services": services or SERVER_AND_IMAGE,
        }
        self.config = tmp / "broker.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = tmp / "broker.log"
        self.process = BrokerProcess(self.config, self.log).start()
        self.osb = OSBClient(
            self.process.url, "broker", PASSWORD, context=context(space), timeout=60
        )
        try:
            catalog = self.osb.catalog()
            assert catalog.status == 200, catalog.body
        except BaseException:  # no fixture teardown for a constructor that raised
            self.process.kill()
            raise
        self.catalog = catalog.body
        self.ids = {s["name"]: (s["id"], s["plans"][0]["id"]) for s in catalog.body["services"]}

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def wait(
        self, iid: str, operation: str | None, kind: str, binding_id: str | None = None
    ) -> Any:
        """The operation's final answer, which the broker owes by its deadline."""
        timeout = self.deadlines[kind] + self.lease + MAX_RETRY + POLL
        return self.osb.wait(iid, operation, binding_id=binding_id, timeout=timeout)

    def restart(self) -> None:
        """SIGKILL (no cleanup of any kind) and a new process on the same port and database."""
        self.process.kill()
        self.process = BrokerProcess(self.config, self.log, listen=self.process.listen).start()

    def plan(self, service: str, plan: str | None = None) -> tuple[str, str]:
        """(service id, plan id) of `service`'s plan named `plan` (default its first)."""
        if plan is None:
            return self.ids[service]
        [entry] = [s for s in self.catalog["services"] if s["name"] == service]
        [found] = [p["id"] for p in entry["plans"] if p["name"] == plan]
        return entry["id"], found

    def provision(
        self, service: str, label: str, parameters: dict[str, Any], plan: str | None = None
    ) -> tuple[str, Any]:
        """Provision and wait: (instance id, the final last_operation answer)."""
        service_id, plan_id = self.plan(service, plan)
        iid = instance_id(label)
        answer = self.osb.provision(iid, service_id, plan_id, parameters)
        assert answer.status == 202, answer.body
        return iid, self.wait(iid, answer.operation, "provision")

    def bind(
        self,
        service: str,
        iid: str,
        suffix: str = "b",
        parameters: dict[str, Any] | None = None,
        plan: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        service_id, plan_id = self.plan(service, plan)
        binding = f"{iid}-{suffix}"
        answer = self.osb.bind(iid, binding, service_id, plan_id, parameters)
        assert answer.status == 202, answer.body
        last = self.wait(iid, answer.operation, "bind", binding)
        assert last.body["state"] == "succeeded", last.body
        got = self.osb.get_binding(iid, binding)
        assert got.status == 200, got.body
        return binding, got.body["credentials"]

    def update(self, service: str, iid: str, parameters: dict[str, Any]) -> Any:
        """Update the instance's parameters and wait: the final last_operation answer (which
        must say succeeded)."""
        service_id, _plan_id = self.plan(service)
        answer = self.osb.update(iid, service_id, None, parameters)
        assert answer.status == 202, answer.body
        last = self.wait(iid, answer.operation, "provision")  # an update's deadline is as long
        assert last.body["state"] == "succeeded", last.body
        return last

    def unbind(self, service: str, iid: str, binding: str, plan: str | None = None) -> None:
        service_id, plan_id = self.plan(service, plan)
        answer = self.osb.unbind(iid, binding, service_id, plan_id)
        assert answer.status == 202, answer.body
        assert self.wait(iid, answer.operation, "unbind", binding).status == 410

    def deprovision(self, service: str, iid: str, plan: str | None = None) -> None:
        service_id, plan_id = self.plan(service, plan)
        answer = self.osb.deprovision(iid, service_id, plan_id)
        assert answer.status == 202, answer.body
        assert self.wait(iid, answer.operation, "deprovision").status == 410

    def openstack(self, clouds_yaml: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The `openstack` CLI (with the --os-scope plugin) on a binding's clouds.yaml."""
        path = self.tmp / f"binding-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(clouds_yaml)
        env = {**self.lab.env(), "OS_CLIENT_CONFIG_FILE": str(path)}
        name = next(iter(yaml.safe_load(clouds_yaml)["clouds"]))
        return subprocess.run(
            [str(OPENSTACK), "--os-cloud", name, *args, "-f", "json"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip

    def cli_json(self, clouds_yaml: str, *args: str) -> Any:
        """`openstack <args>` with a binding's clouds.yaml: its JSON (the test fails with the
        CLI's stderr when it fails)."""
        done = self.openstack(clouds_yaml, *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def server_binding_works(
        self, creds: dict[str, Any], server_id: str, image_id: str, scope: Any
    ) -> dict[str, Any]:
        """A binding's credential of a server's project with the `openstack` CLI: an
        application credential at the router carrying `scope`, which shows the server and,
        through the scope, the image it was booted from (in another cloud). The server as the
        CLI shows it."""
        entry = yaml.safe_load(creds["clouds_yaml"])["clouds"][creds["os_cloud"]]
        assert entry["auth_type"] == "v3applicationcredential"
        assert entry.get("scope") == scope
        server: dict[str, Any] = self.cli_json(creds["clouds_yaml"], "server", "show", server_id)
        assert server["status"] == "ACTIVE"
        image = self.cli_json(creds["clouds_yaml"], "image", "show", image_id)
        assert image["id"] == image_id
        return server

    def revoked(self, creds: dict[str, Any], server_id: str) -> bool:
        """Whether keystone refuses the binding's credential (after its unbind)."""
        return self.openstack(creds["clouds_yaml"], "server", "show", server_id).returncode != 0

    def repair(self) -> dict[str, Any]:
        """`scoperouter broker repair --json` on this broker's config and database: what it
        found of each service in each cloud. Every cloud must have been read (nothing
        `unchecked`); the lab may hold other runs' drift, so callers look at their own
        instances (`drift_of`)."""
        done = subprocess.run(
            [sys.executable, "-m", "scoperouter.broker", "repair", "--config", str(self.config),
             "--json"],
            capture_output=True, text=True, check=False, timeout=300,
            env={**os.environ, "SCOPEROUTER_BROKER_SECRET_KEYS": BrokerProcess.keys},
        )  # fmt: skip
        assert done.returncode in (0, 1), (done.returncode, done.stdout[-2000:], done.stderr)
        report: dict[str, Any] = json.loads(done.stdout)
        assert report["errors"] == [] and report["unchecked"] == [], report
        return report

    def stop(self) -> None:
        self.process.stop()
        self.osb.close()


def drift_of(report: dict[str, Any], iid: str) -> list[str]:
    """The drift `broker repair` reported about instance `iid`: ["orphans"], ["missing"]..."""
    return [
        kind
        for kind in ("orphans", "missing")
        for item in report[kind]
        if item.get("instance_id") == iid
    ]


def swept_clouds(lab: Any, fed: Any, *services: str) -> Iterator[FederationClouds]:
    """A module's `clouds` fixture: the broker's federation (skipped unless the lab runs
    `services`), and at the end whatever this run left swept (`sweep_all`)."""
    from tests.e2e.labservices import require_service

    for service in services:
        require_service(lab, service)
    clouds = broker_clouds(lab, fed)
    yield clouds
    sweep_all(clouds)


def run_projects(clouds: FederationClouds, cloud: str) -> list[str]:
    """The ids of this run's keystone projects in `cloud` (the spaces' projects)."""
    admin = clouds.connect(cloud)
    return [p.id for p in admin.identity.projects() if f"osb-{RUN}" in p.name]


def sweep_all(clouds: FederationClouds, timeout: float = 180.0) -> list[str]:
    """`sweep`, and first this run's stacks, containers (with their objects) and volumes,
    last its key pairs and security groups, in every cloud; what was deleted."""
    gone: list[str] = []
    mine = f"osb-{RUN}"
    for cloud in clouds.names():
        admin = clouds.connect(cloud)
        for project_id in run_projects(clouds, cloud):
            conn = clouds.connect(cloud, project_id=project_id)
            stacks = [s for s in conn.orchestration.stacks() if mine in (s.name or "")]
            for stack in stacks:
                conn.orchestration.delete_stack(stack, ignore_missing=True)
                gone.append(f"{cloud} stack {stack.name}")
            for stack in stacks:
                conn.orchestration.wait_for_delete(stack, wait=timeout)
            for container in conn.object_store.containers():
                if mine not in container.name:
                    continue
                for obj in conn.object_store.objects(container.name):
                    conn.object_store.delete_object(obj, container=container.name)
                conn.object_store.delete_container(container.name, ignore_missing=True)
                gone.append(f"{cloud} container {container.name}")
            for volume in conn.block_storage.volumes():
                if mine in (volume.name or ""):
                    for attachment in volume.attachments or []:
                        admin.compute.delete_volume_attachment(
                            attachment["server_id"], volume.id, ignore_missing=True
                        )
                    conn.block_storage.wait_for_status(
                        volume, "available", failures=["error"], wait=timeout
                    )
                    conn.block_storage.delete_volume(volume, ignore_missing=True)
                    gone.append(f"{cloud} volume {volume.id}")
    gone += sweep(clouds, timeout)
    for cloud in clouds.names():
        admin = clouds.connect(cloud)
        for keypair in admin.compute.keypairs():
            if mine in keypair.name:
                admin.compute.delete_keypair(keypair, ignore_missing=True)
                gone.append(f"{cloud} key pair {keypair.name}")
        for group in admin.network.security_groups():
            if mine in (group.name or ""):
                admin.network.delete_security_group(group, ignore_missing=True)
                gone.append(f"{cloud} security group {group.name}")
    return gone


DB_ENV = "SCOPEROUTER_E2E_BROKER_DB"  # sqlite or postgresql: every broker of these tests


def database(request: Any, default: str = "sqlite") -> str | None:
    """The database URL of a broker for the test asking (`request`): ``$SCOPEROUTER_E2E_BROKER_DB``
    when set, else `default`; None for SQLite (the broker's file in its directory), a new
    database of the session's throwaway PostgreSQL cluster (tests/broker/pg.py) otherwise.
    PostgreSQL not installed: SQLite, unless CI (which installs it) says otherwise."""
    import os

    kind = os.environ.get(DB_ENV) or default
    if kind not in ("sqlite", "postgresql"):
        raise ValueError(f"{DB_ENV}={kind!r}: sqlite or postgresql")
    if kind == "sqlite":
        return None
    cluster = request.getfixturevalue("pg_cluster")
    if cluster is None:
        return None
    return str(cluster.url(cluster.new_database(template="broker_template")))


def binding_connection(tmp: Path, creds: dict[str, Any]) -> Any:
    """An openstacksdk Connection from the binding's clouds.yaml (nothing from the
    environment)."""
    from openstack import config as os_config
    from openstack import connection

    path = tmp / f"binding-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(creds["clouds_yaml"])
    cfg = os_config.OpenStackConfig(config_files=[str(path)], load_envvars=False)
    return connection.Connection(config=cfg.get_one(cloud=creds["os_cloud"]))


def container_lifecycle(
    env: OSBBroker,
    clouds: Any,
    cloud: Any,
    service: str,
    label: str,
    params: dict[str, Any],
    *,
    repair: bool = False,
) -> None:
    """The lifecycle of a container service, the built-in one or the example ansible pack:
    a provision puts the container `osb-<instance id>` in the space's project of `cloud` with
    its storage URL at that cloud's router; the binding's application credential (keystone
    access rules for that container's path) puts and gets an object through the router with
    openstacksdk, and is refused on another container of the same project and on the account;
    after the unbind keystone refuses it; the deprovision deletes the container with its
    object. With `repair`, `broker repair` finds the container while it is bound."""
    from keystoneauth1.exceptions.http import HttpError
    from openstack import exceptions

    [offered] = [s for s in env.catalog["services"] if s["name"] == service]
    assert offered["bindable"] and [p["name"] for p in offered["plans"]] == ["standard"]

    iid, last = env.provision(service, label, params)
    assert last.body["state"] == "succeeded", last.body
    attributes = env.osb.get_instance(iid).body["metadata"]["attributes"]
    name, project_id = attributes["container"], attributes["project_id"]
    assert name == f"osb-{iid}" and attributes["cloud"] == cloud.name
    # the storage URL is the project's object-store endpoint at the cloud's router
    assert attributes["storage_url"] == (
        f"http://{cloud.front_ip}:8080/v1/AUTH_{project_id}/{name}"
    ), attributes
    assert project_id in run_projects(clouds, cloud.name)  # the space's project
    store = clouds.connect(cloud.name, project_id=project_id).object_store
    assert store.get_container_metadata(name).metadata.get("osb-instance-id") == iid
    # another container of the same project: the binding must not reach it
    other = f"osb-{RUN}-other-{uuid.uuid4().hex[:6]}"
    store.create_container(name=other)
    store.upload_object(container=other, name="private.txt", data=b"not the binding's")

    binding, creds = env.bind(service, iid)
    assert creds["container"] == name and creds["storage_url"] == attributes["storage_url"]
    entry = yaml.safe_load(creds["clouds_yaml"])["clouds"][creds["os_cloud"]]
    assert entry["auth_type"] == "v3applicationcredential"
    assert entry["auth"]["auth_url"] == f"http://{cloud.front_ip}:5000/v3"
    conn = binding_connection(env.tmp, creds)
    body = f"written through the binding of {iid}".encode()
    conn.object_store.upload_object(container=name, name="hello.txt", data=body)
    assert conn.object_store.download_object("hello.txt", container=name) == body
    assert [o.name for o in conn.object_store.objects(name)] == ["hello.txt"]
    # keystone's access rules: the other container, the account, are refused
    with pytest.raises(exceptions.HttpException) as refused:
        conn.object_store.download_object("private.txt", container=other)
    assert refused.value.status_code in (401, 403), refused.value
    with pytest.raises(exceptions.HttpException) as refused:
        conn.object_store.upload_object(container=other, name="x.txt", data=b"x")
    assert refused.value.status_code in (401, 403), refused.value
    with pytest.raises(exceptions.HttpException):
        list(conn.object_store.containers())
    # the object is there for the project's admin too: what the binding wrote is real
    assert store.download_object("hello.txt", container=name) == body
    # an update makes the container public to read: anyone, no token, through the router
    anonymous = requests.Session()
    anonymous.trust_env = False  # straight to the router
    public = f"{attributes['storage_url']}/hello.txt"
    assert anonymous.get(public, timeout=60).status_code in (401, 403)
    env.update(service, iid, {"public_read": True})
    read = anonymous.get(public, timeout=60)
    assert read.status_code == 200 and read.content == body, read.status_code
    assert env.osb.get_instance(iid).body["metadata"]["attributes"]["public_read"] is True
    if repair:
        assert drift_of(env.repair(), iid) == []

    env.unbind(service, iid, binding)
    with pytest.raises(HttpError) as revoked:  # keystone refuses the deleted credential
        binding_connection(env.tmp, creds).object_store.download_object("hello.txt", container=name)
    assert "Could not find Application Credential" in str(revoked.value), revoked.value

    env.deprovision(service, iid)
    with pytest.raises(exceptions.NotFoundException):
        store.get_container_metadata(name)
    store.delete_object("private.txt", container=other)
    store.delete_container(other)
