"""``DELETE .../service_bindings/:binding_id``: unbind. Asynchronous with
``accepts_incomplete=true``; else inline (200 ``{}``) within the service's
``synchronous_seconds``. An unbind during its bind stops that bind (asynchronous only)."""

from __future__ import annotations

from scoperouter.broker import models
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
    concurrency,
    log,
    required_query,
)
from scoperouter.broker.services.base import Done
from scoperouter.broker.tables import GONE, UNBINDING

UnbindReply = Reply[models.AsyncResponse] | Reply[models.EmptyResponse]


def unbind(
    ep: Endpoints,
    instance_id: str,
    binding_id: str,
    service_id: str | None,
    plan_id: str | None,
    accepts_incomplete: bool,
    facts: RequestFacts,
) -> UnbindReply:
    check_id("instance_id", instance_id)
    check_id("binding_id", binding_id)
    service_id, plan_id = required_query(service_id, plan_id)
    with ep.store.write() as session:
        binding = ep.store.binding(session, binding_id)
        instance = ep.store.instance(session, instance_id)
        if (
            binding is None
            or instance is None
            or binding.instance_id != instance_id
            or binding.state == GONE
        ):
            return Reply(410, EMPTY)
        if service_id != binding.service_id:
            raise bad_request(
                f"service_id: binding {excerpt(binding_id)} is not of service "
                f"{excerpt(service_id)!r}"
            )
        ref = ep.plan(service_id, plan_id)
        sync_seconds = ref.config.synchronous_seconds
        active = ep.active(session, instance)
        if active is not None and active.binding_id == binding_id and active.kind == "unbind":
            if not accepts_incomplete:
                raise concurrency(f"binding {excerpt(binding_id)} is being deleted")
            return accepted(active.id)
        stop_bind = active is not None and active.binding_id == binding_id
        if active is not None and not (stop_bind and accepts_incomplete):
            # a synchronous unbind cannot wait for a bind to stop: the platform retries
            raise concurrency(
                f"instance {excerpt(instance_id)} has an operation in progress ({active.kind})"
            )
        if not accepts_incomplete and sync_seconds <= 0:
            raise async_required(f"unbinding {ref.entry.name}")
        op = ep.new_op(
            "unbind",
            instance_id,
            ref,
            facts,
            binding_id=binding_id,
            accepts_incomplete=accepts_incomplete,
            lease_owner=None if accepts_incomplete else ep.owner,
        )
        ep.store.add(session, op)
        ep.take_over(session, instance, active, op)
        binding.state = UNBINDING
        operation_id = op.id
        log.info("unbind %s of %s: %s", binding_id, instance_id, op.id)
    if accepts_incomplete:
        ep.wake()
        return accepted(operation_id)
    outcome = ep.run_inline(operation_id, sync_seconds, "unbind")
    if isinstance(outcome, Done):
        return Reply(200, EMPTY)
    raise OSBError(500, outcome)
