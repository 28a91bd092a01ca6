"""``DELETE /v2/service_instances/:instance_id``: deprovision (asynchronous only); during a
provision it stops that provision and removes what it built (orphan mitigation)."""

from __future__ import annotations

from scoperouter.broker import models
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb.common import (
    EMPTY,
    Endpoints,
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
from scoperouter.broker.tables import DEPROVISIONING, GONE

DeprovisionReply = Reply[models.AsyncResponse] | Reply[models.EmptyResponse]


def deprovision(
    ep: Endpoints,
    instance_id: str,
    service_id: str | None,
    plan_id: str | None,
    accepts_incomplete: bool,
    facts: RequestFacts,
) -> DeprovisionReply:
    check_id("instance_id", instance_id)
    service_id, plan_id = required_query(service_id, plan_id)
    with ep.store.write() as session:
        instance = ep.store.instance(session, instance_id)
        if instance is None or instance.state == GONE:
            return Reply(410, EMPTY)
        if service_id != instance.service_id:
            raise bad_request(
                f"service_id: instance {excerpt(instance_id)} is not of service "
                f"{excerpt(service_id)!r}"
            )
        ref = ep.plan(service_id, plan_id)
        active = ep.active(session, instance)
        if active is not None and active.kind == "deprovision":
            if not accepts_incomplete:
                raise async_required(f"deprovisioning {excerpt(instance_id)}")
            return accepted(active.id)
        if active is not None and active.kind != "provision":
            raise concurrency(
                f"instance {excerpt(instance_id)} has an operation in progress ({active.kind})"
            )
        if not accepts_incomplete:
            raise async_required(f"deprovisioning {ref.entry.name}")
        op = ep.new_op("deprovision", instance_id, ref, facts)
        ep.store.add(session, op)
        ep.take_over(session, instance, active, op)
        instance.state = DEPROVISIONING
        log.info("deprovision %s: %s", instance_id, op.id)
        reply = accepted(op.id)
    ep.wake()
    return reply
