"""What the router remembers about one request, shared by its addons (in ``flow.metadata``).

The routing addon creates a :class:`FlowState` in ``requestheaders``; the others read and
complete it: the decision, the upstream connection being opened, which timeout fired, the final
status the router chose when it answers itself. :func:`answer` is the one way an addon answers
a request itself (a refusal), whatever stage the request is in.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from mitmproxy import http

from scoperouter.errors import Reject
from scoperouter.routing import Combined, Forward

if TYPE_CHECKING:
    from mitmproxy.connection import Server

META = "scoperouter"
REQUEST_ID_HEADER = "x-scope-request-id"
REJECT_HOST = "reject.scoperouter.invalid"
"""Where a refused request with a streamed body is sent: the routing addon's ``server_connect``
fails that connection before any I/O, and the client gets the refusal through the error path."""

_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
_PREFIX = f"req-{secrets.token_hex(4)}{os.getpid() & 0xFFFF:04x}"
_counter = itertools.count(1)


def request_id(received: str | None) -> str:
    """The id a previous router gave this request (when well-formed), else a new one: unique
    across processes (random prefix per process, then a counter), cheap (no uuid per request)."""
    if received is not None and _REQUEST_ID.match(received):
        return received
    return f"{_PREFIX}-{next(_counter):x}"


@dataclass(slots=True, kw_only=True)
class FlowState:
    request_id: str
    headers: Mapping[str, str]  # the request's header fields as received, lower-case names
    method: str
    path: str  # as the client sent it, without the query string (absolute in forward mode)
    started: float  # time.monotonic() when the request head was in
    decision: Forward | Reject | Combined | None = None
    server: Server | None = None  # the upstream connection opened for this flow, if any
    watches: Any = None  # the timeouts addon's timers for this flow
    timed_out: Literal["connect", "response"] | None = None
    status: int | None = None  # the status the router answered with on the error path
    message: str | None = None  # ... and why (for the log)
    logged: bool = False  # by the access log
    counted: bool = False  # by the metrics
    # A combined decision (A & B, A | B; proxy/combined.py): what each cloud did, for the log
    # ("CloudDown: it refused the connection; CloudTwo: 200"), and the cloud whose answer a
    # failover returned.
    tried: str | None = None
    answered: str | None = None


def begin(flow: http.HTTPFlow) -> FlowState:
    """Start the state of a new request (the first addon to see it calls this)."""
    request = flow.request
    path = request.path.partition("?")[0]
    if flow.client_conn.proxy_mode.type_name == "regular":  # forward proxy: absolute URL
        path = f"{request.scheme}://{request.host}:{request.port}{path}"
    state = new_state(request.method, path, header_map(request.headers))
    flow.metadata[META] = state
    return state


def new_state(
    method: str, path: str, headers: Mapping[str, str], started: float | None = None
) -> FlowState:
    """The state of a request whose head is in (both data paths start a request here)."""
    return FlowState(
        request_id=request_id(headers.get(REQUEST_ID_HEADER)),
        headers=headers,
        method=method,
        path=path,
        started=time.monotonic() if started is None else started,
    )


class HeadRefusal(Protocol):
    """A request refused while its head was read, before any hook (both data paths)."""

    @property
    def status(self) -> int: ...
    @property
    def message(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def client_address(self) -> str | None: ...


def header_map(headers: http.Headers) -> dict[str, str]:
    """Lower-case name -> value (repeated fields joined with ", ", as mitmproxy does), in one
    pass over the fields: a lookup by name in mitmproxy's Headers scans them all, so reading
    them name by name would be quadratic in the number of fields."""
    found: dict[str, str] = {}
    for raw_name, raw_value in headers.fields:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("utf-8", "surrogateescape")
        found[name] = f"{found[name]}, {value}" if name in found else value
    return found


def set_headers(headers: http.Headers, edits: Mapping[str, str]) -> None:
    """Set these fields (lower-case names), replacing any of the same name, in one pass."""
    names = {name.encode("latin-1") for name in edits}
    kept = tuple(field for field in headers.fields if field[0].lower() not in names)
    headers.fields = kept + tuple(
        (name.encode("latin-1"), value.encode("utf-8", "surrogateescape"))
        for name, value in edits.items()
    )


def state_of(flow: http.HTTPFlow) -> FlowState | None:
    state = flow.metadata.get(META)
    return state if isinstance(state, FlowState) else None


def answer(flow: http.HTTPFlow, state: FlowState, reject: Reject) -> None:
    """Answer the request with `reject` (OpenStack JSON); nothing is sent upstream."""
    state.decision = reject
    request = flow.request
    if request.stream or is_chunked(state):
        # A body too large to buffer is on its way: mitmproxy cannot answer from a hook while
        # it streams, so send the request nowhere (see Routing.server_connect) and answer
        # through the error path, closing the connection.
        request.headers.pop("expect", None)  # no "100 Continue" for a refused body
        request.stream = True  # fail now, not after buffering the first MiB
        request.scheme = "http"
        request.data.host = REJECT_HOST
        request.data.port = 9
        return
    flow.response = json_response(reject)


def json_response(reject: Reject) -> http.Response:
    """The response for `reject`: OpenStack JSON, with the standard reason phrase."""
    response = http.Response.make(
        reject.status, reject.body(), {"Content-Type": "application/json"}
    )
    response.reason = reject.title  # mitmproxy's table lacks some (508 Loop Detected)
    return response


def is_chunked(state: FlowState) -> bool:
    """The request's body comes in chunks (its length is not known in advance)."""
    return "chunked" in state.headers.get("transfer-encoding", "").lower()
