"""The broker's ASGI middleware: authentication, the API version, the request identity and
the bound on request bodies for every request, before FastAPI sees it; the routes platforms
poll (`/v2/catalog`, `last_operation`) and `/healthz` answered right here
(docs/broker.md, "The OSB API")."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from scoperouter.broker import logs, metrics, models
from scoperouter.broker.config import DEFAULT_MAX_BODY_BYTES, parse_api_version
from scoperouter.broker.logs import excerpt

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]  # what FastAPI's app is

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


# A request answered before its body was read (a refusal, a 413) whose declared body left to
# read is at most twice max_body_bytes: that rest is read and dropped, for at most this long, before
# the answer, as the router does. Closing a connection with unread bytes makes the kernel send
# a reset, which can destroy the answer before the client reads it; a larger or chunked body
# is not waited for (answered at once, `Connection: close`).
DRAIN_SECONDS = 2.0


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
        app: ASGIApp,
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

        async def drain() -> None:
            """Read and drop what is left of a small declared body (see DRAIN_SECONDS)."""
            nonlocal body_done, received
            if body_done or declared is None or declared - received > 2 * self._max_body:
                return
            try:
                async with asyncio.timeout(DRAIN_SECONDS):
                    while not body_done:
                        message = await receive()
                        if message["type"] != "http.request":
                            return  # the client left
                        received += len(message.get("body", b""))
                        body_done = not message.get("more_body", False)
            except TimeoutError:
                return

        async def too_large(what: str) -> None:
            nonlocal answered
            answered = True
            await drain()
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
                    await drain()
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
                metrics.api_request(scope["method"], scope["path"], status_holder[0])
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
