"""Combining: ``A & B`` and ``A | B`` on the mitmproxy paths (reverse mode on ``data_path:
mitmproxy``, and the forward proxy, e.g. nova calling glance with the user's scope).

The routing addon leaves a combined decision in the flow's state; this addon answers it in the
``request`` hook (the body is in by then) with the worker's
:class:`~scoperouter.proxy.combined.Combiner`, the same one the lean data path calls: nothing is
sent upstream by mitmproxy (``flow.response`` is set before any connection is opened). Bodies
over mitmproxy's streaming threshold (``stream_large_bodies``, 1 MiB) and chunked ones never
reach that hook whole: such a request is refused with 413 when its head arrives.
"""

from __future__ import annotations

from collections.abc import Awaitable

from mitmproxy import http

from scoperouter.errors import Reject, status_title
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.health import UpstreamHealth
from scoperouter.proxy.addons.identity import TokenSwap
from scoperouter.proxy.combined import Combiner, bodiless
from scoperouter.proxy.flowstate import REQUEST_ID_HEADER, FlowState, answer, is_chunked, state_of
from scoperouter.routing import Combined, Failover, FanOut

STREAM_LIMIT = 1024 * 1024  # engine.BASE_OPTIONS["stream_large_bodies"]
TOO_LARGE = (
    "a scope combining clouds ('&', '|') needs the request body whole: on this path at most "
    "1 MiB with a Content-Length; name one cloud for large or chunked uploads"
)


class Combining:
    def __init__(self, config: RouterConfig, health: UpstreamHealth, swap: TokenSwap) -> None:
        self.config = config
        self.combiner = Combiner(config, health, swap)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is None or flow.response is not None:
            return
        if not isinstance(state.decision, FanOut | Failover):
            return
        length = state.headers.get("content-length", "")
        too_long = length.isdigit() and int(length) > STREAM_LIMIT
        if flow.request.stream or is_chunked(state) or too_long:
            answer(flow, state, Reject(413, TOO_LARGE))

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        state = state_of(flow)
        if state is None or flow.response is not None:
            return None
        decision = state.decision
        if not isinstance(decision, FanOut | Failover):
            return None
        return self._answer(flow, state, decision)

    async def _answer(self, flow: http.HTTPFlow, state: FlowState, decision: Combined) -> None:
        request = flow.request
        reply = await self.combiner.answer(
            decision,
            state,
            request.method,
            state.headers,
            request.raw_content or b"",
            self._base(flow),
        )
        headers = [
            (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
            for name, value in reply.headers.items()
            if name != "content-length"
        ]
        headers.append((REQUEST_ID_HEADER.encode(), state.request_id.encode()))
        body = b"" if bodiless(request.method, reply.status) else reply.body
        response = http.Response.make(reply.status, body, headers)
        response.reason = status_title(reply.status)
        flow.response = response

    def _base(self, flow: http.HTTPFlow) -> str:
        """``scheme://host:port`` the client addressed: merged next links point there."""
        listener = self.config.by_spec.get(flow.client_conn.proxy_mode.full_spec)
        if listener is not None and listener.frontend is not None:
            return listener.frontend.url.base
        request = flow.request  # the forward proxy: the absolute URL's
        return f"{request.scheme}://{request.host}:{request.port}"

    def done(self) -> None:
        self.combiner.close()
