"""Bindings: one keystone application credential per binding, least privilege.

A bind creates an application credential named ``osb-<binding_id>``, owned by the broker's
user in the instance's cloud, **restricted** (``unrestricted: false``: it cannot create other
credentials or trusts), limited to the instance's project and to the plan's roles (``member`` by
default), with keystone access rules when the plan gives them (only services whose
keystonemiddleware enforces them honour them) and an expiry when the plan sets a lifetime. The
bind response carries a ready-to-use clouds.yaml entry (``auth_type: v3applicationcredential``
at the cloud's *router*, its region, and the routing scope when there is one) plus the router
URL and the scope, so an application uses the federation exactly as the CLI does.

Unbind deletes the credential; keystone refuses it at once. Rotation (OSB 2.17
``predecessor_binding_id``) is a new bind: a new credential for the same project, while the
predecessor's stays valid until its own unbind.

Crash safety: the secret exists only in keystone's answer to the create call, which the worker
stores encrypted with the operation's outcome. A pass that died after the create and before that
commit leaves a credential whose secret is lost: the next pass finds it by name, deletes it and
creates a new one, so no credential is orphaned and no binding gets a secret nobody has.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import yaml

from scoperouter.broker.contract import Done, Found, OperationContext
from scoperouter.broker.identity import APP_CREDENTIAL_PREFIX, credential_name, keystone

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger("scoperouter.broker.credentials")


@dataclass(frozen=True, kw_only=True)
class CredentialPolicy:
    """What a plan allows a binding's credential (from the plan's settings):

    - ``binding_roles``: keystone roles the credential carries (default ``[member]``);
    - ``binding_lifetime``: seconds until the credential expires (default: no expiry);
    - ``binding_renew_fraction``: ``renew_before`` sits this fraction of the lifetime before
      ``expires_at`` (default 0.2);
    - ``binding_access_rules``: keystone access rules (``[{service, method, path}]``).
    """

    roles: tuple[str, ...] = ("member",)
    lifetime: float | None = None
    renew_fraction: float = 0.2
    access_rules: tuple[Mapping[str, str], ...] = ()

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any], default_roles: Sequence[str] = ("member",)
    ) -> CredentialPolicy:
        lifetime = settings.get("binding_lifetime")
        return cls(
            roles=tuple(settings.get("binding_roles") or default_roles),
            lifetime=float(lifetime) if lifetime else None,
            renew_fraction=float(settings.get("binding_renew_fraction", 0.2)),
            access_rules=tuple(settings.get("binding_access_rules") or ()),
        )

    def times(self, now: datetime) -> tuple[datetime | None, datetime | None]:
        """(expires_at, renew_before) for a credential made at `now` (UTC)."""
        if not self.lifetime:
            return None, None
        expires = now + timedelta(seconds=self.lifetime)
        renew = expires - timedelta(seconds=self.lifetime * self.renew_fraction)
        return expires.replace(microsecond=0), renew.replace(microsecond=0)


def clouds_yaml_entry(
    *,
    name: str,
    auth_url: str,
    region: str,
    credential_id: str,
    secret: str,
    scope: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A clouds.yaml document with one entry `name` for an application credential. With a
    scope, the entry carries it (read by ``openstack --os-scope``'s plugin) and openstacksdk's
    hook that applies it (``scoperouter.client:connection_hook``)."""
    entry: dict[str, Any] = {
        "auth_type": "v3applicationcredential",
        "auth": {
            "auth_url": auth_url,
            "application_credential_id": credential_id,
            "application_credential_secret": secret,
        },
        "region_name": region,
        "interface": "public",
        "identity_api_version": 3,
    }
    if scope:
        entry["scope"] = dict(scope)
        entry["vendor_hook"] = "scoperouter.client:connection_hook"
    return {"clouds": {name: entry}}


