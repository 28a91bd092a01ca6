"""Helpers for the e2e tests of the broker's server and image services (test_broker_server.py,
test_broker_image.py): the broker's view of the lab, and a sweep of what a test left.

Everything these tests create in the lab has a name or tag starting with ``osb`` and carries a
per-run id, so a sweep removes exactly what this run made and never another helper's resources.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from scoperouter.broker.clouds import CloudAccess, FederationClouds
from scoperouter.broker.services.base import OperationContext

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


class LabProjects:
    """A project per (cloud, platform space), made the way the broker's identity component
    does (found by name, else created; the broker's account gets the member role), for the
    pass-level tests that run services without the broker's API."""

    def __init__(self, clouds: FederationClouds) -> None:
        self.clouds = clouds
        self.made: dict[str, set[str]] = {}

    def name(self, op: OperationContext) -> str:
        return f"osb-{RUN}-space-{op.instance.context.get('space_guid', 'none')}"

    def ensure(self, op: OperationContext, cloud: str) -> str:
        admin = self.clouds.connect(cloud)
        name = self.name(op)
        project = admin.identity.find_project(name, domain_id="default")
        if project is None:
            project = admin.identity.create_project(
                name=name, domain_id="default", tags=[f"osb-{RUN}"]
            )
            member = admin.identity.find_role("member", ignore_missing=False)
            admin.identity.assign_project_role_to_user(project, admin.current_user_id, member)
        self.made.setdefault(cloud, set()).add(project.id)
        return str(project.id)


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
            if project.name.startswith(f"osb-{RUN}"):
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
