"""The upstream pool (scoperouter.http.pool): warm peer links, their size, lending order."""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import time
from pathlib import Path
from typing import Any

from scoperouter.http.pool import (
    LENT_SOFT_MAX,
    QUEUE_WAIT,
    Pool,
    Warm,
    WarmSpec,
    client_context,
)
from scoperouter.http.upstream import Origin, UpstreamConnection
from scoperouter.pki import new_ca

PEER = Origin("https", "127.0.0.3", 9443)
BACKEND = Origin("http", "127.0.1.2", 9292)


def _configure(pool: Pool, warm: dict[Origin, WarmSpec]) -> None:
    context = client_context(None, True)
    pool.configure(context, context, warm)


def test_the_pool_keeps_peer_links_warm_across_reloads() -> None:
    pool = Pool()
    _configure(pool, {PEER: WarmSpec(3, 5.0, 54.0)})
    warm = pool.warm[PEER]
    warm.opening = 2  # connects under way when the config is reloaded
    _configure(pool, {PEER: WarmSpec(1, 5.0, 54.0)})
    assert pool.warm[PEER] is warm and (warm.count, warm.opening) == (1, 2)
    assert pool.idle_seconds == {PEER: 54.0}
    _configure(pool, {})  # the peer left the federation
    assert pool.warm == {} and pool.idle_seconds == {}


