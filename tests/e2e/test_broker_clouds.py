"""The broker's view of the federation (scoperouter.broker.clouds) against the lab: every
connection enters a cloud through its router, scopes compose clouds, capacity comes from each
cloud's placement, and a cloud that cannot be reached is reported, not fatal."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from scoperouter.broker.clouds import CloudAccess, CloudUnavailable, FederationClouds

pytestmark = pytest.mark.e2e


@pytest.fixture
def clouds(lab, fed) -> FederationClouds:
    one, two, _ = fed
    return FederationClouds(
        [CloudAccess(name=c.name, entry=f"{c.slug}-admin") for c in (one, two)],
        config_files=[lab.clouds_yaml],
    )


def test_connections_enter_through_the_router_and_scopes_compose(clouds, fed):
    one, two, tiny = fed
    assert clouds.names() == (one.name, two.name)
    assert clouds.identity_url(one.name) == f"http://{one.front_ip}:5000/v3"
    assert clouds.region(one.name) == one.region
    plain = clouds.connect(one.name)
    assert clouds.connect(one.name) is plain  # cached
    images = {i.id for i in plain.image.images()}
    assert tiny[one.name] in images and tiny[two.name] not in images
    scoped = clouds.connect(one.name, scope=json.dumps({"image": two.name}))
    images = {i.id for i in scoped.image.images()}
    assert tiny[two.name] in images and tiny[one.name] not in images
    # every endpoint the connection uses is a router frontend
    assert plain.session.get_endpoint(service_type="image").startswith(f"http://{one.front_ip}:")


def test_connection_to_another_project(clouds, fed):
    one, _, _ = fed
    admin = clouds.connect(one.name)
    project = admin.identity.find_project("admin")
    conn = clouds.connect(one.name, project_id=project.id)
    assert conn.current_project_id == project.id


def test_capacity_from_placement(clouds, fed):
    one, two, _ = fed
    for cloud in (one, two):
        cap = clouds.capacity(cloud.name)
        assert cap.cloud == cloud.name
        assert cap.total["VCPU"] > 0 and 0 <= cap.free["VCPU"] <= cap.total["VCPU"]
        assert cap.free["MEMORY_MB"] <= cap.total["MEMORY_MB"]
        # one allocation's limit: placement's max_unit, never above what is free
        assert cap.largest is not None
        for rc in ("VCPU", "MEMORY_MB"):
            assert 0 < cap.largest[rc] <= cap.free[rc]
        assert clouds.capacity(cloud.name) is cap  # cached for capacity_ttl


def test_unknown_and_unreachable_clouds_are_reported(lab, fed, tmp_path: Path):
    one, _, _ = fed
    entry = lab.cloud_entry(f"{one.slug}-admin")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    entry["auth"]["auth_url"] = f"http://127.0.0.1:{port}/v3"
    path = tmp_path / "clouds.yaml"
    path.write_text(yaml.safe_dump({"clouds": {"down": entry}}))
    clouds = FederationClouds([CloudAccess(name="CloudDown", entry="down")], config_files=[path])
    with pytest.raises(CloudUnavailable, match="capacity of CloudDown unreadable"):
        clouds.capacity("CloudDown")
    with pytest.raises(CloudUnavailable, match="no cloud 'Nowhere' in the broker config"):
        clouds.connect("Nowhere")
