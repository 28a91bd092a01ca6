"""Hostile and broken clients against a real router: limits answer them, the others don't wait,
memory stays bounded, and every refusal is the client's error, in JSON, logged once."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from .backends import EchoBackend
from .routers import Router, cloud_entry, free_port, request, start_all, stop_all, write_config

pytestmark = pytest.mark.integration

HOST = "127.0.0.20"
HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5


@dataclass
class Solo:
    router: Router
    url: str
    port: int

    def worker_rss_mb(self) -> float:
        """The largest RSS among the router's worker processes."""
        assert self.router.proc is not None
        workers = psutil.Process(self.router.proc.pid).children()
        return max(p.memory_info().rss for p in workers) / 2**20


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Solo]:
    tmp = tmp_path_factory.mktemp("limits")
    backend = EchoBackend("127.0.1.20", name="solo-image").start()
    port = free_port(HOST)
    config = write_config(
        tmp / "solo.yaml",
        {"Solo": cloud_entry(HOST, {"image": (port, "", backend.url)})},
        limits={"header_timeout": HEADER_TIMEOUT, "idle_timeout": IDLE_TIMEOUT},
    )
    router = Router("Solo", config, tmp / "solo.log", [(HOST, port)])
    start_all([router])
    try:
        yield Solo(router, f"http://{HOST}:{port}", port)
    finally:
        codes = stop_all([router])
        backend.stop()
        assert codes == {"Solo": 0}, router.log_text()[-3000:]


def exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, object]]:
    """Send `data` in 16 KiB pieces until the router answers (it may refuse before the end, as
    a well-behaved client would stop sending then), and read that one answer. A small send
    buffer keeps the client from handing the kernel far more than the router has read."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 15)
        sock.settimeout(timeout)
        sock.connect((HOST, port))
        with contextlib.suppress(OSError):
            for start in range(0, len(data), 1 << 14):
                sock.sendall(data[start : start + (1 << 14)])
                if select.select([sock], [], [], 0)[0]:
                    break
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        return response.status, json.loads(response.read() or b"{}")


def small_request(url: str) -> float:
    """Seconds one small routed request takes (new connection), asserting it succeeded."""
    started = time.monotonic()
    reply = request("GET", url + "/v2/images", headers={"X-Scope": '{"image": "Solo"}'})
    assert reply.status == 200, reply
    return time.monotonic() - started


def test_header_flood_is_refused_and_others_are_not_held_up(solo: Solo) -> None:
    head = b"GET /v2/images HTTP/1.1\r\nHost: x\r\n"
    head += b"".join(b"X-Flood-%05d: value\r\n" % i for i in range(10_000)) + b"\r\n"
    result: dict[str, tuple[int, dict[str, object]]] = {}
    flood = threading.Thread(target=lambda: result.update(flood=exchange(solo.port, head)))
    flood.start()
    timings = [small_request(solo.url) for _ in range(5)]
    flood.join(timeout=30)
    status, body = result["flood"]
    assert status == 431
    assert "larger than 65536 bytes" in json.dumps(body)
    # The acceptance bound: small requests beside the flood are answered in under 100 ms (the
    # median, so one scheduling hiccup of this shared machine is not mistaken for the router).
    assert sorted(timings)[2] < 0.1, timings
    assert max(timings) < 1.0, timings


@pytest.mark.parametrize(
    ("data", "status", "fragment"),
    [
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", 431, "150 header fields"),
        (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", 414, "request line is longer"),
        (b"GET / HTTP/1.1\r\nX-Nul: a\x00b\r\n\r\n", 400, "control character"),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400, "invalid header name"),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            400,
            "malformed request",
        ),
    ],
)
def test_protocol_errors_are_the_clients_400s_logged_once(
    solo: Solo, data: bytes, status: int, fragment: str
) -> None:
    path = f"/refused-{uuid.uuid4().hex}"
    data = data.replace(b" / HTTP", b" " + path.encode() + b" HTTP", 1)
    if b" /a" in data[:8]:  # the long request line keeps its length
        data = data.replace(b"GET /", f"GET {path}".encode(), 1)
        path = data.split(b" ")[1].decode()
    got, body = exchange(solo.port, data)
    assert got == status
    message = body["error"]["message"]  # type: ignore[index]
    assert fragment in message
    assert "validate_inbound_headers" not in message and "unreachable" not in message
    [entry] = solo.router.wait_for_access(path=path[:256])
    assert entry["status"] == status and entry["decision"] == "refused"
    assert entry["reason"].startswith(message[:40])
    time.sleep(0.7)  # the log is written in batches: no second line comes
    assert len(solo.router.wait_for_access(path=path[:256])) == 1


def test_slow_clients_get_408_and_memory_comes_back(solo: Solo) -> None:
    small_request(solo.url)
    baseline = solo.worker_rss_mb()
    sockets = []
    for _ in range(1000):
        sock = socket.create_connection((HOST, solo.port), timeout=10)
        sock.sendall(b"GET /v2/images HTTP/1.1\r\nHost: x\r\nX-Scope: {")  # never finished
        sockets.append(sock)
    time.sleep(0.3)
    small_request(solo.url)  # others are served meanwhile
    answers = []
    started = time.monotonic()
    for sock in sockets:
        with sock:
            answers.append(sock.recv(200))
    elapsed = time.monotonic() - started
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]
    assert elapsed < HEADER_TIMEOUT + 5
    time.sleep(0.5)
    after = solo.worker_rss_mb()
    assert after < baseline + 15, (baseline, after)


def test_idle_keep_alive_connections_are_closed(solo: Solo) -> None:
    with socket.create_connection((HOST, solo.port), timeout=10) as sock:
        sock.sendall(b'GET /v2/images HTTP/1.1\r\nHost: x\r\nX-Scope: {"image": "Solo"}\r\n\r\n')
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        response.read()
        assert response.status == 200
        started = time.monotonic()
        assert sock.recv(100) == b""  # the router closes it, quietly
        assert IDLE_TIMEOUT - 0.2 < time.monotonic() - started < IDLE_TIMEOUT + 3


def test_distinct_huge_scopes_keep_memory_bounded(solo: Solo) -> None:
    """2,000 requests, each with a different 1 MiB scope: refused at the head limit, never
    parsed or kept; the router's RSS stays under 150 MB throughout."""
    filler = b"A" * (1 << 20)
    peak = {"rss": solo.worker_rss_mb()}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            peak["rss"] = max(peak["rss"], solo.worker_rss_mb())

    def one(i: int) -> int:
        scope = b'{"image": "C%d' % i + filler + b'"}'
        data = b"GET /v2/images HTTP/1.1\r\nHost: x\r\nX-Scope: " + scope + b"\r\n\r\n"
        try:
            return exchange(solo.port, data, timeout=30)[0]
        except OSError:
            return 0

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(one, range(2000)))
    finally:
        done.set()
        watcher.join()
    assert statuses.count(431) >= 1990, {s: statuses.count(s) for s in set(statuses)}
    assert peak["rss"] < 150, peak
    small_request(solo.url)


def test_508_has_its_reason_phrase(tmp_path: Path) -> None:
    """Arriving past hop_limit: refused with 508 and the standard reason phrase."""
    port = free_port("127.0.0.21")
    backend = EchoBackend("127.0.1.21", name="b").start()
    config = write_config(
        tmp_path / "f.yaml", {"Solo": cloud_entry("127.0.0.21", {"image": (port, "", backend.url)})}
    )
    router = Router("Solo", config, tmp_path / "r.log", [("127.0.0.21", port)])
    start_all([router])
    try:
        with socket.create_connection(("127.0.0.21", port), timeout=10) as sock:
            sock.sendall(b"GET /v2/images HTTP/1.1\r\nHost: x\r\nX-Scope-Hops: 8\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 508 Loop Detected\r\n")
    finally:
        stop_all([router])
        backend.stop()
