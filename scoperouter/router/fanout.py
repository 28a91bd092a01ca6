"""Running ``A & B`` and ``A | B`` decisions: engine-neutral, async.

``routing.decide(..., combined=True)`` returns a :class:`~scoperouter.routing.FanOut` or a
:class:`~scoperouter.routing.Failover`; :func:`execute` carries it out with a *send function*
the engine supplies (the router's per-process upstream pool, or :func:`httpx_sender` around
an ``httpx.AsyncClient``), so this module opens no connection of
its own and knows nothing of mitmproxy or httptools.

* A fan-out sends one request per cloud at once, each with its own timeout, and merges the
  answers with :func:`scoperouter.merge.merge_list` (a list), or answers with the one cloud
  that has the resource, :func:`scoperouter.merge.find_one` (a read by id).
* A failover tries the candidates in order (:mod:`scoperouter.failover` says when to move on),
  skipping those the engine's peer health marks down (`is_down`), and tells the engine each
  attempt's outcome (`report`) so that its circuit breaker learns from it.

The router plugs in its own parts (:mod:`scoperouter.router.combined`): the worker's upstream
pool as the send function, its circuit breaker (:mod:`scoperouter.router.health`) as `is_down`
and `report`; this module imports none of them.

**Each cloud is asked at most once per request** (the cost of a request is linear in the
clouds it names): the parser keeps a part once (``A & A`` is ``A``), and a later candidate of
a failover naming a cloud already asked (``(A & B) | A``: every cloud, else A's alone) reuses
that cloud's outcome, its answer or its failure, instead of asking again; one that would need
another request of it (another query) fails without being sent.

Bodies are buffered: ``&`` reads lists and single resources, and a ``|`` request with a body
needs it again for the next candidate. Large transfers (images) keep the engine's streaming
path with one cloud.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from scoperouter.errors import error_body
from scoperouter.failover import (
    Failure,
    IsDown,
    Report,
    Skipped,
    all_down_message,
    classify,
    exhausted_message,
    moves_on,
)
from scoperouter.merge import CloudAnswer, CloudFailure, ListPlan, find_one, merge_list
from scoperouter.routing import Failover, FanOut, Forward
from scoperouter.semantics import HOP_BY_HOP

if TYPE_CHECKING:
    import httpx

# Not forwarded: hop-by-hop fields, and those the sender sets itself.
_DROPPED = HOP_BY_HOP | {"host"}
MAX_BODY = 32 * 1024 * 1024  # one cloud's answer to a merged list or a failover request


@dataclass(frozen=True, slots=True)
class Request:
    """The client's request, once its head (and small body) has arrived."""

    method: str
    headers: Mapping[str, str]  # lower-case names, as the client sent them
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer: a cloud's, or the one made here (merged list, error)."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""


class SendError(Exception):
    """Raised by a send function when no answer came: how it failed, and why in words."""

    def __init__(self, failure: Failure, reason: str) -> None:
        super().__init__(reason)
        self.failure = failure
        self.reason = reason


Send = Callable[[Forward, str, Request], Awaitable[Reply]]
"""``send(forward, url, request)``: send `request` to `url` (``forward.url`` or the same with a
fan-out's per-cloud query), with ``forward.set_headers`` already applied to its headers. The
engine applies what else the Forward asks (token swaps, catalog region) and raises
:class:`SendError` when no answer comes; ``Failure.NOT_SENT`` only when nothing was sent."""

Timeout = float | Callable[[Forward], float]
"""Seconds to wait for one destination's answer, or how the engine computes it per forward."""


async def execute(
    decision: FanOut | Failover,
    request: Request,
    send: Send,
    *,
    base_url: str,
    timeout: Timeout,
    is_down: IsDown | None = None,
    report: Report | None = None,
) -> Reply:
    """The answer to a combined decision. `base_url` is ``scheme://host:port`` of the router
    as the client addressed it (merged lists' next links point there)."""
    runner = _Runner(request, send, base_url, timeout, is_down, report)
    if isinstance(decision, FanOut):
        return await runner.fan_out(decision, None)
    return await runner.failover(decision, None)


