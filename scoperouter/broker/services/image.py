"""``openstack-image``: a copy of an image of one cloud of the federation in another, streamed
through the routers.

Parameters: ``image`` (name or id in the source cloud), ``cloud`` (where the copy goes),
optional ``source_cloud`` (default: the first other cloud, in config order, where the image is
visible) and ``name`` (default: the source image's name).

The copy is never whole in memory or on disk: the broker reads the source image through the
target cloud's router with the scope ``{"image": <source cloud>}`` (the routers carry it to the
source glance) and uploads it into the target glance as the same stream, a chunk at a time
(:class:`CopyStream`), hashing it on the way. The copy must then have the source's size and
checksums (md5 ``checksum`` and the ``os_hash_algo`` one) and those the broker computed, or
it is deleted and the operation fails. Disk and container formats, ``min_disk``, ``min_ram``
and the source's own properties and tags are copied; the copy is private to the platform
space's project in the target cloud and carries the tags ``<tag>`` and
``osb-instance-<instance id>`` and the properties ``osb_instance_id``, ``osb_source_cloud`` and
``osb_source_image_id``.

Passes (docs/broker.md): find and save the source; ensure the space's project in the target;
find the copy by tag, else create its record (saved); upload the data unless the copy is active;
verify. A copy a dead pass left half-uploaded (not active) is deleted and started again.
Deprovision deletes every image carrying the instance's tag in every cloud.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from openstack import exceptions
from openstack.image.v2.image import Image

from scoperouter.broker import credentials
from scoperouter.broker.contract import (
    DRAFT4,
    CatalogEntry,
    Clouds,
    Done,
    Failed,
    Found,
    InvalidParameters,
    OperationContext,
    OperationKind,
    Outcome,
    Pending,
    PlanEntry,
    Service,
)
from scoperouter.broker.offerings import IMAGE_REF, offering
from scoperouter.broker.openstack_helpers import (
    DEFAULT_BROKER_TAG,
    bind_credentials,
    error_text,
    find_image,
    glance,
    instance_tag,
    refusal,
    short,
    space_project,
)

if TYPE_CHECKING:
    from openstack.connection import Connection
    from requests import Response

METADATA_KEY = "osb_instance_id"
CHUNK_BYTES = 1024 * 1024
# glance keeps these itself (or refuses them): never copied as properties
_GLANCE_OWN = frozenset(
    {
        "checksum", "container_format", "created_at", "direct_url", "disk_format", "file", "id",
        "locations", "min_disk", "min_ram", "name", "os_hash_algo", "os_hash_value", "os_hidden",
        "owner", "protected", "schema", "self", "size", "status", "stores", "tags", "updated_at",
        "virtual_size", "visibility", "os_glance_import_task", "os_glance_failed_import",
        "os_glance_importing_to_stores", "os_glance_stage_host",
    }
)  # fmt: skip
_OWN_PREFIXES = ("os_glance", "osb_")


class CopyStream:
    """A file-like view of a streamed HTTP download that hashes what passes through it.

    requests sends it as the upload body with ``Content-Length: len(stream)``, reading a block
    at a time; only one source chunk is held at once, so memory does not grow with the image.
    A source that ends before `size` bytes raises (the upload is aborted, never short)."""

    def __init__(self, chunks: Iterator[bytes], size: int, hash_algo: str | None) -> None:
        self._chunks = chunks
        self._size = size
        self._buffer = memoryview(b"")
        self.sent = 0
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.multihash = hashlib.new(hash_algo) if hash_algo else None

    def __len__(self) -> int:
        return self._size

    def read(self, size: int = -1) -> bytes:
        while not self._buffer:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                if self.sent < self._size:
                    raise OSError(
                        f"the source ended after {self.sent} of {self._size} bytes"
                    ) from None
                return b""
            self._buffer = memoryview(chunk)
        take = len(self._buffer) if size is None or size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:take])
        self._buffer = self._buffer[take:]
        self.sent += take
        if self.sent > self._size:
            raise OSError(f"the source sent more than the {self._size} bytes it announced")
        self.md5.update(data)
        if self.multihash is not None:
            self.multihash.update(data)
        return data


class ImageService(Service):
    """``openstack-image`` (see the module docstring)."""

    name: ClassVar[str] = "openstack-image"

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        super().__init__(settings, clouds)
        self.broker_tag = str(settings.get("tag", DEFAULT_BROKER_TAG))
        self.chunk_bytes = int(settings.get("chunk_bytes", CHUNK_BYTES))
        self._catalog = offering(
            self.name,
            settings,
            self.parameters_schema(),
            description="A copy of an image of one cloud of the federation in another",
            display_name="OpenStack image copy (federation)",
            tags=("openstack", "image", "glance"),
        )

    # ------------------------------------------------------------------------- catalog

    def catalog(self) -> CatalogEntry:
        return self._catalog

    def parameters_schema(self) -> dict[str, Any]:
        clouds = list(self.clouds.names())
        return {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "required": ["image", "cloud"],
            "properties": {
                "image": {**IMAGE_REF, "description": "name or id of the image to copy"},
                "cloud": {"type": "string", "enum": clouds, "description": "where the copy goes"},
                "source_cloud": {
                    "type": "string",
                    "enum": clouds,
                    "description": "where the image is (default: the first other cloud "
                    "where it is visible)",
                },
                "name": {"type": "string", "minLength": 1, "maxLength": 255},
            },
        }

    def validate(self, kind: OperationKind, plan: PlanEntry, parameters: Mapping[str, Any]) -> None:
        if kind == "provision" and parameters.get("source_cloud") == parameters.get("cloud"):
            raise InvalidParameters(
                "parameters.source_cloud", "must differ from cloud (that would copy in place)"
            )

    # ----------------------------------------------------------------------- provision

    def provision(self, op: OperationContext) -> Outcome:
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived; it removes what was built")
        params = op.parameters
        target = str(params["cloud"])
        if "source" not in op.progress:
            found = self._locate(
                op.clouds, target, str(params["image"]), params.get("source_cloud")
            )
            if isinstance(found, Failed):
                return found
            op.save(source=found)
        source = op.progress["source"]
        project_id = space_project(op, target)
        conn = op.clouds.connect(target, project_id=project_id)
        copy = self._find_copy(conn, op.instance.id)
        if copy is not None and copy.status not in ("active", "queued"):
            # a dead pass's half-done upload: start again
            op.log.info("deleting the unfinished copy %s (%s)", copy.id, copy.status)
            conn.image.delete_image(copy.id, ignore_missing=True)
            copy = None
        if copy is None:
            if op.cancelled:
                return Failed("stopped: a deprovision request arrived")
            # the resource API, not Proxy.create_image: that one adds properties of its own
            copy = Image.new(**self._record(op, source)).create(conn.image)
            op.save(copy_id=copy.id, project_id=project_id)
        if copy.status == "queued":
            sent = self._stream(op, target, source, conn, copy.id)
            if isinstance(sent, Failed):
                return sent
            copy = glance(conn).get_image(copy.id)
        if copy.status != "active":
            return Pending(f"copy {copy.id} in {target} is {copy.status}", 2.0)
        mismatch = _compare(source, copy)
        if mismatch:
            conn.image.delete_image(copy.id, ignore_missing=True)
            op.save(copy_id=None)
            return Failed(f"the copy in {target} does not match the source ({mismatch}); deleted")
        op.set_cloud(target)
        op.set_resources(
            cloud=target,
            project_id=project_id,
            image_id=copy.id,
            source_cloud=source["cloud"],
            source_image_id=source["id"],
        )
        return Done(
            f"image {copy.id} in {target}: a copy of {source['name']!r} ({source['id']}) of "
            f"{source['cloud']}, {copy.size} bytes streamed through the routers, checksums "
            "verified"
        )

    def _locate(
        self, clouds: Clouds, target: str, ref: str, source_cloud: str | None
    ) -> dict[str, Any] | Failed:
        """The source image's facts, looked up through the target's router with a scope."""
        names = clouds.names()
        search = [source_cloud] if source_cloud else [c for c in names if c != target]
        problems = []
        for cloud in search:
            conn = _source_conn(clouds, target, cloud)
            try:
                image = find_image(conn, ref)
            except ValueError as exc:
                problems.append(f"{cloud}: {exc}")
                continue
            except Exception as exc:
                problems.append(f"{cloud}: {error_text(exc)}")
                continue
            if image is not None:
                return _facts(cloud, conn.image.get(f"/images/{image.id}").json())
        detail = f" ({'; '.join(problems)})" if problems else ""
        return Failed(f"no active image {ref!r} in {', '.join(search)}{detail}")

    def _record(self, op: OperationContext, source: Mapping[str, Any]) -> dict[str, Any]:
        tags = sorted({*source["tags"], self.broker_tag, instance_tag(op.instance.id)})
        return {
            **source["properties"],
            "name": str(op.parameters.get("name") or source["name"] or source["id"]),
            "disk_format": source["disk_format"],
            "container_format": source["container_format"],
            "min_disk": source["min_disk"],
            "min_ram": source["min_ram"],
            "visibility": "private",
            "tags": tags,
            METADATA_KEY: op.instance.id,
            "osb_source_cloud": source["cloud"],
            "osb_source_image_id": source["id"],
        }

    def _stream(
        self,
        op: OperationContext,
        target: str,
        source: Mapping[str, Any],
        conn: Connection,
        copy_id: str,
    ) -> Failed | None:
        """Read the source through the routers and upload it as one stream."""
        download = _source_conn(op.clouds, target, source["cloud"]).image.get(
            f"/images/{source['id']}/file", stream=True
        )
        try:
            if download.status_code != 200:
                return Failed(
                    f"reading image {source['id']} of {source['cloud']} failed: "
                    f"{download.status_code} {short(download.text)}"
                )
            stream = CopyStream(
                download.iter_content(self.chunk_bytes), int(source["size"]), source["hash_algo"]
            )
            op.log.info(
                "copying image %s of %s into %s (%s bytes)",
                source["id"], source["cloud"], target, source["size"],
            )  # fmt: skip
            response = Image(id=copy_id).upload(conn.image, data=stream, size=len(stream))
        finally:
            download.close()
        stored = _after_upload(response, target)
        if isinstance(stored, Failed):
            return stored
        if not stored:
            op.log.info("copy %s in %s: an earlier pass's upload is still being saved", copy_id,
                        target)  # fmt: skip
            return None  # the caller reads the copy's status: Pending, then a pass restarts it
        computed = {"checksum": stream.md5.hexdigest()}
        if stream.multihash is not None:
            computed["hash_value"] = stream.multihash.hexdigest()
        for key, value in computed.items():
            if source.get(key) and source[key] != value:
                conn.image.delete_image(copy_id, ignore_missing=True)
                op.save(copy_id=None)
                return Failed(
                    f"the bytes read from {source['cloud']} do not match its {key}; copy deleted"
                )
        return None

    def _find_copy(self, conn: Connection, instance_id: str) -> Image | None:
        found = list(glance(conn).images(tag=instance_tag(instance_id)))
        return found[0] if found else None

    # -------------------------------------------------------------------- deprovision

    def deprovision(self, op: OperationContext) -> Outcome:
        tag = instance_tag(op.instance.id)
        deleted: list[str] = []
        problems: list[str] = []
        for cloud in op.clouds.names():
            try:
                conn = op.clouds.connect(cloud)
                for image in self._tagged(conn, tag):
                    conn.image.delete_image(image.id, ignore_missing=True)
                    deleted.append(f"{image.id} in {cloud}")
            except Exception as exc:
                problems.append(f"{cloud}: {error_text(exc)}")
        if problems:
            return Pending("cannot check every cloud yet: " + "; ".join(problems), 5.0)
        text = ("deleted image " + ", ".join(deleted)) if deleted else (
            "no image of this instance is left in any cloud"
        )  # fmt: skip
        revoked = credentials.revoke_instance(op)
        return Done(f"{text}; {revoked} binding credential(s) revoked" if revoked else text)

    def bind(self, op: OperationContext) -> Outcome:
        """An application credential on the copy's project; the credentials also say the
        image's id and cloud."""
        res = op.instance.resources
        if not res.get("image_id"):
            return Failed("the instance has no image to bind to")
        extra = {"image_id": res["image_id"], "source_cloud": res.get("source_cloud")}
        return bind_credentials(op, self.settings, extra)

    def unbind(self, op: OperationContext) -> Outcome:
        return credentials.revoke(op)

    def inventory(self, cloud: str) -> Iterable[Found]:
        for image in self._tagged(self.clouds.connect(cloud), self.broker_tag):
            yield Found(
                cloud=cloud,
                kind="image",
                id=image.id,
                instance_id=(image.properties or {}).get(METADATA_KEY),
                name=image.name,
            )

    @staticmethod
    def _tagged(conn: Connection, tag: str) -> Iterator[Image]:
        """Images carrying `tag` in every project the broker's account sees (glance lists
        every project's images to an admin)."""
        yield from glance(conn).images(tag=tag)


