"""Router-to-router links: TLS with verified certificates, and the lean path's pool of
connections to each peer router (opened ahead, reused across client connections, dropped
before the peer's idle timeout, one retry when the peer closed a pooled connection).

    CloudOne router  127.0.0.40  image frontend :P; peer link https://127.0.0.40:L
    CloudTwo router  127.0.0.41  image frontend :P; peer link https://127.0.0.41:R, which
                     its router binds on another port: a counting relay sits at R and
                     passes bytes to it, so the test sees every TCP connection (and so every
                     TLS handshake) CloudOne's router opens to CloudTwo's, and who closes it
    Skeptic router   127.0.0.42  a CloudOne router whose config trusts another CA
    backends         127.0.1.40 (CloudOne), 127.0.1.41 (CloudTwo): echo servers
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from .backends import EchoBackend, blob_chunks, blob_sha256
from .certs import federation_ca, issue
from .routers import (
    Router,
    cloud_entry,
    download,
    free_port,
    request,
    start_all,
    stop_all,
    write_config,
)
from .test_streaming import assert_flat, peak_rss

pytestmark = pytest.mark.integration

ONE, TWO, SKEPTIC = "127.0.0.40", "127.0.0.41", "127.0.0.42"
IDLE_TIMEOUT = 4.0  # limits.idle_timeout: the pool drops a peer connection after 2 s idle
SCOPE = {"X-Auth-Token": 'tok!SCOPE!{"image": "CloudTwo"}'}
SIZE = 128 * 1024 * 1024


@dataclass
class Conn:
    opened: float
    last: float  # the last bytes it carried
    closed_at: float | None = None


@dataclass
class Relay:
    """A TCP relay that counts connections: listen -> target, bytes passed as they are.
    `break_next()`: the next data a connection opened before the call sends is dropped and
    that connection closed (a peer that closed a pooled connection as a request crossed)."""

    host: str
    target: tuple[str, int]
    port: int = 0
    conns: list[Conn] = field(default_factory=list)
    broken: int = 0
    _break_before: float = 0.0
    _sock: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Relay:
        sock = socket.create_server((self.host, 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def break_next(self) -> None:
        with self._lock:
            self._break_before = time.monotonic()

    def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            now = time.monotonic()
            conn = Conn(now, now)
            self.conns.append(conn)
            try:
                server = socket.create_connection(self.target)
            except OSError:
                conn.closed_at = time.monotonic()
                client.close()
                continue
            done = threading.Event()
            for src, dst, side in ((client, server, "client"), (server, client, "server")):
                threading.Thread(
                    target=self._pipe, args=(src, dst, side, conn, done), daemon=True
                ).start()

    def _pipe(
        self, src: socket.socket, dst: socket.socket, side: str, conn: Conn, done: threading.Event
    ) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if data and side == "client":
                with self._lock:
                    doomed = conn.opened < self._break_before
                    if doomed:
                        self._break_before = 0.0
                        self.broken += 1
                if doomed:
                    data = b""
            if not data:
                if conn.closed_at is None:
                    conn.closed_at = time.monotonic()
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                done.set()
                return
            conn.last = time.monotonic()
            try:
                dst.sendall(data)
            except OSError:
                continue


@dataclass
class Links:
    one: str  # CloudOne's image frontend
    skeptic: str  # the same through the router that trusts another CA
    two_peer: str  # CloudTwo's peer link, the router's own port (not the relay)
    routers: dict[str, Router]
    relay: Relay
    ca: Path  # the federation's CA
    metrics: str  # CloudOne's router's /metrics

    def scoped_get(self, rest: str = "/v2/images") -> Any:
        return request("GET", self.one + rest, headers=SCOPE)

    def peer_connects(self, reason: str) -> float:
        """scoperouter_peer_connections_opened_total{reason=...} of CloudOne's router (to
        CloudTwo's link: its only peer) now."""
        prefix = "scoperouter_peer_connections_opened_total{"
        total = 0.0
        for line in request("GET", self.metrics + "/metrics").body.decode().splitlines():
            if line.startswith(prefix) and f'reason="{reason}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Links]:
    tmp = tmp_path_factory.mktemp("peer-links")
    ca, certs = federation_ca(tmp, {"one": ONE, "two": TWO, "skeptic": SKEPTIC})
    _, _, other_ca = issue(tmp, TWO, name="other")
    backends = {
        "CloudOne": EchoBackend("127.0.1.40", name="CloudOne-image").start(),
        "CloudTwo": EchoBackend("127.0.1.41", name="CloudTwo-image").start(),
    }
    ports = {host: (free_port(host), free_port(host)) for host in (ONE, TWO, SKEPTIC)}
    two_bind = ports[TWO][1]
    relay = Relay(TWO, (TWO, two_bind)).start()
    metrics_port = free_port(ONE)

    def cloud(host: str, name: str, backend: str, peer_port: int, bind: int) -> dict[str, Any]:
        entry = cloud_entry(host, {"image": (ports[host][0], "", backend)})
        cert = certs[name]
        entry["peer"] = {
            "url": f"https://{host}:{peer_port}",
            "listen": f"{host}:{bind}",
            "tls": {"cert": str(cert), "key": str(cert.with_suffix(".key"))},
        }
        return entry

    two = cloud(TWO, "two", backends["CloudTwo"].url, relay.port, two_bind)
    settings: dict[str, Any] = {
        "limits": {"idle_timeout": IDLE_TIMEOUT},
        "breaker": {"failures": 1000},
        "connect_timeout": 2.0,
        "response_timeout": 5.0,
    }
    trusting = write_config(
        tmp / "trusting.yaml",
        {
            "CloudOne": cloud(ONE, "one", backends["CloudOne"].url, *[ports[ONE][1]] * 2)
            | {"metrics": {"listen": f"{ONE}:{metrics_port}"}},
            "CloudTwo": two,
        },
        peers={"ca": str(ca), "warm": 2},
        **settings,
    )
    doubting = write_config(
        tmp / "doubting.yaml",
        {
            "CloudOne": cloud(
                SKEPTIC, "skeptic", backends["CloudOne"].url, *[ports[SKEPTIC][1]] * 2
            ),
            # Straight to CloudTwo's router, not through the relay (which counts CloudOne's).
            "CloudTwo": cloud(TWO, "two", backends["CloudTwo"].url, two_bind, two_bind),
        },
        peers={"ca": str(other_ca)},
        **settings,
    )
    routers = {
        "one": Router("CloudOne", trusting, tmp / "one.log", [(ONE, ports[ONE][0])]),
        "two": Router("CloudTwo", trusting, tmp / "two.log", [(TWO, ports[TWO][0])]),
        "skeptic": Router(
            "CloudOne", doubting, tmp / "skeptic.log", [(SKEPTIC, ports[SKEPTIC][0])]
        ),
    }
    start_all(routers.values())
    try:
        yield Links(
            f"http://{ONE}:{ports[ONE][0]}",
            f"http://{SKEPTIC}:{ports[SKEPTIC][0]}",
            f"https://{TWO}:{two_bind}",
            routers,
            relay,
            ca,
            f"http://{ONE}:{metrics_port}",
        )
    finally:
        codes = stop_all(routers.values())
        relay.stop()
        for backend in backends.values():
            backend.stop()
    assert set(codes.values()) == {0}, {k: r.log_text()[-2000:] for k, r in routers.items()}


