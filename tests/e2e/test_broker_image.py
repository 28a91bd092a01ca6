"""openstack-image against the lab: a 200 MB image of CloudTwo copied into CloudOne through
the routers by `broker serve`, driven over the OSB API (properties, tags and checksums; the
broker's peak memory stays far below the image's size: the copy is streamed, never whole in
memory or on disk; bind, the binding's clouds.yaml with the `openstack` CLI, unbind,
deprovision), and, pass by pass, a copy killed in the middle of its upload that the next pass
finishes without a second image."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scoperouter.broker.openstack_helpers import instance_tag
from scoperouter.broker.services.base import Done
from scoperouter.broker.services.image import METADATA_KEY, CopyStream, ImageService
from tests.broker.passes import MemoryOperation, after, drive, instance
from tests.e2e.broker_services import (
    RUN,
    OSBBroker,
    broker_clouds,
    context,
    identity,
    instance_id,
    sweep,
)
from tests.e2e.memory import RSSSampler

pytestmark = pytest.mark.e2e

BIG_MB = 200
IMAGE = "openstack-image"


@pytest.fixture(scope="module")
def clouds(lab, fed) -> Iterator[Any]:
    clouds = broker_clouds(lab, fed)
    yield clouds
    sweep(clouds)


@pytest.fixture
def service(clouds) -> ImageService:
    return ImageService({"plans": [{"name": "copy"}]}, clouds)


def _op(service, kind: str, view, saved=None) -> MemoryOperation:
    plan = service.catalog().plans[0]
    return MemoryOperation(kind, view, plan, service.clouds, saved, identity=identity())


class Blocks:
    """`size` bytes of a repeated random block, as a file-like upload body (never in memory)."""

    def __init__(self, size: int) -> None:
        self.block = os.urandom(1024 * 1024)
        self.size = size
        self.left = size

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        take = min(self.left, len(self.block) if n is None or n < 0 else n, len(self.block))
        self.left -= take
        return self.block[:take]


def _source_image(clouds, cloud: str, label: str, size: int, **properties: str) -> Any:
    """A public image of `size` bytes in `cloud` (uploaded as a stream)."""
    from openstack.image.v2.image import Image

    conn = clouds.connect(cloud)
    image = Image.new(
        name=f"osb-{RUN}-{label}", disk_format="raw", container_format="bare",
        visibility="public", min_ram=16, tags=[f"osb-{RUN}", "e2e-source"], **properties,
    ).create(conn.image)  # fmt: skip
    Image(id=image.id).upload(conn.image, data=Blocks(size), size=size)
    image = conn.image.get_image(image.id)
    assert image.status == "active", image.status
    return image


def test_a_200mb_image_of_cloudtwo_copied_into_cloudone_through_the_osb_api(
    lab, clouds, fed, tmp_path
):
    """The whole lifecycle through `broker serve`; the broker's memory is sampled while it
    copies an image much larger than what it may hold: the copy is streamed."""
    one, two, _ = fed
    size = BIG_MB * 1024 * 1024
    source = _source_image(clouds, two.name, "big", size, os_distro="cirros",
                           hw_disk_bus="scsi")  # fmt: skip
    env = OSBBroker(lab, tmp_path)
    try:
        params = {"image": source.name, "cloud": one.name, "name": f"osb-{RUN}-copy"}
        with RSSSampler(env.pid) as rss:
            start = time.monotonic()
            iid, last = env.provision(IMAGE, "big", params)
            seconds = time.monotonic() - start
        assert last.body["state"] == "succeeded", last.body
        grown_mb = (rss.peak - rss.start) / 2**20
        print(
            f"\n{BIG_MB} MB copy through the broker: {seconds:.1f} s, broker RSS "
            f"{rss.start / 2**20:.0f} MB -> peak {rss.peak / 2**20:.0f} MB (+{grown_mb:.0f} MB)"
        )
        # the whole image would add 200 MB; a streamed copy holds a chunk or two (1 MiB each)
        assert grown_mb < 40, (rss.start, rss.peak)
        description = last.body["description"]
        assert f"a copy of {source.name!r} ({source.id}) of {two.name}" in description
        assert "checksums verified" in description
        attributes = env.osb.get_instance(iid).body["metadata"]["attributes"]
        assert attributes["cloud"] == one.name and attributes["source_cloud"] == two.name
        conn = clouds.connect(one.name)
        copy = conn.image.get_image(attributes["image_id"])
        assert copy.name == f"osb-{RUN}-copy" and copy.owner == attributes["project_id"]
        assert (copy.size, copy.checksum, copy.hash_value) == (
            source.size, source.checksum, source.hash_value
        )  # fmt: skip
        assert copy.visibility == "private" and copy.min_ram == 16
        assert {"osb", instance_tag(iid), f"osb-{RUN}", "e2e-source"} <= set(copy.tags)
        raw = conn.image.get(f"/images/{copy.id}").json()  # glance's JSON: every property
        assert raw["os_distro"] == "cirros" and raw["hw_disk_bus"] == "scsi"
        assert raw[METADATA_KEY] == iid and raw["osb_source_image_id"] == source.id

        binding, creds = env.bind(IMAGE, iid)
        assert creds["image_id"] == copy.id and creds["cloud"] == one.name
        shown = env.openstack(creds["clouds_yaml"], "image", "show", copy.id)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["checksum"] == source.checksum
        env.unbind(IMAGE, iid, binding)
        assert env.openstack(creds["clouds_yaml"], "image", "show", copy.id).returncode != 0

        # a binding the platform does not unbind goes with the instance
        _, left = env.bind(IMAGE, iid, "left")
        assert env.openstack(left["clouds_yaml"], "image", "show", copy.id).returncode == 0
        env.deprovision(IMAGE, iid)
        assert env.openstack(left["clouds_yaml"], "token", "issue").returncode != 0
        assert list(conn.image.images(tag=instance_tag(iid))) == []
        assert clouds.connect(two.name).image.get_image(source.id).status == "active"
    finally:
        env.stop()


def test_a_copy_killed_mid_upload_is_finished_by_the_next_pass(clouds, fed, service, monkeypatch):
    one, two, _ = fed
    source = _source_image(clouds, two.name, "crash", 8 * 1024 * 1024)
    iid = instance_id("crash")
    params = {"image": source.id, "cloud": one.name, "source_cloud": two.name}
    view = instance(iid, params, context=context("img"))
    op = _op(service, "provision", view)
    real_read = CopyStream.read

    def dies_after_a_mebibyte(self: CopyStream, size: int = -1) -> bytes:
        if self.sent >= 1024 * 1024:
            raise SystemExit("SIGKILL in the middle of the upload")
        return real_read(self, size)

    monkeypatch.setattr(CopyStream, "read", dies_after_a_mebibyte)
    with pytest.raises(SystemExit):
        service.provision(op)
    monkeypatch.setattr(CopyStream, "read", real_read)
    target = clouds.connect(one.name)
    (half,) = target.image.images(tag=instance_tag(iid))
    assert half.status != "active"
    outcome = drive(service, _op(service, "provision", view, op.saved))
    assert isinstance(outcome, Done), outcome
    (copy,) = target.image.images(tag=instance_tag(iid))  # one copy, whole
    assert copy.status == "active" and copy.checksum == source.checksum
    drive(service, _op(service, "deprovision", after(view, op.saved)))
    assert list(target.image.images(tag=instance_tag(iid))) == []
