"""``GET .../last_operation`` of an instance or a binding: what platforms call most (every few
seconds per operation in flight). One indexed query, answered without an ORM session or a
pydantic model (the body is the OSB ``LastOperation`` object as a TypedDict; tests validate it
against models.LastOperation)."""

from __future__ import annotations

import math
from datetime import datetime

from scoperouter.broker import models
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb.common import (
    EMPTY,
    Endpoints,
    OSBError,
    Reply,
)
from scoperouter.broker.tables import FAILED, IN_PROGRESS, SUCCEEDED, utcnow

LastOperationReply = Reply[models.LastOperationBody] | Reply[models.EmptyResponse]
GONE: Reply[models.EmptyResponse] = Reply(410, EMPTY)


def last_operation(
    ep: Endpoints, instance_id: str, operation: str | None, binding_id: str | None = None
) -> LastOperationReply:
    """The state of the operation (the latest, or the one named); 410 once a deprovision or
    unbind succeeded (the resource is gone); 404 for an unknown one."""
    op = ep.store.status(instance_id, binding_id, operation)
    if op is None:
        what = f"binding {excerpt(binding_id)} of instance" if binding_id else "instance"
        detail = f" with operation {excerpt(operation)}" if operation else ""
        raise OSBError(404, f"no {what} {excerpt(instance_id)}{detail}")
    if op.kind in ("deprovision", "unbind") and op.state == SUCCEEDED:
        return GONE
    body: models.LastOperationBody = {"state": op.state}  # type: ignore[typeddict-item]
    if op.description:
        body["description"] = op.description
    if op.state == FAILED:
        if op.kind == "update":
            body["instance_usable"] = True
            body["update_repeatable"] = True
        elif op.kind == "deprovision":
            body["instance_usable"] = False
    if op.state == IN_PROGRESS:
        return Reply(200, body, retry_after=retry_after(op.not_before))
    return Reply(200, body)


def retry_after(not_before: datetime) -> int:
    """Seconds until the operation's next pass (1-60): when polling again is worth it."""
    wait = (not_before - utcnow()).total_seconds()
    return max(1, min(60, math.ceil(wait)))
