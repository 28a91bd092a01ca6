"""The ScopeRouter addon: applies `routing.decide` to every request, in `requestheaders`.

Routing happens as soon as the request headers are in, so bodies over ``stream_large_bodies``
stream through untouched (a streamed body is never seen by later hooks). The addon:

* builds :class:`~scoperouter.routing.RequestFacts` from the flow: in reverse mode the URL the
  client addressed is the frontend of the listener the request came in on (told apart by
  ``flow.client_conn.proxy_mode``); in forward mode it is the absolute request URL;
* applies a :class:`~scoperouter.routing.Forward` by rewriting scheme, host, port and path (the
  client's ``Host`` header is kept) and the header edits;
* answers a :class:`~scoperouter.errors.Reject` itself with its OpenStack JSON body;
* turns upstream failures into 502/504 JSON naming the cloud and service (see ``upstream``);
* logs one line per request (never a token, password or scope-bearing header).

The catalog is one immutable object; :meth:`ScopeRouter.reload` swaps it whole.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from mitmproxy import exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.connection import Client, Server
from mitmproxy.proxy import server_hooks

from scoperouter.catalog import Catalog, load_catalog
from scoperouter.errors import ConfigError, Reject, error_body
from scoperouter.identity import Identity, add_region
from scoperouter.proxy import upstream
from scoperouter.proxy.listeners import Listener, listener_signature, listeners_for
from scoperouter.routing import Forward, RequestFacts, decide
from scoperouter.scope import split_token

logger = logging.getLogger("scoperouter")

REJECT_HOST = "reject.scoperouter.invalid"
"""Where a refused request with a streamed body is sent: the `server_connect` hook fails that
connection before any I/O, and the client gets the refusal through the error path."""

_META = "scoperouter"
CLIENT_GONE = "Client disconnected"  # mitmproxy's message when the client closes mid-request


@dataclass(slots=True)
class _FlowState:
    """What the router remembers about one flow (in ``flow.metadata``)."""

    method: str
    path: str  # as the client sent it, without the query string
    decision: Forward | Reject | None = None
    server: Server | None = None  # the upstream connection opened for this flow, if any
    connect_watch: upstream.ConnectWatch | None = None
    watch: upstream.ResponseWatch | None = None
    logged: bool = False

    def timed_out(self) -> str | None:
        """Which timeout of the router ended this flow: "connect", "response" or None."""
        if self.connect_watch is not None and self.connect_watch.fired:
            return "connect"
        if self.watch is not None and self.watch.fired:
            return "response"
        return None

    def stop_watches(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
        if self.connect_watch is not None:
            self.connect_watch.cancel()


class ScopeRouter:
    def __init__(self) -> None:
        self.catalog: Catalog | None = None
        self.cloud: str = ""
        self.config_path: str = ""
        self.listeners: tuple[Listener, ...] = ()
        self._by_spec: dict[str, Listener] = {}
        # The flow in progress on each client connection (HTTP/1.1: one at a time), so that
        # server_connect, which only knows the connections, can find it.
        self._current: dict[str, _FlowState] = {}
        self._own_frontends: set[tuple[str, int]] = set()
        self.identity: Identity | None = None

    # ------------------------------------------------------------------ options

    def load(self, loader: Loader) -> None:
        loader.add_option("scoperouter_config", str, "", "Federation config file (YAML).")
        loader.add_option("scoperouter_cloud", str, "", "The cloud this router serves.")

    def configure(self, updated: set[str]) -> None:
        if not ({"scoperouter_config", "scoperouter_cloud"} & updated):
            return
        from mitmproxy import ctx

        path, cloud = ctx.options.scoperouter_config, ctx.options.scoperouter_cloud
        if not path or not cloud:
            return
        try:
            catalog = load_catalog(path)
        except ConfigError as exc:
            raise exceptions.OptionsError(f"invalid config: {exc}") from None
        if cloud not in catalog.clouds:
            raise exceptions.OptionsError(
                f"cloud {cloud!r} is not in {path} (clouds: {', '.join(sorted(catalog.clouds))})"
            )
        self.config_path, self.cloud = path, cloud
        self._install(catalog)

    def _install(self, catalog: Catalog) -> None:
        listeners = listeners_for(catalog, self.cloud)
        self.listeners = listeners
        self._by_spec = {item.spec: item for item in listeners}
        self._own_frontends = _frontend_addresses(catalog, self.cloud)
        self.identity = Identity(catalog, self.cloud)
        self.catalog = catalog  # one assignment: requests see the old or the new catalog

    # ------------------------------------------------------------------ reload

    def reload(self) -> bool:
        """Re-read the config file; on any problem keep the current catalog. True if swapped."""
        try:
            catalog = load_catalog(self.config_path)
            if self.cloud not in catalog.clouds:
                raise ConfigError(self.config_path, f"cloud {self.cloud!r} is no longer defined")
        except ConfigError as exc:
            logger.error("reload refused, keeping the current config: %s", exc)
            return False
        old = self.listeners
        new = listeners_for(catalog, self.cloud)
        if listener_signature(new) != listener_signature(old):
            logger.warning(
                "reload: listeners or certificates of %s changed (%s -> %s); routing uses the "
                "new config but the listeners stay as they are until the router is restarted",
                self.cloud,
                ", ".join(item.address for item in old),
                ", ".join(item.address for item in new),
            )
            catalog_listeners = old  # keep recognising the listeners that actually run
        else:
            catalog_listeners = new
        self._own_frontends = _frontend_addresses(catalog, self.cloud) | {
            (item.frontend.url.host, item.frontend.url.port)
            for item in catalog_listeners
            if item.frontend is not None
        }
        if self.identity is not None:
            self.identity.update(catalog)
        self.catalog = catalog
        self.listeners = catalog_listeners
        self._by_spec = {item.spec: item for item in catalog_listeners}
        logger.info("reloaded %s: %s", self.config_path, catalog.describe())
        return True

    # ------------------------------------------------------------------ hooks

    def requestheaders(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Route the request. Synchronous on the common path; when a local service's token
        must be swapped for another cloud (see identity.py), returns a coroutine that mitmproxy
        awaits (keystone checks are cached, so that is rare too)."""
        request = flow.request
        path = request.path.partition("?")[0]
        if flow.client_conn.proxy_mode.type_name == "regular":  # forward proxy: absolute URL
            path = f"{request.scheme}://{request.host}:{request.port}{path}"
        state = _FlowState(request.method, path)
        flow.metadata[_META] = state
        self._current[flow.client_conn.id] = state
        try:
            decision = self._decide(flow)
        except Exception:  # the router must answer, whatever happens
            logger.exception("routing failed for %s %s", state.method, state.path)
            decision = Reject(500, "the router failed to route this request (see its log)")
        if isinstance(decision, Forward) and decision.swap_tokens and self.identity is not None:
            return self._swap_then_apply(flow, decision, state, self.identity)
        self._apply(flow, decision, state)
        return None

    async def _swap_then_apply(
        self, flow: http.HTTPFlow, decision: Forward, state: _FlowState, identity: Identity
    ) -> None:
        headers = {
            name: split_token(flow.request.headers[name])[0]
            for name in decision.swap_tokens
            if name in flow.request.headers
        }
        try:
            result = await identity.swap(headers, decision.swap_tokens, decision.cloud)
        except Exception:
            logger.exception("token swap failed for %s %s", state.method, state.path)
            result = Reject(500, "the router failed to carry the request's tokens (see its log)")
        if isinstance(result, Reject):
            self._apply(flow, result, state)
        else:
            edited = replace(decision, set_headers={**decision.set_headers, **result})
            self._apply(flow, edited, state)

    def _apply(self, flow: http.HTTPFlow, decision: Forward | Reject, state: _FlowState) -> None:
        if isinstance(decision, Forward):
            try:
                self._forward(flow, decision, state)
            except Exception:
                logger.exception("routing failed for %s %s", state.method, state.path)
                decision = Reject(500, "the router failed to route this request (see its log)")
        state.decision = decision
        if isinstance(decision, Reject):
            self._reject(flow, decision)

    def _decide(self, flow: http.HTTPFlow) -> Forward | Reject:
        catalog = self.catalog
        assert catalog is not None
        request = flow.request
        listener = self._by_spec.get(flow.client_conn.proxy_mode.full_spec)
        headers = {name.lower(): request.headers[name] for name in request.headers}
        if listener is not None and listener.frontend is not None:
            frontend = listener.frontend
            tls = flow.client_conn.tls_established
            if tls != (frontend.url.scheme == "https"):
                expected = "HTTPS" if frontend.url.scheme == "https" else "plain HTTP"
                return Reject(400, f"{frontend.url} of {self.cloud} speaks {expected} only")
            facts = RequestFacts(
                request.method,
                frontend.url.scheme,
                frontend.url.host,
                frontend.url.port,
                request.path,
                headers,
                "reverse",
            )
        elif listener is not None:
            facts = RequestFacts(
                request.method,
                request.scheme,
                request.host,
                request.port,
                request.path,
                headers,
                "forward",
            )
        else:
            return Reject(500, f"request arrived on an unknown listener of {self.cloud}")
        return decide(facts, catalog, self.cloud)

    def _forward(self, flow: http.HTTPFlow, decision: Forward, state: _FlowState) -> None:
        request = flow.request
        scheme, host, port, path = split_url(decision.url)
        host_header = request.host_header
        request.scheme = scheme
        request.data.host = host
        request.data.port = port
        request.path = path
        request.host_header = host_header  # services build links that point at the router
        headers = request.headers
        for name in decision.remove_headers:
            if name in headers:
                del headers[name]
        for name, value in decision.set_headers.items():
            headers[name] = value
        if request.stream or _chunked(request):
            # The body streams upstream (chunked bodies from the first byte, rather than after
            # buffering 1 MiB): the response timeout watches its progress from now on.
            state.watch = self._response_watch(flow, state)
            request.stream = state.watch.passthrough

    def _reject(self, flow: http.HTTPFlow, reject: Reject) -> None:
        request = flow.request
        if request.stream or _chunked(request):
            # A body too large to buffer is on its way: mitmproxy cannot answer from a hook
            # while it streams, so send the request nowhere (see server_connect) and answer
            # through the error path, closing the connection.
            request.headers.pop("expect", None)  # no "100 Continue" for a refused body
            request.stream = True  # fail now, not after buffering the first MiB
            request.scheme = "http"
            request.data.host = REJECT_HOST
            request.data.port = 9
            return
        flow.response = http.Response.make(
            reject.status, reject.body(), {"Content-Type": "application/json"}
        )

    def http_connect(self, flow: http.HTTPFlow) -> None:
        message = (
            f"CONNECT tunnels are not supported by the forward proxy of {self.cloud}: "
            "send plain http:// requests through it, or call the https frontend directly"
        )
        flow.metadata[_META] = _FlowState("CONNECT", f"{flow.request.host}:{flow.request.port}")
        flow.response = http.Response.make(
            403, error_body(403, message), {"Content-Type": "application/json"}
        )

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.error:
            return
        if server.address is not None:
            if server.address[0] == REJECT_HOST:
                server.error = "refused by the router"
                return
            if (server.address[0], server.address[1]) in self._own_frontends:
                # Routing never targets this router's own frontends; going there would loop.
                server.error = f"refusing to connect to a frontend of {self.cloud} (loop)"
                return
        catalog = self.catalog
        if catalog is None:
            return
        watch = upstream.ConnectWatch(data.client, server, catalog.settings.connect_timeout)
        state = self._current.get(data.client.id)
        if state is not None:
            state.server = server
            state.connect_watch = watch

    def request(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_META)
        if isinstance(state, _FlowState) and isinstance(state.decision, Forward):
            if state.watch is not None:
                state.watch.touch()  # the whole body is sent: from now on, the response
            elif flow.response is None:
                state.watch = self._response_watch(flow, state)

    def _response_watch(self, flow: http.HTTPFlow, state: _FlowState) -> upstream.ResponseWatch:
        timeout = self.catalog.settings.response_timeout if self.catalog else 120.0
        return upstream.ResponseWatch(flow, timeout, lambda: state.server or flow.server_conn)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_META)
        if isinstance(state, _FlowState):
            state.stop_watches()

    def response(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_META)
        if isinstance(state, _FlowState):
            state.stop_watches()
            decision = state.decision
            if isinstance(decision, Forward) and decision.catalog_region and flow.response:
                _add_catalog_region(flow.response, decision.catalog_region)
            self._done(flow, state)
            status = flow.response.status_code if flow.response else 0
            self._log(flow, state, status)

    def busy_clients(self) -> set[str]:
        """Client connections with a request in progress."""
        return set(self._current)

    def client_disconnected(self, client: Client) -> None:
        self._current.pop(client.id, None)

    def _done(self, flow: http.HTTPFlow, state: _FlowState) -> None:
        if self._current.get(flow.client_conn.id) is state:
            del self._current[flow.client_conn.id]

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_META)
        if isinstance(state, _FlowState):
            self._done(flow, state)
            self._log(flow, state, flow.response.status_code if flow.response else 0)

    def error(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_META)
        if not isinstance(state, _FlowState):
            return
        state.stop_watches()
        self._done(flow, state)
        decision = state.decision
        status: int | None = None
        if flow.error is not None and flow.error.msg.startswith(CLIENT_GONE):
            status = 499  # the client went away; nothing is sent to it
        elif isinstance(decision, Reject):
            status = decision.status
            upstream.set_error_response(flow, status, decision.message)
        elif isinstance(decision, Forward):
            # Used only if mitmproxy renders an error response now (not when the response
            # had already started, e.g. an upstream that dies in the middle of a body).
            status, message = self._upstream_failure(flow, decision, state)
            upstream.set_error_response(flow, status, message)
        self._log(flow, state, status or 0)

    def _upstream_failure(
        self, flow: http.HTTPFlow, decision: Forward, state: _FlowState
    ) -> tuple[int, str]:
        """Status and message for a forwarded request whose upstream failed."""
        assert flow.error is not None
        reason = flow.error.msg
        settings = self.catalog.settings if self.catalog else None
        if decision.remote:
            what = f"the router of {decision.cloud} for the {decision.service_type} service"
            where = f" at {_base(decision.url)}"
        else:  # the backend addresses of this cloud are not for clients to see
            what = f"the {decision.service_type} service of {decision.cloud}"
            where = ""
            reason = _hide_address(reason, flow.request.host)
        timed_out = state.timed_out()
        if timed_out is None and upstream.CONNECT_TIMEOUT_MESSAGE in reason:
            timed_out = "connect"
        if timed_out == "connect":
            timeout = settings.connect_timeout if settings else 0
            return 504, f"timed out after {timeout:g}s connecting to {what}{where}"
        if timed_out == "response":
            timeout = settings.response_timeout if settings else 0
            return 504, f"{what}{where} did not answer within {timeout:g}s"
        server = state.server or flow.server_conn
        if server.timestamp_tcp_setup is None:
            return 502, f"{what} is unreachable{where}: {reason}"
        return 502, f"{what}{where} failed: {reason}"

    # ------------------------------------------------------------------ logging

    def _log(self, flow: http.HTTPFlow, state: _FlowState, status: int) -> None:
        if state.logged:
            return
        state.logged = True
        decision = state.decision
        if isinstance(decision, Forward):
            service, cloud = decision.service_type, decision.cloud
            target = decision.url.partition("?")[0]
        else:
            service = cloud = target = "-"
        started = flow.request.timestamp_start
        duration_ms = (time.time() - started) * 1000 if started else 0.0
        logger.info(
            "%s %s service=%s cloud=%s target=%s status=%s ms=%.1f%s",
            state.method,
            state.path,
            service,
            cloud,
            target,
            status or "-",
            duration_ms,
            f" error={_short(flow.error.msg)!r}" if flow.error else "",
        )