def test_a_remote_call_crosses_the_tls_peer_link(links: Links) -> None:
    reply = links.scoped_get()
    assert reply.status == 200, reply.body[:300]
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-image"
    assert seen["headers"]["x-scope-hops"] == "2"
    assert "x-scope-frontend" not in seen["headers"]  # the link's header stops at the router
    rid = reply.headers["x-scope-request-id"]
    # one request id, the entry router's: the peer router's (the same id) is not passed on
    assert [v for k, v in reply.fields if k == "x-scope-request-id"] == [rid]
    sent = links.routers["one"].wait_for_access(request_id=rid)[0]
    assert sent["target"].startswith(f"https://{TWO}:{links.relay.port}/"), sent
    links.routers["two"].wait_for_access(request_id=rid, status=200)


def test_the_peer_link_refuses_plain_http_and_unnamed_frontends(links: Links) -> None:
    plain = request("GET", links.two_peer.replace("https://", "http://") + "/v2/images")
    assert plain.status == 400
    assert "speaks HTTPS only" in plain.error_message()
    context = ssl.create_default_context(cafile=str(links.ca))
    unnamed = request("GET", links.two_peer + "/v2/images", context=context)
    assert unnamed.status == 400
    assert "X-Scope-Frontend" in unnamed.error_message()


