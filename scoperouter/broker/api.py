"""The OSB 2.17 HTTP API (FastAPI): validate, write state and operation in ONE transaction,
answer (docs/broker.md).

Every mutating handler decides from what is in the database and either answers from it (an
identical repeat: the same operation; a conflict: 409; a busy instance: 422) without writing
anything, or writes its rows and commits *before* answering. Any 4xx is raised inside the
transaction, which rolls it back: the database is exactly as it was (the tests compare table
snapshots). Concurrent identical requests race on the primary key or on the guarded claim of
the instance's active operation; the loser re-reads and answers as a repeat or with 422.

The API never calls a cloud: the catalog and ``last_operation`` read configuration and the
database only. The one exception is a *synchronous* bind or unbind (a request without
``accepts_incomplete=true``), which this process runs inline under the operation's lease for up
to the service's ``synchronous_seconds``.

Cross-cutting concerns live in one ASGI middleware (cheap enough for 1,000 polls/s): basic auth
(401), ``X-Broker-API-Version`` (412), ``X-Broker-API-Request-Identity`` echoed on every
response and put on every log line of the request, one access-log line per request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import Annotated, Any
from urllib.parse import unquote, unquote_plus

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from scoperouter.broker import logs, models
from scoperouter.broker.config import parse_api_version
from scoperouter.broker.runtime import Broker, PlanRef
from scoperouter.broker.services.base import Done, Failed, InvalidParameters
from scoperouter.broker.store import (
    BINDING,
    BOUND,
    DEPROVISIONING,
    FAILED,
    GONE,
    IN_PROGRESS,
    PROVISIONED,
    PROVISIONING,
    SUCCEEDED,
    UNBINDING,
    UPDATING,
    Binding,
    Instance,
    Operation,
    is_duplicate,
    iso,
    new_operation_id,
    request_hash,
    utcnow,
)
from scoperouter.broker.worker import Runner, Worker, owner_id

# the ASGI callables' parameters
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

log = logging.getLogger("scoperouter.broker.api")
access_log = logging.getLogger("scoperouter.broker.access")

VERSION_HEADER = "x-broker-api-version"
ORIGINATING_HEADER = "x-broker-api-originating-identity"
REQUEST_ID_HEADER = "x-broker-api-request-identity"
# OSB recommends ids of RFC 3986 unreserved characters; the broker requires them, since ids
# become keystone tags and names (`osb-instance-<id>`), which refuse "/" and ",".
ID_PATTERN = re.compile(r"^[A-Za-z0-9._~-]{1,200}$")
MAX_ID_HINT = "1-200 characters from A-Z a-z 0-9 . _ ~ -"


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


def _json(status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Any:
    return JSONResponse(dict(body), status_code=status, headers=dict(headers or {}))


class Answer:
    """A whole JSON answer sent straight on the ASGI channel: what the polling routes return.
    Starlette's Response builds and checks its headers on every call, which costs more than
    the indexed query behind a `last_operation`; this is two messages with prebuilt headers."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
        self.status = status
        self.body = body
        self.headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            *extra,
        ]

    @classmethod
    def of(cls, status: int, body: Mapping[str, Any], *extra: tuple[bytes, bytes]) -> Answer:
        return cls(status, json.dumps(body, separators=(",", ":")).encode(), *extra)

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


# ---------------------------------------------------------------------------- middleware


HEALTH_PATH = "/healthz"


class Health:
    """``GET /healthz`` for probes (Kubernetes, load balancers): no authentication, no version
    header, no data in the answer; 200 while the database answers a trivial query within
    `timeout` seconds, else 503 (the cause is logged). A replica whose database is gone stops
    getting traffic, while the catalog alone (config only) would still look fine.

    The query blocks, so it runs in a thread, one at a time: probes that arrive while one runs
    share its result, and a database that hangs ties up one thread, not one per probe."""

    OK = b'{"status":"ok"}'
    DOWN = b'{"status":"unavailable"}'

    def __init__(self, ping: Callable[[], None], timeout: float = 5.0) -> None:
        self._ping = ping
        self._timeout = timeout
        self._running: asyncio.Future[bool] | None = None

    def _check(self) -> bool:
        try:
            self._ping()
        except Exception as exc:
            log.warning("health: the database does not answer: %s", logs.short_error(exc))
            return False
        return True

    async def __call__(self) -> Answer:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(asyncio.to_thread(self._check))
        try:
            ok = await asyncio.wait_for(asyncio.shield(self._running), self._timeout)
        except TimeoutError:
            log.warning("health: the database did not answer in %.0f s", self._timeout)
            ok = False
        return Answer(200, self.OK) if ok else Answer(503, self.DOWN)


