"""``GET /v2/service_instances/:instance_id``: a provisioned instance (404 while provisioning,
422 while updating)."""

from __future__ import annotations

from scoperouter.broker import models
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb.common import (
    Endpoints,
    OSBError,
    Reply,
    concurrency,
    instance_metadata,
)
from scoperouter.broker.tables import FAILED, GONE, PROVISIONING, UPDATING


def get_instance(ep: Endpoints, instance_id: str) -> Reply[models.InstanceResponse]:
    with ep.store.read() as session:
        instance = ep.store.instance(session, instance_id)
    if instance is None or instance.state in (GONE, PROVISIONING, FAILED):
        raise OSBError(
            404, f"no instance {excerpt(instance_id)} (or it is still being provisioned)"
        )
    if instance.state == UPDATING:
        raise concurrency(f"instance {excerpt(instance_id)} is being updated")
    return Reply(
        200,
        models.InstanceResponse(
            service_id=instance.service_id,
            plan_id=instance.plan_id,
            parameters=dict(instance.parameters or {}),
            maintenance_info={"version": instance.maintenance_version}
            if instance.maintenance_version
            else None,
            metadata=instance_metadata(instance),
        ),
    )
