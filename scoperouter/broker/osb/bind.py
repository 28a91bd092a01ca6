"""``PUT .../service_bindings/:binding_id``: bind. Asynchronous with
``accepts_incomplete=true`` (202, then GET of the binding gives the credentials); else run
inline for up to the service's ``synchronous_seconds`` and answered 201 with the credentials
(422 ``AsyncRequired`` when the service allows no synchronous bind). Rotation: a bind naming a
``predecessor_binding_id`` of the same instance."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from scoperouter.broker import models
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
    log,
    validate,
)
from scoperouter.broker.runtime import PlanRef
from scoperouter.broker.services.base import Done
from scoperouter.broker.tables import (
    BINDING,
    BOUND,
    GONE,
    PROVISIONED,
    UNBINDING,
    UPDATING,
    Binding,
    iso,
    request_hash,
    utcnow,
)

BindReply = Reply[models.AsyncResponse] | Reply[models.BindingResponse]


def bind(
    ep: Endpoints,
    instance_id: str,
    binding_id: str,
    body: models.BindRequest,
    accepts_incomplete: bool,
    facts: RequestFacts,
) -> BindReply:
    check_id("instance_id", instance_id)
    check_id("binding_id", binding_id)
    ref = ep.plan(body.service_id, body.plan_id)
    if not ref.bindable:
        raise bad_request(f"plan_id: plan {ref.plan.name} is not bindable")
    sync_seconds = ref.config.synchronous_seconds

    def write() -> BindReply | str:
        with ep.store.write() as session:
            instance = ep.store.instance(session, instance_id)
            if instance is None or instance.state == GONE:
                raise OSBError(404, f"no instance {excerpt(instance_id)}")
            if (body.service_id, body.plan_id) != (instance.service_id, instance.plan_id):
                raise bad_request(
                    f"plan_id: instance {excerpt(instance_id)} is of plan "
                    f"{excerpt(instance.plan_id)}"
                )
            parameters = body.parameters
            if body.predecessor_binding_id is not None:
                parameters = _predecessor(ep, session, ref, instance_id, body, parameters)
            parameters = dict(parameters or {})
            validate(ref, "binding_create", "bind", parameters)
            check_references(ep, session, ref, "bind", parameters, instance)
            bind_resource = (
                body.bind_resource.model_dump(exclude_none=True) if body.bind_resource else {}
            )
            digest = request_hash(
                {
                    "instance_id": instance_id,
                    "service_id": body.service_id,
                    "plan_id": body.plan_id,
                    "parameters": parameters,
                    "bind_resource": bind_resource,
                    "app_guid": body.app_guid,
                    "predecessor_binding_id": body.predecessor_binding_id,
                }
            )
            existing = ep.store.binding(session, binding_id)
            if existing is not None:
                return _repeat(ep, session, existing, digest, accepts_incomplete)
            if instance.state not in (PROVISIONED, UPDATING):
                raise concurrency(f"instance {excerpt(instance_id)} is {instance.state}")
            if not accepts_incomplete and sync_seconds <= 0:
                raise async_required(f"binding {ref.entry.name}")
            op = ep.new_op(
                "bind",
                instance_id,
                ref,
                facts,
                binding_id=binding_id,
                digest=digest,
                accepts_incomplete=accepts_incomplete,
                lease_owner=None if accepts_incomplete else ep.owner,
            )
            binding = Binding(
                id=binding_id,
                instance_id=instance_id,
                service_id=body.service_id,
                plan_id=body.plan_id,
                parameters=parameters,
                context=dict(body.context or {}),
                bind_resource=bind_resource,
                predecessor_binding_id=body.predecessor_binding_id,
                resources={},
                state=BINDING,
                asynchronous=accepts_incomplete,
                request_hash=digest,
            )
            ep.store.add(session, binding)
            ep.store.add(session, op)
            if not ep.store.claim_instance(session, instance, op.id):
                raise concurrency(
                    f"instance {excerpt(instance_id)} has another operation in progress"
                )
            log.info("bind %s to %s: %s", binding_id, instance_id, op.id)
            return op.id

    result = ep.retrying(write)
    if not isinstance(result, str):
        return result
    if accepts_incomplete:
        ep.wake()
        return accepted(result)
    outcome = ep.run_inline(result, sync_seconds, "bind")
    with ep.store.read() as session:
        made = ep.store.binding(session, binding_id)
    assert made is not None
    if isinstance(outcome, Done):
        return Reply(201, ep.binding_body(made, credentials=True))
    raise OSBError(500, outcome)


def _predecessor(
    ep: Endpoints,
    session: Session,
    ref: PlanRef,
    instance_id: str,
    body: models.BindRequest,
    parameters: dict[str, Any] | None,
) -> dict[str, Any] | None:
    if not ref.entry.binding_rotatable:
        raise bad_request(f"predecessor_binding_id: plan {ref.plan.name} is not rotatable")
    previous = ep.store.binding(session, body.predecessor_binding_id or "")
    if previous is None or previous.instance_id != instance_id or previous.state != BOUND:
        raise bad_request(
            f"predecessor_binding_id: no live binding {excerpt(body.predecessor_binding_id)} "
            f"of instance {excerpt(instance_id)}"
        )
    if previous.expires_at is not None and previous.expires_at <= utcnow():
        raise bad_request(
            f"predecessor_binding_id: binding {excerpt(previous.id)} expired at "
            f"{iso(previous.expires_at)}"
        )
    # the platform need not send the parameters again (OSB "Binding Rotation")
    return parameters if parameters is not None else dict(previous.parameters or {})


def _repeat(
    ep: Endpoints, session: Session, binding: Binding, digest: str, accepts_incomplete: bool
) -> BindReply:
    if binding.request_hash != digest or binding.state == GONE:
        raise OSBError(409, f"binding {excerpt(binding.id)} exists with different attributes")
    if binding.state == BOUND:
        # the same answer as the original: with the credentials
        return Reply(200, ep.binding_body(binding, credentials=True))
    op = ep.store.last_operation(session, binding.instance_id, binding.id)
    if binding.state == BINDING and op is not None and op.kind == "bind":
        if not accepts_incomplete:
            raise concurrency(f"binding {excerpt(binding.id)} is being created")
        return accepted(op.id)
    if binding.state == UNBINDING:
        raise concurrency(f"binding {excerpt(binding.id)} is being deleted")
    raise OSBError(
        409, f"binding {excerpt(binding.id)} exists and is {binding.state}: delete it first"
    )
