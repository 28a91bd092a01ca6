"""What the router remembers about one request while it answers it (whatever engine carries it).

:func:`new_state` starts it when the request head is in; the pipeline's steps complete it: the
decision, which timeout fired, the status and message the router answered with itself, what
each cloud of a combined request did; the access log and the metrics read it once each.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from scoperouter.errors import Reject
from scoperouter.routing import Combined, Forward

REQUEST_ID_HEADER: Final = "x-scope-request-id"

_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
_PREFIX: Final = f"req-{secrets.token_hex(4)}{os.getpid() & 0xFFFF:04x}-"


class _Sequence:
    """This process's count of request ids made (an attribute: compiled, an increment and a
    decimal text cost ~50 ns, where ``f"{next(counter):x}"`` cost ~450)."""

    def __init__(self) -> None:
        self.last = 0


_SEQUENCE: Final = _Sequence()


def request_id(received: str | None) -> str:
    """The id a previous router gave this request (when well-formed), else a new one: unique
    across processes (random prefix per process, then a counter), cheap (no uuid per request)."""
    if received is not None and _REQUEST_ID.match(received):
        return received
    _SEQUENCE.last += 1
    return _PREFIX + str(_SEQUENCE.last)


# __init__ written out: dataclasses' is Python code even in the compiled build (one per request)
@dataclass(slots=True, kw_only=True, init=False)
class RequestState:
    request_id: str
    headers: Mapping[str, str]  # the request's header fields as received, lower-case names
    method: str
    path: str  # without the query string (an absolute URL on the forward proxy)
    started: float  # time.monotonic() when the request head was in
    decision: Forward | Reject | Combined | None = None
    authority: str | None = None  # an absolute-form target's: the Host sent on (RFC 9112 3.2.2)
    timed_out: Literal["connect", "response"] | None = None
    status: int | None = None  # the status the router answered with itself
    message: str | None = None  # ... and why (for the log)
    logged: bool = False  # by the access log
    counted: bool = False  # by the metrics
    # A combined decision (A & B, A | B; router/combined.py): what each cloud did, for the log
    # ("CloudDown: it refused the connection; CloudTwo: 200"), and the cloud whose answer a
    # failover returned.
    tried: str | None = None
    answered: str | None = None
    # The identity fields dropped from the client's head (only keystonemiddleware sets them):
    # their names, for the log (never their values).
    stripped: tuple[str, ...] = ()

    # fmt: off
    def __init__(
        self, *, request_id: str, headers: Mapping[str, str], method: str, path: str,
        started: float, decision: Forward | Reject | Combined | None = None,
        authority: str | None = None, timed_out: Literal["connect", "response"] | None = None,
        status: int | None = None, message: str | None = None, logged: bool = False,
        counted: bool = False, tried: str | None = None, answered: str | None = None,
        stripped: tuple[str, ...] = (),
    ) -> None:
        self.request_id, self.headers, self.method, self.path = request_id, headers, method, path
        self.started, self.decision, self.authority = started, decision, authority
        self.timed_out, self.status, self.message = timed_out, status, message
        self.logged, self.counted, self.tried, self.answered = logged, counted, tried, answered
        self.stripped = stripped
    # fmt: on


def new_state(
    method: str, path: str, headers: Mapping[str, str], started: float | None = None
) -> RequestState:
    """The state of a request whose head is in."""
    return RequestState(
        request_id=request_id(headers.get(REQUEST_ID_HEADER)),
        headers=headers,
        method=method,
        path=path,
        started=time.monotonic() if started is None else started,
    )


class HeadRefusal(Protocol):
    """A request refused while its head was read, before the pipeline saw it (the HTTP
    server's and the forward proxy's refusals)."""

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