def issue(
    op: OperationContext,
    *,
    cloud: str,
    project_id: str,
    policy: CredentialPolicy,
    scope: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Done:
    """Create the binding's application credential in `cloud` for `project_id` (replacing one
    a dead pass left) and return the bind outcome: credentials with the clouds.yaml entry,
    plus ``expires_at`` / ``renew_before`` when the policy sets a lifetime."""
    assert op.binding is not None, "issue() is for bind operations"
    name = credential_name(op.binding.id)
    conn = op.clouds.connect(cloud, project_id=project_id)
    user_id = str(conn.current_user_id)
    for stale in keystone(conn).application_credentials(user=user_id, name=name):
        # made by a pass that died before its outcome was stored: its secret is lost
        keystone(conn).delete_application_credential(user_id, stale.id, ignore_missing=True)
        op.log.info("replaced application credential %s left by an interrupted pass", stale.id)
    expires_at, renew_before = policy.times(datetime.now(UTC))
    attrs: dict[str, Any] = {
        "name": name,
        "description": f"OSB binding {op.binding.id}{_of_instance(op.instance.id)}",
        "roles": [{"name": role} for role in policy.roles],
        "unrestricted": False,
    }
    if expires_at is not None:
        attrs["expires_at"] = expires_at.strftime("%Y-%m-%dT%H:%M:%S")
    if policy.access_rules:
        attrs["access_rules"] = [dict(rule) for rule in policy.access_rules]
    credential = keystone(conn).create_application_credential(user=user_id, **attrs)
    op.set_resources(
        application_credential_id=credential.id, user_id=user_id, cloud=cloud, project_id=project_id
    )
    auth_url = op.clouds.identity_url(cloud)
    region = op.clouds.region(cloud)
    entry_name = name
    document = clouds_yaml_entry(
        name=entry_name,
        auth_url=auth_url,
        region=region,
        credential_id=credential.id,
        secret=credential.secret,
        scope=scope,
    )
    credentials: dict[str, Any] = {
        "cloud": cloud,
        "region": region,
        "project_id": project_id,
        "router_url": auth_url,
        "auth_url": auth_url,
        "application_credential_id": credential.id,
        "application_credential_secret": credential.secret,
        "scope": json.dumps(dict(scope), sort_keys=True) if scope else None,
        "os_cloud": entry_name,
        "clouds_yaml": yaml.safe_dump(document, sort_keys=False),
        **(extra or {}),
    }
    result: dict[str, Any] = {"credentials": credentials}
    if expires_at is not None:
        result["expires_at"] = expires_at
        result["renew_before"] = renew_before
    return Done(
        f"application credential {credential.id} for project {project_id} in {cloud}", result
    )


def revoke(op: OperationContext) -> Done:
    """Delete the binding's application credential (by the id recorded at bind, else by name);
    Done when none is left."""
    assert op.binding is not None, "revoke() is for unbind operations"
    resources = op.binding.resources
    cloud = resources.get("cloud") or op.instance.cloud
    project_id = resources.get("project_id")
    if not cloud or not project_id:
        return Done("no credential was issued")
    # the broker's own project: the instance's may be gone already, and a user lists and
    # deletes its application credentials with any of its tokens
    conn = op.clouds.connect(str(cloud))
    user_id = str(resources.get("user_id") or conn.current_user_id)
    removed = 0
    for credential in keystone(conn).application_credentials(
        user=user_id, name=credential_name(op.binding.id)
    ):
        keystone(conn).delete_application_credential(user_id, credential.id, ignore_missing=True)
        removed += 1
    return Done(
        f"application credential of binding {op.binding.id} deleted"
        if removed
        else "no application credential was left"
    )


def _of_instance(instance_id: str) -> str:
    """The end of a binding credential's description that names its instance: keystone keeps
    a credential's description as created (application credentials are immutable), so it tells
    which instance a credential was made for when several share one project."""
    return f" of instance {instance_id}"


def revoke_instance(op: OperationContext) -> int:
    """Delete the credentials of the instance's bindings that the platform did not unbind
    before deprovisioning (OSB allows it), in the instance's cloud and project. The project may
    be a platform space's, shared with other instances, so only the credentials issued for
    this instance (:func:`issue` names it in the description) go. Returns how many."""
    cloud = op.instance.cloud
    project_id = op.instance.resources.get("project_id")
    if not cloud or not project_id:
        return 0
    conn = op.clouds.connect(cloud)
    user_id = str(conn.current_user_id)
    suffix = _of_instance(op.instance.id)
    removed = 0
    for credential in keystone(conn).application_credentials(user=user_id):
        if (
            credential.name.startswith(APP_CREDENTIAL_PREFIX)
            and credential.project_id == project_id
            and (credential.description or "").endswith(suffix)
        ):
            keystone(conn).delete_application_credential(
                user_id, credential.id, ignore_missing=True
            )
            removed += 1
    return removed


def revoke_all(conn: Connection, project_id: str) -> int:
    """Delete every binding credential of the broker's user for `project_id` (deprovision of
    an instance whose bindings the platform did not remove first)."""
    user_id = str(conn.current_user_id)
    removed = 0
    for credential in keystone(conn).application_credentials(user=user_id):
        if (
            credential.name.startswith(APP_CREDENTIAL_PREFIX)
            and credential.project_id == project_id
        ):
            keystone(conn).delete_application_credential(
                user_id, credential.id, ignore_missing=True
            )
            removed += 1
    return removed


def inventory(
    conn: Connection, cloud: str, project_ids: Iterable[str] | None = None
) -> Iterable[Found]:
    """The broker's binding credentials in `cloud` (for `broker repair`)."""
    user_id = str(conn.current_user_id)
    wanted = set(project_ids) if project_ids is not None else None
    for credential in keystone(conn).application_credentials(user=user_id):
        if not credential.name.startswith(APP_CREDENTIAL_PREFIX):
            continue
        if wanted is not None and credential.project_id not in wanted:
            continue
        yield Found(
            cloud=cloud,
            kind="application_credential",
            id=credential.id,
            instance_id=None,
            binding_id=credential.name[len(APP_CREDENTIAL_PREFIX) :],
            name=credential.name,
        )
