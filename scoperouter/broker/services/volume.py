"""``openstack-volume``: a cinder volume in a chosen cloud of the federation, which a binding
may attach to a server instance of the same broker.

Provision chooses the cloud (`where`: one cloud or a scope; default the config's
``default_cloud``, else the first) and the platform space's keystone project there, and
creates the volume ``osb-<instance id>`` (size and type from the parameters, else the plan),
with the metadata ``osb_instance_id``; a pass looks it up by name before creating one, so a
re-run after a crash makes no second volume. An update grows it (cinder extends, never
shrinks: a smaller size is 400).

A bind gives an application credential of the volume's project and the volume's id; with
``server_instance_id`` (an ``openstack-server`` instance of this broker) it also attaches the
volume to that server: the binding is that server's application's. A server in another cloud
or another project is refused with 400 before anything is written (nova attaches volumes of
its own cloud and project only). Unbind detaches it and deletes the credential. Deprovision
detaches the volume from every server and deletes it.

Config (``services.openstack-volume``; all optional)::

    openstack-volume:
      default_cloud: CloudOne
      max_size: 1000                   # GB a volume may have
      plans:
        - name: standard
          description: A volume (size from the parameters, 1 GB by default)
          size: 1                      # the plan's default size
          volume_type: null            # cinder's default type
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from scoperouter.broker import credentials
from scoperouter.broker.contract import (
    DRAFT4,
    CatalogEntry,
    Clouds,
    Done,
    Failed,
    Found,
    InstanceLookup,
    InstanceView,
    InvalidParameters,
    OperationContext,
    OperationKind,
    Outcome,
    Pending,
    PlanEntry,
    Schemas,
    stable_id,
)
from scoperouter.broker.offerings import catalog_plans
from scoperouter.broker.openstack_helpers import cinder
from scoperouter.broker.services import placed

if TYPE_CHECKING:
    from openstack.block_storage.v3._proxy import Proxy as BlockStorage
    from openstack.block_storage.v3.volume import Volume

METADATA_KEY = "osb_instance_id"
SERVER_SERVICE = "openstack-server"
POLL_SECONDS = 2.0
_SAFE = re.compile(r"^[A-Za-z0-9._~-]{1,200}$")


def volume_name(instance_id: str) -> str:
    if _SAFE.match(instance_id):
        return f"osb-{instance_id}"
    return "osb-" + hashlib.sha256(instance_id.encode()).hexdigest()[:48]


class VolumeService(placed.PlacedService):
    """``openstack-volume`` (see the module docstring)."""

    name: ClassVar[str] = "openstack-volume"

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        super().__init__(settings, clouds)
        names = clouds.names()
        self.placement = placed.in_default_cloud(settings, names)
        self.max_size = int(settings.get("max_size", 1000))
        size = {"type": "integer", "minimum": 1, "maximum": self.max_size}
        create: dict[str, Any] = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "size": {**size, "description": "GB (default: the plan's)"},
                "volume_type": {"type": "string", "minLength": 1, "maxLength": 255},
            },
        }
        placed.add_where(create, self.placement, names)
        update = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {"size": {**size, "description": "GB: a volume only grows"}},
        }
        bind = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "server_instance_id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 255,
                    "description": "an openstack-server instance of this broker, in the "
                    "volume's cloud and space: the volume is attached to its server",
                }
            },
        }
        plans = list(
            settings.get("plans")
            or [{"name": "standard", "description": "A volume (1 GB unless the size is given)"}]
        )
        self._catalog = CatalogEntry(
            id=str(settings.get("id") or stable_id(self.name)),
            name=self.name,
            description=str(
                settings.get("description")
                or "A block storage volume in a chosen cloud of the federation, attachable to "
                "a server of this broker"
            ),
            plans=catalog_plans(
                self.name,
                {"plans": plans},
                Schemas(instance_create=create, instance_update=update, binding_create=bind),
            ),
            bindable=True,
            tags=("openstack", "block-storage", "cinder"),
            metadata={"displayName": "OpenStack volume"},
        )

    def check_references(
        self,
        kind: OperationKind,
        plan: PlanEntry,
        parameters: Mapping[str, Any],
        *,
        instance: InstanceView | None,
        lookup: InstanceLookup,
    ) -> None:
        if kind == "update" and instance is not None and "size" in parameters:
            current = int(instance.resources.get("size") or 0)
            if int(parameters["size"]) < current:
                raise InvalidParameters(
                    "parameters.size", f"a volume only grows: at least {current} (GB)"
                )
        if kind != "bind" or instance is None or "server_instance_id" not in parameters:
            return
        server_id = str(parameters["server_instance_id"])
        server = lookup(server_id)
        field = "parameters.server_instance_id"
        if server is None or server.service_name != SERVER_SERVICE:
            raise InvalidParameters(
                field, f"{server_id} is not a provisioned {SERVER_SERVICE} instance of this broker"
            )
        if server.cloud != instance.cloud:
            raise InvalidParameters(
                field,
                f"server instance {server_id} is in {server.cloud}, this volume in "
                f"{instance.cloud}: nova attaches volumes of its own cloud only",
            )
        if server.resources.get("project_id") != instance.resources.get("project_id"):
            raise InvalidParameters(
                field,
                f"server instance {server_id} is in another platform space's project than "
                "this volume: nova attaches volumes of the server's project only",
            )

    # ------------------------------------------------------------------------ helpers

    @staticmethod
    def _find(op: OperationContext, block: BlockStorage) -> Volume | None:
        """The instance's volume: by the recorded id, else by name and metadata."""
        from openstack import exceptions

        known = op.progress.get("volume_id") or op.instance.resources.get("volume_id")
        if known:
            try:
                return block.get_volume(known)
            except exceptions.NotFoundException:
                return None
        for volume in block.volumes(name=volume_name(op.instance.id)):
            if (volume.metadata or {}).get(METADATA_KEY) == op.instance.id[:255]:
                return volume
        return None

    # ------------------------------------------------------------------------ passes

    def provision(self, op: OperationContext) -> Outcome:
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived; it removes what was built")
        target = placed.choose(op, self.placement, "space")
        if isinstance(target, Failed | Pending):
            return target
        block = cinder(placed.connect(op, target))
        where = placed.describe(target)
        volume = self._find(op, block)
        if volume is None:
            if op.cancelled:
                return Failed("stopped: a deprovision request arrived")
            settings = op.plan.settings
            attrs: dict[str, Any] = {
                "name": volume_name(op.instance.id),
                "size": int(op.parameters.get("size") or settings.get("size") or 1),
                "metadata": {METADATA_KEY: op.instance.id[:255]},
            }
            volume_type = op.parameters.get("volume_type") or settings.get("volume_type")
            if volume_type:
                attrs["volume_type"] = str(volume_type)
            volume = block.create_volume(**attrs)
            op.save(volume_id=volume.id)
            op.log.info("created volume %s in %s", volume.id, target["cloud"])
            return Pending(f"creating volume {volume.id} in {where}", POLL_SECONDS)
        if op.progress.get("volume_id") != volume.id:
            op.save(volume_id=volume.id)
        if volume.status == "available":
            op.set_resources(volume_id=volume.id, size=volume.size, volume_type=volume.volume_type)
            return Done(f"volume {volume.id} ({volume.size} GB) is available in {where}")
        if volume.status in ("error", "error_extending"):
            return Failed(f"volume {volume.id} went to {volume.status} in {where}")
        return Pending(f"volume {volume.id} is {volume.status} in {where}", POLL_SECONDS)

    def update(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Failed("the instance has no volume (it was not provisioned)")
        block = cinder(placed.connect(op, target))
        volume = self._find(op, block)
        if volume is None:
            return Failed(f"volume {volume_name(op.instance.id)} is gone from {target['cloud']}")
        wanted = int(op.parameters.get("size") or volume.size)
        if volume.size < wanted and not op.progress.get("extending"):
            block.extend_volume(volume, wanted)
            op.save(extending=wanted)
            return Pending(f"extending volume {volume.id} to {wanted} GB", POLL_SECONDS)
        if volume.status.startswith("error"):
            return Failed(f"volume {volume.id} went to {volume.status} while extended")
        if volume.size < wanted or volume.status == "extending":
            return Pending(
                f"volume {volume.id} is {volume.status} ({volume.size} GB)", POLL_SECONDS
            )
        op.set_resources(size=volume.size)
        return Done(f"volume {volume.id} has {volume.size} GB")

    def deprovision(self, op: OperationContext) -> Outcome:
        from openstack import exceptions

        target = placed.recorded(op)
        if target is None:
            return Done("nothing was built")
        conn = placed.connect(op, target)
        volume = self._find(op, cinder(conn))
        where = placed.describe(target)
        if volume is None:
            revoked = credentials.revoke_instance(op)
            text = f"no volume of this instance is left in {where}"
            return Done(f"{text}; {revoked} binding credential(s) revoked" if revoked else text)
        attached = [a.get("server_id") for a in (volume.attachments or []) if a.get("server_id")]
        if attached:
            for server_id in attached:
                conn.compute.delete_volume_attachment(server_id, volume.id, ignore_missing=True)
            return Pending(f"detaching volume {volume.id} from {', '.join(attached)}", POLL_SECONDS)
        if volume.status not in ("deleting", "detaching"):
            try:
                cinder(conn).delete_volume(volume, ignore_missing=True)
            except exceptions.BadRequestException as exc:  # e.g. still detaching
                op.log.info("volume %s not deleted yet: %s", volume.id, exc)
        return Pending(f"deleting volume {volume.id} in {where}", POLL_SECONDS)

    def bind(self, op: OperationContext) -> Outcome:
        assert op.binding is not None
        target = placed.recorded(op)
        volume_id = op.instance.resources.get("volume_id")
        if target is None or not volume_id:
            return Failed("the instance has no volume to bind to (it was not provisioned)")
        if op.cancelled:
            return Failed("stopped: an unbind request arrived")
        extra: dict[str, Any] = {"volume_id": volume_id, "size": op.instance.resources.get("size")}
        server_instance = op.parameters.get("server_instance_id")
        if server_instance:
            attached = self._attach(op, target, str(volume_id))
            if not isinstance(attached, dict):
                return attached
            extra.update(attached)
        policy = credentials.CredentialPolicy.from_settings(
            {**self.settings, **op.plan.settings}, op.identity.config.binding_roles
        )
        return credentials.issue(
            op, cloud=str(target["cloud"]), project_id=str(target["project_id"]), policy=policy,
            extra=extra,
        )  # fmt: skip

    def _attach(
        self, op: OperationContext, target: Mapping[str, Any], volume_id: str
    ) -> dict[str, Any] | Outcome:
        """Attach the volume to the server of the named server instance (once: a re-run finds
        the attachment); its device once cinder says in-use."""
        assert op.binding is not None
        server_id = op.progress.get("server_id")
        conn = placed.connect(op, target)
        if not server_id:
            server_id = self._server_of(op)
            if server_id is None:
                return Failed(
                    f"server instance {op.parameters.get('server_instance_id')} has no server in "
                    f"{op.instance.cloud} any more"
                )
            op.save(server_id=server_id)
            op.set_resources(server_id=server_id, volume_id=volume_id)
        volume = conn.block_storage.get_volume(volume_id)
        mine = [a for a in (volume.attachments or []) if a.get("server_id") == server_id]
        if not mine and volume.status == "available":
            conn.compute.create_volume_attachment(server_id, volume_id=volume_id)
            return Pending(f"attaching volume {volume_id} to server {server_id}", POLL_SECONDS)
        if volume.status.startswith("error"):
            return Failed(f"volume {volume_id} went to {volume.status} while attached")
        if not mine or volume.status != "in-use":
            return Pending(f"volume {volume_id} is {volume.status}", POLL_SECONDS)
        return {"server_id": server_id, "device": mine[0].get("device")}

    def _server_of(self, op: OperationContext) -> str | None:
        """The nova server of the server instance the binding names, as that instance is now
        (the API checked cloud and project when the bind was asked)."""
        server = op.instance_of(str(op.parameters.get("server_instance_id")))
        if server is None or server.cloud != op.instance.cloud:
            return None
        value = server.resources.get("server_id")
        return str(value) if value else None

    def unbind(self, op: OperationContext) -> Outcome:
        assert op.binding is not None
        server_id = op.binding.resources.get("server_id")
        volume_id = op.binding.resources.get("volume_id")
        target = placed.recorded(op)
        if server_id and volume_id and target is not None:
            conn = placed.connect(op, target)
            volume = conn.block_storage.get_volume(volume_id)
            mine = [a for a in (volume.attachments or []) if a.get("server_id") == server_id]
            if mine:
                if not op.progress.get("detaching"):
                    conn.compute.delete_volume_attachment(server_id, volume_id, ignore_missing=True)
                    op.save(detaching=True)
                return Pending(f"detaching volume {volume_id} from {server_id}", POLL_SECONDS)
        return credentials.revoke(op)

    # ------------------------------------------------------------------------- inventory

    def inventory(self, cloud: str) -> Iterable[Found]:
        """Volumes carrying ``osb_instance_id`` in every project the broker manages in
        `cloud`, and its binding credentials there."""
        conn = self.clouds.connect(cloud)
        projects = placed.managed_projects(self.clouds, cloud)
        for project_id in projects:
            block = self.clouds.connect(cloud, project_id=project_id).block_storage
            for volume in block.volumes():
                owner = (volume.metadata or {}).get(METADATA_KEY)
                if owner:
                    yield Found(
                        cloud=cloud, kind="volume", id=volume.id, instance_id=owner,
                        name=volume.name,
                    )  # fmt: skip
        yield from credentials.inventory(conn, cloud, projects)
