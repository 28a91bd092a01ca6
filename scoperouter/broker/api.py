"""The OSB 2.17 HTTP transport (FastAPI): the app, basic auth, the version header, the request
identity, the routes and the one mapping from errors to OSB error JSON (docs/broker.md).

The spec's rules for each endpoint live in ``scoperouter/broker/osb/`` (one module per
endpoint, each returning a typed :class:`~scoperouter.broker.osb.common.Reply`); this module
only turns HTTP into their arguments and their replies and errors into HTTP.

The API never calls a cloud: the catalog and ``last_operation`` read configuration and the
database only. The one exception is a *synchronous* bind or unbind (a request without
``accepts_incomplete=true``), which this process runs inline under the operation's lease for up
to the service's ``synchronous_seconds``.

Cross-cutting concerns live in one ASGI middleware (cheap enough for 1,000 polls/s): basic auth
(401), ``X-Broker-API-Version`` (412), the body limit (413), ``X-Broker-API-Request-Identity``
echoed on every response and put on every log line of the request, one access-log line per
request. The two routes platforms poll (the catalog, ``last_operation``) are answered by the
middleware itself.

Bodies: nothing reads a request's body before its credentials and version are checked (uvicorn
holds at most 64 KiB of it meanwhile); a declared ``Content-Length`` over ``max_body_bytes`` is
413 at once, and a chunked body is counted as it is read and refused at the first byte over.
A request answered without its body read whole (a refusal, a poll that carried a body) is
answered with ``Connection: close``, so the broker does not go on reading what it will not use.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Annotated, Any
from urllib.parse import unquote, unquote_plus

import sqlalchemy.exc
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from scoperouter.broker import logs, models
from scoperouter.broker.config import DEFAULT_MAX_BODY_BYTES, parse_api_version
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb import (
    bind,
    binding,
    catalog,
    deprovision,
    instance,
    last_operation,
    provision,
    unbind,
    update,
)
from scoperouter.broker.osb.common import (
    Endpoints,
    OSBError,
    Reply,
    RequestFacts,
    bad_request,
)
from scoperouter.broker.runtime import Broker
from scoperouter.broker.worker import Runner, Worker

# the ASGI callables' parameters
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

log = logging.getLogger("scoperouter.broker.api")
access_log = logging.getLogger("scoperouter.broker.access")

VERSION_HEADER = "x-broker-api-version"
ORIGINATING_HEADER = "x-broker-api-originating-identity"
REQUEST_ID_HEADER = "x-broker-api-request-identity"


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
PATH_SHOWN = 256  # characters of a request's path on its access-log line


class _BodyTooLarge(Exception):
    """Raised into the app by the counting `receive`: the body went over the limit."""


def _shown_path(path: str) -> str:
    return path if len(path) <= PATH_SHOWN and path.isprintable() else excerpt(path, PATH_SHOWN)


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
        max_body: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.app = app
        self._poll = poll
        self._health = health
        self._max_body = max_body
        self._too_large = Answer.of(
            413,
            models.ErrorBody(
                error="ContentTooLarge",
                description=f"the request body is larger than {max_body} bytes (the broker's "
                "max_body_bytes); OSB request bodies are small: send less",
            ).body(),
        )
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
        declared = _content_length(headers)
        # whether the body was read whole (true at once without a body); a request answered
        # before that gets `Connection: close`: uvicorn would otherwise read (and drop) the rest
        body_done = declared == 0 and b"transfer-encoding" not in headers
        received = 0
        over = False  # the body went over the limit: whatever the app answers becomes 413
        answered = False  # the 413 of an over-long body was sent

        async def send_with_identity(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
                extra = []
                if request_id:
                    extra.append((b"x-broker-api-request-identity", request_id.encode("latin-1")))
                if not body_done:
                    extra.append((b"connection", b"close"))
                if extra:
                    message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        async def counted() -> MutableMapping[str, Any]:
            nonlocal received, body_done, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max_body:
                    over = True
                    raise _BodyTooLarge
                if not message.get("more_body", False):
                    body_done = True
            return message

        async def too_large(what: str) -> None:
            nonlocal answered
            answered = True
            log.warning(
                "%s %s: %s, over the limit of %d bytes (max_body_bytes): 413",
                scope["method"],
                _shown_path(scope["path"]),
                what,
                self._max_body,
            )
            await self._too_large(scope, receive, send_with_identity)

        async def app_send(message: MutableMapping[str, Any]) -> None:
            if over:  # the app's own answer to the cut body (FastAPI: a 400) is not sent
                if not answered:
                    await too_large(f"a body of more than {self._max_body} bytes")
                return
            await send_with_identity(message)

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
                elif declared is not None and declared > self._max_body:
                    await too_large(f"a declared body of {declared} bytes")
                else:
                    try:
                        await self.app(scope, counted, app_send)
                    except _BodyTooLarge:
                        if not answered:
                            await too_large(f"a body of more than {self._max_body} bytes")
            finally:
                if access_log.isEnabledFor(logging.INFO):
                    access_log.info(
                        "%s %s %s %.1fms",
                        scope["method"],
                        _shown_path(scope["path"]),
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
            text = excerpt(version.decode("latin-1"), 40)
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


def _content_length(headers: Mapping[bytes, bytes]) -> int | None:
    """The declared body length; None when there is none (a chunked body, or no body: then
    0 unless ``Transfer-Encoding`` is set). uvicorn refuses a malformed one before the app."""
    value = headers.get(b"content-length")
    if value is None:
        return None if b"transfer-encoding" in headers else 0
    try:
        return int(value)
    except ValueError:
        return None


# ------------------------------------------------------------------------ request parts


def request_facts(request: Request) -> RequestFacts:
    """The originating identity (``<platform> <base64 JSON object>``, else 400) and the
    request identity of a mutating request."""
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


def _query_value(query: bytes, name: bytes) -> str | None:
    """The first non-empty value of `name` in a query string, as parse_qs would decode it
    (percent-decoded UTF-8, + for space); the polling path's cheaper spelling of it."""
    for part in query.split(b"&"):
        key, _, value = part.partition(b"=")
        if key == name and value:
            return unquote_plus(value.decode("latin-1"))
    return None