class _Runner:
    def __init__(
        self,
        request: Request,
        send: Send,
        base_url: str,
        timeout: Timeout,
        is_down: IsDown | None,
        report: Report | None,
    ) -> None:
        self.request = request
        self.send = send
        self.base_url = base_url
        self.timeout = timeout
        self.is_down = is_down
        self.report = report
        # Asked once per request: on CPython 3.11 each call makes a getpid() system call.
        self.loop = asyncio.get_running_loop()
        # cloud -> (what it was asked, its outcome): each cloud is asked once per request
        self.asked: dict[str, tuple[tuple[object, ...], asyncio.Future[Reply | SendError]]] = {}

    async def fan_out(self, decision: FanOut, query: str | None) -> Reply:
        """Every part at once; `query` is ignored (a fan-out sets each part's own)."""
        plan = decision.plan
        parts = dict(decision.parts)
        asked = plan.asked
        # Every part's query first (nothing runs yet if one fails), then the tasks, made on the
        # known loop: gather would ask asyncio for it once per part.
        calls = [(parts[label], plan.query_for(label)) for label in asked]
        create = self.loop.create_task
        results = await asyncio.gather(*[create(self._part(part, query)) for part, query in calls])
        answers = dict(zip(asked, results, strict=True))
        if isinstance(plan, ListPlan):
            merged = merge_list(plan, answers, self.base_url)
        else:
            merged = find_one(plan, answers)
        return Reply(merged.status, _lower(merged.headers), merged.body)

    async def _part(
        self, part: Forward | Failover, query: str | None
    ) -> CloudAnswer | CloudFailure:
        if isinstance(part, Failover):
            reply = await self.failover(part, query)
            return CloudAnswer(reply.status, reply.headers, reply.body)
        outcome = await self._attempt(part, query)
        if isinstance(outcome, SendError):
            status = 504 if outcome.failure is Failure.TIMEOUT else 502
            return CloudFailure(status, outcome.reason)
        return CloudAnswer(outcome.status, outcome.headers, outcome.body)

    async def failover(self, decision: Failover, query: str | None) -> Reply:
        """The candidates in order. Peer health is asked about each one just before it would
        be tried (not about those after the one that answers: a cloud past its down period is
        probed only when it is needed)."""
        method = self.request.method
        skipped: list[Skipped[Forward]] = []
        failures: list[tuple[str, str]] = []
        outcome: Reply | SendError | None = None
        for candidate in decision.candidates:
            if isinstance(candidate, FanOut):
                outcome = await self.fan_out(candidate, query)
                name = candidate.expression
            else:
                reason = None if self.is_down is None else self.is_down(candidate)
                if reason is not None:
                    skipped.append(Skipped(candidate, reason))
                    failures.append((candidate.cloud, reason))
                    continue
                outcome = await self._attempt(candidate, query)
                name = candidate.cloud
            if isinstance(outcome, SendError):
                failure: Failure | None = outcome.failure
                failures.append((name, outcome.reason))
            else:
                failure = classify(outcome.status, None)
                if failure is not None:
                    failures.append((name, f"it answered {outcome.status}"))
            if not moves_on(method, failure):
                break
        if outcome is None:
            return error_reply(503, all_down_message(skipped))
        if isinstance(outcome, Reply):
            return outcome  # the answer, or the last cloud's own error answer
        status = 504 if outcome.failure is Failure.TIMEOUT else 502
        return error_reply(status, exhausted_message(decision.service_type, failures))

    async def _attempt(self, forward: Forward, query: str | None) -> Reply | SendError:
        url = forward.url if query is None else forward.url.partition("?")[0] + query
        what = _what(forward, url)
        earlier = self.asked.get(forward.cloud)
        if earlier is not None:  # asked already in this request: never twice
            if earlier[0] == what:
                return await earlier[1]
            return SendError(Failure.NOT_SENT, ASKED_ALREADY)
        outcome_of: asyncio.Future[Reply | SendError] = self.loop.create_future()
        self.asked[forward.cloud] = (what, outcome_of)
        outcome = await self._send_once(forward, url)
        outcome_of.set_result(outcome)
        return outcome

    async def _send_once(self, forward: Forward, url: str) -> Reply | SendError:
        headers = {k: v for k, v in self.request.headers.items() if k not in _DROPPED}
        headers.update(forward.set_headers)
        request = Request(self.request.method, headers, self.request.body)
        seconds = self.timeout if isinstance(self.timeout, (float, int)) else self.timeout(forward)
        try:
            # (wait_for would make a task per part; timeout_at spares asking for the loop)
            async with asyncio.timeout_at(self.loop.time() + seconds):
                reply = await self.send(forward, url, request)
        except SendError as exc:
            outcome: Reply | SendError = exc
        except TimeoutError:
            outcome = SendError(Failure.TIMEOUT, f"it did not answer within {seconds:g}s")
        else:
            outcome = reply
        if self.report is not None:
            self.report(forward, outcome.reason if isinstance(outcome, SendError) else None)
        return outcome


ASKED_ALREADY = (
    "not asked again: it was asked with another query earlier in this request (a request "
    "asks each cloud once)"
)


def _what(forward: Forward, url: str) -> tuple[object, ...]:
    """What a request to `url` asks, whatever the order of its query's parameters: a cloud's
    earlier outcome is reused for the same question only."""
    base, _, query = url.partition("?")
    return (forward.remote, base, tuple(sorted(parse_qsl(query, keep_blank_values=True))))


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def error_reply(status: int, message: str) -> Reply:
    """An answer the router makes itself: OpenStack error JSON (the executor's and the
    engines' own refusals of a combined request)."""
    return Reply(status, {"content-type": "application/json"}, error_body(status, message))


def httpx_sender(client: httpx.AsyncClient, max_body: int = MAX_BODY) -> Send:
    """A send function on an ``httpx.AsyncClient`` (its pool, its TLS settings), for callers
    outside a router (tests, tools); the router sends on its own pool (router/combined.py).
    Connection failures before the request was written are ``NOT_SENT``; a read timeout is
    ``TIMEOUT``; a broken answer ``BROKEN``. httpx is imported here, not with the module: a
    router imports this module and is installed without httpx (not one of its requirements)."""
    import httpx

    async def send(forward: Forward, url: str, request: Request) -> Reply:
        try:
            async with client.stream(
                request.method, url, headers=request.headers, content=request.body or None
            ) as response:
                body = bytearray()
                async for chunk in response.aiter_bytes():  # decoded: the merge reads it
                    body += chunk
                    if len(body) > max_body:
                        raise SendError(
                            Failure.BROKEN, f"its answer is larger than {max_body} bytes"
                        )
                headers = {
                    k: v
                    for k, v in _lower(dict(response.headers)).items()
                    if k not in _DROPPED and k != "content-encoding"
                }
                return Reply(response.status_code, headers, bytes(body))
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise SendError(Failure.NOT_SENT, _connect_reason(exc)) from None
        except httpx.TimeoutException:
            raise SendError(Failure.TIMEOUT, "it did not answer in time") from None
        except httpx.HTTPError:
            raise SendError(Failure.BROKEN, "its answer failed") from None

    return send


def _connect_reason(exc: httpx.HTTPError) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return "it did not accept a connection in time"
    return "it refused the connection"
