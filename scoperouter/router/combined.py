"""The router's side of ``A & B`` and ``A | B``: the executor wired to the router's parts.

:func:`scoperouter.router.fanout.execute` runs a combined decision (``routing.decide(...,
combined=True)``) with a *send function*; a :class:`Combiner`, one per worker process, makes
it from the router's parts and a :data:`Transmit` the engine gives (the worker's upstream pool:
single-cloud and combined requests share its connections and its one exchange client):

* **Each part's request** carries the decision's header edits (completed scope naming that
  cloud alone, the hop count), the request id and the client's ``Host``.
* **Timeouts** per destination kind (``settings.timeouts(forward.remote)``: backends vs peer
  routers): the connect timeout bounds the connect, the response timeout the wait for the
  answer's head and then for its body.
* **Peer health**: the router's circuit breaker
  (:class:`~scoperouter.router.health.UpstreamHealth`) is the executor's ``is_down``
  (``admit``: a cloud marked down is skipped without waiting, or probed once its down period
  is over) and hears every outcome (``report``: refusals and timeouts count, any answer clears
  them), so after one timeout the next ``A | B`` request goes straight to B, and a
  single-cloud request to A fails fast too (one breaker).
* **Identity**: a part leaving the cloud gets its tokens swapped for the router's own in
  that cloud (``Forward.swap_tokens``); a token validation's answer gets its catalog region
  twins (:func:`~scoperouter.router.region.regioned`).
* **Loops**: the hop count was checked by ``decide``; an address of this router is never
  connected to.

The answer is buffered (``fanout.MAX_BODY``, 32 MiB, per cloud and for the request body):
``&`` merges JSON lists, and ``|`` needs the request again for the next cloud. Large transfers
(image data) stream on the single-cloud path.

**Cost** (``settings.combine``): a request whose expression names more clouds than
``max_parts`` (or more distinct clouds than ``max_clouds``) is a 400; the executor asks each
cloud at most once per request; what a request buffers (its body, the clouds' answers as they
arrive) is reserved on the worker's :class:`~scoperouter.router.budget.Budget`
(``buffer_mib``) and released when its answer is made, whatever happened: past it, a 503.

What each cloud did goes into the request's :class:`~scoperouter.router.state.RequestState`
for its one access log line (``tried``) and the metrics.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from scoperouter.errors import Reject, error_body
from scoperouter.failover import Failure
from scoperouter.router import fanout
from scoperouter.router.budget import MIB, TRIM_AFTER, Budget, Lease, trim_soon
from scoperouter.router.config import RouterConfig
from scoperouter.router.health import UpstreamHealth
from scoperouter.router.region import regioned
from scoperouter.router.state import REQUEST_ID_HEADER, RequestState
from scoperouter.router.targets import split_url
from scoperouter.router.tokens import TokenSwap
from scoperouter.routing import Combined, FanOut, Forward
from scoperouter.semantics import HOP_BY_HOP, header_map

logger = logging.getLogger("scoperouter")

MAX_BODY = fanout.MAX_BODY
BODY_TOO_LARGE = (
    f"the request body is larger than {MAX_BODY // (1024 * 1024)} MiB: a scope combining "
    "clouds ('&', '|') buffers it; name one cloud for large transfers"
)
INTERNAL_ERROR = "the router failed to combine the clouds' answers (see its log)"
RETRY_AFTER = "5"  # seconds: a combined request holds the budget for about that long at most

_HOP = HOP_BY_HOP
# Not passed on to the clouds: the sender sets them, or the buffered exchange makes them moot
# (accept-encoding: the merge reads the clouds' JSON, so it must come uncompressed).
_NOT_SENT = _HOP | {"host", "accept-encoding", REQUEST_ID_HEADER}
_NOT_RETURNED = _HOP | {REQUEST_ID_HEADER}
_BODILESS_STATUS = (204, 304)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One part's request, ready for the engine to send."""

    scheme: str
    host: str
    port: int
    target: str  # path and query
    method: str
    headers: Mapping[str, str]  # every field to send, Host and Content-Length included
    body: bytes
    remote: bool  # to a peer router (its TLS link and trust), else a backend
    connect_timeout: float
    response_timeout: float
    reserve: Callable[[int], bool] | None = None  # asked before each piece of the answer is kept