def _body(reply: Reply[Any]) -> dict[str, Any]:
    body = reply.body
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_none=True)
    return dict(body)


def respond(reply: Reply[Any]) -> Response:
    """An endpoint's reply as a Starlette response."""
    headers = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else None
    return JSONResponse(_body(reply), status_code=reply.status, headers=headers)


def answer(reply: Reply[Any]) -> Answer:
    """An endpoint's reply on the polling path (no Starlette response)."""
    if reply.retry_after is not None:
        return Answer.of(reply.status, _body(reply), (b"retry-after", b"%d" % reply.retry_after))
    return Answer.of(reply.status, _body(reply))


GONE_ANSWER = Answer(410, b"{}")


class Polling:
    """The polling routes (GET, after the middleware's auth and version checks): the catalog,
    rendered once, and last_operation of instances and bindings."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self.catalog_answer = Answer.of(200, catalog.catalog(endpoints.broker).body())

    def __call__(self, path: str, query: bytes) -> Answer | None:
        """The answer for `path`; None for any other path."""
        if path == "/v2/catalog":
            return self.catalog_answer
        match = POLL_PATH.match(path)
        if match is None:
            return None
        operation = _query_value(query, b"operation") if query else None
        instance_id, binding_id = unquote(match.group(1)), match.group(2)
        try:
            reply = last_operation.last_operation(
                self.endpoints,
                instance_id,
                operation,
                unquote(binding_id) if binding_id else None,
            )
        except OSBError as exc:
            return Answer.of(exc.status, exc.body)
        except sqlalchemy.exc.OperationalError as exc:
            return database_unavailable("GET", path, exc)
        except Exception as exc:  # never uvicorn's text/plain 500 on this path
            log.error("internal error on GET %s", path, exc_info=exc)
            return Answer.of(500, INTERNAL_ERROR)
        return GONE_ANSWER if reply is last_operation.GONE else answer(reply)


INTERNAL_ERROR = {"description": "internal error of the broker (logged with the request identity)"}
DATABASE_RETRY_AFTER = 5  # seconds: a database restart or failover


def database_unavailable(method: str, path: str, exc: BaseException) -> Answer:
    """503 with Retry-After when the database refused (down, restarting, failing over): an
    error the platform retries, logged as one line (no traceback: nothing in the broker broke).
    Found by bench.chaos: the polling path answered uvicorn's text/plain 500 then, and every
    other route a 500 with a traceback in the log."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    log.warning(
        "%s %s: the database is unavailable (503): %s",
        method,
        path,
        lines[0] if lines else type(orig).__name__,
    )
    return Answer.of(
        503,
        {"description": "the broker's database is unavailable; try again shortly"},
        (b"retry-after", b"%d" % DATABASE_RETRY_AFTER),
    )


