"""ErrorAnswers: what the client gets when a request fails after routing.

In the ``error`` hook the router decides the status and the OpenStack JSON message that
mitmproxy's error page will carry (see :mod:`scoperouter.proxy.mitm`, item 1):

* the upstream failed: 502 (refused, reset, garbage) or 504 (connect or response timeout),
  naming the cloud and service; another cloud's router is named with its address, a backend
  of this cloud is not (its address is not for clients to see);
* the upstream is this router itself: 508 (a loop the config did not show);
* a refusal of a request whose body was streaming: the refusal's own status and message;
* the client's own fault: it went away (499, nothing is sent) or sent a malformed body (400).

The status is kept in the flow's state for the access log and the metrics.
"""

from __future__ import annotations

from mitmproxy import http

from scoperouter.errors import Reject
from scoperouter.proxy import mitm
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.routing import LOOP_MESSAGE
from scoperouter.proxy.flowstate import FlowState, state_of
from scoperouter.routing import Forward

CLIENT_GONE_STATUS = 499  # nginx's "client closed request": nothing is sent to anyone


class ErrorAnswers:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def error(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state is None or flow.error is None:
            return
        decision = state.decision
        if mitm.client_went_away(flow):
            state.status, state.message = CLIENT_GONE_STATUS, "the client went away"
            return
        if mitm.client_protocol_error(flow):
            state.status = 400
            state.message = f"malformed request body: {flow.error.msg}"
            mitm.set_error_response(flow, 400, state.message)
            return
        if isinstance(decision, Reject):
            status, message = decision.status, decision.message
        elif isinstance(decision, Forward):
            # Used only if mitmproxy renders an error response now (not when the response had
            # already started, e.g. an upstream that dies in the middle of a body).
            status, message = self.upstream_failure(flow, decision, state)
        else:
            return
        state.status, state.message = status, message
        mitm.set_error_response(flow, status, message)

    def upstream_failure(
        self, flow: http.HTTPFlow, decision: Forward, state: FlowState
    ) -> tuple[int, str]:
        """Status and message for a forwarded request whose upstream failed."""
        assert flow.error is not None
        server = state.server or flow.server_conn
        return upstream_failure(
            self.config,
            decision,
            state.timed_out,
            flow.error.msg,
            connected=server.timestamp_tcp_setup is not None,
            host=flow.request.host,
        )


def upstream_failure(
    config: RouterConfig,
    decision: Forward,
    timed_out: str | None,
    reason: str,
    *,
    connected: bool,
    host: str,
) -> tuple[int, str]:
    """Status and message for a forwarded request whose upstream failed (both data paths):
    `reason` is the connection error, `connected` whether TCP was up, `host` the upstream's
    host (hidden from clients when it is a backend of this cloud)."""
    if LOOP_MESSAGE in reason:
        target = (
            _base(decision.url)
            if decision.remote
            else f"the {decision.service_type} backend of {decision.cloud}"
        )
        return 508, (
            f"routing loop: {target} is an address of the router of {config.cloud} "
            "itself; check the federation config"
        )
    if decision.remote:
        what = f"the router of {decision.cloud} for the {decision.service_type} service"
        where = f" at {_base(decision.url)}"
    else:  # the backend addresses of this cloud are not for clients to see
        what = f"the {decision.service_type} service of {decision.cloud}"
        where = ""
        reason = _hide_address(reason, host)
    if timed_out is None and mitm.CONNECT_TIMEOUT_MESSAGE in reason:
        timed_out = "connect"
    connect_timeout, response_timeout = config.current().settings.timeouts(decision.remote)
    if timed_out == "connect":
        return 504, f"timed out after {connect_timeout:g}s connecting to {what}{where}"
    if timed_out == "response":
        return 504, f"{what}{where} did not answer within {response_timeout:g}s"
    if not connected:
        return 502, f"{what} is unreachable{where}: {reason}"
    return 502, f"{what}{where} failed: {reason}"


def _hide_address(reason: str, host: str) -> str:
    if "Connect call failed" in reason:  # OSError text: "[Errno 111] Connect call failed (addr)"
        return "connection refused"
    return reason.replace(host, "<backend>")


def _base(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"
