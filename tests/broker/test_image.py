"""openstack-image without a lab: the copy stream (hashes, bounds, a short source), which
properties are copied, how a copy is compared with its source, parameters and the catalog.
The copy itself, through the routers, is tests/e2e/test_broker_image.py."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from openstack import exceptions

from scoperouter.broker.contract import Failed, InvalidParameters
from scoperouter.broker.services.image import (
    CopyStream,
    ImageService,
    _after_upload,
    _compare,
    _facts,
    _own_properties,
)


class Names:
    def names(self) -> tuple[str, ...]:
        return ("CloudOne", "CloudTwo")


def service() -> ImageService:
    return ImageService({"plans": [{"name": "copy", "description": "a copy"}]}, Names())


def test_stream_hashes_and_hands_out_bounded_blocks():
    chunks = [b"a" * 1000, b"b" * 24, b"c" * 3000]
    data = b"".join(chunks)
    stream = CopyStream(iter(chunks), len(data), "sha512")
    assert len(stream) == len(data)
    read = []
    while block := stream.read(512):
        assert len(block) <= 512
        read.append(block)
    assert b"".join(read) == data and stream.sent == len(data)
    assert stream.md5.hexdigest() == hashlib.md5(data).hexdigest()
    assert stream.multihash is not None
    assert stream.multihash.hexdigest() == hashlib.sha512(data).hexdigest()


def test_a_source_that_ends_early_or_sends_too_much_aborts_the_upload():
    short = CopyStream(iter([b"x" * 10]), 20, None)
    assert short.read(100) == b"x" * 10
    with pytest.raises(OSError, match="the source ended after 10 of 20 bytes"):
        short.read(100)
    long = CopyStream(iter([b"x" * 30]), 20, None)
    with pytest.raises(OSError, match="more than the 20 bytes"):
        long.read(-1)


def test_user_properties_are_copied_but_not_glances_or_the_brokers():
    raw = {
        "id": "i", "name": "cirros", "size": 5, "checksum": "c", "os_hash_algo": "sha512",
        "os_hash_value": "h", "disk_format": "qcow2", "container_format": "bare",
        "min_disk": 1, "min_ram": None, "tags": ["t"], "status": "active", "owner": "p",
        "visibility": "public", "os_hidden": False, "stores": "fs", "file": "/v2/...",
        "os_distro": "cirros", "hw_disk_bus": "scsi", "os_glance_import_task": "x",
        "osb_instance_id": "other", "owner_specified.openstack.md5": "",
    }  # fmt: skip
    assert _own_properties(raw) == {
        "os_distro": "cirros", "hw_disk_bus": "scsi", "owner_specified.openstack.md5": "",
    }  # fmt: skip
    facts = _facts("CloudTwo", raw)
    assert facts["hash_algo"] == "sha512" and facts["min_ram"] == 0 and facts["tags"] == ["t"]
    assert facts["cloud"] == "CloudTwo" and "osb_instance_id" not in facts["properties"]


def test_a_copy_matches_on_size_and_both_checksums():
    source = {"size": 5, "checksum": "m", "hash_algo": "sha512", "hash_value": "h"}
    copy = SimpleNamespace(size=5, checksum="m", hash_algo="sha512", hash_value="h")
    assert _compare(source, copy) is None
    assert _compare(source, SimpleNamespace(**{**vars(copy), "size": 4})) == "size 4 != 5"
    assert _compare(source, SimpleNamespace(**{**vars(copy), "checksum": "x"})) == (
        "md5 checksum differs"
    )
    assert _compare(source, SimpleNamespace(**{**vars(copy), "hash_value": "x"})) == (
        "sha512 differs"
    )
    # a target using another algorithm cannot be compared on it: md5 and size still are
    assert _compare(source, SimpleNamespace(**{**vars(copy), "hash_algo": "sha256"})) is None


def test_catalog_and_parameters():
    svc = service()
    entry = svc.catalog()
    assert entry.name == "openstack-image" and [p.name for p in entry.plans] == ["copy"]
    schema = entry.plans[0].schemas.instance_create
    assert schema is not None and schema["required"] == ["image", "cloud"]
    assert schema["properties"]["cloud"]["enum"] == ["CloudOne", "CloudTwo"]
    plan = entry.plans[0]
    svc.validate("provision", plan, {"image": "x", "cloud": "CloudOne", "source_cloud": "CloudTwo"})
    with pytest.raises(InvalidParameters) as caught:
        svc.validate("provision", plan, {"image": "x", "cloud": "CloudOne",
                                         "source_cloud": "CloudOne"})  # fmt: skip
    assert caught.value.field == "parameters.source_cloud"


def _answer(status: int, body: bytes = b"") -> Any:
    response = requests.Response()
    response.status_code = status
    response._content = body
    response.headers["Content-Type"] = "application/json"
    response.url = "http://127.0.0.2:9292/v2/images/c0ffee/file"
    return response


def test_what_glances_answer_to_the_upload_means():
    """openstacksdk's Image.upload returns glance's answer unchecked: a 409 (the copy still
    "saving" a dead pass's upload) once ended the pass as a checksum mismatch of the bytes read
    (found in CI: tests/e2e/test_broker_image.py's killed copy)."""
    assert _after_upload(_answer(204), "CloudOne") is True
    assert _after_upload(_answer(409, b'{"message": "saving to saving"}'), "CloudOne") is False
    quota = _after_upload(_answer(413, b'{"message": "over quota"}'), "CloudOne")
    assert isinstance(quota, Failed)
    assert quota.description.startswith("uploading the copy into CloudOne failed: 413")
    for retried in (500, 503, 429):
        with pytest.raises(exceptions.HttpException):
            _after_upload(_answer(retried, b'{"message": "try again"}'), "CloudOne")
