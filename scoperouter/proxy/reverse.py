"""The reverse-mode server of one worker: the frontends and the peer link, on the router's own
HTTP/1.1 layer (:mod:`scoperouter.http`), each request handed to the router's pipeline
(:mod:`scoperouter.router.pipeline`).

This module wires the two and does nothing else: it listens (on the supervisor's sockets; an
https frontend tells TLS from plain HTTP by a connection's first byte), keeps the HTTP
server's limits in step with the config, and is the pipeline's :class:`Engine` for each
request: it sends on the worker's pool with the one exchange client
(:func:`scoperouter.http.client.exchange`) and relays the answer, and it sends the parts of
``A & B`` / ``A | B`` the same way (:func:`transmit`). Deadlines are checked by the worker's
sweep (:meth:`ReverseServer.check`), not by a timer per request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from collections.abc import Awaitable, Iterable, Mapping
from typing import Final

from scoperouter.catalog import Catalog, Frontend
from scoperouter.errors import Reject, status_title
from scoperouter.http import client, wire
from scoperouter.http.client import Answer, ExchangeError
from scoperouter.http.pool import Pool, WarmSpec, client_context
from scoperouter.http.request import BodyError, Refusal, Request
from scoperouter.http.server import ClientConnection, ServerState
from scoperouter.http.upstream import OVER_BUDGET, TOO_LARGE, Head, Origin
from scoperouter.router import fanout
from scoperouter.router.combined import BODY_TOO_LARGE, Outgoing, Received, TransmitError
from scoperouter.router.config import RouterConfig
from scoperouter.router.failures import TimedOut
from scoperouter.router.listeners import Listener
from scoperouter.router.pipeline import Incoming, Outcome, Pipeline, Plan
from scoperouter.router.region import REGION_MAX, regioned
from scoperouter.router.state import REQUEST_ID_HEADER, RequestState
from scoperouter.router.targets import split_url
from scoperouter.routing import FRONTEND_HEADER

logger = logging.getLogger("scoperouter")

_REQUEST_ID: Final = REQUEST_ID_HEADER.encode()
_REQUEST_ID_FIELD: Final = b"X-Scope-Request-Id"
_NOT_FORWARDED: Final = wire.HOP_BY_HOP | {_REQUEST_ID, FRONTEND_HEADER.encode()}
# An answer's fields not passed on: the request id is this router's (a peer router's answer
# carries the same id, which would make it a repeated field)
_NOT_RETURNED: Final = wire.HOP_BY_HOP | {_REQUEST_ID}
_TIMED_OUT: Final[dict[str, TimedOut]] = {"connect_timeout": "connect", "timeout": "response"}


class ReverseServer:
    """The reverse-mode listeners of one worker."""

    def __init__(self, config: RouterConfig, pipeline: Pipeline, pool: Pool) -> None:
        self.config = config
        self.pipeline = pipeline
        self.pool = pool
        self.state = ServerState(config.current().settings.limits)
        self.state.on_open = pipeline.metrics.opened
        self.state.on_close = pipeline.metrics.closed
        self.servers: list[asyncio.AbstractServer] = []
        self.acceptors: list[asyncio.Task[None]] = []  # https frontends' accept loops
        self.sniffing: set[asyncio.Task[None]] = set()  # connections not yet told apart
        config.subscribe(self._configure)

    def _configure(self, catalog: Catalog) -> None:
        self.state.limits = catalog.settings.limits

    async def start(
        self, listeners: Iterable[Listener], sockets: Mapping[tuple[str, int], socket.socket]
    ) -> None:
        """Serve `listeners` on the supervisor's `sockets` (bound here when there is none)."""
        loop = asyncio.get_running_loop()
        for listener in listeners:
            frontend = listener.frontend
            assert frontend is not None
            sock = sockets.get((listener.host.lower(), listener.port))
            if sock is None:
                sock = socket.create_server(
                    (listener.host, listener.port), backlog=1024, reuse_port=True
                )
            app = _Site(self, listener)
            context = frontend_context(frontend)
            if context is None:
                factory = functools.partial(ClientConnection, self.state, app)
                self.servers.append(await loop.create_server(factory, sock=sock, backlog=1024))
            else:
                self.acceptors.append(loop.create_task(self._accept(sock, app, context)))

    async def _accept(self, sock: socket.socket, app: _Site, context: ssl.SSLContext) -> None:
        """An https frontend: each connection's first byte says whether the client speaks TLS
        (a handshake record) or plain HTTP, which the pipeline answers with a 400."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                logger.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._sniff(conn, app, context))
            self.sniffing.add(task)
            task.add_done_callback(self.sniffing.discard)

    async def _sniff(self, conn: socket.socket, app: _Site, context: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        readable: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await asyncio.wait_for(readable, self.state.limits.header_timeout)
            first = conn.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            conn.close()
            return
        finally:
            loop.remove_reader(fd)
        if not first:
            conn.close()
            return
        tls = first[0] == 0x16  # a TLS handshake record
        try:
            await loop.connect_accepted_socket(
                lambda: ClientConnection(self.state, app, tls=tls),
                conn,
                ssl=context if tls else None,
                ssl_handshake_timeout=self.state.limits.header_timeout if tls else None,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            logger.info("TLS handshake with a client failed: %s", exc)
            conn.close()

    def check(self, now: float) -> None:
        """The connections' deadlines (head, body, unread answer, idle)."""
        for conn in list(self.state.connections):
            try:
                conn.check(now)
            except Exception:  # one connection must not stop the sweep
                logger.exception("checking a connection's deadlines failed")

    def stop_listening(self) -> None:
        for server in self.servers:
            server.close()
        for task in self.acceptors:
            task.cancel()
        self.servers, self.acceptors = [], []

    def busy(self) -> bool:
        return any(conn.busy or conn.queue for conn in self.state.connections)

    def drain_step(self, late: bool) -> None:
        """Close idle connections (all of them once `late`); busy ones close after their
        answer."""
        for conn in list(self.state.connections):
            conn.draining = True
            if late:
                conn.abort()
            elif not conn.busy and not conn.queue:
                conn.close()