@dataclass(frozen=True, slots=True)
class Received:
    """An upstream's answer, read whole."""

    status: int
    fields: list[tuple[bytes, bytes]]
    body: bytes


class TransmitError(Exception):
    """No whole answer: how (`kind`), why (`reason`), and whether its head had come."""

    def __init__(
        self,
        kind: Literal[
            "connect_timeout", "unreachable", "timeout", "broken", "too_large", "over_budget"
        ],
        reason: str,
        answered: bool,
    ) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.answered = kind, reason, answered


Transmit = Callable[[Outgoing], Awaitable[Received]]
"""The engine's way to send one part and read its answer whole (:class:`TransmitError`)."""


class Combiner:
    """Runs combined decisions for one worker process."""

    def __init__(
        self, config: RouterConfig, health: UpstreamHealth, tokens: TokenSwap, transmit: Transmit
    ) -> None:
        self.config = config
        self.health = health
        self.tokens = tokens
        self.transmit = transmit
        self.budget = Budget()  # bytes this worker's combined requests hold buffered

    async def answer(
        self,
        decision: Combined,
        state: RequestState,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        base_url: str,
    ) -> fanout.Reply:
        """The answer to a combined request (`headers` as received, lower-case names;
        `base_url`: ``scheme://host:port`` the client addressed). Never raises but for
        cancellation: a failure of the router itself is a 500, logged."""
        limits = self.config.current().settings.combine
        too_many = _too_many(decision, limits.max_parts, limits.max_clouds)
        if too_many is not None:
            state.message = too_many
            return fanout.error_reply(400, too_many)
        lease = self.budget.lease(limits.buffer_mib * MIB)
        run = _Run(self, state, lease)
        request = fanout.Request(method, _outgoing(headers), body)
        try:
            if not lease.reserve(len(body)):
                reply = _over_budget(lease)
            else:
                reply = await fanout.execute(
                    decision,
                    request,
                    run.send,
                    base_url=base_url,
                    timeout=run.deadline,
                    is_down=run.is_down,
                    report=run.report,
                )
                if lease.refused:
                    reply = _over_budget(lease)
        except Exception:
            logger.exception("combining clouds failed for %s %s", state.method, state.path)
            reply = fanout.error_reply(500, INTERNAL_ERROR)
        finally:
            if lease.held >= TRIM_AFTER:
                trim_soon()
            lease.release()
        state.tried = "; ".join(text for _, text in sorted(run.tried)) or None
        state.answered = run.answered
        if reply.status >= 400 and not any(reply is r for r in run.replies):
            state.message = _message(reply)  # the router's own error answer
        return reply


