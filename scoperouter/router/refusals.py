"""Why the router answered a request itself: a reason from a fixed set, for
``scoperouter_refusals_total{reason}`` and the status page.

The reason is read from what the router decided (the status it answered with, whether a
timeout fired, the router's own message), never taken from the client: whatever a request
holds, the label is one of :data:`REASONS` (a bounded label set).
"""

from __future__ import annotations

from typing import Final

REASONS: Final = (
    "bad_request",  # a malformed request head or body, a header the router cannot use (400)
    "bad_scope",  # a scope that does not parse or cannot be followed (400)
    "unknown_cloud",  # a scope naming a cloud the federation does not have (400)
    "unknown_service",  # a cloud without the service the request is for (400)
    "not_in_catalog",  # no service of the catalog at that path / host (404, forward 403)
    "forbidden",  # a tunnel, a token or a frontend the router does not serve (401, 403, 405)
    "too_large",  # a head or a body past the limits (413, 414, 431)
    "timeout",  # the client (408) or an upstream (504) too slow
    "upstream_down",  # an upstream marked down by the breaker: failed fast (503)
    "upstream_failed",  # an upstream refused, reset or broke its answer (502)
    "overloaded",  # a combined request past the buffer budget (503 without a breaker)
    "loop",  # a routing loop (508)
    "not_implemented",  # a transfer coding, an expression the path cannot serve (501, 505)
    "misdirected",  # an absolute URL naming another host on a reverse frontend (421)
    "internal",  # the router itself failed (500)
    "other",  # any other status the router answered with itself
)

_BY_STATUS: Final = {
    400: "bad_request",
    401: "forbidden",
    403: "forbidden",
    404: "not_in_catalog",
    405: "forbidden",
    408: "timeout",
    413: "too_large",
    414: "too_large",
    421: "misdirected",
    431: "too_large",
    500: "internal",
    501: "not_implemented",
    502: "upstream_failed",
    503: "overloaded",
    504: "timeout",
    505: "not_implemented",
    508: "loop",
}


def refusal_reason(status: int, message: str | None = None) -> str:
    """The reason (one of :data:`REASONS`) of an answer the router gave itself with `status`
    and its own `message` (the texts of :mod:`scoperouter.routing`, :mod:`.health`, ...)."""
    reason = _BY_STATUS.get(status, "other")
    if message is None:
        return reason
    if status == 400:
        if message.startswith("invalid scope"):
            return "unknown_cloud" if "unknown cloud" in message else "bad_scope"
        if " has no " in message and message.endswith(" service"):
            return "unknown_service"
        if message.startswith("the scope names"):
            return "bad_scope"
    elif status == 403 and "of the federation catalog" in message:
        return "not_in_catalog"
    elif status == 503 and "is marked down" in message:
        return "upstream_down"
    return reason
