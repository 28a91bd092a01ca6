"""Platform identities → keystone (README "Identity mapping").

Two mappings, both documented in the config:

- **Where**: the platform *context* of a request (Cloud Foundry organization and space GUIDs,
  Kubernetes cluster id and namespace, ...) names a *space*. In each cloud, the broker manages
  one keystone project per space, created on first use and tagged ``osb-space-<digest>``, so
  that resources of one platform space share a project (services such as ``openstack-server``
  put their servers there). An ``openstack-project`` instance is its own project, tagged
  ``osb-instance-<id>``.
- **Who**: ``X-Broker-API-Originating-Identity`` (the platform user behind the request) is
  recorded with every operation; when a row of the config's ``identity.users`` table matches
  it, the row's keystone user gets the row's role on the projects the request creates.

Everything here is keyed by tags and names derived from OSB ids, so a pass re-run after a crash
finds what a dead pass created (look up before create). The pure parts (`space_of`,
`mapped_users`, the tag helpers) do no I/O; :class:`Identity` calls keystone through the
connections it is given (which go through the routers).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from scoperouter.broker.config import IdentityConfig, UserMapping
from scoperouter.broker.logs import excerpt

if TYPE_CHECKING:
    from openstack.connection import Connection
    from openstack.identity.v3._proxy import Proxy as KeystoneV3
    from openstack.identity.v3.project import Project

log = logging.getLogger("scoperouter.broker.identity")

MANAGED_TAG = "osb-managed"  # every project the broker creates
INSTANCE_TAG_PREFIX = "osb-instance-"
SPACE_TAG_PREFIX = "osb-space-"
APP_CREDENTIAL_PREFIX = "osb-"


def keystone(conn: Connection) -> KeystoneV3:
    """The connection's identity proxy, which is v3 (the broker's clouds.yaml entries are)."""
    return cast("KeystoneV3", conn.identity)


def instance_tag(instance_id: str) -> str:
    """The keystone tag of what an instance owns (keystone tags: <= 255 chars, no / or ,;
    the API accepts only ids that fit)."""
    return f"{INSTANCE_TAG_PREFIX}{instance_id}"


def credential_name(binding_id: str) -> str:
    """The name of a binding's application credential (unique per user in keystone)."""
    return f"{APP_CREDENTIAL_PREFIX}{binding_id}"


@dataclass(frozen=True)
class Space:
    """A platform space: what the broker manages one keystone project for, per cloud."""

    platform: str
    parts: tuple[tuple[str, str], ...]  # ("organization_guid", ...), ("space_guid", ...)

    @property
    def digest(self) -> str:
        text = self.platform + "|" + "|".join(f"{k}={v}" for k, v in self.parts)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    @property
    def tag(self) -> str:
        return f"{SPACE_TAG_PREFIX}{self.digest}"

    @property
    def project_name(self) -> str:
        """Readable and unique: ``osb-cloudfoundry-<org 8>-<space 8>-<digest 8>``."""
        short = "-".join(_slug(v)[:12] for _, v in self.parts)
        return f"osb-{_slug(self.platform)[:16]}-{short}-{self.digest[:8]}"[:64]

    def describe(self) -> str:
        return f"{self.platform} " + " ".join(f"{k}={v}" for k, v in self.parts)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


# keys of the OSB profile's context objects that name where a resource belongs
_SPACE_KEYS: Mapping[str, tuple[str, ...]] = {
    "cloudfoundry": ("organization_guid", "space_guid"),
    "kubernetes": ("clusterid", "namespace"),
}
BUILTIN_PLATFORMS = tuple(_SPACE_KEYS)
MAX_TENANT_VALUE = 255  # characters of one value naming a tenant (a GUID, a namespace)