POLL_PATH = re.compile(
    r"^/v2/service_instances/([^/]+)(?:/service_bindings/([^/]+))?/last_operation$"
)


class BrokerMiddleware:
    """Auth, version and request identity for every request (pure ASGI: no per-request task),
    and the two routes platforms poll (`/v2/catalog`, `last_operation`) answered right here:
    they are most of a broker's traffic, and FastAPI's routing and validation would cost more
    than their one dictionary lookup or indexed query (bench/broker.py)."""

    def __init__(
        self,
        app: Any,
        *,
        username: str,
        password: str,
        min_version: str,
        poll: Callable[[str, bytes], Answer | None] | None = None,
        health: Health | None = None,
    ) -> None:
        self.app = app
        self._poll = poll
        self._health = health
        expected = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._auth = f"Basic {expected}".encode()
        self._min = parse_api_version(min_version)
        self._versions_ok: set[bytes] = set()

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        request_id = headers.get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")[:255]
        started = time.perf_counter()
        status_holder = [0]

        async def send_with_identity(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
                if request_id:
                    message["headers"] = [
                        *message.get("headers", []),
                        (b"x-broker-api-request-identity", request_id.encode("latin-1")),
                    ]
            await send(message)

        with logs.identity(request_id or None):
            try:
                get = scope["method"] == "GET"
                if get and self._health is not None and scope["path"] == HEALTH_PATH:
                    answer: Answer | None = await self._health()  # open: probes carry nothing
                else:
                    answer = self._refuse(headers)
                    if answer is None and self._poll is not None and get:
                        answer = self._poll(scope["path"], scope.get("query_string", b""))
                if answer is not None:
                    await answer(scope, receive, send_with_identity)
                else:
                    await self.app(scope, receive, send_with_identity)
            finally:
                if access_log.isEnabledFor(logging.INFO):
                    access_log.info(
                        "%s %s %s %.1fms",
                        scope["method"],
                        scope["path"],
                        status_holder[0],
                        (time.perf_counter() - started) * 1000,
                    )

    def _refuse(self, headers: Mapping[bytes, bytes]) -> Answer | None:
        given = headers.get(b"authorization", b"")
        if not hmac.compare_digest(given, self._auth):
            return Answer.of(
                401,
                {"description": "authentication required (HTTP basic auth)"},
                (b"www-authenticate", b'Basic realm="scoperouter broker"'),
            )
        version = headers.get(VERSION_HEADER.encode())
        if version is not None and version in self._versions_ok:
            return None
        minimum = f"{self._min[0]}.{self._min[1]}"
        if version is None:
            return Answer.of(
                412, {"description": f"X-Broker-API-Version is required (2.x, at least {minimum})"}
            )
        try:
            major, minor = parse_api_version(version.decode("latin-1"))
        except ValueError:
            major, minor = (0, 0)
        if major != 2 or (major, minor) < self._min:
            text = version.decode("latin-1")[:40]
            return Answer.of(
                412,
                {
                    "description": f"X-Broker-API-Version {text!r} is not supported: "
                    f"use 2.x, at least {minimum} (2.17 is the newest this broker knows)"
                },
            )
        if len(self._versions_ok) < 16:  # the few spellings platforms send, parsed once
            self._versions_ok.add(version)
        return None


# ------------------------------------------------------------------------ request parts


class RequestFacts:
    """What every mutating request records with its operation."""

    def __init__(self, originating: dict[str, Any] | None, request_id: str | None) -> None:
        self.originating = originating
        self.request_id = request_id


def request_facts(request: Request) -> RequestFacts:
    header = request.headers.get(ORIGINATING_HEADER)
    originating: dict[str, Any] | None = None
    if header is not None:
        platform, _, value = header.strip().partition(" ")
        if not platform or not value:
            raise bad_request(
                "X-Broker-API-Originating-Identity: expected '<platform> <base64 JSON object>'"
            )
        try:
            decoded = json.loads(base64.b64decode(value.strip(), validate=True))
        except (binascii.Error, ValueError):
            raise bad_request(
                "X-Broker-API-Originating-Identity: the value is not base64 of a JSON object"
            ) from None
        if not isinstance(decoded, dict):
            raise bad_request("X-Broker-API-Originating-Identity: the value is not a JSON object")
        originating = {"platform": platform, "value": decoded}
    request_id = request.headers.get(REQUEST_ID_HEADER) or None
    return RequestFacts(originating, request_id[:255] if request_id else None)


Facts = Annotated[RequestFacts, Depends(request_facts)]


def check_id(what: str, value: str) -> None:
    if not ID_PATTERN.match(value):
        raise bad_request(f"{what}: expected {MAX_ID_HINT}")


def _validate(ref: PlanRef, which: str, kind: str, parameters: Mapping[str, Any]) -> None:
    try:
        ref.validate(which, kind, parameters)
    except InvalidParameters as exc:
        raise bad_request(f"{exc.field}: {exc.message}") from None


def _maintenance_conflict(ref: PlanRef, given: models.MaintenanceInfo | None) -> None:
    if given is None:
        return
    offered = (ref.plan.maintenance_info or {}).get("version")
    if offered != given.version:
        raise OSBError(
            422,
            f"maintenance_info.version {given.version!r} does not match the catalog's "
            f"{offered!r} for plan {ref.plan.name}: fetch the catalog again",
            "MaintenanceInfoConflict",
        )


def _query_value(query: bytes, name: bytes) -> str | None:
    """The first non-empty value of `name` in a query string, as parse_qs would decode it
    (percent-decoded UTF-8, + for space); the polling path's cheaper spelling of it."""
    for part in query.split(b"&"):
        key, _, value = part.partition(b"=")
        if key == name and value:
            return unquote_plus(value.decode("latin-1"))
    return None


def _required_query(service_id: str | None, plan_id: str | None) -> tuple[str, str]:
    """The service_id and plan_id query parameters a DELETE must carry (OSB), or 400."""
    if not service_id:
        raise bad_request("service_id: query parameter required")
    if not plan_id:
        raise bad_request("plan_id: query parameter required")
    return service_id, plan_id


def _metadata(instance: Instance) -> models.InstanceMetadata:
    attributes: dict[str, Any] = {"cloud": instance.cloud, **(instance.resources or {})}
    labels = {"cloud": instance.cloud} if instance.cloud else None
    return models.InstanceMetadata(labels=labels, attributes=attributes)


def _retry_after(not_before: datetime) -> bytes:
    """Seconds until the operation's next pass (1-60): when polling again is worth it."""
    wait = (not_before - utcnow()).total_seconds()
    return b"%d" % max(1, min(60, math.ceil(wait)))


GONE_ANSWER = Answer(410, b"{}")


# ----------------------------------------------------------------------------- the app


class BrokerAPI:
    """The route handlers, bound to one broker (and the worker to wake)."""

    def __init__(self, broker: Broker, runner: Runner, worker: Worker | None) -> None:
        self.broker = broker
        self.store = broker.store
        self.runner = runner
        self.worker = worker
        self.owner = owner_id("api")
        catalog = models.Catalog(
            services=[models.service_model(entry) for entry in broker.offerings.values()]
        )
        self.catalog_answer = Answer.of(200, catalog.body())

    def _wake(self) -> None:
        if self.worker is not None:
            self.worker.notify()

    def _plan(self, service_id: str, plan_id: str) -> PlanRef:
        if service_id not in self.broker.offerings:
            raise bad_request(f"service_id: no service {service_id!r} in the catalog")
        ref = self.broker.plan(service_id, plan_id)
        if ref is None:
            raise bad_request(f"plan_id: no plan {plan_id!r} in service {service_id!r}")
        return ref

    def _new_op(
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

    def _retrying(self, action: Callable[[], Any]) -> Any:
        """Run a write; a duplicate-key race with a concurrent identical request is answered
        by running it again (it then sees the winner's rows)."""
        try:
            return action()
        except IntegrityError as exc:
            if not is_duplicate(exc):
                raise
            return action()

    def _active(self, session: Session, instance: Instance) -> Operation | None:
        """The operation that may change `instance` now (None: it is free)."""
        if not instance.active_operation_id:
            return None
        return self.store.operation(session, instance.active_operation_id)

    def _take_over(
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
            raise concurrency(f"instance {instance.id} has an operation in progress")

    # ------------------------------------------------------------------------- catalog

    def catalog(self) -> Answer:
        return self.catalog_answer

    def poll(self, path: str, query: bytes) -> Answer | None:
        """The polling routes (GET, after auth and version checks): the catalog and
        last_operation of instances and bindings; None for any other path."""
        if path == "/v2/catalog":
            return self.catalog()
        match = POLL_PATH.match(path)
        if match is None:
            return None
        operation = _query_value(query, b"operation") if query else None
        instance_id, binding_id = unquote(match.group(1)), match.group(2)
        try:
            return self.last_operation(
                instance_id, operation, unquote(binding_id) if binding_id else None
            )
        except OSBError as exc:
            return Answer.of(exc.status, exc.body)

    # ----------------------------------------------------------------------- provision

    def provision(
        self,
        instance_id: str,
        body: models.ProvisionRequest,
        accepts_incomplete: bool,
        facts: RequestFacts,
    ) -> Any:
        check_id("instance_id", instance_id)
        ref = self._plan(body.service_id, body.plan_id)
        parameters = dict(body.parameters or {})
        _validate(ref, "instance_create", "provision", parameters)
        _maintenance_conflict(ref, body.maintenance_info)
        context = dict(body.context or {})
        digest = request_hash(
            {
                "service_id": body.service_id,
                "plan_id": body.plan_id,
                "parameters": parameters,
                "context": context,
                "organization_guid": body.organization_guid,
                "space_guid": body.space_guid,
                "maintenance_info": body.maintenance_info.version
                if body.maintenance_info
                else None,
            }
        )

        def write() -> Any:
            with self.store.write() as session:
                existing = self.store.instance(session, instance_id)
                if existing is not None:
                    return self._provision_repeat(session, existing, digest, accepts_incomplete)
                if not accepts_incomplete:
                    raise async_required(f"provisioning {ref.entry.name}")
                op = self._new_op("provision", instance_id, ref, facts, digest=digest)
                instance = Instance(
                    id=instance_id,
                    service_id=body.service_id,
                    plan_id=body.plan_id,
                    service_name=ref.service.name,
                    parameters=parameters,
                    context=context,
                    organization_guid=body.organization_guid,
                    space_guid=body.space_guid,
                    cloud=None,
                    resources={},
                    state=PROVISIONING,
                    maintenance_version=(ref.plan.maintenance_info or {}).get("version"),
                    request_hash=digest,
                    active_operation_id=op.id,
                )
                self.store.add(session, instance)
                self.store.add(session, op)
                log.info(
                    "provision %s of %s/%s: %s", instance_id, ref.entry.name, ref.plan.name, op.id
                )
                return _json(202, models.AsyncResponse(operation=op.id).body())

        response = self._retrying(write)
        self._wake()
        return response

    def _provision_repeat(
        self, session: Session, instance: Instance, digest: str, accepts_incomplete: bool
    ) -> Any:
        if instance.state == GONE:
            raise OSBError(
                409,
                f"instance {instance.id} existed and was deprovisioned: use a new id "
                "(or forget the old one with `scoperouter broker purge`)",
            )
        if instance.request_hash != digest:
            raise OSBError(409, f"instance {instance.id} exists with different attributes")
        if instance.state in (PROVISIONED, UPDATING):
            return _json(200, models.ProvisionResponse(metadata=_metadata(instance)).body())
        if instance.state == DEPROVISIONING:
            raise concurrency(f"instance {instance.id} is being deprovisioned")
        if not accepts_incomplete:
            raise async_required(f"provisioning {instance.id}")
        first = [op for op in self.store.operations(session, instance.id) if op.kind == "provision"]
        return _json(202, models.AsyncResponse(operation=first[0].id if first else None).body())

    # -------------------------------------------------------------------------- update

    def update(
        self,
        instance_id: str,
        body: models.UpdateRequest,
        accepts_incomplete: bool,
        facts: RequestFacts,
    ) -> Any:
        check_id("instance_id", instance_id)
        with self.store.write() as session:
            instance = self.store.instance(session, instance_id)
            if instance is None or instance.state == GONE:
                raise OSBError(404, f"no instance {instance_id}")
            if body.service_id != instance.service_id:
                raise bad_request(f"service_id: instance {instance_id} is not of this service")
            current = self._plan(instance.service_id, instance.plan_id)
            target_plan = body.plan_id or instance.plan_id
            ref = self._plan(instance.service_id, target_plan)
            if target_plan != instance.plan_id and not current.plan_updateable:
                raise OSBError(
                    422,
                    f"plan {current.plan.name} cannot be changed to {ref.plan.name}",
                    update_repeatable=False,
                )
            if body.parameters is not None:
                _validate(ref, "instance_update", "update", body.parameters)
            _maintenance_conflict(ref, body.maintenance_info)
            parameters = (
                {**instance.parameters, **body.parameters}
                if body.parameters is not None
                else dict(instance.parameters)
            )
            maintenance = body.maintenance_info.version if body.maintenance_info else None
            digest = request_hash(
                {
                    "plan_id": target_plan,
                    "parameters": body.parameters,
                    "maintenance_info": maintenance,
                }
            )
            active = self._active(session, instance)
            if active is not None:
                if active.kind == "update" and active.request_hash == digest:
                    if not accepts_incomplete:
                        raise async_required(f"updating {instance_id}")
                    return _json(202, models.AsyncResponse(operation=active.id).body())
                raise concurrency(
                    f"instance {instance_id} has an operation in progress ({active.kind})"
                )
            if instance.state != PROVISIONED:
                raise OSBError(
                    422,
                    f"instance {instance_id} is {instance.state}: it cannot be updated (delete it)",
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
                return _json(200, {})
            if not accepts_incomplete:
                raise async_required(f"updating {ref.entry.name}")
            request: dict[str, Any] = {"plan_id": target_plan, "parameters": parameters}
            if maintenance:
                request["maintenance_version"] = maintenance
            if body.context is not None and ref.entry.allow_context_updates:
                request["context"] = dict(body.context)
            op = self._new_op("update", instance_id, ref, facts, request=request, digest=digest)
            self.store.add(session, op)
            if not self.store.claim_instance(session, instance, op.id):
                raise concurrency(f"instance {instance_id} has an operation in progress")
            instance.state = UPDATING
            response = _json(202, models.AsyncResponse(operation=op.id).body())
        self._wake()
        return response

    # --------------------------------------------------------------------- deprovision

    def deprovision(
        self,
        instance_id: str,
        service_id: str | None,
        plan_id: str | None,
        accepts_incomplete: bool,
        facts: RequestFacts,
    ) -> Any:
        check_id("instance_id", instance_id)
        service_id, plan_id = _required_query(service_id, plan_id)
        with self.store.write() as session:
            instance = self.store.instance(session, instance_id)
            if instance is None or instance.state == GONE:
                return _json(410, {})
            if service_id != instance.service_id:
                raise bad_request(
                    f"service_id: instance {instance_id} is not of service {service_id}"
                )
            ref = self._plan(service_id, plan_id)
            active = self._active(session, instance)
            if active is not None and active.kind == "deprovision":
                if not accepts_incomplete:
                    raise async_required(f"deprovisioning {instance_id}")
                return _json(202, models.AsyncResponse(operation=active.id).body())
            if active is not None and active.kind != "provision":
                raise concurrency(
                    f"instance {instance_id} has an operation in progress ({active.kind})"
                )
            if not accepts_incomplete:
                raise async_required(f"deprovisioning {ref.entry.name}")
            op = self._new_op("deprovision", instance_id, ref, facts)
            self.store.add(session, op)
            self._take_over(session, instance, active, op)
            instance.state = DEPROVISIONING
            log.info("deprovision %s: %s", instance_id, op.id)
            response = _json(202, models.AsyncResponse(operation=op.id).body())
        self._wake()
        return response

    # -------------------------------------------------------------------- last operation

    def last_operation(
        self, instance_id: str, operation: str | None, binding_id: str | None = None
    ) -> Answer:
        """What platforms call most (every few seconds per operation in flight): one indexed
        query, answered without an ORM session, a pydantic model or a Starlette response (the
        body is the OSB ``LastOperation`` object; tests validate it against models.py)."""
        op = self.store.status(instance_id, binding_id, operation)
        if op is None:
            what = f"binding {binding_id} of instance" if binding_id else "instance"
            detail = f" with operation {operation}" if operation else ""
            raise OSBError(404, f"no {what} {instance_id}{detail}")
        if op.kind in ("deprovision", "unbind") and op.state == SUCCEEDED:
            return GONE_ANSWER
        body: dict[str, Any] = {"state": op.state}
        if op.description:
            body["description"] = op.description
        if op.state == FAILED:
            if op.kind == "update":
                body["instance_usable"] = True
                body["update_repeatable"] = True
            elif op.kind == "deprovision":
                body["instance_usable"] = False
        if op.state == IN_PROGRESS:
            return Answer.of(200, body, (b"retry-after", _retry_after(op.not_before)))
        return Answer.of(200, body)

    # --------------------------------------------------------------------- fetch

    def get_instance(self, instance_id: str) -> Any:
        with self.store.read() as session:
            instance = self.store.instance(session, instance_id)
        if instance is None or instance.state in (GONE, PROVISIONING, FAILED):
            raise OSBError(404, f"no instance {instance_id} (or it is still being provisioned)")
        if instance.state == UPDATING:
            raise concurrency(f"instance {instance_id} is being updated")
        body = models.InstanceResponse(
            service_id=instance.service_id,
            plan_id=instance.plan_id,
            parameters=dict(instance.parameters or {}),
            maintenance_info={"version": instance.maintenance_version}
            if instance.maintenance_version
            else None,
            metadata=_metadata(instance),
        )
        return _json(200, body.body())

    def get_binding(self, instance_id: str, binding_id: str) -> Any:
        with self.store.read() as session:
            binding = self.store.binding(session, binding_id)
        if (
            binding is None
            or binding.instance_id != instance_id
            or binding.state not in (BOUND, UNBINDING)
        ):
            raise OSBError(404, f"no binding {binding_id} (or it is still being created)")
        return _json(200, self._binding_body(binding, credentials=binding.asynchronous))

    def _binding_body(self, binding: Binding, *, credentials: bool) -> dict[str, Any]:
        meta = None
        if binding.expires_at or binding.renew_before:
            meta = models.BindingMetadata(
                expires_at=iso(binding.expires_at), renew_before=iso(binding.renew_before)
            )
        body = models.BindingResponse(
            metadata=meta,
            credentials=self.broker.secrets.decrypt(binding.credentials)
            if credentials and binding.credentials
            else None,
            endpoints=[models.Endpoint(**e) for e in binding.endpoints]
            if binding.endpoints
            else None,
            parameters=dict(binding.parameters or {}) or None,
        )
        return body.body()

    # ---------------------------------------------------------------------------- bind

    def bind(
        self,
        instance_id: str,
        binding_id: str,
        body: models.BindRequest,
        accepts_incomplete: bool,
        facts: RequestFacts,
    ) -> Any:
        check_id("instance_id", instance_id)
        check_id("binding_id", binding_id)
        ref = self._plan(body.service_id, body.plan_id)
        if not ref.bindable:
            raise bad_request(f"plan_id: plan {ref.plan.name} is not bindable")
        sync_seconds = ref.config.synchronous_seconds

        def write() -> Any:
            with self.store.write() as session:
                instance = self.store.instance(session, instance_id)
                if instance is None or instance.state == GONE:
                    raise OSBError(404, f"no instance {instance_id}")
                if (body.service_id, body.plan_id) != (instance.service_id, instance.plan_id):
                    raise bad_request(
                        f"plan_id: instance {instance_id} is of plan {instance.plan_id}"
                    )
                parameters = body.parameters
                if body.predecessor_binding_id is not None:
                    parameters = self._predecessor(session, ref, instance_id, body, parameters)
                parameters = dict(parameters or {})
                _validate(ref, "binding_create", "bind", parameters)
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
                existing = self.store.binding(session, binding_id)
                if existing is not None:
                    return self._bind_repeat(session, existing, digest, accepts_incomplete)
                if instance.state not in (PROVISIONED, UPDATING):
                    raise concurrency(f"instance {instance_id} is {instance.state}")
                if not accepts_incomplete and sync_seconds <= 0:
                    raise async_required(f"binding {ref.entry.name}")
                op = self._new_op(
                    "bind",
                    instance_id,
                    ref,
                    facts,
                    binding_id=binding_id,
                    digest=digest,
                    accepts_incomplete=accepts_incomplete,
                    lease_owner=None if accepts_incomplete else self.owner,
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
                self.store.add(session, binding)
                self.store.add(session, op)
                if not self.store.claim_instance(session, instance, op.id):
                    raise concurrency(f"instance {instance_id} has another operation in progress")
                log.info("bind %s to %s: %s", binding_id, instance_id, op.id)
                return op.id

        result = self._retrying(write)
        if not isinstance(result, str):
            return result
        if accepts_incomplete:
            self._wake()
            return _json(202, models.AsyncResponse(operation=result).body())
        outcome = self._run_inline(result, sync_seconds, "bind")
        with self.store.read() as session:
            binding = self.store.binding(session, binding_id)
        assert binding is not None
        if isinstance(outcome, Done):
            return _json(201, self._binding_body(binding, credentials=True))
        raise OSBError(500, outcome)

    def _predecessor(
        self,
        session: Session,
        ref: PlanRef,
        instance_id: str,
        body: models.BindRequest,
        parameters: dict[str, Any] | None,
    ) -> dict[str, Any] | None:
        if not ref.entry.binding_rotatable:
            raise bad_request(f"predecessor_binding_id: plan {ref.plan.name} is not rotatable")
        previous = self.store.binding(session, body.predecessor_binding_id or "")
        if previous is None or previous.instance_id != instance_id or previous.state != BOUND:
            raise bad_request(
                f"predecessor_binding_id: no live binding {body.predecessor_binding_id} "
                f"of instance {instance_id}"
            )
        if previous.expires_at is not None and previous.expires_at <= utcnow():
            raise bad_request(
                f"predecessor_binding_id: binding {previous.id} expired at "
                f"{iso(previous.expires_at)}"
            )
        # the platform need not send the parameters again (OSB "Binding Rotation")
        return parameters if parameters is not None else dict(previous.parameters or {})

    def _bind_repeat(
        self, session: Session, binding: Binding, digest: str, accepts_incomplete: bool
    ) -> Any:
        if binding.request_hash != digest or binding.state == GONE:
            raise OSBError(409, f"binding {binding.id} exists with different attributes")
        if binding.state == BOUND:
            # the same answer as the original: with the credentials
            return _json(200, self._binding_body(binding, credentials=True))
        op = self.store.last_operation(session, binding.instance_id, binding.id)
        if binding.state == BINDING and op is not None and op.kind == "bind":
            if not accepts_incomplete:
                raise concurrency(f"binding {binding.id} is being created")
            return _json(202, models.AsyncResponse(operation=op.id).body())
        if binding.state == UNBINDING:
            raise concurrency(f"binding {binding.id} is being deleted")
        raise OSBError(409, f"binding {binding.id} exists and is {binding.state}: delete it first")

    def _run_inline(self, operation_id: str, seconds: float, what: str) -> Done | str:
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
                self._wake()
                return (
                    f"{what} did not finish within {seconds:.0f}s (it goes on in the background: "
                    f"{outcome.description}); retry with accepts_incomplete=true or delete it"
                )
            time.sleep(max(outcome.retry_after, 0.05))

    # -------------------------------------------------------------------------- unbind

    def unbind(
        self,
        instance_id: str,
        binding_id: str,
        service_id: str | None,
        plan_id: str | None,
        accepts_incomplete: bool,
        facts: RequestFacts,
    ) -> Any:
        check_id("instance_id", instance_id)
        check_id("binding_id", binding_id)
        service_id, plan_id = _required_query(service_id, plan_id)
        with self.store.write() as session:
            binding = self.store.binding(session, binding_id)
            instance = self.store.instance(session, instance_id)
            if (
                binding is None
                or instance is None
                or binding.instance_id != instance_id
                or binding.state == GONE
            ):
                return _json(410, {})
            if service_id != binding.service_id:
                raise bad_request(
                    f"service_id: binding {binding_id} is not of service {service_id}"
                )
            ref = self._plan(service_id, plan_id)
            sync_seconds = ref.config.synchronous_seconds
            active = self._active(session, instance)
            if active is not None and active.binding_id == binding_id and active.kind == "unbind":
                if not accepts_incomplete:
                    raise concurrency(f"binding {binding_id} is being deleted")
                return _json(202, models.AsyncResponse(operation=active.id).body())
            stop_bind = active is not None and active.binding_id == binding_id
            if active is not None and not (stop_bind and accepts_incomplete):
                # a synchronous unbind cannot wait for a bind to stop: the platform retries
                raise concurrency(
                    f"instance {instance_id} has an operation in progress ({active.kind})"
                )
            if not accepts_incomplete and sync_seconds <= 0:
                raise async_required(f"unbinding {ref.entry.name}")
            op = self._new_op(
                "unbind",
                instance_id,
                ref,
                facts,
                binding_id=binding_id,
                accepts_incomplete=accepts_incomplete,
                lease_owner=None if accepts_incomplete else self.owner,
            )
            self.store.add(session, op)
            self._take_over(session, instance, active, op)
            binding.state = UNBINDING
            operation_id = op.id
            log.info("unbind %s of %s: %s", binding_id, instance_id, op.id)
        if accepts_incomplete:
            self._wake()
            return _json(202, models.AsyncResponse(operation=operation_id).body())
        outcome = self._run_inline(operation_id, sync_seconds, "unbind")
        if isinstance(outcome, Done):
            return _json(200, {})
        raise OSBError(500, outcome)


def create_app(broker: Broker, *, worker: Worker | None = None, password: str) -> BrokerMiddleware:
    """The ASGI app of the broker. `worker` (if any) is woken when an operation is created."""
    runner = worker.runner if worker is not None else Runner(broker)
    api = BrokerAPI(broker, runner, worker)
    app = FastAPI(
        title="scoperouter Open Service Broker",
        version="2.17",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.api = api

    @app.exception_handler(OSBError)
    async def _osb_error(_request: Request, exc: OSBError) -> Response:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse(_validation_body(exc.errors()), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse({"description": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            {"description": "internal error of the broker (logged with the request identity)"},
            status_code=500,
        )

    base = "/v2/service_instances/{instance_id}"

    # GET /v2/catalog and the last_operation routes are answered by the middleware (poll)
    @app.put(base)
    def provision(
        instance_id: str,
        body: models.ProvisionRequest,
        facts: Facts,
        accepts_incomplete: bool = False,
    ) -> Response:
        return api.provision(instance_id, body, accepts_incomplete, facts)  # type: ignore[no-any-return]

    @app.patch(base)
    def update(
        instance_id: str,
        body: models.UpdateRequest,
        facts: Facts,
        accepts_incomplete: bool = False,
    ) -> Response:
        return api.update(instance_id, body, accepts_incomplete, facts)  # type: ignore[no-any-return]

    @app.delete(base)
    def deprovision(
        instance_id: str,
        facts: Facts,
        service_id: str | None = None,
        plan_id: str | None = None,
        accepts_incomplete: bool = False,
    ) -> Response:
        return api.deprovision(instance_id, service_id, plan_id, accepts_incomplete, facts)  # type: ignore[no-any-return]

    @app.get(base)
    def get_instance(instance_id: str) -> Response:
        return api.get_instance(instance_id)  # type: ignore[no-any-return]

    binding_path = base + "/service_bindings/{binding_id}"

    @app.put(binding_path)
    def bind(
        instance_id: str,
        binding_id: str,
        body: models.BindRequest,
        facts: Facts,
        accepts_incomplete: bool = False,
    ) -> Response:
        return api.bind(instance_id, binding_id, body, accepts_incomplete, facts)  # type: ignore[no-any-return]

    @app.delete(binding_path)
    def unbind(
        instance_id: str,
        binding_id: str,
        facts: Facts,
        service_id: str | None = None,
        plan_id: str | None = None,
        accepts_incomplete: bool = False,
    ) -> Response:
        return api.unbind(  # type: ignore[no-any-return]
            instance_id, binding_id, service_id, plan_id, accepts_incomplete, facts
        )

    @app.get(binding_path)
    def get_binding(instance_id: str, binding_id: str) -> Response:
        return api.get_binding(instance_id, binding_id)  # type: ignore[no-any-return]

    return BrokerMiddleware(
        app,
        username=broker.config.auth.username,
        password=password,
        min_version=broker.config.min_api_version,
        poll=api.poll,
        health=Health(broker.store.ping),
    )


def _validation_body(errors: Any) -> dict[str, Any]:
    """FastAPI's validation errors as one OSB 400 naming the first bad field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ())]
    if first.get("type") == "json_invalid":
        text = "request body: not valid JSON"
    elif loc[:1] == ["body"] and len(loc) == 1:
        text = "request body: expected a JSON object"
    else:
        field = ".".join(loc[1:]) if loc and loc[0] in ("body", "query", "path") else ".".join(loc)
        text = f"{field}: {first.get('msg', 'invalid')}"
    return models.ErrorBody(error="BadRequest", description=text).body()