def _after_upload(response: Response, target: str) -> bool | Failed:
    """What glance's answer to an upload means. openstacksdk's ``Image.upload`` returns it
    unchecked (its proxies send with ``raise_exc=False``): True, the bytes were stored (2xx);
    False, a 409 (the copy is still "saving" the upload of a pass that died in it: nothing of
    this one was stored, the next pass starts the copy again); a :class:`Failed` for a refusal
    no pass changes (another 4xx: quota, size); openstacksdk's ``HttpException`` raised for the
    rest (5xx: the worker retries the pass)."""
    if response.status_code < 300:
        return True
    if response.status_code == 409:
        return False
    try:
        exceptions.raise_from_response(response)
    except exceptions.HttpException as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        return Failed(f"uploading the copy into {target} failed: {refused}")
    # a 3xx (raise_from_response raises from 400 on): glance never redirects an upload
    raise exceptions.HttpException(
        f"the upload into {target} was answered {response.status_code}", response=response
    )


def _source_conn(clouds: Clouds, target: str, source_cloud: str) -> Connection:
    """Image calls enter at the target's router and go to the source's glance (the scope)."""
    scope = json.dumps({"image": source_cloud}, separators=(",", ":"))
    return clouds.connect(target, scope=scope)


def _facts(cloud: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """What the copy needs of the source image, from glance's own JSON of it (openstacksdk's
    Image maps some properties, e.g. ``os_distro``, to attributes, others to ``properties``:
    the raw JSON has them all)."""
    return {
        "cloud": cloud,
        "id": raw["id"],
        "name": raw.get("name"),
        "size": raw.get("size"),
        "checksum": raw.get("checksum"),
        "hash_algo": raw.get("os_hash_algo"),
        "hash_value": raw.get("os_hash_value"),
        "disk_format": raw.get("disk_format"),
        "container_format": raw.get("container_format"),
        "min_disk": raw.get("min_disk") or 0,
        "min_ram": raw.get("min_ram") or 0,
        "tags": list(raw.get("tags") or []),
        "properties": _own_properties(raw),
    }


def _own_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The properties a user set on the source (hw_*, os_distro, ...), minus glance's own and
    the broker's (a copy of a copy names its own source)."""
    return {
        key: value
        for key, value in properties.items()
        if key not in _GLANCE_OWN and not key.startswith(_OWN_PREFIXES)
    }


def _compare(source: Mapping[str, Any], copy: Image) -> str | None:
    """What differs between the source's facts and the active copy (None: they match)."""
    if source.get("size") is not None and copy.size != source["size"]:
        return f"size {copy.size} != {source['size']}"
    if source.get("checksum") and copy.checksum != source["checksum"]:
        return "md5 checksum differs"
    same_algo = copy.hash_algo == source.get("hash_algo")
    if source.get("hash_value") and same_algo and copy.hash_value != source["hash_value"]:
        return f"{source['hash_algo']} differs"
    return None
