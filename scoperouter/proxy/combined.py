"""The router's side of ``A & B`` and ``A | B``: the executor wired to the router's parts.

:func:`scoperouter.proxy.fanout.execute` runs a combined decision (``routing.decide(...,
combined=True)``) with a *send function*; a :class:`Combiner` supplies it, one per worker
process, shared by both data paths (the lean server calls it from its request handler, the
mitmproxy paths, reverse and forward, from the ``Combining`` addon's ``request`` hook):

* **Send** on the worker's own upstream pool (:class:`scoperouter.proxy.lean.Pool`: the lean
  server's, so single and combined requests share its keep-alive connections; a worker on
  ``data_path: mitmproxy`` gets a pool of its own, made on first use). Each part's request
  carries the decision's header edits (completed scope naming that cloud alone, the hop count),
  the request id and the client's ``Host``; an idle pooled connection the peer had closed is
  retried once for an idempotent method, as on the lean path.
* **Timeouts** per destination kind (``settings.timeouts(forward.remote)``: backends vs peer
  routers): the connect timeout bounds the connect, the response timeout the wait for the
  answer's head and then for its body.
* **Peer health**: the router's circuit breaker (:class:`~.addons.health.UpstreamHealth`) is
  the executor's ``is_down`` (``admit``: a cloud marked down is skipped without waiting, or
  probed once its down period is over) and hears every outcome (``report``: refusals and
  timeouts count, any answer clears them), so after one timeout the next ``A | B`` request
  goes straight to B, and a single-cloud request to A fails fast too (one breaker).
* **Identity**: a part leaving the cloud gets its tokens swapped for the router's own in
  that cloud (``Forward.swap_tokens``, :func:`~.addons.identity.swap_tokens`); a token
  validation's answer gets its catalog region twins (:func:`~.addons.region.regioned`).
* **Loops**: the hop count was checked by ``decide``; an address of this router is never
  connected to.

The answer is buffered (``fanout.MAX_BODY``, 32 MiB, per cloud and for the request body):
``&`` merges JSON lists, and ``|`` needs the request again for the next cloud. Large transfers
(image data) stream on the single-cloud path. What each cloud did goes into the request's
:class:`~.flowstate.FlowState` for its one access log line (``tried``) and the metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, TypeVar

from scoperouter.errors import Reject
from scoperouter.failover import IDEMPOTENT, Failure
from scoperouter.proxy import fanout
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.addons.health import UpstreamHealth
from scoperouter.proxy.addons.identity import TokenSwap, swap_tokens
from scoperouter.proxy.addons.region import regioned
from scoperouter.proxy.addons.routing import split_url
from scoperouter.proxy.flowstate import REQUEST_ID_HEADER, FlowState
from scoperouter.proxy.heads import HOP_BY_HOP
from scoperouter.routing import Combined, Forward

if TYPE_CHECKING:
    from scoperouter.catalog import Catalog
    from scoperouter.proxy.lean import Pool, UpstreamConnection

logger = logging.getLogger("scoperouter")
T = TypeVar("T")

MAX_BODY = fanout.MAX_BODY
BODY_TOO_LARGE = (
    f"the request body is larger than {MAX_BODY // (1024 * 1024)} MiB: a scope combining "
    "clouds ('&', '|') buffers it; name one cloud for large transfers"
)
INTERNAL_ERROR = "the router failed to combine the clouds' answers (see its log)"

_HOP = frozenset(name.decode("latin-1") for name in HOP_BY_HOP)
# Not passed on to the clouds: the sender sets them, or the buffered exchange makes them moot
# (accept-encoding: the merge reads the clouds' JSON, so it must come uncompressed).
_NOT_SENT = _HOP | {"host", "content-length", "expect", "accept-encoding", REQUEST_ID_HEADER}
_NOT_RETURNED = _HOP | {"content-length", REQUEST_ID_HEADER}
_BODILESS_STATUS = (204, 304)


class Combiner:
    """Runs combined decisions for one worker process (both data paths)."""

    def __init__(self, config: RouterConfig, health: UpstreamHealth, swap: TokenSwap) -> None:
        self.config = config
        self.health = health
        self.swap = swap
        self._pool: Pool | None = None
        self._own_pool = False
        config.subscribe(self._configure)

    def use_pool(self, pool: Pool) -> None:
        """Send through `pool` (the lean server's: one upstream pool per worker process)."""
        self._pool, self._own_pool = pool, False

    @property
    def pool(self) -> Pool:
        if self._pool is None:  # data_path mitmproxy: a pool of our own, made on first use
            from scoperouter.proxy.lean import Pool

            self._pool, self._own_pool = Pool(), True
            self._configure(self.config.current())
        return self._pool

    def _configure(self, catalog: Catalog) -> None:
        if self._own_pool and self._pool is not None:
            from scoperouter.proxy.lean import peer_links  # lean imports this module

            self._pool.configure(catalog.settings, peer_links(catalog, self.config.cloud))

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()

    async def answer(
        self,
        decision: Combined,
        state: FlowState,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        base_url: str,
    ) -> fanout.Reply:
        """The answer to a combined request (`headers` as received, lower-case names;
        `base_url`: ``scheme://host:port`` the client addressed). Never raises but for
        cancellation: a failure of the router itself is a 500, logged."""
        if self._own_pool:
            self.pool.sweep(time.monotonic())
        run = _Run(self, state)
        request = fanout.Request(method, _outgoing(headers), body)
        try:
            reply = await fanout.execute(
                decision,
                request,
                run.send,
                base_url=base_url,
                timeout=run.deadline,
                is_down=run.is_down,
                report=run.report,
            )
        except Exception:
            logger.exception("combining clouds failed for %s %s", state.method, state.path)
            reply = fanout.error_reply(500, INTERNAL_ERROR)
        state.tried = "; ".join(text for _, text in sorted(run.tried)) or None
        state.answered = run.answered
        if reply.status >= 400 and not any(reply is r for r in run.replies):
            state.message = _message(reply)  # the router's own error answer
        return reply


class _Run:
    """One combined request: the executor's hooks, and what each cloud did."""

    def __init__(self, combiner: Combiner, state: FlowState) -> None:
        self.combiner = combiner
        self.state = state
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
        """A bound over one attempt: the send function's own timeouts fire first."""
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
        if kind in ("down", "loop"):
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
        if key not in self.checked:  # a part of A & B: the breaker's fast refusal applies
            refusal = combiner.health.admit(forward)
            if refusal is not None:
                self.kinds[key] = "down"
                raise fanout.SendError(Failure.NOT_SENT, refusal.message)
        scheme, host, port, path = split_url(url)
        if (host, port) in combiner.config.own_addresses:
            self.kinds[key] = "loop"
            raise fanout.SendError(
                Failure.NOT_SENT,
                f"{scheme}://{host}:{port} is an address of this router (a routing loop; "
                "check the federation config)",
            )
        edits: Mapping[str, str] = {}
        identity = combiner.swap.identity
        if forward.swap_tokens and identity is not None:
            swapped = await swap_tokens(identity, self.state, forward)
            if isinstance(swapped, Reject):
                self.kinds[key] = "local"
                self.statuses[key] = swapped.status
                return fanout.error_reply(swapped.status, swapped.message)
            edits = swapped
        head = self._head(request, path, host, port, edits)
        reply = await self._exchange(forward, scheme, host, port, head, request)
        self.statuses[key] = reply.status
        self.replies.append(reply)
        return reply

    def _head(
        self, request: fanout.Request, path: str, host: str, port: int, edits: Mapping[str, str]
    ) -> bytes:
        headers = dict(request.headers)
        headers.update(edits)
        headers[REQUEST_ID_HEADER] = self.state.request_id
        lines = [f"{request.method} {path} HTTP/1.1\r\n".encode("latin-1")]
        client_host = self.state.headers.get("host")
        lines.append(b"Host: %s\r\n" % (client_host or f"{host}:{port}").encode("latin-1"))
        lines += [
            name.encode("latin-1") + b": " + value.encode("utf-8", "surrogateescape") + b"\r\n"
            for name, value in headers.items()
            if name not in ("host", "content-length")
        ]
        if request.body or request.method in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: %d\r\n" % len(request.body))
        lines.append(b"\r\n")
        return b"".join(lines)

    async def _exchange(
        self,
        forward: Forward,
        scheme: str,
        host: str,
        port: int,
        head: bytes,
        request: fanout.Request,
    ) -> fanout.Reply:
        from scoperouter.proxy.lean import TOO_LARGE

        key = id(forward)
        pool = self.combiner.pool
        connect_timeout, response_timeout = self.settings.timeouts(forward.remote)
        destination = f"{scheme}://{host}:{port}"
        method = request.method
        upstream: UpstreamConnection | None = None
        try:
            for attempt in (1, 2):
                upstream = pool.take(destination)
                reused = upstream is not None
                if upstream is None:
                    try:
                        upstream = await pool.connect(
                            destination, scheme, host, port, connect_timeout
                        )
                    except TimeoutError:
                        self.kinds[key] = "connect"
                        raise fanout.SendError(
                            Failure.NOT_SENT,
                            f"it did not accept a connection within {connect_timeout:g}s",
                        ) from None
                    except (OSError, ssl.SSLError) as exc:
                        raise fanout.SendError(Failure.NOT_SENT, _unreachable(exc)) from None
                upstream.reset(skip_body=method == "HEAD")
                upstream.keep_whole = True
                assert upstream.transport is not None
                upstream.transport.write(head + request.body)
                status = await self._within(
                    key,
                    upstream,
                    _final_head(upstream),
                    response_timeout,
                    f"it did not answer within {response_timeout:g}s",
                )
                if status:
                    break
                if reused and attempt == 1 and not upstream.received and method in IDEMPOTENT:
                    upstream.discard()
                    continue  # a pooled connection its peer had closed: once more, anew
                raise fanout.SendError(
                    Failure.BROKEN, f"the connection broke before its answer ({upstream.error})"
                )
            assert upstream is not None
            status, _, fields = upstream.heads.popleft()
            await self._within(
                key,
                upstream,
                _whole(upstream),
                response_timeout,
                f"its answer did not end within {response_timeout:g}s",
            )
            if upstream.error is not None and not upstream.complete:
                if upstream.error == TOO_LARGE:
                    self.kinds[key] = "too_large"
                    raise fanout.SendError(
                        Failure.BROKEN, f"{TOO_LARGE}; name one cloud for large transfers"
                    )
                raise fanout.SendError(Failure.BROKEN, f"its answer broke off ({upstream.error})")
            body = b"".join(upstream.pending)
            upstream.pending, upstream.pending_size = [], 0
            if upstream.keep_alive and upstream.open:
                pool.give_back(upstream)
            elif upstream.transport is not None:
                upstream.transport.close()
            upstream = None
        except BaseException:
            if upstream is not None:
                upstream.fail("the exchange was given up")
            raise
        headers = _returned(fields, keep_length=method == "HEAD" or status in _BODILESS_STATUS)
        region = forward.catalog_region
        if region and status == 200:
            body = regioned(body, region, status, headers.get("content-type", "")) or body
        return fanout.Reply(status, headers, body)

    async def _within(
        self,
        key: int,
        upstream: UpstreamConnection,
        step: Awaitable[T],
        seconds: float,
        message: str,
    ) -> T:
        """`step` of an exchange, given up after `seconds` (a response timeout)."""
        try:
            return await asyncio.wait_for(step, seconds)
        except TimeoutError:
            upstream.fail("response timeout")
            self.kinds[key] = "response"
            raise fanout.SendError(Failure.TIMEOUT, message) from None


async def _final_head(upstream: UpstreamConnection) -> int:
    """The final answer's status once its head is in (informational ones dropped); 0 when
    the connection failed first."""
    while True:
        await upstream.wait()
        while upstream.heads:
            if upstream.heads[0][0] >= 200:
                return upstream.heads[0][0]
            upstream.heads.popleft()
        if upstream.error is not None or upstream.complete:
            return 0


async def _whole(upstream: UpstreamConnection) -> None:
    while not upstream.complete and upstream.error is None:
        await upstream.wait()


def _outgoing(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's header fields that go on to the clouds."""
    drop = _NOT_SENT | _tokens(headers.get("connection"))
    return {name: value for name, value in headers.items() if name not in drop}


def _returned(fields: list[tuple[bytes, bytes]], keep_length: bool) -> dict[str, str]:
    """A cloud's header fields that go back to the client (lower-case names)."""
    found: dict[str, str] = {}
    for raw_name, raw_value in fields:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("utf-8", "surrogateescape")
        found[name] = f"{found[name]}, {value}" if name in found else value
    drop = _NOT_RETURNED | _tokens(found.get("connection"))
    if keep_length:
        drop = drop - {"content-length"}
    return {name: value for name, value in found.items() if name not in drop}


def _tokens(connection: str | None) -> frozenset[str]:
    if not connection:
        return frozenset()
    return frozenset(t.strip().lower() for t in connection.split(",") if t.strip())


def _unreachable(exc: BaseException) -> str:
    from scoperouter.proxy.lean import describe_error  # lean imports this module

    text = str(exc)
    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in text:
        return "it refused the connection"
    if isinstance(exc, ssl.SSLError):  # worded as for a single-cloud request
        return describe_error(exc)
    return f"it is unreachable ({text})"


def _message(reply: fanout.Reply) -> str | None:
    try:
        message = json.loads(reply.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return message if isinstance(message, str) else None


def bodiless(method: str, status: int) -> bool:
    """An answer that carries no body, whatever its headers say."""
    return method == "HEAD" or status in _BODILESS_STATUS or status < 200
