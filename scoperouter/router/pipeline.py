"""The router's one request pipeline: the order every request goes through, whatever engine
carries its bytes (it imports neither an HTTP library nor mitmproxy).

    facts -> decide -> admit (breaker) -> swap tokens -> send, or combine -> failure answer
          -> catalog region -> access log + metrics

* **facts** (the HTTP layer has dropped identity fields a client forged and refused a path
  a backend could resolve elsewhere; :meth:`Pipeline.stripped` logs and counts the former):
  where the request came in (a frontend, or the peer link and the frontend its
  ``X-Scope-Frontend`` names; plain HTTP on an https frontend is refused), its origin-form
  target (an absolute-form target is reduced when it names the frontend itself, refused with
  421 otherwise: the client's authority never reaches an upstream, the frontend's is its
  Host);
* **decide**: :func:`scoperouter.routing.decide` on the current catalog (combined
  expressions included); a failure of the router itself is a 500, logged;
* **admit**: the circuit breaker (:class:`~.health.UpstreamHealth`) refuses at once a request
  for an upstream marked down (503);
* **swap tokens**: a local service's token carried to another cloud
  (:class:`~.tokens.TokenSwap`); an address of this router is never sent to (508);
* **send**: the engine's (:class:`Engine`): the reverse HTTP server sends on the worker's
  pool and relays the answer (the catalog region of a token validation applied,
  :func:`~.region.regioned`); ``A & B`` / ``A | B`` are answered by the worker's
  :class:`~.combined.Combiner` with the body read whole;
* **failure answer**: an upstream that fails is worded once (:mod:`~.failures`) and told
  to the breaker;
* **access log and metrics**: one line and one count per request, whatever the answer
  (:meth:`Pipeline.done`), and per head refused before a request existed
  (:meth:`Pipeline.refused`).

:meth:`Pipeline.handle` runs the order for the reverse HTTP server (frontends and the peer
link); the forward proxy's mitmproxy adapter calls the same steps from its hooks
(:meth:`~Pipeline.route`, :meth:`~Pipeline.prepare`, :meth:`~Pipeline.swap`,
:meth:`~Pipeline.failed`,
:meth:`~Pipeline.combine`, :meth:`~Pipeline.done`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from scoperouter.catalog import Catalog, Frontend
from scoperouter.errors import ClientGone, Reject
from scoperouter.router import fanout
from scoperouter.router.accesslog import AccessLog
from scoperouter.router.combined import MAX_BODY, Combiner
from scoperouter.router.config import RouterConfig
from scoperouter.router.failures import (
    CLIENT_GONE,
    CLIENT_GONE_STATUS,
    INTERNAL_ERROR,
    TimedOut,
    loop_failure,
    upstream_failure,
)
from scoperouter.router.health import UpstreamHealth
from scoperouter.router.listeners import Listener
from scoperouter.router.metrics import Metrics
from scoperouter.router.state import HeadRefusal, RequestState, new_state
from scoperouter.router.targets import split_url
from scoperouter.router.tokens import TokenSwap
from scoperouter.routing import (
    FRONTEND_HEADER,
    Combined,
    Failover,
    FanOut,
    Forward,
    RequestFacts,
    decide,
    header_title,
)

logger = logging.getLogger("scoperouter")


# The __init__ of the classes built per request is written out: dataclasses' own is Python code
# even in the compiled build (see routing.Forward).
@dataclass(slots=True, kw_only=True, init=False)
class Incoming:
    """A request whose head is in, as the pipeline needs it."""

    method: str
    target: str  # origin-form: path and query
    authority: str | None = None  # an absolute-form target's (lower-case), else None
    headers: Mapping[str, str]  # lower-case names, repeated fields joined
    listener: Listener  # a frontend, or the peer link
    tls: bool  # the client spoke TLS
    started: float  # time.monotonic() of the head's first byte
    stripped: tuple[str, ...] = ()  # identity fields the HTTP layer dropped (their names)

    # fmt: off
    def __init__(
        self, *, method: str, target: str, authority: str | None = None,
        headers: Mapping[str, str], listener: Listener, tls: bool, started: float,
        stripped: tuple[str, ...] = (),
    ) -> None:
        self.method, self.target, self.authority, self.headers = method, target, authority, headers
        self.listener, self.tls, self.started, self.stripped = listener, tls, started, stripped
    # fmt: on


@dataclass(slots=True, kw_only=True, init=False)  # __init__ written out: see Incoming
class Plan:
    """A request ready to go to one upstream."""

    state: RequestState
    decision: Forward
    edits: dict[str, str] = field(default_factory=dict)  # header fields set (or replaced)
    scheme: str
    host: str
    port: int
    target: str  # path and query
    connect_timeout: float
    response_timeout: float

    def __init__(
        self,
        *,
        state: RequestState,
        decision: Forward,
        edits: dict[str, str] | None = None,
        scheme: str,
        host: str,
        port: int,
        target: str,
        connect_timeout: float,
        response_timeout: float,
    ) -> None:
        self.state = state
        self.decision = decision
        self.edits = {} if edits is None else edits
        self.scheme = scheme
        self.host = host
        self.port = port
        self.target = target
        self.connect_timeout = connect_timeout
        self.response_timeout = response_timeout


# Not frozen (a frozen dataclass's __init__ could not be written out: it sets each field with
# object.__setattr__), treated as immutable all the same: the reverse server shares one per
# status (proxy/reverse.py, _answered).
@dataclass(slots=True, init=False)
class Outcome:
    """How the engine's send went: the status answered (and an error for the log), or how
    the upstream failed before any answer (`failed`: the pipeline answers)."""

    status: int = 0
    error: str | None = None
    failed: bool = False
    timed_out: TimedOut | None = None
    reason: str = ""
    connected: bool = False

    # fmt: off
    def __init__(
        self, status: int = 0, error: str | None = None, failed: bool = False,
        timed_out: TimedOut | None = None, reason: str = "", connected: bool = False,
    ) -> None:
        self.status, self.error, self.failed = status, error, failed
        self.timed_out, self.reason, self.connected = timed_out, reason, connected
    # fmt: on


class Engine(Protocol):
    """What an engine does for :meth:`Pipeline.handle` (the reverse HTTP server's adapter)."""

    async def send(self, plan: Plan) -> Outcome:
        """Send the request upstream and relay its answer; a client's body that fails is the
        engine's to answer (400, 408) and to report in the outcome."""

    async def read_body(self, limit: int) -> bytes | Reject:
        """The request body whole, or the refusal (too large, malformed, too slow)."""

    async def reply(self, state: RequestState, reply: fanout.Reply) -> None:
        """Answer with `reply` (a combined request's)."""

    async def refuse(self, state: RequestState, reject: Reject) -> None:
        """Answer with the router's own error."""


class Pipeline:
    """The router's steps for one worker process (one of each part, shared by its engines)."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        health: UpstreamHealth,
        tokens: TokenSwap,
        log: AccessLog,
        metrics: Metrics,
        combiner: Combiner,
    ) -> None:
        self.config = config
        self.health = health
        self.tokens = tokens
        self.log = log
        self.metrics = metrics
        self.combiner = combiner
        self.frontends: dict[str, Frontend] = {}  # this cloud's, by base URL (the peer link)
        self.settings = config.current().settings
        config.subscribe(self._configure)

    def _configure(self, catalog: Catalog) -> None:
        self.settings = catalog.settings
        spec = catalog.clouds.get(self.config.cloud)
        self.frontends = {f.url.base: f for f in spec.frontends} if spec is not None else {}

    # -- the order, for the reverse HTTP server

    async def handle(self, request: Incoming, engine: Engine) -> None:
        """Answer one request that came in on a frontend or the peer link."""
        path = request.target.partition("?")[0]
        state = new_state(request.method, path, request.headers, request.started)
        if request.stripped:
            self.stripped(state, request.stripped)
        status, error = 0, None
        try:
            decision = self.reverse(request, state)
            # (a tuple: compiled, `FanOut | Failover` is a union object made at each call)
            if isinstance(decision, (FanOut, Failover)):
                state.decision = decision
                body = await engine.read_body(MAX_BODY)
                if isinstance(body, Reject):
                    status = await self._refuse(engine, state, body)
                    return
                base = request.listener.frontend.url.base if request.listener.frontend else ""
                reply = await self.combine(
                    decision, state, request.method, request.headers, body, base
                )
                status = reply.status
                if status >= 400:
                    error = state.message
                await engine.reply(state, reply)
                return
            if isinstance(decision, Forward):
                planned = self.prepare(decision, state)
                if isinstance(planned, Plan) and decision.swap_tokens:
                    planned = await self.swap(planned)
                if isinstance(planned, Reject):
                    status = await self._refuse(engine, state, planned)
                    return
                outcome = await engine.send(planned)
                if outcome.failed:
                    reject = self.failed(
                        planned, outcome.timed_out, outcome.reason, outcome.connected
                    )
                    status, error = await self._refuse(engine, state, reject), outcome.reason
                    return
                status, error = outcome.status, outcome.error
                return
            status = await self._refuse(engine, state, decision)
        except ClientGone:
            status, error = CLIENT_GONE_STATUS, CLIENT_GONE
            state.status, state.message = status, error
        finally:
            self.done(state, status, error)

    async def _refuse(self, engine: Engine, state: RequestState, reject: Reject) -> int:
        if state.decision is None:  # else the decision it failed (logged with its target)
            state.decision = reject
        state.status, state.message = reject.status, reject.message
        await engine.refuse(state, reject)
        return reject.status

    # -- the steps

    def reverse(self, request: Incoming, state: RequestState) -> Forward | Reject | Combined:
        """facts and decide for a request on a frontend or the peer link."""
        listener = request.listener
        frontend = listener.frontend
        assert frontend is not None
        if (frontend.url.scheme == "https") != request.tls:
            return wrong_scheme(self.config, frontend)
        if listener.kind == "peer":
            # The peer link: another router's hop, for the frontend it names.
            named = request.headers.get(FRONTEND_HEADER, "")
            addressed = self.frontends.get(named.lower())
            if addressed is None:
                return Reject(400, self._unknown_frontend(named))
            frontend = addressed
        if request.authority is not None and request.authority not in _authorities(frontend):
            return Reject(
                421,
                f"the request names {request.authority[:200]!r}: this is {frontend.url.base} "
                f"of {self.config.cloud} (a reverse frontend: send the path, not a URL; the "
                "forward proxy is where absolute URLs go)",
            )
        state.authority = request.authority
        facts = reverse_facts(frontend, request.method, request.target, request.headers)
        return self.route(facts, state)

    def route(self, facts: RequestFacts, state: RequestState) -> Forward | Reject | Combined:
        """decide() on the current config, combined expressions included (``A & B``,
        ``A | B``); a failure of the router itself is a 500, logged."""
        try:
            return decide(facts, self.config.current(), self.config.cloud, combined=True)
        except Exception:  # the router must answer, whatever happens
            logger.exception("routing failed for %s %s", state.method, state.path)
            return Reject(500, INTERNAL_ERROR)

    def prepare(self, decision: Forward, state: RequestState) -> Plan | Reject:
        """admit, refuse a loop: the plan, or the refusal (the breaker's becomes the request's
        decision; a loop is the decision's failure). When the decision swaps tokens
        (``Forward.swap_tokens``), :meth:`swap` is the next step."""
        state.decision = decision
        refusal = self.health.admit(decision)
        if refusal is not None:
            state.decision = refusal
            return refusal
        scheme, host, port, target = split_url(decision.url)
        if (host, port) in self.config.own_addresses:
            return Reject(*loop_failure(self.config, decision))
        connect, response = self.settings.timeouts(decision.remote)
        # An absolute-form target's authority replaces the Host field.
        edits = {"host": state.authority} if state.authority is not None else {}
        return Plan(
            state=state,
            decision=decision,
            edits=edits,
            scheme=scheme,
            host=host,
            port=port,
            target=target,
            connect_timeout=connect,
            response_timeout=response,
        )

    async def swap(self, plan: Plan) -> Plan | Reject:
        """The plan with the decision's tokens carried to its cloud, or the refusal (which
        becomes the request's decision)."""
        swapped = await self.tokens.swap(plan.state, plan.decision)
        if isinstance(swapped, Reject):
            plan.state.decision = swapped
            return swapped
        plan.edits = {**swapped, **plan.edits}
        return plan

    def failed(
        self, plan: Plan, timed_out: TimedOut | None, reason: str, connected: bool
    ) -> Reject:
        """The upstream failed before its answer: the breaker hears it, the client gets the
        one wording of that failure."""
        plan.state.timed_out = timed_out
        self.health.failed(plan.decision, timed_out, reason)
        status, message = upstream_failure(
            self.config, plan.decision, timed_out, reason, connected=connected, host=plan.host
        )
        return Reject(status, message)

    def succeeded(self, decision: Forward) -> None:
        """The upstream answered (its head came)."""
        self.health.succeeded(decision)

    async def combine(
        self,
        decision: Combined,
        state: RequestState,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        base_url: str,
    ) -> fanout.Reply:
        state.decision = decision
        return await self.combiner.answer(decision, state, method, headers, body, base_url)

    def stripped(self, state: RequestState, names: tuple[str, ...]) -> None:
        """The client's head carried identity fields only keystonemiddleware sets (`names`,
        dropped before anyone read the head): a warning, once per request, names only (never
        the values); the access log line says so too, and the count."""
        state.stripped = names
        logger.warning(
            "request %s (%s %s): dropped the identity header field(s) %s the client sent: only "
            "keystonemiddleware sets them (CVE-2026-22797)",
            state.request_id,
            state.method,
            state.path[:200],
            ", ".join(names),
        )
        self.metrics.stripped()

    def done(self, state: RequestState, status: int, error: str | None = None) -> None:
        """The request is answered (or given up): its access log line and its count."""
        self.log.write(state, status, error)
        self.metrics.count(state, status)

    def refused(self, refusal: HeadRefusal) -> None:
        """A head refused before a request existed: logged and counted like any answer."""
        self.log.refused(refusal)
        self.metrics.refused(refusal)

    def _unknown_frontend(self, named: str) -> str:
        cloud = self.config.cloud
        if not named:
            return (
                f"the peer link of {cloud} carries other routers' hops: the request must name "
                f"one of {cloud}'s frontends in {header_title(FRONTEND_HEADER)}"
            )
        return f"{named[:200]!r} is not a frontend of {cloud} ({', '.join(sorted(self.frontends))})"


def _authorities(frontend: Frontend) -> frozenset[str]:
    """How an absolute-form target may name `frontend` (its port written or implied)."""
    url = frontend.url
    host = f"[{url.host}]" if ":" in url.host else url.host
    names = {f"{host}:{url.port}".lower()}
    if url.port == {"http": 80, "https": 443}.get(url.scheme):
        names.add(host.lower())
    return frozenset(names)


def reverse_facts(
    frontend: Frontend, method: str, path: str, headers: Mapping[str, str]
) -> RequestFacts:
    """What routing needs of a request that came in on `frontend`: the URL the client
    addressed is the frontend's, with the request's path."""
    return RequestFacts(
        method=method,
        scheme=frontend.url.scheme,
        host=frontend.url.host,
        port=frontend.url.port,
        path=path,
        headers=headers,
        mode="reverse",
    )


def wrong_scheme(config: RouterConfig, frontend: Frontend) -> Reject:
    """The refusal of plain HTTP on an https frontend (or TLS on an http one)."""
    expected = "HTTPS" if frontend.url.scheme == "https" else "plain HTTP"
    return Reject(400, f"{frontend.url} of {config.cloud} speaks {expected} only")
