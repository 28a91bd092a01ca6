"""The broker's tables (SQLAlchemy 2 declarative models) and the states their rows go through.

Instances, bindings and operations; the schema is created and changed by Alembic
(``scoperouter/broker/migrations``), whose ``env.py`` reads :class:`Base`. The queries are in
:mod:`scoperouter.broker.store`. Times are naive UTC datetimes computed by the broker
(:func:`utcnow`).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID_LENGTH = 255


def utcnow() -> datetime:
    """Naive UTC now: what every timestamp column holds."""
    return datetime.now(UTC).replace(tzinfo=None)


def iso(value: datetime | None) -> str | None:
    """A stored time as ISO 8601 UTC with a Z (the OSB binding metadata format)."""
    if value is None:
        return None
    return (
        value.replace(microsecond=(value.microsecond // 100_000) * 100_000).isoformat(
            timespec="milliseconds"
        )[:-2]
        + "Z"
    )


def request_hash(fields: Mapping[str, Any]) -> str:
    """Digest of what a request asked for: equal digests are identical repeats (200/202 with
    the same operation), different ones are conflicts (409)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def new_operation_id(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(12)}"


class Base(DeclarativeBase):
    pass


# Instance / binding states
PROVISIONING, PROVISIONED, UPDATING, DEPROVISIONING, GONE, FAILED = (
    "provisioning",
    "provisioned",
    "updating",
    "deprovisioning",
    "gone",
    "failed",
)
BINDING, BOUND, UNBINDING = "binding", "bound", "unbinding"
# Operation states: the OSB words
IN_PROGRESS, SUCCEEDED = "in progress", "succeeded"
OP_FAILED = "failed"


class Instance(Base):
    __tablename__ = "instances"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    service_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    plan_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    service_name: Mapped[str] = mapped_column(String(ID_LENGTH))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    context: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    organization_guid: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    space_guid: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    cloud: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    resources: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # what a service keeps for later operations of the instance (a generated key pair's
    # private key), encrypted (secrets.py); never shown
    secrets: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(32))
    maintenance_version: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    request_hash: Mapped[str] = mapped_column(String(64))
    # the one operation that may change this instance now (binding operations included)
    active_operation_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class Binding(Base):
    __tablename__ = "bindings"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    instance_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("instances.id", ondelete="CASCADE"), index=True
    )
    service_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    plan_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    context: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    bind_resource: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    predecessor_binding_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # the credentials of the bind response, encrypted (secrets.py); null until bound
    credentials: Mapped[str | None] = mapped_column(Text)
    endpoints: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    resources: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    renew_before: Mapped[datetime | None] = mapped_column(DateTime)
    state: Mapped[str] = mapped_column(String(32))
    # created by an async request: GET of the binding is then how the platform receives the
    # credentials (the spec's MUST); a synchronous bind returned them already
    asynchronous: Mapped[bool] = mapped_column(Boolean, default=False)
    request_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class Operation(Base):
    __tablename__ = "operations"
    __table_args__ = (Index("ix_operations_due", "state", "not_before"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    instance_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("instances.id", ondelete="CASCADE"), index=True
    )
    binding_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), index=True)
    state: Mapped[str] = mapped_column(String(16))
    description: Mapped[str] = mapped_column(Text, default="")
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # what the request asked for that is not in the instance row yet (an update's target plan,
    # parameters and maintenance_info)
    request: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    request_hash: Mapped[str] = mapped_column(String(64))
    accepts_incomplete: Mapped[bool] = mapped_column(Boolean, default=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    not_before: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    deadline_at: Mapped[datetime] = mapped_column(DateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    originating_identity: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request_identity: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


TABLES = ("instances", "bindings", "operations")
