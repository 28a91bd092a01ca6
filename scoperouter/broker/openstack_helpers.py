"""OpenStack helpers the broker's services share: what a resource is tagged with, how a
cloud's error reads in a description (and whether it is a refusal), finding an image, the
platform space's project, and a bind's application credential.

Below the services (:mod:`scoperouter.broker.services`): they import this module, never the
other way round (tests/unit/test_layers.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from scoperouter.broker import credentials
from scoperouter.broker.contract import Failed, OperationContext, Outcome
from scoperouter.broker.identity import INSTANCE_TAG_PREFIX, space_of

if TYPE_CHECKING:
    from openstack.block_storage.v3._proxy import Proxy as CinderV3
    from openstack.connection import Connection
    from openstack.image.v1.image import Image as ImageV1
    from openstack.image.v2._proxy import Proxy as GlanceV2
    from openstack.image.v2.image import Image

METADATA_KEY = "osb_instance_id"
DEFAULT_BROKER_TAG = "osb"
_TAG_SAFE = re.compile(r"[A-Za-z0-9._:-]{1,47}\Z")  # 13 + 47 = nova's 60


def instance_tag(instance_id: str) -> str:
    """The nova/glance tag of what an instance owns: ``osb-instance-<id>`` as on keystone
    projects (identity.py) when it fits a nova tag (<= 60 characters, no ``/`` or ``,``), else
    ``osb-instance-<sha256 prefix>``."""
    if _TAG_SAFE.match(instance_id):
        return f"{INSTANCE_TAG_PREFIX}{instance_id}"
    return INSTANCE_TAG_PREFIX + hashlib.sha256(instance_id.encode()).hexdigest()[:40]


def refusal(exc: BaseException) -> str | None:
    """What a cloud's error means for placement: the reason when the cloud refused (an HTTP 4xx
    other than 408/429: quota, a bad flavor or image, no key pair, no access), None when it is
    worth retrying (5xx, timeouts, the network)."""
    from openstack import exceptions

    if isinstance(exc, exceptions.HttpException):
        status = exc.status_code or 0
        if 400 <= status < 500 and status not in (408, 429):
            return error_text(exc)
    return None


def error_text(exc: BaseException) -> str:
    """An error for a description: ``<status>: <what the service said>`` for an HTTP error
    (openstacksdk keeps the service's message in `details`), else its first line."""
    from openstack import exceptions

    if isinstance(exc, exceptions.HttpException) and exc.status_code:
        return f"{exc.status_code}: {short(exc.details or exc.message)}"
    return short(exc)


def short(text: object, limit: int = 300) -> str:
    """The first line of an error, at most `limit` characters (descriptions stay readable)."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else "no details"
    return first if len(first) <= limit else first[: limit - 3] + "..."


def glance(conn: Connection) -> GlanceV2:
    """The connection's image proxy, which is v2 (glance has had no v1 API since Rocky;
    openstacksdk types `conn.image` as either)."""
    return cast("GlanceV2", conn.image)


def cinder(conn: Connection) -> CinderV3:
    """The connection's block-storage proxy, which is v3 (cinder's v2 API is gone since
    Xena; openstacksdk types `conn.block_storage` as either)."""
    return cast("CinderV3", conn.block_storage)


def find_image(conn: Connection, ref: str) -> Image | ImageV1 | None:
    """An active image by id or name through `conn` (None: none visible). Raises ValueError
    when the name is ambiguous (several images of that name)."""
    from openstack import exceptions

    try:
        image = conn.image.find_image(ref, ignore_missing=True)
    except exceptions.DuplicateResource:
        raise ValueError(f"several images are named {ref!r}; give its id") from None
    if image is None or image.status != "active":
        return None
    return image


def space_project(op: OperationContext, cloud: str) -> str:
    """The keystone project of the instance's platform space in `cloud` (identity.py: created
    on first use, the broker's user holding the binding roles there), with the identity
    table's grants to the platform user applied. Remembered in the operation's progress, so
    later passes do not ask keystone again."""
    known = dict(op.progress.get("projects") or {})
    if cloud in known:
        return str(known[cloud])
    conn = op.clouds.connect(cloud)
    space = space_of(op.context, platforms=op.identity.config.platforms)
    project_id = op.identity.space_project(conn, space)
    granted = op.identity.grant_mapped(conn, cloud, project_id, op.originating_identity)
    if granted:
        op.log.info("granted %s on project %s in %s", ", ".join(granted), project_id, cloud)
    op.save(projects={**known, cloud: project_id})
    return project_id


def bind_credentials(
    op: OperationContext, settings: Mapping[str, Any], extra: Mapping[str, Any]
) -> Outcome:
    """A bind of an instance living in one project of one cloud: an application credential on
    that project (credentials.py), the clouds.yaml entry carrying the instance's routing scope
    (so the application sees what the instance was built with), plus `extra` facts."""
    cloud = op.instance.cloud
    project_id = op.instance.resources.get("project_id")
    if not cloud or not project_id:
        return Failed("the instance has nothing to bind to (it was not provisioned)")
    if op.cancelled:
        return Failed("stopped: an unbind request arrived")
    policy = credentials.CredentialPolicy.from_settings(
        {**settings, **op.plan.settings}, op.identity.config.binding_roles
    )
    scope_text = op.instance.resources.get("scope")
    return credentials.issue(
        op,
        cloud=cloud,
        project_id=str(project_id),
        policy=policy,
        scope=json.loads(scope_text) if scope_text else None,
        extra=extra,
    )