class _Site:
    """The application of one listener (:class:`scoperouter.http.server.Application`)."""

    def __init__(self, server: ReverseServer, listener: Listener) -> None:
        self.server = server
        self.listener = listener

    def handle(self, conn: ClientConnection, request: Request) -> Awaitable[None]:
        incoming = Incoming(
            method=request.method,
            target=request.target.decode("latin-1"),
            authority=request.authority,
            headers=request.headers,
            listener=self.listener,
            tls=conn.tls,
            started=request.started,
            stripped=request.stripped,
        )
        return self.server.pipeline.handle(incoming, _Answering(self.server, conn, request))

    def refused(self, conn: ClientConnection, refusal: Refusal) -> None:
        self.server.pipeline.refused(refusal)


class _Answering:
    """The pipeline's engine for one request (:class:`scoperouter.router.pipeline.Engine`)."""

    def __init__(self, server: ReverseServer, conn: ClientConnection, request: Request) -> None:
        self.server = server
        self.conn = conn
        self.request = request

    def _continue(self) -> None:
        """``Expect: 100-continue``: the body is wanted (the request is routed and admitted)."""
        headers = self.request.headers
        if "expect" in headers and headers["expect"].lower() == "100-continue":
            self.conn.write(wire.CONTINUE)

    async def send(self, plan: Plan) -> Outcome:
        request, conn, pool = self.request, self.conn, self.server.pool
        state = plan.state
        if "expect" in request.headers:
            self._continue()
        try:
            answer = await client.exchange(
                pool,
                _origin(plan.scheme, plan.host, plan.port),
                _request_head(request, plan),
                method=request.method,
                body=request.body if request.has_body else None,
                chunked=request.chunked,
                connect_timeout=plan.connect_timeout,
                response_timeout=plan.response_timeout,
                client=conn,
                informational=self._informational,
            )
        except ExchangeError as exc:
            request.keep_alive = request.keep_alive and request.body.complete
            return Outcome(
                failed=True,
                timed_out=_TIMED_OUT.get(exc.kind),
                reason=exc.reason,
                connected=exc.connected,
            )
        except BodyError as failed:  # (not `exc`: compiled, a name has one type per function)
            state.status, state.message = failed.status, failed.message
            request.keep_alive = False
            conn.write(wire.error_response(failed.status, failed.message, True, self._id(state)))
            return Outcome(status=failed.status, error=failed.message)
        self.server.pipeline.succeeded(plan.decision)
        try:
            body = None
            if plan.decision.catalog_region:  # a token validation another cloud answered
                body = await self._regioned(plan, plan.decision.catalog_region, answer)
            request.keep_alive = await client.relay(
                answer,
                conn,
                method=request.method,
                version=request.version,
                keep=request.keep_alive and not conn.draining,
                extra=[(_REQUEST_ID_FIELD, state.request_id.encode())],
                timeout=plan.response_timeout,
                body=body,
                dropped=_NOT_RETURNED,
            )
        except ExchangeError as exc:
            # The upstream failed in the middle of its answer: the client's connection is cut
            # (it must not take a truncated body for a whole one).
            conn.abort()
            request.keep_alive = False
            return Outcome(status=answer.status, error=exc.reason)
        finally:
            client.finish(pool, answer)
        if not request.body.complete:
            request.keep_alive = False  # answered early: the rest of the body is not read
        return _answered(answer.status)

    async def _regioned(self, plan: Plan, region: str, answer: Answer) -> bytes | None:
        """The answer's body with the catalog region twins (small JSON answers only), else
        None (the answer streams as it is)."""
        if answer.status != 200 or self.request.method == "HEAD":
            return None
        found = wire.field_map(answer.fields)
        length = found.get(b"content-length", b"")
        if not length.isdigit() or int(length) > REGION_MAX:
            return None
        body = await client.read_whole(answer, plan.response_timeout)
        content_type = found.get(b"content-type", b"").decode("latin-1")
        return regioned(body, region, answer.status, content_type) or body

    def _informational(self, head: Head) -> None:
        status, reason, fields = head
        if status != 100 and self.request.version == "1.1":
            self.conn.write(wire.render(status, reason.decode("latin-1"), fields))

    async def read_body(self, limit: int) -> bytes | Reject:
        self._continue()
        body = bytearray()
        try:
            while (chunk := await self.request.body.get()) is not None:
                body += chunk
                if len(body) > limit:
                    self.request.keep_alive = False
                    return Reject(413, BODY_TOO_LARGE)
        except BodyError as exc:
            self.request.keep_alive = False
            return Reject(exc.status, exc.message)
        return bytes(body)

    async def reply(self, state: RequestState, reply: fanout.Reply) -> None:
        request, conn = self.request, self.conn
        request.keep_alive = request.keep_alive and not conn.draining and request.body.complete
        status = reply.status
        fields = [
            (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
            for name, value in reply.headers.items()
            if name != "content-length"
        ]
        payload = reply.body
        if wire.bodiless(request.method, status):
            payload = b""
            length = reply.headers.get("content-length")
            if length is not None and request.method == "HEAD":
                fields.append((b"Content-Length", length.encode("latin-1")))
        else:
            fields.append((b"Content-Length", b"%d" % len(payload)))
        fields += self._id(state)
        if not request.keep_alive:
            fields.append((b"Connection", b"close"))
        head = wire.render(status, status_title(status), fields)
        if payload:  # a merged list may be tens of MB: written as it is, not joined to the head
            conn.writelines([head, payload])
        else:
            conn.write(head)
        await conn.drain()

    async def refuse(self, state: RequestState, reject: Reject) -> None:
        request = self.request
        close = not request.keep_alive or not request.body.complete or self.conn.draining
        request.keep_alive = not close
        self.conn.write(wire.error_response(reject.status, reject.message, close, self._id(state)))
        await self.conn.drain()

    @staticmethod
    def _id(state: RequestState) -> list[tuple[bytes, bytes]]:
        return [(_REQUEST_ID_FIELD, state.request_id.encode())]


_ORIGINS: Final[dict[tuple[str, str, int], Origin]] = {}


def _origin(scheme: str, host: str, port: int) -> Origin:
    """The pool's key for an upstream (one object per upstream: they recur)."""
    key = (scheme, host, port)
    found = _ORIGINS.get(key)
    if found is None:
        if len(_ORIGINS) > 1024:
            _ORIGINS.clear()
        found = _ORIGINS[key] = Origin(scheme, host, port)
    return found


_ANSWERED: Final[dict[int, Outcome]] = {}


def _answered(status: int) -> Outcome:
    """The outcome of an answer relayed whole (one per status: they are alike)."""
    found = _ANSWERED.get(status)
    if found is None:
        found = _ANSWERED[status] = Outcome(status=status)
    return found


def _request_head(request: Request, plan: Plan) -> bytes:
    """The head sent upstream: the client's head fields (never its trailers), without the
    hop-by-hop ones, those its Connection names and those the plan sets, then the plan's."""
    request_id = plan.state.request_id
    edits = plan.decision.set_headers
    if REQUEST_ID_HEADER in edits or REQUEST_ID_HEADER in plan.edits:  # (routing sets none)
        edits = {**edits, **plan.edits, REQUEST_ID_HEADER: request_id}
    elif plan.edits:
        edits = {**edits, **plan.edits}
    drop = _dropped(tuple(edits))  # (the request id's name is among those never forwarded)
    if request.connection:
        drop = drop | request.connection
    # Parts appended one by one and joined once: no bytes object per field (mypyc compiles
    # an append to a list call; `lines += (a, b, c, d)` builds a tuple first).
    lines = [f"{request.method} {plan.target} HTTP/1.1\r\n".encode("latin-1")]
    for name, value in request.fields:
        if name.lower() not in drop:
            lines.append(name)
            lines.append(b": ")
            lines.append(value)
            lines.append(b"\r\n")
    if "host" not in request.headers and "host" not in edits:
        lines.append(f"Host: {plan.host}:{plan.port}\r\n".encode("latin-1"))
    # The plan's fields, the request id and the framing as one text, encoded once.
    text: list[str] = []
    for edit, setting in edits.items():  # (compiled, a name has one type per function)
        text.append(edit)
        text.append(": ")
        text.append(setting)
        text.append("\r\n")
    if REQUEST_ID_HEADER not in edits:
        text.append(REQUEST_ID_HEADER)
        text.append(": ")
        text.append(request_id)
        text.append("\r\n")
    if request.chunked:
        text.append("Transfer-Encoding: chunked\r\n")
    elif request.length is not None:
        text.append(f"Content-Length: {request.length}\r\n")
    text.append("\r\n")
    lines.append("".join(text).encode("utf-8", "surrogateescape"))
    return b"".join(lines)


_DROPPED: Final[dict[tuple[str, ...], frozenset[bytes]]] = {}


def _dropped(names: tuple[str, ...]) -> frozenset[bytes]:
    """The fields not passed on when the plan sets `names` (memoised: a few name sets recur)."""
    found = _DROPPED.get(names)
    if found is None:
        if len(_DROPPED) > 256:
            _DROPPED.clear()
        found = _DROPPED[names] = _NOT_FORWARDED | {name.encode() for name in names}
    return found


async def transmit(pool: Pool, out: Outgoing) -> Received:
    """One part of a combined request on the worker's pool, its answer read whole
    (:data:`scoperouter.router.combined.Transmit`)."""
    fields = [
        (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
        for name, value in out.headers.items()
    ]
    head = wire.render_request(out.method, out.target, fields)
    try:
        answer = await client.exchange(
            pool,
            Origin(out.scheme, out.host, out.port),
            head,
            method=out.method,
            body=out.body,
            connect_timeout=out.connect_timeout,
            response_timeout=out.response_timeout,
        )
    except ExchangeError as exc:
        raise TransmitError(exc.kind, exc.reason, answered=False) from None
    try:
        body = await client.read_whole(answer, out.response_timeout, out.reserve)
    except ExchangeError as exc:
        if exc.reason == TOO_LARGE:
            raise TransmitError("too_large", exc.reason, answered=True) from None
        if exc.reason == OVER_BUDGET:
            raise TransmitError("over_budget", exc.reason, answered=True) from None
        raise TransmitError(exc.kind, exc.reason, answered=True) from None
    finally:
        client.finish(pool, answer)
    return Received(answer.status, answer.fields, body)


def configure_pool(pool: Pool, catalog: Catalog, cloud: str) -> None:
    """The pool's TLS and the peer routers it keeps warm, from the config."""
    settings = catalog.settings
    spec = WarmSpec(
        settings.peers.warm,
        settings.peer_connect_timeout,
        settings.peers.idle_seconds(settings.limits.idle_timeout),
    )
    warm = {}
    for url in peer_links(catalog, cloud):
        scheme, host, port, _ = split_url(url)
        warm[Origin(scheme, host, port)] = spec
    pool.configure(
        client_context(settings.ca_bundle, settings.verify),
        client_context(settings.peers.ca or settings.ca_bundle, settings.verify),
        warm,
    )


def peer_links(catalog: Catalog, cloud: str) -> list[str]:
    """The other clouds' peer links (base URLs): the pool's warm origins, verified with the
    federation's CA (``settings.peers.ca``)."""
    return [
        other.peer.url.base
        for name, other in catalog.clouds.items()
        if name != cloud and other.peer is not None
    ]


def frontend_context(frontend: Frontend) -> ssl.SSLContext | None:
    """The TLS context of an https frontend (its certificate and key), else None."""
    if frontend.url.scheme != "https" or frontend.cert is None or frontend.key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(frontend.cert, frontend.key)
    context.set_alpn_protocols(["http/1.1"])
    return context
