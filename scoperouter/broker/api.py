"""The OSB 2.17 HTTP transport (FastAPI): the app, basic auth, the version header, the request
identity, the routes and the one mapping from errors to OSB error JSON (docs/broker.md).

The spec's rules for each endpoint live in ``scoperouter/broker/osb/`` (one module per
endpoint, each returning a typed :class:`~scoperouter.broker.osb.common.Reply`); this module
only turns HTTP into their arguments and their replies and errors into HTTP.

The API never calls a cloud: the catalog and ``last_operation`` read configuration and the
database only. The one exception is a *synchronous* bind or unbind (a request without
``accepts_incomplete=true``), which this process runs inline under the operation's lease for up
to the service's ``synchronous_seconds``.

Cross-cutting concerns (authentication, the version header, the body limit, the request
identity, the access log, the polled routes) live in one ASGI middleware
(:mod:`scoperouter.broker.middleware`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import unquote, unquote_plus

import sqlalchemy.exc
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from scoperouter.broker import models
from scoperouter.broker.logs import excerpt
from scoperouter.broker.middleware import (
    ORIGINATING_HEADER,
    POLL_PATH,
    REQUEST_ID_HEADER,
    Answer,
    BrokerMiddleware,
    Health,
)
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
    ReplyBody,
    RequestFacts,
    bad_request,
)
from scoperouter.broker.runtime import Broker
from scoperouter.broker.worker import Runner, Worker

# the ASGI callables' parameters
log = logging.getLogger("scoperouter.broker.api")

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


def _body(reply: Reply[ReplyBody]) -> dict[str, Any]:
    body = reply.body
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_none=True)
    return dict(body)


def respond(reply: Reply[ReplyBody]) -> Response:
    """An endpoint's reply as a Starlette response."""
    headers = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else None
    return JSONResponse(_body(reply), status_code=reply.status, headers=headers)


def answer(reply: Reply[ReplyBody]) -> Answer:
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


def _validation_body(errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
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
