"""``openstack-object-container``: a swift container in a chosen cloud of the federation.

Provision chooses the cloud (`where`: one cloud or a scope; default the config's
``default_cloud``, else the first cloud) and the platform space's keystone project there, then
creates the container ``osb-<instance id>`` (swift's PUT is idempotent: a pass re-run after a
crash makes no second container) with its read ACL (``public_read``). Its storage URL is the
object-store endpoint of the project's catalog, which names the cloud's *router*.

A binding is an application credential of that project, restricted and limited by keystone
access rules to requests on that container's path (``GET``, ``HEAD``, ``PUT``, ``POST``,
``DELETE`` on ``<account path>/<container>`` and below): as far as the cloud allows, since
only a swift whose keystonemiddleware enforces access rules honours them (elsewhere the
credential is as wide as the project's ``member`` role). The container's ACL cannot tell
bindings apart (their credentials all act as the broker's user), so it only says whether
anyone may read. Unbind deletes the credential: keystone refuses it at once. Deprovision
deletes the objects (a batch a pass), the container, and the credentials of bindings the
platform did not unbind.

Config (``services.openstack-object-container``; all optional)::

    openstack-object-container:
      default_cloud: CloudOne
      binding_lifetime: 7776000        # seconds: bindings carry expires_at / renew_before
      plans:
        - name: standard
          description: One container
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from scoperouter.broker import credentials
from scoperouter.broker.contract import (
    DRAFT4,
    CatalogEntry,
    Clouds,
    Done,
    Failed,
    Found,
    OperationContext,
    Outcome,
    Pending,
    Schemas,
    stable_id,
)
from scoperouter.broker.offerings import catalog_plans
from scoperouter.broker.services import placed

if TYPE_CHECKING:
    from openstack.object_store.v1._proxy import Proxy as ObjectStore

PUBLIC_READ_ACL = ".r:*,.rlistings"
DELETE_BATCH = 500  # objects deleted per deprovision pass
METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE")
INSTANCE_META = "osb-instance-id"
_SAFE = re.compile(r"^[A-Za-z0-9._~-]{1,200}$")


def container_name(instance_id: str) -> str:
    """``osb-<instance id>`` (swift takes up to 256 bytes without ``/``), else a digest."""
    if _SAFE.match(instance_id):
        return f"osb-{instance_id}"
    return "osb-" + hashlib.sha256(instance_id.encode()).hexdigest()[:48]


def access_rules(storage_url: str) -> tuple[dict[str, str], ...]:
    """Keystone access rules allowing object-store requests on one container only: on its
    path (``/v1/AUTH_<project>/<container>``) and on every object below it."""
    path = urlsplit(storage_url).path.rstrip("/")
    return tuple(
        {"service": "object-store", "method": method, "path": target}
        for target in (path, f"{path}/**")
        for method in METHODS
    )


class ObjectContainerService(placed.PlacedService):
    """``openstack-object-container`` (see the module docstring)."""

    name: ClassVar[str] = "openstack-object-container"

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        super().__init__(settings, clouds)
        names = clouds.names()
        self.placement = placed.in_default_cloud(settings, names)
        create: dict[str, Any] = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "public_read": {
                    "type": "boolean",
                    "description": "anyone may read and list the container (default false)",
                }
            },
        }
        placed.add_where(create, self.placement, names)
        update = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {"public_read": {"type": "boolean"}},
        }
        bind = {"$schema": DRAFT4, "type": "object", "additionalProperties": False}
        plans = list(
            settings.get("plans") or [{"name": "standard", "description": "One container"}]
        )
        schemas = Schemas(instance_create=create, instance_update=update, binding_create=bind)
        self._catalog = CatalogEntry(
            id=str(settings.get("id") or stable_id(self.name)),
            name=self.name,
            description=str(
                settings.get("description")
                or "An object storage container in a chosen cloud of the federation, each "
                "binding a credential limited to it"
            ),
            plans=catalog_plans(self.name, {"plans": plans}, schemas),
            bindable=True,
            binding_rotatable=True,
            tags=("openstack", "object-storage", "swift"),
            metadata={"displayName": "OpenStack object storage container"},
        )

    # ------------------------------------------------------------------------ passes

    @staticmethod
    def _store(op: OperationContext, target: Mapping[str, Any]) -> ObjectStore:
        store: ObjectStore = placed.connect(op, target).object_store
        return store

    def provision(self, op: OperationContext) -> Outcome:
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived; it removes what was built")
        target = placed.choose(op, self.placement, "space")
        if isinstance(target, Failed | Pending):
            return target
        store = self._store(op, target)
        name = container_name(op.instance.id)
        public = bool(op.parameters.get("public_read"))
        store.create_container(name=name, read_ACL=PUBLIC_READ_ACL if public else "")
        metadata: dict[str, Any] = {INSTANCE_META: op.instance.id}  # X-Container-Meta-*
        store.set_container_metadata(name, **metadata)
        url = f"{str(store.get_endpoint()).rstrip('/')}/{name}"
        op.set_resources(container=name, storage_url=url, public_read=public)
        return Done(f"container {name} in {placed.describe(target)}")

    def update(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Failed("the instance has no container (it was not provisioned)")
        public = bool(op.parameters.get("public_read"))
        name = container_name(op.instance.id)
        self._store(op, target).set_container_metadata(
            name, read_ACL=PUBLIC_READ_ACL if public else ""
        )
        op.set_resources(public_read=public)
        return Done(f"container {name} is {'public' if public else 'private'} to read")

    def deprovision(self, op: OperationContext) -> Outcome:
        from openstack import exceptions

        target = placed.recorded(op)
        if target is None:
            return Done("nothing was built")
        store = self._store(op, target)
        name = container_name(op.instance.id)
        where = placed.describe(target)
        try:
            batch = [obj.name for obj in itertools.islice(store.objects(name), DELETE_BATCH)]
        except exceptions.NotFoundException:
            batch = None
        if batch:
            for obj in batch:
                store.delete_object(obj, container=name, ignore_missing=True)
            return Pending(f"deleting the objects of container {name} in {where}", 0.1)
        if batch is not None:
            store.delete_container(name, ignore_missing=True)
        revoked = credentials.revoke_instance(op)
        text = f"container {name} deleted from {where}"
        return Done(f"{text}; {revoked} binding credential(s) revoked" if revoked else text)

    def bind(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        url = op.instance.resources.get("storage_url")
        if target is None or not url:
            return Failed("the instance has no container to bind to (it was not provisioned)")
        if op.cancelled:
            return Failed("stopped: an unbind request arrived")
        base = credentials.CredentialPolicy.from_settings(
            {**self.settings, **op.plan.settings}, op.identity.config.binding_roles
        )
        policy = credentials.CredentialPolicy(
            roles=base.roles,
            lifetime=base.lifetime,
            renew_fraction=base.renew_fraction,
            access_rules=access_rules(str(url)),
        )
        return credentials.issue(
            op,
            cloud=str(target["cloud"]),
            project_id=str(target["project_id"]),
            policy=policy,
            extra={"container": op.instance.resources.get("container"), "storage_url": url},
        )

    def unbind(self, op: OperationContext) -> Outcome:
        return credentials.revoke(op)

    # ------------------------------------------------------------------------- inventory

    def inventory(self, cloud: str) -> Iterable[Found]:
        """The broker's containers in every project it manages in `cloud` (keystone projects
        tagged as the broker's), and its binding credentials there."""
        conn = self.clouds.connect(cloud)
        projects = placed.managed_projects(self.clouds, cloud)
        for project_id in projects:
            store = self.clouds.connect(cloud, project_id=project_id).object_store
            for container in store.containers(prefix="osb-"):
                meta = store.get_container_metadata(container.name)
                owner = (getattr(meta, "metadata", None) or {}).get(INSTANCE_META)
                if owner is None:
                    continue  # not made by this service
                yield Found(
                    cloud=cloud, kind="container", id=container.name, instance_id=owner,
                    name=container.name,
                )  # fmt: skip
        yield from credentials.inventory(conn, cloud, projects)