def test_a_wrong_ca_fails_with_a_clear_error(links: Links) -> None:
    reply = request("GET", links.skeptic + "/v2/images", headers=SCOPE)
    assert reply.status == 502, reply.body[:300]
    message = reply.error_message()
    assert "CloudTwo" in message
    assert "certificate verif" in message.lower(), message


def test_connections_to_the_peer_are_opened_ahead_and_reused(links: Links) -> None:
    relay = links.relay
    deadline = time.monotonic() + 10
    while len(relay.conns) < 2 and time.monotonic() < deadline:  # the warm set, at start
        time.sleep(0.05)
    assert len(relay.conns) >= 2
    before = len(relay.conns)
    started = time.monotonic()
    for _ in range(20):  # 20 client connections, one request each
        assert links.scoped_get().status == 200
    # Requests one after the other: the warm connections carry them all; a new one only for
    # each warm connection the pool dropped meanwhile for its idle time (IDLE_TIMEOUT: 2 s of
    # a slow run can do that), and the one a request opens itself if it comes while those
    # are being opened again.
    opened = len(relay.conns) - before
    dropped = _dropped(relay, before, started)
    assert opened <= dropped + (dropped > 0), f"{opened} new connections for 20 requests"
    assert opened <= 3, f"{opened} new TCP+TLS connections to the peer for 20 requests"


def _dropped(relay: Relay, before: int, since: float) -> int:
    """Connections of the first `before` that closed after `since` (the pool's idle time)."""
    return sum(1 for c in relay.conns[:before] if c.closed_at is not None and c.closed_at >= since)


def _burst(links: Links, n: int) -> None:
    """`n` scoped requests at once, each held 1 s by CloudTwo's backend: they all overlap
    there even on a loaded machine (the threads start together at a barrier; with 0.3 s, CI
    saw threads started late enough that only 4 of 6 were in flight together)."""
    ready = threading.Barrier(n)

    def one(_: int) -> Any:
        ready.wait(10)
        return links.scoped_get("/sleep/1.0")

    with ThreadPoolExecutor(n) as threads:
        replies = list(threads.map(one, range(n)))
    assert [r.status for r in replies] == [200] * n, [r.body[:200] for r in replies]


def _settled(relay: Relay) -> int:
    """The relay's connection count once the pool's connects ahead are done."""
    count, deadline = len(relay.conns), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if len(relay.conns) == count:
            return count
        count = len(relay.conns)
    return count


def test_a_burst_grows_the_pool_ahead_and_the_next_finds_it_open(links: Links) -> None:
    """A burst larger than the warm set opens what it lacks, and the pool keeps twice the most
    connections that burst had in use at once, whenever its requests came: the same burst
    again, or one half as large again, crosses on connections already open (a router's worker
    gets an uneven share of every burst). What waited for a handshake is the router's own
    count (its metric); the relay sees every connection opened, ahead or not."""
    relay = links.relay
    _settled(relay)
    started = time.monotonic()
    _burst(links, 6)
    _settled(relay)
    open_now = sum(1 for c in relay.conns if c.closed_at is None)
    dropped = sum(1 for c in relay.conns if c.closed_at is not None and c.closed_at >= started)
    assert open_now + dropped >= 2 * 6, f"{open_now} open after a burst of 6 ({dropped} dropped)"
    for size in (6, 9):
        grown = len(relay.conns)
        waited = links.peer_connects("request")
        started = time.monotonic()
        _burst(links, size)
        _settled(relay)
        waited = links.peer_connects("request") - waited
        # Only a connection the pool dropped meanwhile for its idle time (2 s: a slow run's
        # settling can reach it) leaves a request to open its own.
        assert waited <= _dropped(relay, grown, started), f"{waited} waited in a burst of {size}"
    assert links.peer_connects("ahead") > 0


