"""What the OSB endpoints share: errors, request facts, replies, and :class:`Endpoints` (the
broker, its store and runner, and the few steps several endpoints take)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scoperouter.broker import models
from scoperouter.broker.identity import TenancyError
from scoperouter.broker.logs import excerpt
from scoperouter.broker.runtime import Broker, PlanRef
from scoperouter.broker.services.base import (
    Done,
    Failed,
    InstanceView,
    InvalidParameters,
    OperationKind,
)
from scoperouter.broker.store import is_duplicate
from scoperouter.broker.tables import (
    IN_PROGRESS,
    Binding,
    Instance,
    Operation,
    iso,
    new_operation_id,
    utcnow,
)
from scoperouter.broker.worker import Runner, Worker, owner_id

log = logging.getLogger("scoperouter.broker.api")

# OSB recommends ids of RFC 3986 unreserved characters; the broker requires them, since ids
# become keystone tags and names (`osb-instance-<id>`), which refuse "/" and ",".
ID_PATTERN = re.compile(r"^[A-Za-z0-9._~-]{1,200}$")
MAX_ID_HINT = "1-200 characters from A-Z a-z 0-9 . _ ~ -"

T = TypeVar("T")
# A reply's body: a response model of models.py, or a JSON object (the polling route's
# TypedDict). Covariant: a Reply[AsyncResponse] is a Reply[ReplyBody] for the transport.
ReplyBody = BaseModel | Mapping[str, Any]
B = TypeVar("B", bound=ReplyBody, covariant=True)


# -------------------------------------------------------------------------------- errors


class OSBError(Exception):
    """An answer other than success, rendered as OSB error JSON."""

    def __init__(
        self,
        status: int,
        description: str,
        error: str | None = None,
        *,
        instance_usable: bool | None = None,
        update_repeatable: bool | None = None,
    ) -> None:
        super().__init__(description)
        self.status = status
        self.body = models.ErrorBody(
            error=error,
            description=description,
            instance_usable=instance_usable,
            update_repeatable=update_repeatable,
        ).body()


def bad_request(description: str) -> OSBError:
    return OSBError(400, description, "BadRequest")


def concurrency(description: str) -> OSBError:
    return OSBError(422, description, "ConcurrencyError")


def async_required(what: str) -> OSBError:
    return OSBError(
        422,
        f"{what} is asynchronous: the request needs accepts_incomplete=true",
        "AsyncRequired",
    )


# ------------------------------------------------------------------------------- replies


@dataclass(frozen=True, slots=True)
class Reply(Generic[B]):
    """An endpoint's successful answer: the HTTP status and the body (a response model of
    models.py; the polling route's TypedDict). `retry_after`: seconds, for the header."""

    status: int
    body: B
    retry_after: int | None = None


def accepted(operation: str | None) -> Reply[models.AsyncResponse]:
    """202 with the operation the platform polls."""
    return Reply(202, models.AsyncResponse(operation=operation))


EMPTY = models.EmptyResponse()


