"""Part 3: large bodies. One upload (PUT with Content-Length) and one download (GET of a blob),
direct and through the routers, over raw sockets from constant memory; the routers' RSS is
sampled every 10 ms during each transfer to catch its peak. :func:`checked` (the soak's): one
transfer whose bytes are checked end to end, by SHA-256 at both ends."""

from __future__ import annotations

import functools
import hashlib
import json
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.procs import BenchError, rss_max_mb

BLOCK = memoryview(bytes(range(256)) * 4096)  # 1 MiB
CHECKSUM_HEADER = "X-Bench-Checksum"  # the backend answers the body's SHA-256 (httpserver.py)


@dataclass
class TransferResult:
    direction: str  # "upload" | "download"
    path: str  # "direct" | "two routers"
    size: int
    seconds: float
    mb_per_s: float
    rss_before_mb: dict[str, float]
    rss_peak_mb: dict[str, float]
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


class RssSampler:
    """Peak RSS of some processes, sampled in a thread while a transfer runs."""

    def __init__(self, pids: dict[str, int], interval: float = 0.01) -> None:
        self.pids = pids
        self.interval = interval
        self.before = {name: rss_max_mb(pid) for name, pid in pids.items()}
        self.peak = dict(self.before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                value = rss_max_mb(pid)
                if value > self.peak.get(name, 0.0):
                    self.peak[name] = value
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for name, pid in self.pids.items():  # one last sample after the transfer
            self.peak[name] = max(self.peak.get(name, 0.0), rss_max_mb(pid))


def _read_head(sock: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytearray]:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise BenchError("connection closed before the response headers")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return status, headers, bytearray(rest)


def _read_exact_count(sock: socket.socket, already: int, total: int, hasher: Any = None) -> int:
    """Read and drop body bytes until `total` have been seen (each passed to `hasher.update`
    when given); returns the count."""
    got = already
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while got < total:
        n = sock.recv_into(view, min(len(buf), total - got))
        if n == 0:
            break
        if hasher is not None:
            hasher.update(view[:n])
        got += n
    return got


def _request_head(method: str, host: str, port: int, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def upload(
    host: str, port: int, path: str, headers: dict[str, str], size: int
) -> tuple[float, str]:
    """PUT `size` bytes; (seconds until the whole answer is in, answer body)."""
    head = _request_head(
        "PUT",
        host,
        port,
        path,
        {**headers, "Content-Type": "application/octet-stream", "Content-Length": str(size)},
    )
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=120) as sock:
        sock.sendall(head)
        left = size
        while left:
            n = min(left, len(BLOCK))
            sock.sendall(BLOCK[:n])
            left -= n
        status, rheaders, rest = _read_head(sock, bytearray())
        length = int(rheaders.get("content-length", "0"))
        body = bytes(rest)
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    elapsed = time.perf_counter() - start
    if status != 200:
        raise BenchError(f"upload answered {status}: {body[:300]!r}")
    return elapsed, body.decode(errors="replace")


def download(
    host: str, port: int, path: str, headers: dict[str, str], size: int, hasher: Any = None
) -> tuple[float, int]:
    """GET a `size`-byte blob; (seconds until the last byte, bytes received), every byte passed
    to `hasher.update` when given."""
    head = _request_head("GET", host, port, path, headers)
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=120) as sock:
        sock.sendall(head)
        status, rheaders, rest = _read_head(sock, bytearray())
        if status != 200:
            raise BenchError(f"download answered {status}: {bytes(rest)[:300]!r}")
        length = int(rheaders.get("content-length", "-1"))
        if length < 0:
            raise BenchError("download answer has no Content-Length (chunked?): not expected")
        if hasher is not None:
            hasher.update(rest)
        got = _read_exact_count(sock, len(rest), length, hasher)
    return time.perf_counter() - start, got


@functools.lru_cache(maxsize=4)
def pattern_sha256(size: int) -> str:
    """The SHA-256 of the `size` bytes :func:`upload` sends and the backend's blobs are: the
    1 MiB block over and over."""
    hasher = hashlib.sha256()
    left = size
    while left:
        n = min(left, len(BLOCK))
        hasher.update(BLOCK[:n])
        left -= n
    return hasher.hexdigest()


def checked(
    direction: str,
    host: str,
    port: int,
    headers: dict[str, str],
    size: int,
    expect_cloud: str,
    hops: str | None = "2",
) -> tuple[bool, float, str]:
    """One upload or download of `size` bytes on the object-store frontend at host:port, its
    bytes checked end to end: the backend's SHA-256 of what it received (an upload) or ours of
    what came (a download) against the pattern's; the upload's answer must come from
    `expect_cloud`'s backend, with `hops` routers crossed. (intact, seconds, what was found);
    a failed connection or status raises OSError or BenchError."""
    expected = pattern_sha256(size)
    if direction == "upload":
        headers = {**headers, CHECKSUM_HEADER: "sha256"}
        seconds, body = upload(host, port, "/v1/AUTH_soak/c/big", headers, size)
        try:
            answer = json.loads(body)
        except ValueError:
            return False, seconds, f"the upload's answer is not JSON: {body[:200]!r}"
        intact = (
            answer.get("body_sha256") == expected
            and answer.get("body_bytes") == size
            and answer.get("cloud") == expect_cloud
            and answer.get("hops") == hops
        )
        detail = (
            f"backend {answer.get('cloud')} received {answer.get('body_bytes')} bytes, "
            f"SHA-256 {'as sent' if answer.get('body_sha256') == expected else 'DIFFERENT'}, "
            f"X-Scope-Hops {answer.get('hops')!r}"
        )
        return intact, seconds, detail
    hasher = hashlib.sha256()
    seconds, got = download(host, port, f"/v1/AUTH_soak/c/blob/{size}", headers, size, hasher)
    same = hasher.hexdigest() == expected
    return (
        got == size and same,
        seconds,
        f"received {got} bytes, SHA-256 " + ("as expected" if same else "DIFFERENT"),
    )


def measure(
    direction: str,
    label: str,
    host: str,
    port: int,
    headers: dict[str, str],
    size: int,
    pids: dict[str, int],
    expect_cloud: str,
) -> TransferResult:
    with RssSampler(pids) as sampler:
        if direction == "upload":
            seconds, body = upload(host, port, "/v2/images/bench/file", headers, size)
            try:
                answer = json.loads(body)
            except ValueError:
                answer = {}
            got = answer.get("body_bytes")
            # Through routers the backend sees the hop count: two routers crossed.
            hops = None if label == "direct" else "2"
            ok = got == size and answer.get("cloud") == expect_cloud and answer.get("hops") == hops
            detail = (
                f"backend {answer.get('cloud')} received {got} bytes, "
                f"X-Scope-Hops {answer.get('hops')!r} (expected {hops!r})"
            )
        else:
            seconds, got = download(host, port, f"/v2/images/bench/blob/{size}", headers, size)
            ok = got == size
            detail = f"received {got} bytes"
    return TransferResult(
        direction,
        label,
        size,
        seconds,
        size / seconds / 1e6,
        {k: round(v, 1) for k, v in sampler.before.items()},
        {k: round(v, 1) for k, v in sampler.peak.items()},
        ok,
        detail,
    )