def test_pooled_peer_connections_close_before_the_peers_idle_timeout(links: Links) -> None:
    relay = links.relay
    assert links.scoped_get().status == 200
    start = len(relay.conns)
    time.sleep(IDLE_TIMEOUT + 1.5)
    # Every connection that was idle is gone, closed by CloudOne's router after the pool's
    # idle time (2 s here, checked every 0.5 s), before the peer's own idle timeout (4 s):
    # never by the peer. (Who sent the first FIN says nothing with TLS: the side that gets a
    # close_notify answers it and closes at once.)
    old = relay.conns[:start]
    now = time.monotonic()
    ages = [  # for the message: seconds since opened, since its last bytes, since closed
        (
            round(now - c.opened, 2),
            round(now - c.last, 2),
            c.closed_at and round(now - c.closed_at, 2),
        )
        for c in old
    ]
    assert all(c.closed_at is not None for c in old), f"a connection outlived its idle time: {ages}"
    idle = [c.closed_at - c.last for c in old if c.closed_at is not None]
    assert max(idle) < IDLE_TIMEOUT - 0.2, idle  # the peer closes at 4-4.5 s
    assert len(relay.conns) > start
    assert links.scoped_get().status == 200


def test_a_pooled_connection_the_peer_closed_is_retried_once(links: Links) -> None:
    relay = links.relay
    assert links.scoped_get().status == 200
    broken = relay.broken
    relay.break_next()
    reply = links.scoped_get()
    assert relay.broken == broken + 1
    assert reply.status == 200, reply.body[:300]
    # A request with a body is not retried: the peer may have got it.
    assert links.scoped_get().status == 200
    relay.break_next()
    post = request("POST", links.one + "/v2/images", headers=SCOPE, body=b"{}")
    assert post.status == 502, post.body[:300]
    assert "CloudTwo" in post.error_message()


def test_large_bodies_stream_over_the_tls_link_with_flat_memory(links: Links) -> None:
    pids = [links.routers["one"].pid, links.routers["two"].pid]
    procs = [psutil.Process(pid) for pid in pids]
    pids += [child.pid for proc in procs for child in proc.children()]  # the workers
    before = {pid: psutil.Process(pid).memory_info().rss for pid in pids}
    headers = {**SCOPE, "Content-Length": str(SIZE)}
    with peak_rss(pids) as peaks:
        reply = request(
            "PUT",
            links.one + "/v2/images/big/file",
            headers=headers,
            body=blob_chunks(SIZE),
            timeout=180,
        )
        assert reply.status == 200, reply.body[:300]
        assert reply.json()["body_length"] == SIZE
        assert reply.json()["body_sha256"] == blob_sha256(SIZE)
        status, length, sha = download(links.one + f"/v2/images/big/blob/{SIZE}", SCOPE, 180)
        assert (status, length) == (200, SIZE)
        assert sha == blob_sha256(SIZE)
    assert_flat(peaks, before)


def test_combined_scopes_reach_the_peer_over_its_verified_link(links: Links) -> None:
    """A & B / A | B parts are sent by the worker's combiner on the pool of the worker's lean
    server (which serves the peer link on either data path): a peer's part goes to its TLS
    link, verified with the federation's CA (a failure would fail it over to CloudOne)."""
    scope = {"X-Auth-Token": 'tok!SCOPE!{"image": "CloudTwo | CloudOne"}'}
    reply = request("GET", links.one + "/v2/images", headers=scope)
    assert reply.status == 200, reply.body[:300]
    assert reply.json()["backend"] == "CloudTwo-image"
    line = links.routers["one"].wait_for_access(request_id=reply.headers["x-scope-request-id"])
    assert line[0]["decision"] == "failover" and line[0]["tried"] == "CloudTwo: 200", line


def test_a_combined_part_names_a_failed_certificate_check_as_a_single_request_does(
    links: Links,
) -> None:
    """The router that trusts another CA: CloudTwo's part fails its certificate check, said
    in the same words as for a single-cloud request, and the failover moves on to CloudOne."""
    scope = {"X-Auth-Token": 'tok!SCOPE!{"image": "CloudTwo | CloudOne"}'}
    reply = request("GET", links.skeptic + "/v2/images", headers=scope)
    assert reply.status == 200, reply.body[:300]
    assert reply.json()["backend"] == "CloudOne-image"
    rid = reply.headers["x-scope-request-id"]
    [line] = links.routers["skeptic"].wait_for_access(request_id=rid)
    first, second = line["tried"].split("; ")
    assert first.startswith("CloudTwo: TLS certificate verification failed"), line
    assert second == "CloudOne: 200", line