class TenancyError(ValueError):
    """A request whose context names no tenant: `field` is what is missing (``context``,
    ``context.namespace``, ...), so the API can answer 400 naming it."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


def _value(context: Mapping[str, Any], key: str, where: str = "context.") -> str | None:
    """A value that names a tenant: a non-empty string (a number is taken as its text), at
    most MAX_TENANT_VALUE characters; else None (TenancyError when too long)."""
    value = context.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value)
    if len(text) > MAX_TENANT_VALUE:
        raise TenancyError(f"{where}{key}", f"longer than {MAX_TENANT_VALUE} characters")
    return text or None


def space_of(
    context: Mapping[str, Any] | None,
    organization_guid: str | None = None,
    space_guid: str | None = None,
    platforms: Mapping[str, Sequence[str]] | None = None,
) -> Space:
    """The tenant of a request: from `context` (OSB profile: Cloud Foundry org/space GUIDs,
    Kubernetes namespace and, when given, cluster id; another platform: the context keys
    `platforms` (the config's ``identity.platforms``) names for it), else the deprecated
    top-level organization/space GUIDs of Cloud Foundry. There is no shared default: a
    request that names no tenant raises TenancyError (it would otherwise share one project
    with every other such request)."""
    context = dict(context or {})
    if "clusterId" in context and "clusterid" not in context:  # Crossplane provider-osb's
        context["clusterid"] = context["clusterId"]
    top = {"organization_guid": organization_guid, "space_guid": space_guid}
    given = context.get("platform")
    if given is not None and not isinstance(given, str):
        raise TenancyError("context.platform", "expected a string")
    platform = given or ("cloudfoundry" if organization_guid or space_guid else "")
    if not platform:
        raise TenancyError(
            "context.platform",
            "required: the context names the platform and the tenant (Cloud Foundry: "
            "organization_guid and space_guid; Kubernetes: namespace)",
        )
    if platform == "cloudfoundry":
        org = _value(context, "organization_guid") or _value(top, "organization_guid", "")
        space = _value(context, "space_guid") or _value(top, "space_guid", "")
        for key, found in (("organization_guid", org), ("space_guid", space)):
            if not found:
                raise TenancyError(f"context.{key}", "required for platform cloudfoundry")
        return Space(platform, (("organization_guid", str(org)), ("space_guid", str(space))))
    if platform == "kubernetes":
        namespace = _value(context, "namespace")
        if not namespace:
            raise TenancyError("context.namespace", "required for platform kubernetes")
        cluster = _value(context, "clusterid")
        if cluster:
            return Space(platform, (("clusterid", cluster), ("namespace", namespace)))
        return Space(platform, (("namespace", namespace),))
    keys = (platforms or {}).get(platform)
    if not keys:
        known = sorted({*BUILTIN_PLATFORMS, *(platforms or {})})
        raise TenancyError(
            "context.platform",
            f"the broker maps no tenant for platform {excerpt(platform)!r} (it knows: "
            f"{', '.join(known)}; an operator adds one in identity.platforms)",
        )
    parts = []
    for key in keys:
        found = _value(context, key)
        if not found:
            raise TenancyError(f"context.{key}", f"required for platform {excerpt(platform)}")
        parts.append((key, found))
    return Space(platform, tuple(parts))


def tenant_context(context: Mapping[str, Any] | None, space: Space) -> dict[str, Any]:
    """The context an instance keeps: the request's, completed with what named its tenant
    when that came from outside it (Cloud Foundry's deprecated top-level GUIDs), so that
    :func:`space_of` of the kept context alone finds the same space."""
    kept = dict(context or {})
    if not kept.get("platform"):
        kept["platform"] = space.platform
    for key, value in space.parts:
        if not kept.get(key) and not (key == "clusterid" and kept.get("clusterId")):
            kept[key] = value
    return kept


def mapped_users(
    originating_identity: Mapping[str, Any] | None,
    table: Sequence[UserMapping],
    cloud: str,
) -> list[UserMapping]:
    """The rows of the identity table that match the request's originating identity
    (``{"platform": ..., "value": {...}}``) in `cloud`: same platform, and every `match` key
    equal to the identity's value (compared as text)."""
    if not originating_identity:
        return []
    platform = originating_identity.get("platform")
    value = originating_identity.get("value") or {}
    if not isinstance(value, Mapping):
        return []
    found = []
    for row in table:
        if row.platform != platform:
            continue
        if row.clouds is not None and cloud not in row.clouds:
            continue
        if all(str(value.get(k)) == v for k, v in row.match.items()):
            found.append(row)
    return found


class Identity:
    """Keystone projects and role assignments the broker manages (through the routers)."""

    def __init__(self, config: IdentityConfig) -> None:
        self.config = config

    # ----------------------------------------------------------------------- projects

    def domain_id(self, conn: Connection) -> str:
        domain = keystone(conn).find_domain(self.config.domain, ignore_missing=False)
        return str(domain.id)

    @staticmethod
    def find_project(conn: Connection, tag: str) -> Project | None:
        """The project carrying `tag` (one at most: the tag is derived from a unique id)."""
        found = list(keystone(conn).projects(tags=tag))
        if len(found) > 1:  # cannot happen through the broker; say so rather than guess
            log.warning("%d projects carry the tag %s: using the oldest", len(found), tag)
        return found[0] if found else None

    def ensure_project(
        self,
        conn: Connection,
        *,
        tag: str,
        name: str,
        description: str,
        extra_tags: Sequence[str] = (),
    ) -> tuple[Project, bool]:
        """The project tagged `tag`, created if missing. Returns (project, created)."""
        project = self.find_project(conn, tag)
        if project is not None:
            return project, False
        project = keystone(conn).create_project(
            name=name,
            domain_id=self.domain_id(conn),
            description=description[:255],
            tags=[MANAGED_TAG, tag, *extra_tags],
            is_enabled=True,
        )
        log.info("created keystone project %s (%s) tagged %s", name, project.id, tag)
        return project, True

    def space_project(self, conn: Connection, space: Space) -> str:
        """The id of the project the broker manages for `space` in the cloud of `conn`
        (created on first use; the broker's own user gets the binding roles on it)."""
        project, _ = self.ensure_project(
            conn,
            tag=space.tag,
            name=space.project_name,
            description=f"scoperouter broker: {space.describe()}",
        )
        self.grant_self(conn, str(project.id))
        return str(project.id)

    def delete_project(self, conn: Connection, project_id: str) -> bool:
        """Delete a project; False when it was already gone."""
        project = keystone(conn).find_project(project_id, ignore_missing=True)
        if project is None:
            return False
        keystone(conn).delete_project(project, ignore_missing=True)
        log.info("deleted keystone project %s", project_id)
        return True

    # -------------------------------------------------------------------------- roles

    def grant(self, conn: Connection, project_id: str, user: str, role: str) -> None:
        """Give keystone `user` (id, or name in the configured domain) `role` on the project
        (idempotent: keystone ignores a repeated assignment)."""
        user_obj = keystone(conn).find_user(
            user, ignore_missing=False, domain_id=self.domain_id(conn)
        )
        role_obj = keystone(conn).find_role(role, ignore_missing=False)
        keystone(conn).assign_project_role_to_user(project_id, user_obj, role_obj)

    def grant_self(self, conn: Connection, project_id: str) -> None:
        """The broker's own user gets the binding roles on `project_id`: it needs them to
        act in the project and to issue the bindings' application credentials there."""
        user_id = str(conn.current_user_id)
        for role in self.config.binding_roles:
            role_obj = keystone(conn).find_role(role, ignore_missing=False)
            keystone(conn).assign_project_role_to_user(project_id, user_id, role_obj)

    def grant_mapped(
        self,
        conn: Connection,
        cloud: str,
        project_id: str,
        originating_identity: Mapping[str, Any] | None,
    ) -> list[str]:
        """Apply the identity table to the request's platform user; returns what was granted
        ("<user> <role>") for the operation's description."""
        granted = []
        for row in mapped_users(originating_identity, self.config.users, cloud):
            self.grant(conn, project_id, row.keystone_user, row.role)
            granted.append(f"{row.keystone_user} {row.role}")
        return granted