def _add_catalog_region(response: http.Response, region: str) -> None:
    """A token validation answered by another cloud's keystone: twin its catalog endpoints into
    this cloud's region (identity.add_region). Small JSON bodies only; anything else is left."""
    if response.status_code != 200 or response.stream:
        return
    if "json" not in response.headers.get("content-type", ""):
        return
    try:
        body = json.loads(response.content or b"")
    except ValueError:
        return
    if isinstance(body, dict) and add_region(body, region):
        response.content = json.dumps(body).encode()


def _frontend_addresses(catalog: Catalog, cloud: str) -> set[tuple[str, int]]:
    return {(f.url.host, f.url.port) for f in catalog.clouds[cloud].frontends}


def split_url(url: str) -> tuple[str, str, int, str]:
    """``http://h:1/p?q`` -> ``("http", "h", 1, "/p?q")``; the path is kept byte for byte."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"no host in {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = url[len(parts.scheme) + 3 + len(parts.netloc) :]
    return parts.scheme, parts.hostname, port, path or "/"


def _hide_address(reason: str, host: str) -> str:
    if "Connect call failed" in reason:  # OSError text: "[Errno 111] Connect call failed (addr)"
        return "connection refused"
    return reason.replace(host, "<backend>")


def _chunked(request: http.Request) -> bool:
    return "chunked" in request.headers.get("transfer-encoding", "").lower()


def _base(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
