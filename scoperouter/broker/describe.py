"""What the database knows about instances, as the operator commands show it (``broker list``,
``broker show``): plain JSON-able mappings, never a credential."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from scoperouter.broker.store import Store
from scoperouter.broker.tables import GONE


class InstanceRow(TypedDict):
    """One line of ``broker list``."""

    id: str
    service: str
    plan_id: str
    cloud: str | None
    state: str
    operation: str | None
    operation_state: str | None
    description: str | None
    bindings: int


def list_instances(store: Store, *, include_gone: bool = False) -> list[InstanceRow]:
    """Every instance (deprovisioned ones with `include_gone`) with its latest operation and
    its count of live bindings."""
    rows: list[InstanceRow] = []
    with store.read() as session:
        for instance in store.instances(session):
            if instance.state == GONE and not include_gone:
                continue
            op = store.last_operation(session, instance.id)
            rows.append(
                {
                    "id": instance.id,
                    "service": instance.service_name,
                    "plan_id": instance.plan_id,
                    "cloud": instance.cloud,
                    "state": instance.state,
                    "operation": op.id if op else None,
                    "operation_state": op.state if op else None,
                    "description": op.description if op else None,
                    "bindings": len(
                        [b for b in store.bindings_of(session, instance.id) if b.state != GONE]
                    ),
                }
            )
    return rows


def when(value: datetime | None) -> str | None:
    """A stored (naive UTC) time as ISO 8601 with a Z, to the second."""
    return value.isoformat(timespec="seconds") + "Z" if value is not None else None


def describe_instance(store: Store, ident: str) -> dict[str, Any] | None:
    """Everything the database knows about an instance (found by instance, binding or
    operation id); never the credentials."""
    with store.read() as session:
        instance = store.instance(session, ident)
        if instance is None:
            binding = store.binding(session, ident)
            op = store.operation(session, ident)
            owner = binding.instance_id if binding else op.instance_id if op else None
            instance = store.instance(session, owner) if owner else None
        if instance is None:
            return None
        return {
            "id": instance.id,
            "service": instance.service_name,
            "service_id": instance.service_id,
            "plan_id": instance.plan_id,
            "state": instance.state,
            "cloud": instance.cloud,
            "resources": instance.resources,
            "parameters": instance.parameters,
            "context": instance.context,
            "maintenance_version": instance.maintenance_version,
            "active_operation": instance.active_operation_id,
            "created_at": when(instance.created_at),
            "updated_at": when(instance.updated_at),
            "bindings": [
                {
                    "id": b.id,
                    "state": b.state,
                    "resources": b.resources,
                    "parameters": b.parameters,
                    "predecessor_binding_id": b.predecessor_binding_id,
                    "expires_at": when(b.expires_at),
                    "renew_before": when(b.renew_before),
                    "has_credentials": b.credentials is not None,
                }
                for b in store.bindings_of(session, instance.id)
            ],
            "operations": [
                {
                    "id": o.id,
                    "kind": o.kind,
                    "binding_id": o.binding_id,
                    "state": o.state,
                    "description": o.description,
                    "attempts": o.attempts,
                    "cancel_requested": o.cancel_requested,
                    "lease_owner": o.lease_owner,
                    "lease_expires_at": when(o.lease_expires_at),
                    "not_before": when(o.not_before),
                    "deadline_at": when(o.deadline_at),
                    "progress": o.progress,
                    "originating_identity": o.originating_identity,
                    "request_identity": o.request_identity,
                    "created_at": when(o.created_at),
                    "finished_at": when(o.finished_at),
                }
                for o in store.operations(session, instance.id)
            ],
        }