class _Run:
    """One combined request: the executor's hooks, and what each cloud did."""

    def __init__(self, combiner: Combiner, state: RequestState, lease: Lease) -> None:
        self.combiner = combiner
        self.state = state
        self.lease = lease
        self.settings = combiner.config.current().settings
        self.checked: set[int] = set()  # forwards the executor asked is_down about
        self.kinds: dict[int, str] = {}  # forward -> how its attempt failed (for report)
        self.statuses: dict[int, int] = {}
        self.replies: list[fanout.Reply] = []  # the clouds' own answers
        self.tried: list[tuple[int, str]] = []  # (when the cloud was first asked about, what)
        self.order: dict[int, int] = {}  # forward -> that position: the expression's order
        self.answered: str | None = None

    # -- the executor's hooks

    def deadline(self, forward: Forward) -> float:
        """A bound over one attempt: the engine's own timeouts fire first."""
        connect, response = self.settings.timeouts(forward.remote)
        return connect + 2 * response + 1.0

    def _note(self, forward: Forward, what: str) -> None:
        self.tried.append((self.order.setdefault(id(forward), len(self.order)), what))

    def is_down(self, forward: Forward) -> str | None:
        self.checked.add(id(forward))
        self.order.setdefault(id(forward), len(self.order))
        refusal = self.combiner.health.admit(forward)
        if refusal is None:
            return None
        self._note(forward, f"{forward.cloud}: skipped, marked down")
        return refusal.message

    def report(self, forward: Forward, failure: str | None) -> None:
        key = id(forward)
        kind = self.kinds.pop(key, None)
        health = self.combiner.health
        if failure is None:
            self._note(forward, f"{forward.cloud}: {self.statuses.pop(key, '-')}")
            self.answered = forward.cloud
            if kind != "local":  # the router answered itself (token swap refused)
                health.succeeded(forward)
            return
        self._note(forward, f"{forward.cloud}: {failure}")
        if kind in ("down", "loop", "budget"):
            return  # nothing new about the upstream
        if kind == "too_large":
            health.succeeded(forward)  # it answered; the size is no fault of its
        elif kind in ("connect", "response"):
            health.failed(forward, kind, failure)
        elif failure.startswith("it did not answer within"):  # the executor's bound
            health.failed(forward, "response", failure)
        else:
            health.failed(forward, None, failure)

    # -- the send function

    async def send(self, forward: Forward, url: str, request: fanout.Request) -> fanout.Reply:
        key = id(forward)
        # Before any await: a fan-out's parts start in the expression's order.
        self.order.setdefault(key, len(self.order))
        combiner = self.combiner
        if self.lease.refused:  # the request gets the 503: nothing more is sent
            self.kinds[key] = "budget"
            raise fanout.SendError(Failure.NOT_SENT, OVER_BUDGET)
        if key not in self.checked:  # a part of A & B: the breaker's fast refusal applies
            refusal = combiner.health.admit(forward)
            if refusal is not None:
                self.kinds[key] = "down"
                raise fanout.SendError(Failure.NOT_SENT, refusal.message)
        scheme, host, port, target = split_url(url)
        if (host, port) in combiner.config.own_addresses:
            self.kinds[key] = "loop"
            raise fanout.SendError(
                Failure.NOT_SENT,
                f"{scheme}://{host}:{port} is an address of this router (a routing loop; "
                "check the federation config)",
            )
        edits = await combiner.tokens.swap(self.state, forward)
        if isinstance(edits, Reject):
            self.kinds[key] = "local"
            self.statuses[key] = edits.status
            return fanout.error_reply(edits.status, edits.message)
        connect_timeout, response_timeout = self.settings.timeouts(forward.remote)
        outgoing = Outgoing(
            scheme,
            host,
            port,
            target,
            request.method,
            self._headers(request, host, port, edits),
            request.body,
            forward.remote,
            connect_timeout,
            response_timeout,
            self.lease.reserve,
        )
        try:
            received = await combiner.transmit(outgoing)
        except TransmitError as exc:
            raise self._failed(key, exc, connect_timeout, response_timeout) from None
        headers = _returned(
            received.fields,
            keep_length=request.method == "HEAD" or received.status in _BODILESS_STATUS,
        )
        body = received.body
        region = forward.catalog_region
        if region and received.status == 200:
            body = regioned(body, region, 200, headers.get("content-type", "")) or body
        reply = fanout.Reply(received.status, headers, body)
        self.statuses[key] = reply.status
        self.replies.append(reply)
        return reply

    def _headers(
        self, request: fanout.Request, host: str, port: int, edits: Mapping[str, str]
    ) -> dict[str, str]:
        headers = {"host": self.state.headers.get("host") or f"{host}:{port}"}
        headers.update(request.headers)
        headers.update(edits)
        headers[REQUEST_ID_HEADER] = self.state.request_id
        if request.body or request.method in ("POST", "PUT", "PATCH"):
            headers["content-length"] = str(len(request.body))
        return headers

    def _failed(
        self, key: int, exc: TransmitError, connect_timeout: float, response_timeout: float
    ) -> fanout.SendError:
        """The executor's error for a part that got no whole answer (one wording each)."""
        if exc.kind == "connect_timeout":
            self.kinds[key] = "connect"
            return fanout.SendError(
                Failure.NOT_SENT, f"it did not accept a connection within {connect_timeout:g}s"
            )
        if exc.kind == "unreachable":
            return fanout.SendError(Failure.NOT_SENT, _unreachable(exc.reason))
        if exc.kind == "timeout":
            self.kinds[key] = "response"
            if exc.answered:
                return fanout.SendError(
                    Failure.TIMEOUT, f"its answer did not end within {response_timeout:g}s"
                )
            return fanout.SendError(
                Failure.TIMEOUT, f"it did not answer within {response_timeout:g}s"
            )
        if exc.kind == "over_budget":
            self.kinds[key] = "too_large"  # it answered: no fault of its
            return fanout.SendError(Failure.BROKEN, OVER_BUDGET)
        if exc.kind == "too_large":
            self.kinds[key] = "too_large"
            return fanout.SendError(
                Failure.BROKEN, f"{exc.reason}; name one cloud for large transfers"
            )
        if exc.answered:
            return fanout.SendError(Failure.BROKEN, f"its answer broke off ({exc.reason})")
        return fanout.SendError(
            Failure.BROKEN, f"the connection broke before its answer ({exc.reason})"
        )


