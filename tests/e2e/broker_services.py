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
from scoperouter.broker.config import IdentityConfig
from scoperouter.broker.identity import Identity

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
