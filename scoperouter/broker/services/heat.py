"""``heat`` services: a HOT template is a plan (docs/broker/heat-templates.md).

The operator lists plans in the broker config, each naming a Heat Orchestration Template; the
plan's parameter schema is derived from the template's ``parameters`` (:func:`template_schemas`:
types, defaults, descriptions, and the ``constraints`` JSON schema can say: ``length``,
``range``, ``allowed_values``, ``allowed_pattern``, a ``modulo`` without offset), and its
``outputs`` are the bindings' credentials. Provision creates a stack in the chosen cloud through
its router (the placement of :mod:`~scoperouter.broker.services.placed`: with a scope, a stack
in CloudOne whose server boots CloudTwo's image), update updates it (a plan change replaces
the template), deprovision deletes it; a stack that fails says why in the operation's
description (heat's ``stack_status_reason``).

Crash safety: the stack is named after the instance (``osb-<id>``; heat refuses a second stack
of one name in a project) and tagged with it, and a pass looks it up before creating one: a
pass re-run after a crash finds the stack a dead pass created, whatever state it is in, and
goes on polling it. Every call goes through openstacksdk's ``orchestration`` proxy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scoperouter.broker import credentials, placement
from scoperouter.broker.config import BrokerConfigError
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
    PlanEntry,
    Schemas,
    stable_id,
)
from scoperouter.broker.openstack_helpers import error_text, instance_tag
from scoperouter.broker.services import placed
from scoperouter.broker.services.heat_templates import (
    load_template,
    owner_of,
    stack_name,
    stack_parameters,
    template_schemas,
)
from scoperouter.broker.services.placed import PlacementSpec

if TYPE_CHECKING:
    import requests
    from openstack.orchestration.v1._proxy import Proxy as Orchestration
    from openstack.orchestration.v1.stack import Stack

BROKER_TAG = "osb"
POLL_SECONDS = 3.0
DELETE_RETRIES = 3  # a stack that fails to delete is asked again this many times


# ----------------------------------------------------------------------- the config


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeatPlan(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    description: str = Field(min_length=1)
    template: str = Field(min_length=1)  # a file, relative to the broker config
    id: str | None = Field(default=None, min_length=1, max_length=255)
    free: bool = True
    bindable: bool | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # template parameters this plan sets (not offered to platforms)
    parameters: dict[str, Any] = Field(default_factory=dict)
    demand: dict[str, float] | None = None
    maximum_polling_duration: int | None = Field(default=None, gt=0)


class HeatSettings(_Strict):
    """A heat service's section of the broker config (besides the broker's own keys)."""

    id: str | None = Field(default=None, min_length=1, max_length=255)
    description: str = "An OpenStack Heat stack of a template the operator offers"
    bindable: bool = True
    plan_updateable: bool = False
    binding_rotatable: bool = False
    tags: tuple[str, ...] = ("openstack", "heat")
    metadata: dict[str, Any] = Field(default_factory=dict)
    project: placed.ProjectMode = "space"
    placement: PlacementSpec = PlacementSpec()
    # each binding also gets an application credential of the stack's project
    binding_credential: bool = False
    binding_roles: tuple[str, ...] | None = None
    binding_lifetime: float | None = Field(default=None, gt=0)
    binding_access_rules: tuple[dict[str, str], ...] = ()
    # how often a stack in progress is read again
    poll_seconds: float = Field(default=POLL_SECONDS, gt=0, le=60)
    plans: tuple[HeatPlan, ...] = Field(min_length=1)


def service_class(name: str) -> type[HeatService]:
    """The Service class of the heat service enabled as `name`."""
    return type(f"HeatService[{name}]", (HeatService,), {"name": name})


class HeatService(placed.PlacedService):
    """Plans from HOT templates (see the module docstring)."""

    name: ClassVar[str] = "heat"

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        super().__init__(settings, clouds)
        where = f"services.{self.name}"
        try:
            self.spec = HeatSettings.model_validate(dict(settings))
            self.placement = self.spec.placement
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "(top)"
            raise BrokerConfigError(f"{where}.{loc}: {first['msg']}") from None
        try:
            placed.check_default(self.spec.placement, clouds.names())
        except placement.PlacementError as exc:
            raise BrokerConfigError(f"{where}.placement.default: {exc}") from None
        self.templates: dict[str, dict[str, Any]] = {}  # plan id -> template
        plans = []
        for index, plan in enumerate(self.spec.plans):
            template = load_template(Path(plan.template))
            try:
                create, update = template_schemas(template, fixed=plan.parameters)
                placed.add_where(create, self.spec.placement, clouds.names())
            except ValueError as exc:
                raise BrokerConfigError(
                    f"{where}.plans[{index}] ({plan.template}): {exc}"
                ) from None
            plan_id = plan.id or stable_id("heat", self.name, plan.name)
            self.templates[plan_id] = template
            plans.append(
                PlanEntry(
                    id=plan_id,
                    name=plan.name,
                    description=plan.description,
                    free=plan.free,
                    bindable=plan.bindable,
                    schemas=Schemas(
                        instance_create=create,
                        instance_update=update if update["properties"] else None,
                        binding_create={**_EMPTY} if self.spec.bindable else None,
                    ),
                    maximum_polling_duration=plan.maximum_polling_duration,
                    metadata=dict(plan.metadata),
                    settings={"parameters": dict(plan.parameters), "demand": plan.demand},
                )
            )
        self._catalog = CatalogEntry(
            id=self.spec.id or stable_id("heat", self.name),
            name=self.name,
            description=self.spec.description,
            plans=tuple(plans),
            bindable=self.spec.bindable,
            plan_updateable=self.spec.plan_updateable,
            binding_rotatable=self.spec.binding_rotatable,
            tags=self.spec.tags,
            metadata=dict(self.spec.metadata),
        )
        self.policy = credentials.CredentialPolicy(
            roles=tuple(self.spec.binding_roles or ("member",)),
            lifetime=self.spec.binding_lifetime,
            access_rules=self.spec.binding_access_rules,
        )

    # -------------------------------------------------------------------------- passes

    def _values(self, op: OperationContext) -> dict[str, Any]:
        """The stack's parameters: the request's, then the plan's own."""
        given = {k: v for k, v in op.parameters.items() if k != placed.WHERE_PARAMETER}
        return {**given, **dict(op.plan.settings.get("parameters") or {})}

    @staticmethod
    def _orchestration(op: OperationContext, target: Mapping[str, Any]) -> Orchestration:
        orchestration: Orchestration = placed.connect(op, target).orchestration
        return orchestration

    def _find(self, op: OperationContext, orchestration: Orchestration) -> Stack | None:
        """The instance's stack: by the id a pass recorded, else by name (a pass that died
        between the create and its save)."""
        from openstack import exceptions

        known = op.progress.get("stack_id") or op.instance.resources.get("stack_id")
        if known:
            try:
                return orchestration.get_stack(known)  # DELETE_COMPLETE: the caller decides
            except exceptions.NotFoundException:
                pass
        return orchestration.find_stack(stack_name(op.instance.id), ignore_missing=True)

    def provision(self, op: OperationContext) -> Outcome:
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived; it removes what was built")
        target = placed.choose(
            op, self.spec.placement, self.spec.project, op.plan.settings.get("demand")
        )
        if isinstance(target, Failed | Pending):
            return target
        orchestration = self._orchestration(op, target)
        stack = self._find(op, orchestration)
        if stack is None or stack.status == "DELETE_COMPLETE":
            if op.cancelled:
                return Failed("stopped: a deprovision request arrived")
            made = self._create(op, orchestration, target)
            if isinstance(made, Failed):
                return made
            stack = made
        self._record(op, stack)
        return self._outcome("CREATE", stack, target)

    def _create(
        self, op: OperationContext, orchestration: Orchestration, target: Mapping[str, Any]
    ) -> Stack | Failed:
        from openstack import exceptions

        template = self.templates[op.plan.id]
        name = stack_name(op.instance.id)
        try:
            stack_id = create_stack(
                orchestration,
                name=name,
                template=template,
                parameters=stack_parameters(template, self._values(op)),
                tags=[BROKER_TAG, instance_tag(op.instance.id)],
                timeout_mins=_minutes_left(op),
                disable_rollback=True,  # a failed stack keeps its resources and its reason
            )
        except exceptions.ConflictException:
            # a stack of that name exists: made by a pass whose answer was lost
            found = orchestration.find_stack(name, ignore_missing=True)
            if found is None:
                raise
            return found
        except exceptions.BadRequestException as exc:  # heat refused the template/parameters
            where = placed.describe(target)
            return Failed(f"heat refused stack {name} in {where}: {error_text(exc)}")
        op.log.info("created stack %s (%s) in %s", name, stack_id, target["cloud"])
        op.save(stack_id=stack_id)
        return orchestration.get_stack(stack_id)

    def _record(self, op: OperationContext, stack: Stack) -> None:
        if op.progress.get("stack_id") != stack.id:
            op.save(stack_id=stack.id)
        if op.instance.resources.get("stack_id") != stack.id:
            op.set_resources(stack_id=stack.id, stack_name=stack.name)

    def _outcome(self, action: str, stack: Stack, target: Mapping[str, Any]) -> Outcome:
        """Done, Pending or Failed (with heat's reason) for a stack after `action`."""
        status = str(stack.status or "")
        where = placed.describe(target)
        what = f"stack {stack.name} ({stack.id})"
        if status == f"{action}_COMPLETE":
            return Done(f"{what} is {status} in {where}")
        if status.endswith("_IN_PROGRESS") or not status.startswith(f"{action}_"):
            return Pending(f"{what} is {status or 'starting'} in {where}", self.spec.poll_seconds)
        reason = str(stack.status_reason or "no reason given")
        return Failed(f"{what} is {status} in {where}: {reason}")

    def update(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Failed("the instance has no stack to update (it was not provisioned)")
        orchestration = self._orchestration(op, target)
        stack = self._find(op, orchestration)
        if stack is None or stack.status == "DELETE_COMPLETE":
            return Failed(f"stack {stack_name(op.instance.id)} is gone from {target['cloud']}")
        if not op.progress.get("sent"):
            if str(stack.status or "").endswith("_IN_PROGRESS"):
                return Pending(
                    f"stack {stack.name} is {stack.status}: waiting", self.spec.poll_seconds
                )
            template = self.templates[op.plan.id]  # the target plan's
            update_stack(
                orchestration,
                stack,
                template=template,
                parameters=stack_parameters(template, self._values(op)),
                tags=[BROKER_TAG, instance_tag(op.instance.id)],
                timeout_mins=_minutes_left(op),
            )
            op.save(sent=True)
            return Pending(
                f"updating stack {stack.name} in {target['cloud']}", self.spec.poll_seconds
            )
        return self._outcome("UPDATE", orchestration.get_stack(stack.id), target)

    def deprovision(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Done("nothing was built")
        orchestration = self._orchestration(op, target)
        stack = self._find(op, orchestration)
        where = placed.describe(target)
        if stack is None or stack.status == "DELETE_COMPLETE":
            text = f"no stack of this instance is left in {where}"
            if self.spec.binding_credential:
                revoked = credentials.revoke_instance(op)
                if revoked:
                    text += f"; {revoked} binding credential(s) revoked"
            return Done(text)
        status = str(stack.status or "")
        if status == "DELETE_IN_PROGRESS":
            return Pending(f"deleting stack {stack.name} in {where}", self.spec.poll_seconds)
        if status == "DELETE_FAILED":
            failures = int(op.progress.get("delete_failures", 0)) + 1
            if failures > DELETE_RETRIES:
                return Failed(
                    f"stack {stack.name} ({stack.id}) is DELETE_FAILED in {where}: "
                    f"{stack.status_reason or 'no reason given'}"
                )
            op.save(delete_failures=failures)
        orchestration.delete_stack(stack)
        op.log.info("deleting stack %s (%s) in %s", stack.name, stack.id, target["cloud"])
        return Pending(f"deleting stack {stack.name} in {where}", self.spec.poll_seconds)

    def bind(self, op: OperationContext) -> Outcome:
        """The stack's outputs (read now), plus the stack's coordinates and, when the service
        says so, an application credential of its project."""
        target = placed.recorded(op)
        if target is None:
            return Failed("the instance has no stack to bind to (it was not provisioned)")
        if op.cancelled:
            return Failed("stopped: an unbind request arrived")
        stack = self._find(op, self._orchestration(op, target))
        if stack is None or stack.status == "DELETE_COMPLETE":
            return Failed(f"stack {stack_name(op.instance.id)} is gone from {target['cloud']}")
        outputs = {
            str(o.get("output_key")): o.get("output_value")
            for o in (stack.outputs or [])
            if isinstance(o, Mapping) and o.get("output_key") and not o.get("output_error")
        }
        base = {"cloud": target["cloud"], "stack_id": stack.id, "stack_name": stack.name}
        result: dict[str, Any] = {"credentials": {**base, **outputs}}
        if self.spec.binding_credential:
            issued = credentials.issue(
                op,
                cloud=str(target["cloud"]),
                project_id=str(target["project_id"]),
                policy=self.policy,
                scope=json.loads(target["scope"]) if target.get("scope") else None,
            )
            extra = dict(issued.result or {})
            result = {**extra, "credentials": {**extra.get("credentials", {}), **base, **outputs}}
        return Done(
            f"outputs of stack {stack.name}: {', '.join(sorted(outputs)) or 'none'}", result
        )

    def unbind(self, op: OperationContext) -> Outcome:
        if self.spec.binding_credential:
            return credentials.revoke(op)
        return Done("nothing to remove")

    # ----------------------------------------------------------------------- inventory

    def inventory(self, cloud: str) -> Iterable[Found]:
        """Stacks carrying the broker's tag in every project the broker manages in `cloud`
        (and in its account's own, for ``project: broker``), listed project by project with a
        token of each: heat's default policy lets nobody list every project's stacks at once
        (``global_tenant``: ``stacks:global_index`` is ``deny_everybody``)."""
        projects: list[str | None] = list(placed.managed_projects(self.clouds, cloud))
        if self.spec.project == "broker":
            projects.append(None)
        for project_id in projects:
            conn = self.clouds.connect(cloud, project_id=project_id)
            response = conn.orchestration.get("/stacks", params={"tags": BROKER_TAG})
            response.raise_for_status()
            for stack in response.json().get("stacks", []):
                yield Found(
                    cloud=cloud,
                    kind="stack",
                    id=str(stack.get("id")),
                    instance_id=owner_of(stack.get("stack_name"), stack.get("tags") or []),
                    name=stack.get("stack_name"),
                )


def create_stack(
    orchestration: Orchestration,
    *,
    name: str,
    template: Mapping[str, Any],
    parameters: Mapping[str, Any],
    tags: Iterable[str],
    timeout_mins: int,
    disable_rollback: bool,
) -> str:
    """Create a stack (``POST /stacks``); its id. Raises openstacksdk's HTTP exceptions.

    Not openstacksdk's ``create_stack``: its Stack resource sends ``tags`` as a JSON list,
    and heat's API takes them as one comma-separated string (a list is a 400 without a
    message: heat's ``'list' object has no attribute 'split'``)."""
    body = _definition(template, parameters, tags, timeout_mins)
    body.update(stack_name=name, disable_rollback=disable_rollback)
    response = _sent(orchestration.post("/stacks", json=body))
    return str(response.json()["stack"]["id"])


def update_stack(
    orchestration: Orchestration,
    stack: Stack,
    *,
    template: Mapping[str, Any],
    parameters: Mapping[str, Any],
    tags: Iterable[str],
    timeout_mins: int,
) -> None:
    """Update a stack (``PUT /stacks/<name>/<id>``, heat's whole new definition of it). The
    tags go again, as for a create: heat keeps only the tags an update gives, and the broker
    finds its stacks by them (`broker repair`)."""
    body = _definition(template, parameters, tags, timeout_mins)
    _sent(orchestration.put(f"/stacks/{stack.name}/{stack.id}", json=body))


def _definition(
    template: Mapping[str, Any], parameters: Mapping[str, Any], tags: Iterable[str], minutes: int
) -> dict[str, Any]:
    """What a create and an update send: tags as heat's API takes them."""
    return {
        "template": dict(template),
        "parameters": dict(parameters),
        "tags": ",".join(tags),
        "timeout_mins": minutes,
    }


def _sent(response: requests.Response) -> requests.Response:
    """`response`, or openstacksdk's exception for heat's error answer."""
    from openstack import exceptions

    exceptions.raise_from_response(response)
    return response


_EMPTY: dict[str, Any] = {
    "$schema": DRAFT4,
    "type": "object",
    "additionalProperties": False,
    "properties": {},
}


def _minutes_left(op: OperationContext) -> int:
    """The operation's time left, in whole minutes (heat's stack timeout), at least 1."""
    left = (
        op.deadline.replace(tzinfo=None) - datetime.now(UTC).replace(tzinfo=None)
    ).total_seconds()
    return max(1, int(left // 60))