OVER_BUDGET = "not asked: the router's buffer for combined requests is full"


def _too_many(decision: Combined, max_parts: int, max_clouds: int) -> str | None:
    """The 400's message for an expression over ``settings.combine``'s caps, else None. It
    says how many, never the expression (up to 1,024 characters of the client's)."""
    clouds: list[str] = []
    pending: list[Forward | Combined] = [decision]
    while pending:
        node = pending.pop()
        if isinstance(node, Forward):
            clouds.append(node.cloud)
        elif isinstance(node, FanOut):
            pending.extend(part for _, part in node.parts)
        else:
            pending.extend(node.candidates)
    distinct = len(set(clouds))
    if len(clouds) <= max_parts and distinct <= max_clouds:
        return None
    return (
        f"the scope for {decision.service_type!r} combines {len(clouds)} cloud names "
        f"({distinct} distinct clouds) in one request; this router combines at most "
        f"{max_parts} names and {max_clouds} distinct clouds (settings.combine): name fewer"
    )


def _over_budget(lease: Lease) -> fanout.Reply:
    """The 503 of a request refused by the worker's budget; Retry-After when other requests
    held part of it (it frees as they end), none when this request alone needs more."""
    mib = lease.limit // MIB
    if lease.crowded:
        message = (
            f"the router's buffer for combined requests ({mib} MiB per worker, "
            "settings.combine.buffer_mib) is in use by other requests: retry later"
        )
        extra = {"retry-after": RETRY_AFTER}
    else:
        message = (
            f"the clouds' answers to this request are larger than the router's buffer for "
            f"combined requests ({mib} MiB per worker, settings.combine.buffer_mib): ask for "
            "fewer items (limit) or name fewer clouds"
        )
        extra = {}
    headers = {"content-type": "application/json", **extra}
    return fanout.Reply(503, headers, error_body(503, message))


def _outgoing(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's header fields that go on to the clouds."""
    drop = _NOT_SENT | _tokens(headers.get("connection"))
    return {name: value for name, value in headers.items() if name not in drop}


def _returned(fields: list[tuple[bytes, bytes]], keep_length: bool) -> dict[str, str]:
    """A cloud's header fields that go back to the client (lower-case names)."""
    found = header_map(fields)
    drop = _NOT_RETURNED | _tokens(found.get("connection"))
    if keep_length:
        drop = drop - {"content-length"}
    return {name: value for name, value in found.items() if name not in drop}


def _tokens(connection: str | None) -> frozenset[str]:
    if not connection:
        return frozenset()
    return frozenset(t.strip().lower() for t in connection.split(",") if t.strip())


def _unreachable(reason: str) -> str:
    if "Connect call failed" in reason or "refused" in reason.lower():
        return "it refused the connection"
    if reason.startswith("TLS "):  # worded as for a single-cloud request
        return reason
    return f"it is unreachable ({reason})"


def _message(reply: fanout.Reply) -> str | None:
    try:
        message = json.loads(reply.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return message if isinstance(message, str) else None
