"""openstack-image against the lab: an image of CloudTwo copied into CloudOne through the
routers (properties, tags and checksums), and a 200 MB copy whose peak memory stays far below
the image's size (the copy is streamed, never whole in memory or on disk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scoperouter.broker.services.base import Done
from scoperouter.broker.services.image import METADATA_KEY, CopyStream, ImageService
from scoperouter.broker.services.server import instance_tag
from tests.broker.passes import MemoryOperation, after, drive, instance
from tests.e2e.broker_services import RUN, broker_clouds, context, identity, instance_id, sweep

pytestmark = pytest.mark.e2e

BIG_MB = 200
REPO = Path(__file__).resolve().parents[2]


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


def test_copy_of_an_image_of_cloudtwo_into_cloudone(clouds, fed, service):
    one, two, _ = fed
    source = _source_image(clouds, two.name, "src", 3 * 1024 * 1024 + 17,
                           os_distro="cirros", hw_disk_bus="scsi")  # fmt: skip
    iid = instance_id("copy")
    params = {"image": source.name, "cloud": one.name, "name": f"osb-{RUN}-copy"}
    view = instance(iid, params, context=context("img"))
    op = _op(service, "provision", view)
    outcome = drive(service, op)
    assert isinstance(outcome, Done), outcome
    assert f"a copy of {source.name!r} ({source.id}) of {two.name}" in outcome.description
    assert "checksums verified" in outcome.description
    res = op.saved.resources
    assert op.saved.cloud == one.name and res["source_cloud"] == two.name
    copy = clouds.connect(one.name).image.get_image(res["image_id"])
    assert copy.name == f"osb-{RUN}-copy" and copy.owner == res["project_id"]
    assert (copy.size, copy.checksum, copy.hash_value) == (
        source.size, source.checksum, source.hash_value
    )  # fmt: skip
    assert copy.visibility == "private" and copy.min_ram == 16
    assert {"osb", instance_tag(iid), f"osb-{RUN}", "e2e-source"} <= set(copy.tags)
    props = clouds.connect(one.name).image.get(f"/images/{copy.id}").json()  # glance's JSON
    assert props["os_distro"] == "cirros" and props["hw_disk_bus"] == "scsi"
    assert props[METADATA_KEY] == iid and props["osb_source_image_id"] == source.id
    # the image is not in CloudTwo's listing of copies, and the copy is in CloudOne only
    assert {f.id for f in service.inventory() if f.instance_id == iid} == {copy.id}

    # a second provision pass (a re-run) finds the copy: no second image
    again = drive(service, _op(service, "provision", view, op.saved))
    assert isinstance(again, Done)
    assert [i.id for i in clouds.connect(one.name).image.images(tag=instance_tag(iid))] == [copy.id]

    gone = drive(service, _op(service, "deprovision", after(view, op.saved)))
    assert isinstance(gone, Done) and copy.id in gone.description
    assert list(clouds.connect(one.name).image.images(tag=instance_tag(iid))) == []
    assert clouds.connect(two.name).image.get_image(source.id).status == "active"


COPY_IN_A_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    sys.path.insert(0, sys.argv[1])
    args = json.loads(sys.argv[2])
    from tests.broker.passes import MemoryOperation, drive, instance
    from tests.e2e import broker_services
    from tests.e2e.broker_services import context, identity
    from scoperouter.broker.clouds import CloudAccess, FederationClouds
    from scoperouter.broker.services.image import ImageService
    broker_services.RUN = args["run"]
    clouds = FederationClouds([CloudAccess(name=n, entry=e) for n, e in args["access"]],
                              config_files=[args["clouds_yaml"]])
    service = ImageService({"plans": [{"name": "copy"}]}, clouds)
    for name in clouds.names():  # connections, tokens, catalogs: before measuring
        clouds.connect(name).image.get("/images?limit=1")
    view = instance(args["instance"], {"image": args["image"], "cloud": args["to"]},
                    context=context("img"))
    op = MemoryOperation("provision", view, service.catalog().plans[0], clouds,
                         identity=identity())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open("/proc/self/status") as status:
        rss = [int(l.split()[1]) for l in status if l.startswith("VmRSS:")][0]
    start = time.monotonic()
    outcome = drive(service, op)
    seconds = time.monotonic() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"outcome": repr(outcome), "rss_kb": rss, "peak_before_kb": before,
                      "peak_kb": peak, "resources": op.saved.resources,
                      "seconds": seconds}))
    """
)


def test_a_200mb_copy_is_streamed_with_bounded_memory(lab, clouds, fed):
    one, two, _ = fed
    size = BIG_MB * 1024 * 1024
    source = _source_image(clouds, two.name, "big", size)
    args = {
        "run": RUN,
        "access": [(c.name, f"{c.slug}-admin") for c in (one, two)],
        "clouds_yaml": str(lab.clouds_yaml),
        "instance": instance_id("big"),
        "image": source.id,
        "to": one.name,
    }
    proc = subprocess.run(
        [sys.executable, "-c", COPY_IN_A_CHILD, str(REPO), json.dumps(args)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["outcome"].startswith("Done("), report["outcome"]
    copy = clouds.connect(one.name).image.get_image(report["resources"]["image_id"])
    assert copy.size == size and copy.checksum == source.checksum
    grown_mb = (report["peak_kb"] - report["rss_kb"]) / 1024
    print(
        f"\n200 MB copy: RSS before {report['rss_kb'] / 1024:.0f} MB, peak "
        f"{report['peak_kb'] / 1024:.0f} MB (+{grown_mb:.0f} MB), "
        f"{report['seconds']:.1f} s ({BIG_MB / report['seconds']:.0f} MB/s through two routers)"
    )
    # the whole image would add 200 MB; a streamed copy holds a chunk or two (1 MiB each)
    assert grown_mb < 40, report
    clouds.connect(one.name).image.delete_image(copy.id)


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
