"""Routing: applies :func:`scoperouter.routing.decide` to every request, in ``requestheaders``.

Routing happens as soon as the request headers are in, so bodies over ``stream_large_bodies``
stream through untouched (a streamed body is never seen by later hooks). The addon:

* builds :class:`~scoperouter.routing.RequestFacts` from the flow: in reverse mode the URL the
  client addressed is the frontend of the listener the request came in on (told apart by
  ``flow.client_conn.proxy_mode``); in forward mode it is the absolute request URL;
* applies a :class:`~scoperouter.routing.Forward` by rewriting scheme, host, port and path (the
  client's ``Host`` header is kept) and the header edits, and passes the request id on;
* answers a :class:`~scoperouter.errors.Reject` itself with its OpenStack JSON body;
* refuses ``CONNECT`` (the forward proxy carries plain HTTP only) and, in ``server_connect``,
  any connection to an address of this router itself (508: it would loop).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from mitmproxy import http
from mitmproxy.proxy import server_hooks

from scoperouter.catalog import Frontend
from scoperouter.errors import Reject
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.flowstate import (
    REJECT_HOST,
    REQUEST_ID_HEADER,
    FlowState,
    answer,
    begin,
    json_response,
    set_headers,
)
from scoperouter.routing import Combined, Forward, RequestFacts, decide

logger = logging.getLogger("scoperouter")

INTERNAL_ERROR = "the router failed to route this request (see its log)"
LOOP_MESSAGE = "scoperouter: the target is this router itself (loop)"
"""The connection error of an upstream connection refused because it would loop."""


class Routing:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        state = begin(flow)
        try:
            decision = self._decide(flow, state)
            if isinstance(decision, Forward):
                apply_forward(flow, decision, state.request_id)
                state.decision = decision
                return
            if not isinstance(decision, Reject):  # A & B, A | B: the Combining addon runs it
                state.decision = decision
                return
        except Exception:  # the router must answer, whatever happens
            logger.exception("routing failed for %s %s", state.method, state.path)
            decision = Reject(500, INTERNAL_ERROR)
        answer(flow, state, decision)

    def _decide(self, flow: http.HTTPFlow, state: FlowState) -> Forward | Reject | Combined:
        config = self.config
        request = flow.request
        listener = config.by_spec.get(flow.client_conn.proxy_mode.full_spec)
        headers = state.headers
        if listener is None:
            return Reject(500, f"request arrived on an unknown listener of {config.cloud}")
        frontend = listener.frontend
        if frontend is None:  # the forward proxy: the request names an absolute URL
            facts = RequestFacts(
                method=request.method,
                scheme=request.scheme,
                host=request.host,
                port=request.port,
                path=request.path,
                headers=headers,
                mode="forward",
            )
        else:
            mismatch = wrong_scheme(config, frontend, flow.client_conn.tls_established)
            if mismatch is not None:
                return mismatch
            facts = reverse_facts(frontend, request.method, request.path, headers)
        return decide(facts, config.current(), config.cloud, combined=True)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        state = begin(flow)
        state.path = f"{flow.request.host}:{flow.request.port}"
        reject = Reject(
            403,
            f"CONNECT tunnels are not supported by the forward proxy of {self.config.cloud}: "
            "send plain http:// requests through it, or call the https frontend directly",
        )
        state.decision = reject
        flow.response = json_response(reject)

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.error or server.address is None:
            return
        address = (server.address[0], server.address[1])
        if address[0] == REJECT_HOST:
            server.error = "refused by the router"
        elif address in self.config.own_addresses:
            # Routing never targets this router itself; a request that would is a loop.
            server.error = LOOP_MESSAGE


def reverse_facts(
    frontend: Frontend, method: str, path: str, headers: Mapping[str, str]
) -> RequestFacts:
    """What routing needs of a request that came in on `frontend` (both data paths): the URL
    the client addressed is the frontend's, with the request's path."""
    return RequestFacts(
        method=method,
        scheme=frontend.url.scheme,
        host=frontend.url.host,
        port=frontend.url.port,
        path=path,
        headers=headers,
        mode="reverse",
    )


def wrong_scheme(config: RouterConfig, frontend: Frontend, tls: bool) -> Reject | None:
    """The refusal of plain HTTP on an https frontend (or TLS on an http one), both paths."""
    https = frontend.url.scheme == "https"
    if tls == https:
        return None
    expected = "HTTPS" if https else "plain HTTP"
    return Reject(400, f"{frontend.url} of {config.cloud} speaks {expected} only")


def route(
    config: RouterConfig, facts: RequestFacts, state: FlowState
) -> Forward | Reject | Combined:
    """decide() on the current config, combined expressions included (``A & B``, ``A | B``:
    both data paths run them with :mod:`scoperouter.proxy.combined`); a failure of the router
    itself is a 500, logged."""
    try:
        return decide(facts, config.current(), config.cloud, combined=True)
    except Exception:  # the router must answer, whatever happens
        logger.exception("routing failed for %s %s", state.method, state.path)
        return Reject(500, INTERNAL_ERROR)


def apply_forward(flow: http.HTTPFlow, decision: Forward, request_id: str) -> None:
    """Point the flow at the decision's URL and make its header edits. The Host header stays
    as the client sent it (services build links that point at the router): only the
    connection's address changes."""
    request = flow.request
    scheme, host, port, path = split_url(decision.url)
    request.scheme = scheme
    request.data.host = host
    request.data.port = port
    request.path = path
    set_headers(request.headers, {**decision.set_headers, REQUEST_ID_HEADER: request_id})


def split_url(url: str) -> tuple[str, str, int, str]:
    """``http://h:1/p?q`` -> ``("http", "h", 1, "/p?q")``, for the URLs routing makes
    (``scheme://host:port`` then the path, kept byte for byte; IPv6 hosts in brackets)."""
    scheme, sep, rest = url.partition("://")
    hostport, slash, path = rest.partition("/")
    host, colon, port = hostport.rpartition(":")
    if not sep or not colon or not host or not port.isdigit():
        raise ValueError(f"not a routed URL: {url!r}")
    return scheme, host.strip("[]"), int(port), slash + path if slash else "/"
