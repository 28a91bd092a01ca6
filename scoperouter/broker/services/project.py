"""``openstack-project``: a keystone project in a chosen cloud, for one application or team.

Provision creates a project tagged ``osb-instance-<id>`` (and the platform space's tag) in the
cloud the parameters or the plan name, gives the broker's user the binding roles on it (it
issues the bindings' credentials there) and, per the identity table, the platform user's mapped
keystone user its role. Each bind is an application credential limited to that project
(credentials.py); deprovision deletes the credentials left and the project. Keystone only, so
every step is one quick call: a provision is one pass.

Config (``services.openstack-project`` of the broker config; all optional)::

    openstack-project:
      default_cloud: CloudOne          # else the first cloud of the config
      binding_lifetime: 7776000        # seconds (90 days): bindings expire, renew_before set
      plans:
        - name: standard
          description: A keystone project in one cloud of the federation
          cloud: CloudTwo              # this plan's default cloud
          binding_roles: [member]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from scoperouter.broker import credentials
from scoperouter.broker.contract import (
    DRAFT4,
    CatalogEntry,
    Done,
    Failed,
    Found,
    InvalidParameters,
    OperationContext,
    OperationKind,
    Outcome,
    PlanEntry,
    Schemas,
    Service,
    stable_id,
)
from scoperouter.broker.identity import (
    INSTANCE_TAG_PREFIX,
    MANAGED_TAG,
    instance_tag,
    keystone,
    space_of,
)

NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"


class ProjectService(Service):
    name = "openstack-project"

    # ------------------------------------------------------------------------ catalog

    def _cloud_names(self) -> list[str]:
        return list(self.clouds.names())

    def _plans(self) -> list[Mapping[str, Any]]:
        plans = self.settings.get("plans") or [
            {"name": "standard", "description": "A keystone project in one cloud of the federation"}
        ]
        return list(plans)

    def catalog(self) -> CatalogEntry:
        service_id = str(self.settings.get("id") or stable_id(self.name))
        clouds = self._cloud_names()
        create = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "cloud": {
                    "type": "string",
                    "enum": clouds,
                    "description": "the cloud the project is created in (default: the plan's)",
                },
                "name": {
                    "type": "string",
                    "pattern": NAME_PATTERN,
                    "description": "a readable part of the project name (osb-<name>-<digest>)",
                },
                "description": {"type": "string", "maxLength": 200},
            },
        }
        update = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {"description": {"type": "string", "maxLength": 200}},
        }
        bind = {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "properties": {},
        }
        plans = []
        for plan in self._plans():
            name = str(plan["name"])
            settings = {k: v for k, v in plan.items() if k not in ("id", "name", "description")}
            plans.append(
                PlanEntry(
                    id=str(plan.get("id") or stable_id(self.name, name)),
                    name=name,
                    description=str(plan.get("description") or name),
                    free=bool(plan.get("free", True)),
                    bindable=True,
                    plan_updateable=False,
                    schemas=Schemas(
                        instance_create=create, instance_update=update, binding_create=bind
                    ),
                    metadata={"displayName": f"OpenStack project ({name})"},
                    settings=settings,
                )
            )
        return CatalogEntry(
            id=service_id,
            name=self.name,
            description="A Keystone project in a chosen cloud of the federation, with "
            "per-binding application credentials",
            plans=tuple(plans),
            bindable=True,
            plan_updateable=False,
            allow_context_updates=False,
            binding_rotatable=True,
            tags=("openstack", "keystone", "project"),
            metadata={"displayName": "OpenStack project", "providerDisplayName": "scoperouter"},
        )

    def validate(self, kind: OperationKind, plan: PlanEntry, parameters: Mapping[str, Any]) -> None:
        cloud = plan.settings.get("cloud")
        if cloud is not None and cloud not in self._cloud_names():  # a config mistake, said early
            raise InvalidParameters("plan_id", f"the plan names cloud {cloud!r}, which is unknown")

    # ---------------------------------------------------------------------- passes

    def _cloud(self, op: OperationContext) -> str:
        if op.instance.cloud:
            return op.instance.cloud
        cloud = (
            op.parameters.get("cloud")
            or op.plan.settings.get("cloud")
            or self.settings.get("default_cloud")
            or self._cloud_names()[0]
        )
        return str(cloud)

    @staticmethod
    def project_name(instance_id: str, name: str | None) -> str:
        digest = hashlib.sha256(instance_id.encode()).hexdigest()[:12]
        readable = re.sub(r"[^A-Za-z0-9._-]", "-", name or "project")[:40]
        return f"osb-{readable}-{digest}"

    def provision(self, op: OperationContext) -> Outcome:
        cloud = self._cloud(op)
        if op.instance.cloud is None:
            op.set_cloud(cloud)  # durable before anything is built: deprovision looks there
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived")
        conn = op.clouds.connect(cloud)
        space = space_of(op.context, platforms=op.identity.config.platforms)
        name = self.project_name(op.instance.id, op.parameters.get("name"))
        description = str(
            op.parameters.get("description")
            or f"OSB instance {op.instance.id} ({space.describe()})"
        )
        project, created = op.identity.ensure_project(
            conn,
            tag=instance_tag(op.instance.id),
            name=name,
            description=description,
            extra_tags=(space.tag,),
        )
        op.set_resources(project_id=str(project.id), project_name=str(project.name))
        op.identity.grant_self(conn, str(project.id))
        granted = op.identity.grant_mapped(conn, cloud, str(project.id), op.originating_identity)
        text = (
            f"project {project.name} ({project.id}) {'created' if created else 'found'} in {cloud}"
        )
        if granted:
            text += "; granted " + ", ".join(granted)
        return Done(text)

    def update(self, op: OperationContext) -> Outcome:
        cloud = op.instance.cloud
        project_id = op.instance.resources.get("project_id")
        if not cloud or not project_id:
            return Failed("the instance has no project")
        conn = op.clouds.connect(cloud)
        if "description" in op.parameters:
            keystone(conn).update_project(project_id, description=str(op.parameters["description"]))
        return Done(f"project {project_id} updated")

    def deprovision(self, op: OperationContext) -> Outcome:
        cloud = op.instance.cloud
        if not cloud:
            return Done("nothing was built")
        conn = op.clouds.connect(cloud)
        project = op.identity.find_project(conn, instance_tag(op.instance.id))
        if project is None:
            return Done(f"no project of this instance is left in {cloud}")
        removed = credentials.revoke_all(conn, str(project.id))
        op.identity.delete_project(conn, str(project.id))
        text = f"project {project.name} ({project.id}) deleted from {cloud}"
        if removed:
            text += f" with {removed} binding credential(s)"
        return Done(text)

    def bind(self, op: OperationContext) -> Outcome:
        cloud = op.instance.cloud
        project_id = op.instance.resources.get("project_id")
        if not cloud or not project_id:
            return Failed("the instance has no project to bind to")
        if op.cancelled:
            return Failed("stopped: an unbind request arrived")
        policy = credentials.CredentialPolicy.from_settings(
            {**self.settings, **op.plan.settings}, op.identity.config.binding_roles
        )
        return credentials.issue(
            op,
            cloud=cloud,
            project_id=str(project_id),
            policy=policy,
            extra={"project_name": op.instance.resources.get("project_name")},
        )

    def unbind(self, op: OperationContext) -> Outcome:
        return credentials.revoke(op)

    def inventory_clouds(self) -> list[str]:
        return self._cloud_names()

    def inventory(self, cloud: str) -> Iterable[Found]:
        conn = self.clouds.connect(cloud)
        projects = []
        for project in keystone(conn).projects(tags=MANAGED_TAG):
            tags = list(project.tags or [])
            owner = next((t for t in tags if t.startswith(INSTANCE_TAG_PREFIX)), None)
            if owner is None:
                continue
            projects.append(str(project.id))
            yield Found(
                cloud=cloud,
                kind="project",
                id=str(project.id),
                instance_id=owner[len(INSTANCE_TAG_PREFIX) :],
                name=str(project.name),
            )
        yield from credentials.inventory(conn, cloud, projects)
