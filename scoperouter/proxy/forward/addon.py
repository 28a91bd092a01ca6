"""The forward proxy's adapter: mitmproxy's hooks calling the router's pipeline.

A service of this cloud sends its HTTP calls here (``HTTP_PROXY``): the request names an
absolute URL. Each hook is one step of :class:`~scoperouter.router.pipeline.Pipeline`, in its
order:

* ``requestheaders``: the facts (the absolute URL), :meth:`~Pipeline.route`, then for one
  cloud :meth:`~Pipeline.prepare` (breaker, token swap, loop) and the flow pointed at the
  plan's URL with its header edits (``Host`` is the absolute URL's authority, RFC 9112
  3.2.2, whatever the client wrote; in a tunnel the client's, checked); identity fields only
  keystonemiddleware sets are dropped first and a path a backend could resolve elsewhere is
  refused (400), as on the frontends (:func:`~scoperouter.http.heads.strip_identity`,
  :func:`~scoperouter.http.heads.check_path`); a refusal is answered
  here (a streamed body's through the error path, :data:`REJECT_HOST`);
* ``request``: ``A & B`` / ``A | B`` answered by :meth:`~Pipeline.combine` (bodies up to
  mitmproxy's streaming threshold); the response timeout starts;
* ``responseheaders``: the upstream answered (:meth:`~Pipeline.succeeded`);
* ``response``: the catalog region of a token validation, then :meth:`~Pipeline.done`;
* ``error``: the failure worded by :meth:`~Pipeline.failed` (or the client's own fault: it
  went away, 499; its body was malformed, 400, or stopped, 408), then :meth:`~Pipeline.done`;
* ``http_connect``: a ``CONNECT`` to a catalog destination is intercepted when the cloud has
  ``proxy.ca`` (:func:`~scoperouter.routing.tunnel`, the host in the catalog's spelling:
  :func:`~.intercept.catalog_host`; the requests inside come through the hooks above,
  ``https`` URLs), anything else refused (403) and logged;
* ``next_layer``: the first bytes of an intercepted tunnel must be a TLS ClientHello; anything
  else is answered 400 at once and the tunnel closed (:func:`~.mitm.refuse_layer`); a
  handshake not done (``tls_established_client``) within ``header_timeout`` of the
  ``CONNECT`` closes the tunnel (the sweep), logged as a 408;
* inside a tunnel, the frontends' rule for the target (:func:`tunnel_target`): an
  absolute-form target naming the tunnel's own authority is reduced to origin-form, one
  naming another is refused (421), and so is a ``Host`` that names another; what reaches the
  upstream is the origin-form target the access log shows;
* ``server_connect``: the connect timeout starts.

Timeouts are checked by the worker's sweep (:meth:`ForwardAddon.sweep`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from mitmproxy import http
from mitmproxy.connection import Client
from mitmproxy.proxy import server_hooks

from scoperouter.errors import Reject, status_title
from scoperouter.http import heads
from scoperouter.proxy.forward import guard, mitm
from scoperouter.proxy.forward.intercept import catalog_host, idna_forms, normal_host
from scoperouter.proxy.forward.timeouts import Deadlines
from scoperouter.router.failures import (
    CLIENT_GONE,
    CLIENT_GONE_STATUS,
    INTERNAL_ERROR,
    TimedOut,
)
from scoperouter.router.pipeline import Pipeline, Plan
from scoperouter.router.region import regioned
from scoperouter.router.state import REQUEST_ID_HEADER, RequestState, new_state
from scoperouter.routing import Combined, Failover, FanOut, RequestFacts, tunnel
from scoperouter.semantics import header_map

logger = logging.getLogger("scoperouter")

META = "scoperouter"
_IDENTITY = heads.IDENTITY_NAMES.keys()
REJECT_HOST = "reject.scoperouter.invalid"
"""Where a refused request with a streamed body is sent: ``server_connect`` fails that
connection before any I/O, and the client gets the refusal through the error path."""
STREAM_LIMIT = 1024 * 1024  # engine.BASE_OPTIONS["stream_large_bodies"]
COMBINED_TOO_LARGE = (
    "a scope combining clouds ('&', '|') needs the request body whole: on this path at most "
    "1 MiB with a Content-Length; name one cloud for large or chunked uploads"
)


@dataclass(slots=True, eq=False)
class _Flow:
    """What the adapter keeps of one request (in ``flow.metadata``)."""

    state: RequestState
    deadlines: Deadlines
    plan: Plan | None = None


class ForwardAddon:
    name = "scoperouter"

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.config = pipeline.config
        self.inflight: dict[str, _Flow] = {}  # client connection id -> its request
        # client connection id -> the (host, port) of its intercepted tunnel, as the catalog
        # spells the host: every request on that connection from then on is inside it
        self.tunnels: dict[str, tuple[str, int]] = {}
        # client connection id -> when its tunnel's TLS handshake must be done (monotonic)
        self.handshakes: dict[str, tuple[float, Client]] = {}

    # -- lifecycle and connections

    def running(self) -> None:
        guard.set_refusal_handler(self.pipeline.refused)

    def done(self) -> None:
        guard.set_refusal_handler(None)

    def client_connected(self, client: Client) -> None:
        self.pipeline.metrics.opened()

    def client_disconnected(self, client: Client) -> None:
        self.pipeline.metrics.closed()
        self.inflight.pop(client.id, None)
        self.tunnels.pop(client.id, None)
        self.handshakes.pop(client.id, None)

    def tls_established_client(self, data: mitm.TlsData) -> None:
        self.handshakes.pop(data.context.client.id, None)

    def busy(self) -> set[str]:
        """Client connections with a request in progress (draining lets them finish)."""
        return set(self.inflight)

    def sweep(self, now: float) -> None:
        """Look at every request in flight once (the worker's sweep calls this)."""
        now_wall = time.time()
        for entry in list(self.inflight.values()):
            with contextlib.suppress(Exception):  # one request must not stop the sweep
                entry.deadlines.check(entry.state, now_wall, now)
        for client_id, (deadline, client) in list(self.handshakes.items()):
            if now >= deadline:
                with contextlib.suppress(Exception):
                    self._handshake_too_slow(client_id, client, deadline)

    def _handshake_too_slow(self, client_id: str, client: Client, deadline: float) -> None:
        """A tunnel whose TLS handshake did not come (or not whole) in ``header_timeout``:
        closed, as a head not complete in time would be, and logged."""
        del self.handshakes[client_id]
        host, port = self.tunnels.get(client_id, ("-", 0))
        limits = self.config.current().settings.limits
        message = (
            f"the tunnel's TLS handshake was not complete after {limits.header_timeout:g}s "
            "(header_timeout)"
        )
        started = deadline - limits.header_timeout
        guard.report(client, 408, message, "-", f"{host}:{port}", started)
        mitm.close_client(client_id)

    # -- a request

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            await self._requestheaders(flow)
        except Exception:  # the router must answer, whatever happens
            logger.exception("the forward proxy failed on %s", flow.request.method)
            entry = _entry(flow)
            if entry is not None and flow.response is None:
                _answer(flow, entry.state, Reject(500, INTERNAL_ERROR))

    async def _requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        path = request.path.partition("?")[0]
        url = f"{request.scheme}://{request.host}:{request.port}{path}"
        # In one pass over the fields: a lookup by name in mitmproxy's Headers scans them all.
        headers = header_map(request.headers.fields)
        state = new_state(request.method, url, headers)
        entry = _Flow(state, Deadlines(flow.client_conn))
        flow.metadata[META] = entry
        self.inflight[flow.client_conn.id] = entry
        hazard = heads.check_path(request.data.path)  # the path as sent, as on the frontends
        if hazard is not None:
            _answer(flow, state, Reject(400, hazard))
            return
        if not _IDENTITY.isdisjoint(headers):  # forged: only keystonemiddleware sets them
            fields, names = heads.strip_identity(list(request.headers.fields), headers)
            request.headers.fields = tuple(fields)
            self.pipeline.stripped(state, names)
        facts = RequestFacts(
            method=request.method,
            scheme=request.scheme,
            host=request.host,
            port=request.port,
            path=request.path,
            headers=state.headers,
            mode="forward",
        )
        inside = self.tunnels.get(flow.client_conn.id)
        misdirected = tunnel_target(request, inside) if inside is not None else None
        if misdirected is not None:
            _answer(flow, state, misdirected)
            return
        decision = self.pipeline.route(facts, state)
        if isinstance(decision, FanOut | Failover):
            state.decision = decision
            length = state.headers.get("content-length", "")
            if (
                request.stream
                or _chunked(state)
                or (length.isdigit() and int(length) > STREAM_LIMIT)
            ):
                _answer(flow, state, Reject(413, COMBINED_TOO_LARGE))
            return
        if isinstance(decision, Reject):
            _answer(flow, state, decision)
            return
        planned = self.pipeline.prepare(decision, state)
        if isinstance(planned, Plan) and decision.swap_tokens:
            planned = await self.pipeline.swap(planned)
        if isinstance(planned, Reject):
            _answer(flow, state, planned)
            return
        entry.plan = planned
        if "upgrade" in state.headers:  # without "Connection: upgrade" (else refused: 400),
            del request.headers["upgrade"]  # dropped as the frontends drop it (hop-by-hop)
        if inside is None:  # RFC 9112 3.2.2: a proxy replaces Host with the target's authority
            authority = _authority(request)
            if state.headers.get("host", "").lower() not in _spellings(request, authority):
                request.headers["Host"] = authority  # (one that names it is kept as written)
        elif "host" not in state.headers:  # in a tunnel: the Host named it (or none came)
            request.headers["Host"] = f"{request.host}:{request.port}"
        request.scheme = planned.scheme
        request.data.host = planned.host
        request.data.port = planned.port
        request.path = planned.target
        _set_headers(
            request.headers,
            {**decision.set_headers, **planned.edits, REQUEST_ID_HEADER: state.request_id},
        )
        if request.stream or _chunked(state):
            # The body streams upstream (chunked bodies from the first byte, rather than after
            # buffering 1 MiB): the response timeout watches its progress from now on.
            entry.deadlines.start_response(planned.response_timeout)
            request.stream = entry.deadlines.progress

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.error or server.address is None:
            return
        if server.address[0] == REJECT_HOST:
            server.error = "refused by the router"
            return
        entry = self.inflight.get(data.client.id)
        if entry is not None and entry.plan is not None:
            entry.deadlines.connecting(server, entry.plan.connect_timeout)

    async def request(self, flow: http.HTTPFlow) -> None:
        entry = _entry(flow)
        if entry is None or flow.response is not None:
            return
        decision = entry.state.decision
        if isinstance(decision, FanOut | Failover):
            await self._combine(flow, entry.state, decision)
        elif entry.plan is not None:  # the whole body is sent: from now on, the response
            entry.deadlines.start_response(entry.plan.response_timeout)
            if entry.deadlines.server is None:
                entry.deadlines.server = flow.server_conn

    async def _combine(self, flow: http.HTTPFlow, state: RequestState, decision: Combined) -> None:
        request = flow.request
        base = f"{request.scheme}://{request.host}:{request.port}"  # merged next links
        reply = await self.pipeline.combine(
            decision, state, request.method, state.headers, request.raw_content or b"", base
        )
        headers = [
            (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
            for name, value in reply.headers.items()
            if name != "content-length"
        ]
        headers.append((REQUEST_ID_HEADER.encode(), state.request_id.encode()))
        bodiless = request.method == "HEAD" or reply.status in (204, 304)
        response = http.Response.make(reply.status, b"" if bodiless else reply.body, headers)
        response.reason = status_title(reply.status)
        flow.response = response

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        entry = _entry(flow)
        if entry is None or flow.response is None:
            return
        entry.deadlines.stop()
        _set_headers(flow.response.headers, {REQUEST_ID_HEADER: entry.state.request_id})
        if entry.plan is not None:
            self.pipeline.succeeded(entry.plan.decision)

    def response(self, flow: http.HTTPFlow) -> None:
        entry = _entry(flow)
        if entry is None:
            return
        response = flow.response
        status = response.status_code if response is not None else 0
        region = entry.plan.decision.catalog_region if entry.plan is not None else None
        if region and response is not None and not response.stream:
            content_type = response.headers.get("content-type", "")
            body = regioned(response.content or b"", region, status, content_type)
            if body is not None:
                response.content = body
        self._finish(flow, entry, status, None)

    def error(self, flow: http.HTTPFlow) -> None:
        entry = _entry(flow)
        if entry is None or flow.error is None:
            return
        entry.deadlines.stop()
        state = entry.state
        failed = mitm.body_failure(flow)
        if mitm.client_went_away(flow):
            state.status, state.message = CLIENT_GONE_STATUS, CLIENT_GONE
        elif failed is not None:
            state.status, state.message = failed
        elif mitm.client_protocol_error(flow):
            state.status, state.message = 400, f"malformed request body: {flow.error.msg}"
            mitm.set_error_response(flow, 400, state.message)
        elif isinstance(state.decision, Reject):
            state.status, state.message = state.decision.status, state.decision.message
            mitm.set_error_response(flow, state.status, state.message)
        elif entry.plan is not None:
            # Used only if mitmproxy renders an error response now (not when the response had
            # already started, e.g. an upstream that dies in the middle of a body).
            server = flow.server_conn
            reject = self.pipeline.failed(
                entry.plan,
                state.timed_out or _timed_out(flow.error.msg),
                mitm.upstream_reason(flow.error.msg),
                connected=server.timestamp_tcp_setup is not None,
            )
            state.status, state.message = reject.status, reject.message
            mitm.set_error_response(flow, reject.status, reject.message)
        self._finish(flow, entry, state.status or 0, flow.error.msg)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        catalog = self.config.current()
        host = catalog_host(request.host, request.port, catalog)
        reject = tunnel(host, request.port, catalog, self.config.cloud)
        if reject is None:
            # Intercepted: mitmproxy says 200, each request inside is a flow of its own. The
            # tunnel's address (mitmproxy takes it from the request after this hook) is the
            # catalog's spelling: one certificate, one route, whatever the client's.
            request.data.host = host
            client = flow.client_conn
            self.tunnels[client.id] = (host, request.port)
            timeout = catalog.settings.limits.header_timeout
            self.handshakes[client.id] = (time.monotonic() + timeout, client)
            return
        state = new_state(request.method, f"{request.host}:{request.port}", {})
        state.decision = reject
        flow.response = _json_response(reject)
        self.pipeline.done(state, reject.status)

    def next_layer(self, nextlayer: mitm.NextLayer) -> None:
        """The first layer inside an intercepted tunnel: TLS (left to mitmproxy's NextLayer,
        which runs after this hook), or a 400 at once for anything else."""
        context = nextlayer.context
        inside = self.tunnels.get(context.client.id)
        if inside is None or nextlayer.layer is not None or context.client.tls:
            return
        data = nextlayer.data_client()
        if mitm.could_be_tls(data):
            return  # a ClientHello (or the start of one): intercepted
        where = f"{inside[0]}:{inside[1]}"
        self.handshakes.pop(context.client.id, None)  # refused now: no deadline to watch
        nextlayer.layer = mitm.refuse_layer(context, 400, NOT_TLS_MESSAGE, where)

    def _finish(self, flow: http.HTTPFlow, entry: _Flow, status: int, error: str | None) -> None:
        self.pipeline.done(entry.state, status, error)
        if self.inflight.get(flow.client_conn.id) is entry:
            del self.inflight[flow.client_conn.id]


NOT_TLS_MESSAGE = (
    "a tunnel through the forward proxy carries TLS only (a ClientHello first): send plain "
    "HTTP requests to the proxy itself, with an absolute URL"
)


def tunnel_target(request: http.Request, inside: tuple[str, int]) -> Reject | None:
    """The frontends' rule for a request inside the tunnel to `inside` (host, port): an
    absolute-form target (RFC 9112 3.2.2) must name the tunnel's own authority, and is then
    reduced to origin-form (the upstream gets the path the access log shows); one naming
    another authority, or a ``Host`` field naming another, is misdirected: 421 (RFC 9110
    15.5.20, 7.4). The port may be left out for 443 (the tunnel carries https)."""
    host, port = inside
    authority = request.data.authority
    if authority:
        named = authority.decode("utf-8", "surrogateescape")
        if not _names(named, host, port):
            return _misdirected("target", named, host, port)
        request.data.authority = b""  # origin-form upstream: what the access log shows
    field = request.headers.get("host")
    if field is not None and not _names(field, host, port):
        return _misdirected("Host field", field, host, port)
    return None


def _names(authority: str, host: str, port: int) -> bool:
    """Whether `authority` (``host[:port]``, any spelling) names `host`:`port`."""
    named, colon, written = authority.rpartition(":")
    if not colon or "]" in written:  # no port (or an IPv6 address without one)
        named, written = authority, ""
    if written and not (written.isascii() and written.isdigit()):
        return False
    named_port = int(written) if written else 443
    if named_port != port:
        return False
    named = normal_host(named)
    return named == host or host in idna_forms(named)


def _misdirected(what: str, named: str, host: str, port: int) -> Reject:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Reject(
        421,
        f"the request's {what} names {named[:200]!r}: this is a tunnel to {where[:210]} "
        "(send the path, with that authority or none, in the tunnel of the host it is for)",
    )


def _authority(request: http.Request) -> str:
    """The absolute URL's authority (mitmproxy has made the target origin-form already): its
    host (IPv6 in brackets), and its port unless the scheme's default (RFC 9110 4.2.1)."""
    host = f"[{request.host}]" if ":" in request.host else request.host
    default = {"http": 80, "https": 443}.get(request.scheme)
    return host if request.port == default else f"{host}:{request.port}"


def _spellings(request: http.Request, authority: str) -> tuple[str, str]:
    """How a Host field may name the URL's authority (lower-case): its port left out or not."""
    lower = authority.lower()
    return lower, (lower if lower.endswith(f":{request.port}") else f"{lower}:{request.port}")


def _entry(flow: http.HTTPFlow) -> _Flow | None:
    entry = flow.metadata.get(META)
    return entry if isinstance(entry, _Flow) else None


def _timed_out(message: str) -> TimedOut | None:
    return "connect" if mitm.CONNECT_TIMEOUT_MESSAGE in message else None


def _answer(flow: http.HTTPFlow, state: RequestState, reject: Reject) -> None:
    """Answer the request with `reject` (OpenStack JSON); nothing is sent upstream."""
    state.decision = reject
    request = flow.request
    if request.stream or _chunked(state):
        # A body too large to buffer is on its way: mitmproxy cannot answer from a hook while
        # it streams, so send the request nowhere (see server_connect) and answer through the
        # error path, closing the connection.
        request.headers.pop("expect", None)  # no "100 Continue" for a refused body
        request.stream = True  # fail now, not after buffering the first MiB
        request.scheme = "http"
        request.data.host = REJECT_HOST
        request.data.port = 9
        return
    flow.response = _json_response(reject)


def _json_response(reject: Reject) -> http.Response:
    """The response for `reject`: OpenStack JSON, with the standard reason phrase."""
    response = http.Response.make(
        reject.status, reject.body(), {"Content-Type": "application/json"}
    )
    response.reason = reject.title  # mitmproxy's table lacks some (508 Loop Detected)
    return response


def _chunked(state: RequestState) -> bool:
    return "chunked" in state.headers.get("transfer-encoding", "").lower()


def _set_headers(headers: http.Headers, edits: Mapping[str, str]) -> None:
    """Set these fields (lower-case names), replacing any of the same name, in one pass."""
    names = {name.encode("latin-1") for name in edits}
    kept = tuple(field for field in headers.fields if field[0].lower() not in names)
    headers.fields = kept + tuple(
        (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
        for name, value in edits.items()
    )