class _Transport:
    """What the pool calls on an idle connection's transport."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True


def _pool(warm: int = 2) -> Pool:
    pool = Pool()
    _configure(pool, {PEER: WarmSpec(warm, 5.0, 54.0)})
    # Opens nothing ahead here (no event loop): the peer's next connect is never due. Not a
    # method patched on the pool: compiled (mypyc), its methods cannot be replaced.
    pool.warm[PEER].retry_at = math.inf
    return pool


def _idle(pool: Pool, origin: Origin, n: int) -> list[Any]:
    """`n` open connections given back to `pool` (as if each had carried an exchange)."""
    conns = []
    for _ in range(n):
        conn = UpstreamConnection(origin)
        conn.transport, conn.open = _Transport(), True  # type: ignore[assignment]
        pool.give_back(conn)
        conns.append(conn)
    return conns


def test_a_warm_target_is_twice_the_most_in_use_and_shrinks_as_connections_expire() -> None:
    warm = Warm(count=2, timeout=5.0, target=2)
    warm.used(1)
    assert warm.target == 2
    warm.used(3)  # a connection lent with 3 in use, its own included
    assert warm.target == 6
    warm.used(2)  # a smaller burst never lowers it
    assert warm.target == 6
    warm.expired(3)
    assert warm.target == 3
    warm.expired(10)  # never below the configured warm set
    assert warm.target == 2
    off = Warm(count=0, timeout=5.0, target=0)
    off.used(40)  # settings.peers.warm: 0 opens nothing ahead, whatever the load
    assert off.target == 0


def test_the_pool_lends_peer_connections_least_recently_used_first_and_counts_them() -> None:
    pool = _pool()
    first, second, third = _idle(pool, PEER, 3)
    # All of a peer's connections carry traffic in turn: none sits idle until it expires.
    assert pool.take(PEER) is first
    assert pool.lent_count(PEER) == 1
    pool.give_back(first)
    assert pool.lent_count(PEER) == 0
    assert [pool.take(PEER) for _ in range(3)] == [second, third, first]
    assert pool.lent_count(PEER) == 3
    assert pool.take(PEER) is None  # none idle: the caller connects (Pool.connect)
    second.connection_lost(None)  # an exchange's connection that closed is returned too
    assert pool.lent_count(PEER) == 2 and second.on_lost is None
    second.connection_lost(None)  # once
    assert pool.lent_count(PEER) == 2


def test_a_burst_that_takes_the_connections_opened_ahead_grows_the_target_as_one_that_misses() -> (
    None
):
    """A burst of 6 on a warm set of 2: whether its last requests find connections opened ahead
    for the first ones idle, or find none and connect, the target ends at 12 (integration
    tests on a loaded machine saw the burst's requests come far enough apart that those
    opened ahead were taken, and the pool grew to 6, not 12: the same burst again, and one
    half as large again, opened connections)."""
    taking = _pool(warm=2)
    _idle(taking, PEER, 6)  # the warm 2, and 4 opened ahead meanwhile
    assert [taking.take(PEER) is not None for _ in range(6)] == [True] * 6
    assert taking.warm[PEER].target == 12
    missing = _pool(warm=2)
    _idle(missing, PEER, 2)
    assert [missing.take(PEER) is not None for _ in range(3)] == [True, True, False]
    missing.warm[PEER].connecting = 4  # the 4 that found none idle, connecting
    missing.warm[PEER].used(missing.lent_count(PEER) + missing.warm[PEER].connecting)
    assert missing.warm[PEER].target == 12
    backend = _pool()
    _idle(backend, BACKEND, 6)
    assert all(backend.take(BACKEND) for _ in range(6))
    assert BACKEND not in backend.warm  # a backend's pool keeps what it was given back


def test_the_pool_lends_a_backends_connections_most_recently_used_first() -> None:
    pool = _pool()
    first, second = _idle(pool, BACKEND, 2)
    # A backend's pool shrinks to what the load needs: the least used expire.
    assert pool.take(BACKEND) is second
    assert pool.take(BACKEND) is first


def test_an_expired_peer_connection_lowers_the_target_one_the_peer_closed_does_not() -> None:
    pool = _pool(warm=2)
    warm = pool.warm[PEER]
    warm.target = 8
    conns = _idle(pool, PEER, 3)
    conns[0].open = False  # the peer closed it: the load still wants it, it is opened again
    conns[1].idle_since = time.monotonic() - 1000  # unused for longer than the idle time
    assert pool.tidy(time.monotonic()) == 2  # the one the peer closed, the one past its time
    assert warm.target == 7
    assert list(pool.idle[PEER]) == [conns[2]]
    assert conns[1].transport.closed


def test_the_sweep_expires_a_lent_connection_past_its_response_deadline() -> None:
    pool = _pool()
    late, early = _idle(pool, BACKEND, 2)
    assert pool.take(BACKEND) is early and pool.take(BACKEND) is late
    now = time.monotonic()
    late.deadline, early.deadline = now - 1, now + 60
    pool.sweep(now)
    assert late.timed_out and late.error == "response timeout" and late.transport.closed
    assert not early.timed_out and early.error is None


def test_the_pool_keeps_idle_what_the_load_had_in_flight_and_tidies_in_one_pass() -> None:
    """300 exchanges in flight at once give back 300 connections: all stay idle for the next
    300 (a cap of 64 closed the rest, and the next burst opened them again); tidy closes those
    past their idle time and keeps the others in their order."""
    pool = _pool()
    conns = _idle(pool, BACKEND, 300)
    assert list(pool.idle[BACKEND]) == conns
    now = time.monotonic()
    for conn in conns[::2]:
        conn.idle_since = now - 60  # past IDLE_SECONDS
    assert pool.tidy(now) == 150
    assert list(pool.idle[BACKEND]) == conns[1::2]
    assert all(c.transport.closed for c in conns[::2])  # discarded
    assert not any(c.transport.closed for c in conns[1::2])


def test_a_reload_with_the_same_cas_reuses_the_tls_contexts(tmp_path: Path) -> None:
    """A worker configures its pool on its event loop at every reload: building a context reads
    and parses the whole CA file (the system's bundle: 25-50 ms, found stalling every request
    of a worker at each SIGHUP by the soak, bench.soak), so the same file gives the same
    context; a rewritten file, or another verify setting, gives a new one."""
    assert client_context(None, True) is client_context(None, True)
    assert client_context(None, False) is not client_context(None, True)
    assert client_context(None, False).verify_mode == ssl.CERT_NONE
    ca = tmp_path / "ca.pem"
    ca.write_bytes(new_ca("first")[0])
    first = client_context(str(ca), True)
    assert client_context(str(ca), True) is first
    ca.write_bytes(new_ca("second, renewed")[0])  # rotated in place: read again
    second = client_context(str(ca), True)
    assert second is not first
    assert [c["subject"] for c in second.get_ca_certs()] == [
        ((("commonName", "scoperouter second, renewed"),),)
    ]
    assert client_context(str(ca), True) is second


def test_the_pool_tells_which_peer_connections_a_request_waited_for() -> None:
    """on_peer_connect (the router's scoperouter_peer_connections_opened_total): `request` for
    a connection a request opened for itself, `ahead` for those opened in the background; a
    backend's connections are not a peer's."""

    async def run() -> tuple[str, list[tuple[str, str]]]:
        seen: list[tuple[str, str]] = []
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        peer, backend = Origin("http", "127.0.0.1", port), Origin("http", "localhost", port)
        pool = Pool(on_peer_connect=lambda origin, why: seen.append((str(origin), why)))
        _configure(pool, {peer: WarmSpec(2, 5.0, 54.0)})
        # None idle: the request's own connection; the target becomes 2 (twice the one in
        # use), so one more is opened ahead.
        conn = await pool.connect(peer, 5.0)
        other = await pool.connect(backend, 5.0)
        while pool.warm[peer].opening:
            await asyncio.sleep(0.01)
        for c in (conn, other, *pool.idle[peer]):
            c.discard()
        pool.close()
        server.close()
        return str(peer), seen

    peer, seen = asyncio.run(run())
    assert sorted(seen) == [(peer, "ahead"), (peer, "request")]


def test_a_backend_at_its_soft_bound_lends_the_next_connection_given_back() -> None:
    """LENT_SOFT_MAX connections lent to a backend: the next request waits for one given back
    and gets it (nothing opened); one waiting QUEUE_WAIT (the sweep) or woken by a lent one
    that was closed opens its own (one waiter per closed connection, however often it is
    returned); one cancelled after a connection was handed over gives it back (idle, not
    lost)."""

    async def scenario() -> None:
        held: list[asyncio.StreamWriter] = []

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        origin = Origin("http", "127.0.0.1", server.sockets[0].getsockname()[1])
        pool = Pool()
        _configure(pool, {})
        try:
            lent = [await pool.connect(origin, 2.0) for _ in range(LENT_SOFT_MAX)]
            assert pool.lent_count(origin) == LENT_SOFT_MAX

            waiting = asyncio.ensure_future(pool.connect(origin, 2.0))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # at the bound: waits, opens nothing
            pool.give_back(lent[0])
            assert await waiting is lent[0]
            assert pool.lent_count(origin) == LENT_SOFT_MAX and not pool.idle.get(origin)

            late = asyncio.ensure_future(pool.connect(origin, 2.0))
            await asyncio.sleep(0.05)
            assert not late.done()
            pool.sweep(time.monotonic() + QUEUE_WAIT)  # waited long enough: opens its own
            opened = await late
            assert opened not in lent and pool.lent_count(origin) == LENT_SOFT_MAX + 1

            woken = asyncio.ensure_future(pool.connect(origin, 2.0))
            await asyncio.sleep(0.05)
            pool.returned(lent[1])  # a lent one closed instead of given back
            lent[1].discard()
            assert await woken not in lent
            still = asyncio.ensure_future(pool.connect(origin, 2.0))
            await asyncio.sleep(0.05)
            pool.returned(lent[1])  # returned again (lost, then its exchange ended): no wake
            await asyncio.sleep(0.05)
            assert not still.done()
            pool.give_back(lent[3])
            assert await still is lent[3]

            cancelled = asyncio.ensure_future(pool.connect(origin, 2.0))
            await asyncio.sleep(0.05)
            pool.give_back(lent[2])  # handed over, then the request is cancelled
            cancelled.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cancelled
            assert list(pool.idle[origin]) == [lent[2]]
        finally:
            pool.close()
            for conn in [c for lent_set in pool.lent.values() for c in lent_set]:
                conn.discard()
            server.close()
            for writer in held:
                writer.close()

    asyncio.run(scenario())


def test_a_peers_refill_counts_the_idle_connections_held_without_a_pass_over_them() -> None:
    """refill() runs at every request to a peer router: it counts the idle connections as the
    pool holds them (one the peer closed leaves at the next take or tidy), not by a pass over
    each, which made every request's cost grow with what the last burst left open (up to
    IDLE_MAX)."""

    async def scenario() -> None:
        pool = _pool(warm=2)
        warm = pool.warm[PEER]
        conns = _idle(pool, PEER, 3)
        conns[0].open = conns[1].open = False  # closed by the peer, not yet tidied
        warm.target, warm.retry_at = 5, 0.0
        pool.refill(PEER)
        assert warm.opening == 2  # 5 wanted, 3 held
        assert pool.tidy(time.monotonic()) == 2  # the two closed leave, and tidy refills
        assert list(pool.idle[PEER]) == [conns[2]] and warm.opening == 4
        assert pool.idle_count(PEER) == 1  # the status page's count: the open ones
        pool.close()  # the connects ahead, cancelled before they ran

    asyncio.run(scenario())