# ----------------------------------------------------------------------------- the app


def create_app(broker: Broker, *, worker: Worker | None = None, password: str) -> BrokerMiddleware:
    """The ASGI app of the broker. `worker` (if any) is woken when an operation is created."""
    runner = worker.runner if worker is not None else Runner(broker)
    ep = Endpoints(broker, runner, worker)
    polling = Polling(ep)
    app = FastAPI(
        title="scoperouter Open Service Broker",
        version="2.17",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.endpoints = ep

    @app.exception_handler(OSBError)
    async def _osb_error(_request: Request, exc: OSBError) -> Response:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse(_validation_body(exc.errors()), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse({"description": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(sqlalchemy.exc.OperationalError)
    async def _database(request: Request, exc: Exception) -> Response:
        unavailable = database_unavailable(request.method, request.url.path, exc)
        return Response(
            unavailable.body,
            status_code=unavailable.status,
            media_type="application/json",
            headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(INTERNAL_ERROR, status_code=500)

    base = "/v2/service_instances/{instance_id}"

    # GET /v2/catalog and the last_operation routes are answered by the middleware (poll)
    @app.put(base)
    def put_instance(
        instance_id: str,
        body: models.ProvisionRequest,
        facts: Facts,
        accepts_incomplete: bool = False,
    ) -> Response:
        return respond(provision.provision(ep, instance_id, body, accepts_incomplete, facts))

    @app.patch(base)
    def patch_instance(
        instance_id: str,
        body: models.UpdateRequest,
        facts: Facts,
        accepts_incomplete: bool = False,
    ) -> Response:
        return respond(update.update(ep, instance_id, body, accepts_incomplete, facts))

    @app.delete(base)
    def delete_instance(
        instance_id: str,
        facts: Facts,
        service_id: str | None = None,
        plan_id: str | None = None,
        accepts_incomplete: bool = False,
    ) -> Response:
        return respond(
            deprovision.deprovision(ep, instance_id, service_id, plan_id, accepts_incomplete, facts)
        )

    @app.get(base)
    def get_instance_route(instance_id: str) -> Response:
        return respond(instance.get_instance(ep, instance_id))

    binding_path = base + "/service_bindings/{binding_id}"

    @app.put(binding_path)
    def put_binding(
        instance_id: str,
        binding_id: str,
        body: models.BindRequest,
        facts: Facts,
        accepts_incomplete: bool = False,
    ) -> Response:
        return respond(bind.bind(ep, instance_id, binding_id, body, accepts_incomplete, facts))

    @app.delete(binding_path)
    def delete_binding(
        instance_id: str,
        binding_id: str,
        facts: Facts,
        service_id: str | None = None,
        plan_id: str | None = None,
        accepts_incomplete: bool = False,
    ) -> Response:
        return respond(
            unbind.unbind(
                ep, instance_id, binding_id, service_id, plan_id, accepts_incomplete, facts
            )
        )

    @app.get(binding_path)
    def get_binding_route(instance_id: str, binding_id: str) -> Response:
        return respond(binding.get_binding(ep, instance_id, binding_id))

    return BrokerMiddleware(
        app,
        username=broker.config.auth.username,
        password=password,
        min_version=broker.config.min_api_version,
        poll=polling,
        health=Health(broker.store.ping),
        max_body=broker.config.max_body_bytes,
    )


def _validation_body(errors: Any) -> dict[str, Any]:
    """FastAPI's validation errors as one OSB 400 naming the first bad field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [excerpt(p) for p in first.get("loc", ())]  # a key may be the client's
    if first.get("type") == "json_invalid":
        text = "request body: not valid JSON"
    elif loc[:1] == ["body"] and len(loc) == 1:
        text = "request body: expected a JSON object"
    else:
        field = ".".join(loc[1:]) if loc and loc[0] in ("body", "query", "path") else ".".join(loc)
        text = f"{excerpt(field, 128)}: {excerpt(first.get('msg', 'invalid'), 200)}"
    return models.ErrorBody(error="BadRequest", description=text).body()
