"""Upstream connections of one process, per origin (scheme, host, port): kept alive, reused,
opened ahead toward peer routers, verified with TLS.

Idle keep-alive connections are reused (at most :data:`IDLE_MAX` per origin, closed after
:data:`IDLE_SECONDS` idle, or after the idle time of a peer router's link). A backend's are
taken most recently used first (the pool shrinks to what the load needs). The pool keeps idle
what the load had in flight: a cap below the requests a worker has in flight made every request
above it open a connection and close it again (at 1,000 client connections most of them: the
router's cost per request grew with the number of connections).

Peer routers (the other clouds' routers, on their peer links) are *warm* origins: the pool
opens :attr:`Warm.count` connections to each at start and keeps that many open (another is
opened in the background when the peer closed one), so a request finds the TCP and TLS
handshakes across the WAN done. The target is twice the most connections in use at once
(:meth:`Warm.used`, at every lending: whether a burst's requests find the ones opened ahead
for its first requests, or arrive before them and open their own, it grows to the same),
the extra ones opened in the background; it shrinks by those that reach their idle time
unused (:meth:`Warm.expired`). Why a target in all and not a
number kept idle: each worker process has its own pool, and the kernel spreads a burst of
client connections over the workers unevenly (``SO_REUSEPORT``: each worker gets a random
share), so a worker must be ready for more than its usual share, but topping up a number of
idle ones in the middle of every burst above the usual share would open WAN connections for
nothing, as long as the largest share kept growing. Warm connections are taken least recently
used first, so all of them carry traffic and none expires (to be opened again) while the load
lasts. A failed connect is tried again after :data:`WARM_RETRY_SECONDS`, doubling up to
:data:`WARM_RETRY_MAX` while it fails (logged once, and once when it works again). Their idle
time is shorter than the peer's own idle timeout, so the pool never sends on a connection the
peer is closing.

Connections lent to an exchange are the pool's too until given back: :meth:`Pool.sweep`
expires those whose response deadline has passed (one sweep per process, no timer per
request).

A backend's connections lent at once are held near :data:`LENT_SOFT_MAX` per origin: a request
that finds none idle while that many are lent or opening waits for the next one given back
(first come, first served) instead of opening its own, for up to :data:`QUEUE_WAIT` (checked
by the sweep); after that, or when a lent one is closed instead, it opens one. Why: a worker
takes its ready client connections in batches, and without the bound a batch of hundreds of
requests opened hundreds of backend connections, most of them waiting only for the worker to
read their answers: at 1,000 client connections every request paid for a working set of ~500
backend sockets per worker (the figures: docs/benchmarks.md; nothing changes below the
bound). Soft: a slow backend (long transfers) costs a
request beyond the bound at most one wait, never a refusal. Peer routers' warm connections
keep their own target.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from scoperouter.http.upstream import Origin, UpstreamConnection

logger = logging.getLogger("scoperouter")

IDLE_MAX: Final = 1024  # idle upstream connections kept per origin (each one was in use at a peak)
IDLE_SECONDS: Final = 15.0  # an idle upstream connection older than this is closed
LENT_SOFT_MAX: Final = 64  # a backend's connections lent or opening at once before requests wait
# seconds a request waits for a connection given back before opening its own
QUEUE_WAIT: Final = 0.1
# a failed connect ahead to a peer router is tried again after this, doubling up to the max
# while it keeps failing
WARM_RETRY_SECONDS: Final = 5.0
WARM_RETRY_MAX: Final = 60.0


class _Waiter(NamedTuple):
    """A request waiting for a connection given back."""

    since: float  # time.monotonic()
    future: asyncio.Future[UpstreamConnection | None]


@dataclass(slots=True)
class Warm:
    """An origin the pool keeps connections open to ahead of need (a peer router)."""

    count: int  # connections opened ahead at least (settings.peers.warm)
    timeout: float  # connect timeout
    opening: int = 0  # connects ahead under way
    connecting: int = 0  # connects under way for requests that found none idle
    retry_at: float = 0.0  # after a failed connect: not before (time.monotonic())
    backoff: float = 0.0  # seconds to the next try while connects fail (doubling), else 0
    target: int = 0  # connections wanted in all (lent, idle, opening): `count`, grown by load

    def used(self, in_use: int) -> None:
        """A connection was lent (`in_use` lent or connecting, its own included): keep twice
        the most in use at once, so a burst up to that size again finds them open. (Only at a
        miss, the target depended on when a burst's requests came: those that found the
        connections opened ahead for the first ones did not raise it.)"""
        if self.count and 2 * in_use > self.target:
            self.target = 2 * in_use

    def expired(self, unused: int) -> None:
        """`unused` idle connections reached their idle time: the load no longer needs them."""
        self.target = max(self.count, self.target - unused)


@dataclass(frozen=True, slots=True)
class WarmSpec:
    """How to keep an origin warm (from the config)."""

    count: int
    connect_timeout: float
    idle_seconds: float


# (CA file, verify) -> (the file's identity when read, its context): see client_context
_CONTEXTS: Final[dict[tuple[str | None, bool], tuple[tuple[int, ...] | None, ssl.SSLContext]]] = {}


def client_context(cafile: str | None, verify: bool) -> ssl.SSLContext:
    """A TLS client context: verified against `cafile` (else the system's CAs), the host name
    checked, unless `verify` is off.

    Reading a CA file parses every certificate in it (the system's bundle: tens of ms, more on
    a busy machine), and a worker configures its pool on its event loop at every reload: the
    context is kept and given again while the file is the same (path, inode, size and mtime;
    for the system's CAs, OpenSSL's default CA file), so a reload that leaves the CAs alone
    does not stall the requests in flight; a changed file is read again."""
    stamp = _file_stamp(cafile or ssl.get_default_verify_paths().cafile)
    kept = _CONTEXTS.get((cafile, verify))
    if kept is not None and kept[0] is not None and kept[0] == stamp:
        return kept[1]
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    _CONTEXTS[(cafile, verify)] = (stamp, context)
    return context


def _file_stamp(path: str | None) -> tuple[int, ...] | None:
    """What tells a file's versions apart (None: no such file, never kept)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def describe_error(exc: BaseException) -> str:
    """A connection error in words for the client and the log: a failed certificate check says
    so (and why) rather than OpenSSL's bracketed code."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        return f"TLS certificate verification failed: {why}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    return str(exc) or type(exc).__name__


class Pool:
    """`on_peer_connect(origin, reason)`: a connection to a warm origin (a peer router) was
    opened, for a request that found none idle (``request``: it waited for the handshake) or in
    the background (``ahead``); the router counts them (a metric)."""

    def __init__(self, on_peer_connect: Callable[[Origin, str], None] | None = None) -> None:
        self.on_peer_connect = on_peer_connect
        self.idle: dict[Origin, collections.deque[UpstreamConnection]] = {}
        self.lent: dict[Origin, set[UpstreamConnection]] = {}  # carrying an exchange
        self.tls: ssl.SSLContext | None = None
        self.peer_tls: ssl.SSLContext | None = None
        self.warm: dict[Origin, Warm] = {}
        self.idle_seconds: dict[Origin, float] = {}  # per origin, else IDLE_SECONDS
        self._tasks: set[asyncio.Task[None]] = set()
        self._opening: dict[Origin, int] = {}  # connects under way for requests, per backend
        # requests waiting for a connection given back, per backend, oldest first
        self._waiting: dict[Origin, collections.deque[_Waiter]] = {}
        self._closed = False
        self._on_lost = self.returned  # one bound method, not one per lending

    def configure(
        self,
        tls: ssl.SSLContext,
        peer_tls: ssl.SSLContext,
        warm: Mapping[Origin, WarmSpec],
    ) -> None:
        """TLS contexts for backends and for peer routers; the peer routers' origins to keep
        warm (a reload keeps the connects under way of those it keeps)."""
        self.tls, self.peer_tls = tls, peer_tls
        kept: dict[Origin, Warm] = {}
        for origin, spec in warm.items():
            entry = self.warm.get(origin) or Warm(spec.count, spec.connect_timeout)
            entry.count, entry.timeout = spec.count, spec.connect_timeout
            entry.target = max(entry.target, entry.count) if entry.count else 0
            kept[origin] = entry
        self.warm = kept
        self.idle_seconds = {origin: spec.idle_seconds for origin, spec in warm.items()}

    def lent_count(self, origin: Origin) -> int:
        return len(self.lent.get(origin, ()))

    def take(self, origin: Origin) -> UpstreamConnection | None:
        """An idle connection to `origin`, lent to the caller (who gives it back or closes
        it); None when there is none (then :meth:`connect`)."""
        idle = self.idle.get(origin)
        warm = self.warm.get(origin)
        found = None
        if idle:
            limit = self.idle_seconds.get(origin, IDLE_SECONDS)
            now = time.monotonic()
            while idle:
                conn = idle.popleft() if warm is not None else idle.pop()
                if conn.open and now - conn.idle_since <= limit:
                    found = conn
                    break
                if conn.open and warm is not None:
                    warm.expired(1)
                conn.discard()
        if found is not None:
            self._lend(found)
        if warm is not None:
            if found is not None:
                warm.used(self.lent_count(origin) + warm.connecting)
            self.refill(origin)
        return found

    def _lend(self, conn: UpstreamConnection) -> None:
        conn.on_lost = self._on_lost
        lent = self.lent.get(conn.origin)
        if lent is None:
            lent = self.lent[conn.origin] = set()
        lent.add(conn)

    def returned(self, conn: UpstreamConnection) -> None:
        """`conn`'s exchange is over and it goes (closed, or lost): a request waiting for a
        connection to its origin opens its own (once: a lost connection is returned again
        when its exchange ends)."""
        if self._unlend(conn):
            self._hand_over(conn.origin, None)

    def _unlend(self, conn: UpstreamConnection) -> bool:
        """`conn` no longer lent; whether it was."""
        conn.on_lost = None
        conn.deadline = None
        lent = self.lent.get(conn.origin)
        if lent is None or conn not in lent:
            return False
        lent.remove(conn)
        return True

    async def _open(self, origin: Origin, timeout: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        tls = None
        if origin.scheme == "https":
            tls = self.peer_tls if origin in self.warm else self.tls
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: UpstreamConnection(origin),
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls else None,
            ),
            timeout,
        )
        return conn

    async def connect(self, origin: Origin, timeout: float) -> UpstreamConnection:
        """A new connection to `origin`, lent to the caller as :meth:`take`'s (none was
        idle), or one given back meanwhile (a backend at :data:`LENT_SOFT_MAX`). TimeoutError
        after `timeout`; OSError or ssl.SSLError when it fails."""
        warm = self.warm.get(origin)
        if warm is None:
            opening = self._opening.get(origin, 0)
            if self.lent_count(origin) + opening >= LENT_SOFT_MAX:
                handed = await self._wait_for_one(origin)
                if handed is not None:
                    return handed
                opening = self._opening.get(origin, 0)
            self._opening[origin] = opening + 1
            try:
                conn = await self._open(origin, timeout)
            finally:
                self._opening[origin] -= 1
        else:
            warm.connecting += 1
            warm.used(self.lent_count(origin) + warm.connecting)
            self.refill(origin)
            try:
                conn = await self._open(origin, timeout)
            finally:
                warm.connecting -= 1
            if self.on_peer_connect is not None:
                self.on_peer_connect(origin, "request")
        self._lend(conn)
        return conn

    async def _wait_for_one(self, origin: Origin) -> UpstreamConnection | None:
        """The next connection to `origin` given back (lent to the caller), or None: open
        one (waited :data:`QUEUE_WAIT`, or a lent one was closed)."""
        waiter: asyncio.Future[UpstreamConnection | None] = (
            asyncio.get_running_loop().create_future()
        )
        waiting = self._waiting.get(origin)
        if waiting is None:
            waiting = self._waiting[origin] = collections.deque()
        waiting.append(_Waiter(time.monotonic(), waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            # Cancelled after a connection was handed over, before it ran: not lost.
            if waiter.done() and not waiter.cancelled():
                handed = waiter.result()
                if handed is not None:
                    self.give_back(handed)
            raise

    def _hand_over(self, origin: Origin, conn: UpstreamConnection | None) -> bool:
        """Wake the oldest request waiting for a connection to `origin` with `conn` (lent to
        it), or with None (it opens its own); False when none waits."""
        waiting = self._waiting.get(origin)
        while waiting:
            waiter = waiting.popleft().future
            if not waiter.done():
                if conn is not None:
                    self._lend(conn)
                waiter.set_result(conn)
                return True
        return False

    def refill(self, origin: Origin) -> None:
        """Open connections to a warm origin until its target is lent, idle or opening (at
        most :data:`IDLE_MAX` idle)."""
        warm = self.warm.get(origin)
        if warm is None or self._closed or time.monotonic() < warm.retry_at:
            return
        # The idle connections as the pool holds them: one the peer closed leaves at the next
        # take or tidy (the worker tidies every half second). Not idle_count(): refill runs at
        # every request to a peer router, and a pass over every idle connection (up to
        # IDLE_MAX) made a request's cost grow with the connections the last burst left open.
        idle = len(self.idle.get(origin, ()))
        missing = warm.target - self.lent_count(origin) - warm.connecting - idle - warm.opening
        for _ in range(min(missing, IDLE_MAX - idle - warm.opening)):
            warm.opening += 1
            task = asyncio.get_running_loop().create_task(self._open_ahead(origin, warm))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _open_ahead(self, origin: Origin, warm: Warm) -> None:
        try:
            conn = await self._open(origin, warm.timeout)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            if not warm.backoff:  # said once, not at every try
                logger.warning(
                    "cannot open connections ahead to the peer router at %s (trying again "
                    "every %g-%gs): %s",
                    origin,
                    WARM_RETRY_SECONDS,
                    WARM_RETRY_MAX,
                    describe_error(exc),
                )
            warm.backoff = min(WARM_RETRY_MAX, (warm.backoff * 2) or WARM_RETRY_SECONDS)
            warm.retry_at = time.monotonic() + warm.backoff
            return
        finally:
            warm.opening -= 1
        if warm.backoff:
            warm.backoff = 0.0
            logger.warning("connections ahead to the peer router at %s open again", origin)
        if self.on_peer_connect is not None:
            self.on_peer_connect(origin, "ahead")
        if self._closed or self.warm.get(origin) is not warm:
            conn.discard()
            return
        self.give_back(conn)

    def give_back(self, conn: UpstreamConnection) -> None:
        """An exchange is over and its connection may carry another: to the oldest request
        waiting for one, else idle (else it is closed)."""
        if not conn.open:
            self.returned(conn)
            return
        self._unlend(conn)
        if self._hand_over(conn.origin, conn):
            return
        idle = self.idle.get(conn.origin)
        if idle is None:  # (not setdefault: its default would be a deque made per call)
            idle = self.idle[conn.origin] = collections.deque()
        if len(idle) >= IDLE_MAX or self._closed:
            conn.discard()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def sweep(self, now: float) -> None:
        """Expire the exchanges past their response deadline (each tick). An answer whose
        reading is paused (its client reads slowly) is not the upstream's delay: its deadline
        moves on (the client's own is the server's unread-answer timeout). Requests waiting
        for a connection given back for :data:`QUEUE_WAIT` open their own."""
        for waiting in self._waiting.values():
            while waiting and now - waiting[0].since >= QUEUE_WAIT:
                waiter = waiting.popleft().future
                if not waiter.done():
                    waiter.set_result(None)
        for lent in self.lent.values():
            for conn in [c for c in lent if c.deadline is not None and now >= c.deadline]:
                if conn.progress_timeout is not None and conn.flow and conn.flow.read_paused:
                    conn.deadline = now + conn.progress_timeout
                else:
                    conn.expire()

    def tidy(self, now: float) -> int:
        """Close idle connections past their idle time; top warm origins up (less often).
        The number closed."""
        closed = 0
        for origin, idle in self.idle.items():
            limit = self.idle_seconds.get(origin, IDLE_SECONDS)
            gone = [c for c in idle if now - c.idle_since > limit or not c.open]
            if not gone:
                continue
            warm = self.warm.get(origin)
            if warm is not None:
                warm.expired(sum(1 for c in gone if c.open))  # not those the peer closed
            kept = [c for c in idle if now - c.idle_since <= limit and c.open]
            idle.clear()
            idle.extend(kept)  # in their order (one pass, not a removal per connection)
            for conn in gone:
                conn.discard()
            closed += len(gone)
        for origin in self.warm:
            self.refill(origin)
        return closed

    def idle_count(self, origin: Origin) -> int:
        """Idle connections to `origin` that are still open."""
        return sum(1 for conn in self.idle.get(origin, ()) if conn.open)

    def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for waiting in self._waiting.values():
            for item in waiting:
                item.future.cancel()
        self._waiting.clear()
        for idle in self.idle.values():
            for conn in idle:
                conn.discard()
        self.idle.clear()
