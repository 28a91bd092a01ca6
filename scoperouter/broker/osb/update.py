"""``PATCH /v2/service_instances/:instance_id``: update plan, parameters, maintenance_info or
context (asynchronous; nothing to change: 200 ``{}`` at once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scoperouter.broker import models
from scoperouter.broker.identity import TenancyError, space_of
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb.common import (
    EMPTY,
    Endpoints,
    OSBError,
    Reply,
    RequestFacts,
    accepted,
    async_required,
    bad_request,
    check_id,
    check_references,
    concurrency,
    maintenance_conflict,
    no_tenant,
    validate,
)
from scoperouter.broker.runtime import PlanRef
from scoperouter.broker.tables import GONE, PROVISIONED, UPDATING, request_hash

UpdateReply = Reply[models.AsyncResponse] | Reply[models.EmptyResponse]
_ABSENT = object()


def update(
    ep: Endpoints,
    instance_id: str,
    body: models.UpdateRequest,
    accepts_incomplete: bool,
    facts: RequestFacts,
) -> UpdateReply:
    check_id("instance_id", instance_id)
    with ep.store.write() as session:
        instance = ep.store.instance(session, instance_id)
        if instance is None or instance.state == GONE:
            raise OSBError(404, f"no instance {excerpt(instance_id)}")
        if body.service_id != instance.service_id:
            raise bad_request(f"service_id: instance {excerpt(instance_id)} is not of this service")
        current = ep.plan(instance.service_id, instance.plan_id)
        target_plan = body.plan_id or instance.plan_id
        ref = ep.plan(instance.service_id, target_plan)
        if target_plan != instance.plan_id and not current.plan_updateable:
            raise OSBError(
                422,
                f"plan {current.plan.name} cannot be changed to {ref.plan.name}",
                update_repeatable=False,
            )
        if body.context is not None and ref.entry.allow_context_updates:
            same_tenant(ep, instance.context, body.context)
        if body.parameters is not None:
            updatable(ref, instance.parameters, body.parameters)
        maintenance_conflict(ref, body.maintenance_info)
        parameters = (
            {**instance.parameters, **body.parameters}
            if body.parameters is not None
            else dict(instance.parameters)
        )
        if body.parameters is not None:
            check_references(ep, session, ref, "update", parameters, instance)
        maintenance = body.maintenance_info.version if body.maintenance_info else None
        digest = request_hash(
            {"plan_id": target_plan, "parameters": body.parameters, "maintenance_info": maintenance}
        )
        active = ep.active(session, instance)
        if active is not None:
            if active.kind == "update" and active.request_hash == digest:
                if not accepts_incomplete:
                    raise async_required(f"updating {excerpt(instance_id)}")
                return accepted(active.id)
            raise concurrency(
                f"instance {excerpt(instance_id)} has an operation in progress ({active.kind})"
            )
        if instance.state != PROVISIONED:
            raise OSBError(
                422,
                f"instance {excerpt(instance_id)} is {instance.state}: it cannot be updated "
                "(delete it)",
                instance_usable=False,
                update_repeatable=False,
            )
        changes = (
            target_plan != instance.plan_id
            or parameters != instance.parameters
            or (maintenance is not None and maintenance != instance.maintenance_version)
        )
        if not changes:
            if body.context is not None and ref.entry.allow_context_updates:
                instance.context = dict(body.context)
            return Reply(200, EMPTY)
        if not accepts_incomplete:
            raise async_required(f"updating {ref.entry.name}")
        request: dict[str, Any] = {"plan_id": target_plan, "parameters": parameters}
        if maintenance:
            request["maintenance_version"] = maintenance
        if body.context is not None and ref.entry.allow_context_updates:
            request["context"] = dict(body.context)
        op = ep.new_op("update", instance_id, ref, facts, request=request, digest=digest)
        ep.store.add(session, op)
        if not ep.store.claim_instance(session, instance, op.id):
            raise concurrency(f"instance {excerpt(instance_id)} has an operation in progress")
        instance.state = UPDATING
        reply = accepted(op.id)
    ep.wake()
    return reply


def same_tenant(ep: Endpoints, kept: Mapping[str, Any] | None, given: Mapping[str, Any]) -> None:
    """A context update must name a tenant, the instance's own: 400 otherwise. (The broker
    does not move an instance's resources to another project; and a context naming none
    would leave the instance without one.)"""
    try:
        space = space_of(given, platforms=ep.broker.config.identity.platforms)
    except TenancyError as exc:
        raise no_tenant(exc) from None
    try:
        current = space_of(kept, platforms=ep.broker.config.identity.platforms)
    except TenancyError:  # kept from before tenants were required: any tenant will do
        return
    if space.tag != current.tag:
        raise bad_request(
            "context: names another tenant than the instance's; the broker does not move "
            "instances between platform spaces"
        )


def updatable(ref: PlanRef, current: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse at once, changing nothing, an update of parameters the plan cannot update.

    The catalog says what can change: the plan's ``schemas.service_instance.update``. The
    parameters whose value differs from the instance's are checked against it (a value equal
    to the current one is no change: Kubernetes Service Catalog sends every parameter on each
    update); with no update schema, changing any parameter is 422 (OSB: "the requested change
    is not supported"), with ``update_repeatable: false``. Without this, the platform would
    get 202 and then an update that fails, and can never succeed."""
    changing = {k: v for k, v in given.items() if current.get(k, _ABSENT) != v}
    if not changing:
        return
    if "instance_update" not in ref.validators:
        name = sorted(changing)[0]
        raise OSBError(
            422,
            f"parameters.{excerpt(name)}: plan {ref.plan.name} of {ref.entry.name} has no "
            "updatable "
            "parameters (its catalog entry has no schemas.service_instance.update); "
            "nothing was changed: create a new instance to change them",
            instance_usable=True,
            update_repeatable=False,
        )
    validate(ref, "instance_update", "update", changing)