# ------------------------------------------------------------------------- request parts


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What every mutating request records with its operation: the decoded
    ``X-Broker-API-Originating-Identity`` (``{"platform", "value"}``) and the request identity."""

    originating: dict[str, Any] | None
    request_id: str | None


def check_id(what: str, value: str) -> None:
    if not ID_PATTERN.match(value):
        raise bad_request(f"{what}: expected {MAX_ID_HINT}")


TENANT_HINT = " (the tenant: the instance goes in the project of its platform space)"


def no_tenant(exc: TenancyError) -> OSBError:
    """400 for a request whose context names no tenant (identity.space_of), naming the key."""
    return bad_request(f"{exc.field}: {exc.message}{TENANT_HINT}")


def invalid(exc: InvalidParameters) -> OSBError:
    """400 naming the field and the rule; both are cut short, since a service's message may
    quote what the request named (a cloud, another instance's id)."""
    return bad_request(f"{excerpt(exc.field, 128)}: {excerpt(exc.message, 300)}")


def validate(ref: PlanRef, which: str, kind: OperationKind, parameters: Mapping[str, Any]) -> None:
    """The plan's JSON schema and the service's own checks: 400 naming the field."""
    try:
        ref.validate(which, kind, parameters)
    except InvalidParameters as exc:
        raise invalid(exc) from None


def check_references(
    ep: Endpoints,
    session: Session,
    ref: PlanRef,
    kind: str,
    parameters: Mapping[str, Any],
    instance: Instance | None,
) -> None:
    """The service's checks of what the parameters name among the broker's instances (and of
    `instance` as it is): 400 naming the field, before anything is written."""
    from scoperouter.broker.tables import PROVISIONED
    from scoperouter.broker.worker import instance_view

    def lookup(instance_id: str) -> InstanceView | None:
        row = ep.store.instance(session, instance_id)
        return instance_view(row) if row is not None and row.state == PROVISIONED else None

    try:
        ref.service.check_references(
            kind,  # type: ignore[arg-type]
            ref.plan,
            parameters,
            instance=instance_view(instance) if instance is not None else None,
            lookup=lookup,
        )
    except InvalidParameters as exc:
        raise invalid(exc) from None


def maintenance_conflict(ref: PlanRef, given: models.MaintenanceInfo | None) -> None:
    if given is None:
        return
    offered = (ref.plan.maintenance_info or {}).get("version")
    if offered != given.version:
        raise OSBError(
            422,
            f"maintenance_info.version {excerpt(given.version)!r} does not match the catalog's "
            f"{offered!r} for plan {ref.plan.name}: fetch the catalog again",
            "MaintenanceInfoConflict",
        )


def required_query(service_id: str | None, plan_id: str | None) -> tuple[str, str]:
    """The service_id and plan_id query parameters a DELETE must carry (OSB), or 400."""
    if not service_id:
        raise bad_request("service_id: query parameter required")
    if not plan_id:
        raise bad_request("plan_id: query parameter required")
    return service_id, plan_id


def instance_metadata(instance: Instance) -> models.InstanceMetadata:
    """The instance's cloud and OpenStack ids (GET, and a provision's repeat)."""
    attributes: dict[str, Any] = {"cloud": instance.cloud, **(instance.resources or {})}
    labels = {"cloud": instance.cloud} if instance.cloud else None
    return models.InstanceMetadata(labels=labels, attributes=attributes)


# ---------------------------------------------------------------------------- endpoints


class Endpoints:
    """One broker as the endpoints see it (the worker to wake when an operation is made)."""

    def __init__(self, broker: Broker, runner: Runner, worker: Worker | None) -> None:
        self.broker = broker
        self.store = broker.store
        self.runner = runner
        self.worker = worker
        self.owner = owner_id("api")

    def wake(self) -> None:
        if self.worker is not None:
            self.worker.notify()

    def plan(self, service_id: str, plan_id: str) -> PlanRef:
        if service_id not in self.broker.offerings:
            raise bad_request(f"service_id: no service {excerpt(service_id)!r} in the catalog")
        ref = self.broker.plan(service_id, plan_id)
        if ref is None:
            raise bad_request(
                f"plan_id: no plan {excerpt(plan_id)!r} in service {excerpt(service_id)!r}"
            )
        return ref

    def new_op(
        self,
        kind: str,
        instance_id: str,
        ref: PlanRef,
        facts: RequestFacts,
        *,
        binding_id: str | None = None,
        request: dict[str, Any] | None = None,
        digest: str = "",
        accepts_incomplete: bool = True,
        lease_owner: str | None = None,
    ) -> Operation:
        now = utcnow()
        lease = self.runner.lease
        return Operation(
            id=new_operation_id(kind),
            kind=kind,
            instance_id=instance_id,
            binding_id=binding_id,
            state=IN_PROGRESS,
            description=f"{kind} requested",
            progress={},
            request=request or {},
            request_hash=digest,
            accepts_incomplete=accepts_incomplete,
            cancel_requested=False,
            not_before=now,
            lease_owner=lease_owner,
            lease_expires_at=now + lease if lease_owner else None,
            deadline_at=now + timedelta(seconds=ref.config.deadline(kind)),
            attempts=0,
            originating_identity=facts.originating,
            request_identity=facts.request_id,
            created_at=now,
            updated_at=now,
        )

    @staticmethod
    def retrying(action: Callable[[], T]) -> T:
        """Run a write; a duplicate-key race with a concurrent identical request is answered
        by running it again (it then sees the winner's rows)."""
        try:
            return action()
        except IntegrityError as exc:
            if not is_duplicate(exc):
                raise
            return action()

    def active(self, session: Session, instance: Instance) -> Operation | None:
        """The operation that may change `instance` now (None: it is free)."""
        if not instance.active_operation_id:
            return None
        return self.store.operation(session, instance.active_operation_id)

    def take_over(
        self, session: Session, instance: Instance, active: Operation | None, op: Operation
    ) -> None:
        """Make the DELETE's `op` the instance's active operation: when `active` (a provision
        or bind) still runs, ask it to stop and replace it (orphan mitigation: `op` removes
        what it built); else claim the free instance. 422 when a concurrent request won."""
        if active is not None:
            self.store.request_cancel(session, active.id)
            won = self.store.replace_active(session, instance, active.id, op.id)
        else:
            won = self.store.claim_instance(session, instance, op.id)
        if not won:
            raise concurrency(f"instance {excerpt(instance.id)} has an operation in progress")

    def binding_body(self, binding: Binding, *, credentials: bool) -> models.BindingResponse:
        meta = None
        if binding.expires_at or binding.renew_before:
            meta = models.BindingMetadata(
                expires_at=iso(binding.expires_at), renew_before=iso(binding.renew_before)
            )
        return models.BindingResponse(
            metadata=meta,
            credentials=self.broker.secrets.decrypt(binding.credentials)
            if credentials and binding.credentials
            else None,
            endpoints=[models.Endpoint(**e) for e in binding.endpoints]
            if binding.endpoints
            else None,
            parameters=dict(binding.parameters or {}) or None,
        )

    def run_inline(self, operation_id: str, seconds: float, what: str) -> Done | str:
        """Run a synchronous bind/unbind here under this process's lease: its Done, or a
        description of why it did not succeed (Failed, or still running after `seconds`:
        then it is handed to the workers)."""
        heartbeat = self.runner.heartbeat
        heartbeat.start()
        end = time.monotonic() + seconds
        while True:
            outcome = self.runner.run_pass(operation_id, self.owner, release=False)
            if isinstance(outcome, Done):
                return outcome
            if isinstance(outcome, Failed):
                return f"{what} failed: {outcome.description}"
            if outcome is None:
                return f"{what} was taken over by another worker; poll last_operation"
            if time.monotonic() + outcome.retry_after > end:
                self.store.release(
                    operation_id, self.owner, not_before=utcnow(), description=outcome.description
                )
                self.wake()
                return (
                    f"{what} did not finish within {seconds:.0f}s (it goes on in the background: "
                    f"{outcome.description}); retry with accepts_incomplete=true or delete it"
                )
            time.sleep(max(outcome.retry_after, 0.05))
