"""``PUT /v2/service_instances/:instance_id``: provision (asynchronous only)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from scoperouter.broker import models
from scoperouter.broker.identity import Space, TenancyError, space_of, tenant_context
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb.common import (
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
    instance_metadata,
    log,
    maintenance_conflict,
    no_tenant,
    validate,
)
from scoperouter.broker.tables import (
    DEPROVISIONING,
    GONE,
    PROVISIONED,
    PROVISIONING,
    UPDATING,
    Instance,
    request_hash,
)

ProvisionReply = Reply[models.AsyncResponse] | Reply[models.ProvisionResponse]


def provision(
    ep: Endpoints,
    instance_id: str,
    body: models.ProvisionRequest,
    accepts_incomplete: bool,
    facts: RequestFacts,
) -> ProvisionReply:
    check_id("instance_id", instance_id)
    ref = ep.plan(body.service_id, body.plan_id)
    space = tenant(ep, body)
    parameters = dict(body.parameters or {})
    validate(ref, "instance_create", "provision", parameters)
    maintenance_conflict(ref, body.maintenance_info)
    context = dict(body.context or {})
    digest = request_hash(
        {
            "service_id": body.service_id,
            "plan_id": body.plan_id,
            "parameters": parameters,
            "context": context,
            "organization_guid": body.organization_guid,
            "space_guid": body.space_guid,
            "maintenance_info": body.maintenance_info.version if body.maintenance_info else None,
        }
    )

    def write() -> ProvisionReply:
        with ep.store.write() as session:
            existing = ep.store.instance(session, instance_id)
            if existing is not None:
                return _repeat(ep, session, existing, digest, accepts_incomplete)
            check_references(ep, session, ref, "provision", parameters, None)
            if not accepts_incomplete:
                raise async_required(f"provisioning {ref.entry.name}")
            op = ep.new_op("provision", instance_id, ref, facts, digest=digest)
            instance = Instance(
                id=instance_id,
                service_id=body.service_id,
                plan_id=body.plan_id,
                service_name=ref.service.name,
                parameters=parameters,
                context=tenant_context(context, space),
                organization_guid=body.organization_guid,
                space_guid=body.space_guid,
                cloud=None,
                resources={},
                state=PROVISIONING,
                maintenance_version=(ref.plan.maintenance_info or {}).get("version"),
                request_hash=digest,
                active_operation_id=op.id,
            )
            ep.store.add(session, instance)
            ep.store.add(session, op)
            log.info("provision %s of %s/%s: %s", instance_id, ref.entry.name, ref.plan.name, op.id)
            return accepted(op.id)

    reply = ep.retrying(write)
    ep.wake()
    return reply


def tenant(ep: Endpoints, body: models.ProvisionRequest) -> Space:
    """The tenant the instance belongs to (its platform space: identity.py), or 400.

    OSB 2.17 deprecates the top-level ``organization_guid``/``space_guid`` for ``context``,
    but the tenant must come from somewhere: a Cloud Foundry context (or those GUIDs), a
    Kubernetes namespace, or a platform the operator maps in ``identity.platforms``. There is
    no shared project for requests that name none: ``"context": {}`` and an unknown platform
    were accepted and all such instances put in one ``osb-unknown-default`` project."""
    if body.context is None:
        for name in ("organization_guid", "space_guid"):
            if getattr(body, name) is None:
                raise bad_request(f"{name}: required when the request has no context (OSB 2.17)")
    try:
        return space_of(
            body.context,
            body.organization_guid,
            body.space_guid,
            platforms=ep.broker.config.identity.platforms,
        )
    except TenancyError as exc:
        raise no_tenant(exc) from None


def _repeat(
    ep: Endpoints, session: Session, instance: Instance, digest: str, accepts_incomplete: bool
) -> ProvisionReply:
    """A provision of an id that exists: the same answer for an identical repeat, else 409."""
    if instance.state == GONE:
        raise OSBError(
            409,
            f"instance {excerpt(instance.id)} existed and was deprovisioned: use a new id "
            "(or forget the old one with `scoperouter broker purge`)",
        )
    if instance.request_hash != digest:
        raise OSBError(409, f"instance {excerpt(instance.id)} exists with different attributes")
    if instance.state in (PROVISIONED, UPDATING):
        return Reply(200, models.ProvisionResponse(metadata=instance_metadata(instance)))
    if instance.state == DEPROVISIONING:
        raise concurrency(f"instance {excerpt(instance.id)} is being deprovisioned")
    if not accepts_incomplete:
        raise async_required(f"provisioning {excerpt(instance.id)}")
    first = [op for op in ep.store.operations(session, instance.id) if op.kind == "provision"]
    return accepted(first[0].id if first else None)
