"""What the client gets when a forwarded request fails: one wording per failure.

* the upstream failed: 502 (refused, reset, garbage) or 504 (connect or response timeout),
  naming the cloud and service; another cloud's router is named with its address, a backend
  of this cloud is not (its address is not for clients to see);
* the upstream is this router itself: 508 (a loop the config did not show);
* the client's own fault: it went away (499, nothing is sent).
"""

from __future__ import annotations

from typing import Literal

from scoperouter.router.config import RouterConfig
from scoperouter.router.targets import base_url
from scoperouter.routing import Forward

CLIENT_GONE_STATUS = 499  # nginx's "client closed request": nothing is sent to anyone
CLIENT_GONE = "the client went away"
INTERNAL_ERROR = "the router failed to route this request (see its log)"

TimedOut = Literal["connect", "response"]


def loop_failure(config: RouterConfig, decision: Forward) -> tuple[int, str]:
    """The upstream is an address of this router itself (a loop the config did not show)."""
    target = (
        base_url(decision.url)
        if decision.remote
        else f"the {decision.service_type} backend of {decision.cloud}"
    )
    return 508, (
        f"routing loop: {target} is an address of the router of {config.cloud} "
        "itself; check the federation config"
    )


def upstream_failure(
    config: RouterConfig,
    decision: Forward,
    timed_out: TimedOut | None,
    reason: str,
    *,
    connected: bool,
    host: str,
) -> tuple[int, str]:
    """Status and message for a forwarded request whose upstream failed: `reason` is the
    connection error, `connected` whether a connection was up, `host` the upstream's host
    (hidden from clients when it is a backend of this cloud)."""
    if decision.remote:
        what = f"the router of {decision.cloud} for the {decision.service_type} service"
        where = f" at {base_url(decision.url)}"
    else:  # the backend addresses of this cloud are not for clients to see
        what = f"the {decision.service_type} service of {decision.cloud}"
        where = ""
        reason = _hide_address(reason, host)
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
