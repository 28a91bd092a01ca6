"""Part 3: large bodies. One upload (PUT with Content-Length) and one download (GET of a blob),
direct and through the routers, over raw sockets from constant memory; the routers' RSS is
sampled every 10 ms during each transfer to catch its peak."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import asdict, dataclass

from bench.procs import BenchError, rss_max_mb

BLOCK = memoryview(bytes(range(256)) * 4096)  # 1 MiB


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


def _read_exact_count(sock: socket.socket, already: int, total: int) -> int:
    """Read and drop body bytes until `total` have been seen; returns the count."""
    got = already
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while got < total:
        n = sock.recv_into(view, min(len(buf), total - got))
        if n == 0:
            break
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
    host: str, port: int, path: str, headers: dict[str, str], size: int
) -> tuple[float, int]:
    """GET a `size`-byte blob; (seconds until the last byte, bytes received)."""
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
        got = _read_exact_count(sock, len(rest), length)
    return time.perf_counter() - start, got


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
            ok = got == size and answer.get("cloud") == expect_cloud and not answer.get("hops")
            detail = f"backend {answer.get('cloud')} received {got} bytes"
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
