"""A small, fast HTTP/1.1 server on asyncio (raw protocol, keep-alive), run as a subprocess::

    python -m bench.httpserver 127.0.1.2:8001=CloudOne 127.0.1.3:8002=CloudTwo

It is the bench's backend for the large bodies (always) and for the small requests when nginx
cannot be had. Every request's body is read to the end (Content-Length or chunked) and counted;
then it answers:

* ``GET .../blob/<n>``: ``n`` bytes of application/octet-stream, written as fast as the
  connection takes them (flow control honoured, constant memory);
* anything else: a small JSON body ``{"cloud": NAME, "method": ..., "path": ...,
  "body_bytes": n, "hops": <X-Scope-Hops or null>}``, and ``"body_sha256"`` (the hex SHA-256
  of the body) when the request asks for it with ``X-Bench-Checksum: sha256``.

Binds to loopback addresses only. Prints ``ready`` once every listener is up.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import signal
import sys
from typing import Any

BLOCK = memoryview(bytes(range(256)) * 4096)  # 1 MiB
MAX_HEAD = 64 * 1024


class HttpProtocol(asyncio.Protocol):
    def __init__(self, name: str) -> None:
        self.name = name
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.state = "head"  # head | body | chunk-size | chunk-data | chunk-crlf | trailers
        self.remaining = 0
        self.received = 0
        self.hasher: Any = None  # hashlib's sha256 when the request asks for the body's
        self.request: tuple[str, str, dict[str, str]] | None = None
        self.blob_left = 0
        self.paused = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.blob_left:
            self._pump_blob()
            if not self.blob_left and self.buf:
                self._process()  # a request that arrived while the blob was being written

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            self._process()
        except ValueError as exc:
            self._respond(400, json.dumps({"error": str(exc)}).encode(), "application/json")
            self.close_after = True
            self._finish()

    def _process(self) -> None:
        while True:
            if self.blob_left:  # still writing a blob: read on later (pipelining is rare)
                return
            if self.state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > MAX_HEAD:
                        raise ValueError("request head too large")
                    return
                head = bytes(self.buf[:end]).decode("latin-1")
                del self.buf[: end + 4]
                lines = head.split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    headers[key.strip().lower()] = value.strip()
                self.request = (method, target, headers)
                self.received = 0
                wants = headers.get("x-bench-checksum", "").lower() == "sha256"
                self.hasher = hashlib.sha256() if wants else None
                self.close_after = (
                    headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
                )
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    self.state = "chunk-size"
                else:
                    self.remaining = int(headers.get("content-length") or 0)
                    self.state = "body"
            elif self.state == "body":
                take = min(self.remaining, len(self.buf))
                if take:
                    self._hash(take)
                    del self.buf[:take]
                    self.remaining -= take
                    self.received += take
                if self.remaining:
                    return
                self._answer()
            elif self.state == "chunk-size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(self.buf[:end]).split(b";")[0].strip() or b"0", 16)
                del self.buf[: end + 2]
                if size == 0:
                    self.state = "trailers"
                else:
                    self.remaining = size
                    self.state = "chunk-data"
            elif self.state == "chunk-data":
                take = min(self.remaining, len(self.buf))
                self._hash(take)
                del self.buf[:take]
                self.remaining -= take
                self.received += take
                if self.remaining:
                    return
                self.state = "chunk-crlf"
            elif self.state == "chunk-crlf":
                if len(self.buf) < 2:
                    return
                del self.buf[:2]
                self.state = "chunk-size"
            elif self.state == "trailers":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                del self.buf[: end + 2]
                if end == 0:
                    self._answer()

    def _hash(self, take: int) -> None:
        if self.hasher is not None:
            with memoryview(self.buf) as view:
                self.hasher.update(view[:take])

    def _answer(self) -> None:
        assert self.request is not None
        method, target, headers = self.request
        self.state = "head"
        path = target.partition("?")[0]
        _, sep, tail = path.rpartition("/blob/")
        if sep and tail.isdigit() and method in ("GET", "HEAD"):
            size = int(tail)
            self._write_head(200, "application/octet-stream", size)
            if method == "GET" and size:
                self.blob_left = size
                self._pump_blob()
            else:
                self._finish()
            return
        answer = {
            "cloud": self.name,
            "method": method,
            "path": target,
            "body_bytes": self.received,
            "hops": headers.get("x-scope-hops"),
        }
        if self.hasher is not None:
            answer["body_sha256"] = self.hasher.hexdigest()
        body = json.dumps(answer).encode()
        self._respond(200, body, "application/json")
        self._finish()

    def _write_head(self, status: int, ctype: str, length: int) -> None:
        assert self.transport is not None
        reason = {200: "OK", 400: "Bad Request"}.get(status, "OK")
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )

    def _respond(self, status: int, body: bytes, ctype: str) -> None:
        self._write_head(status, ctype, len(body))
        assert self.transport is not None
        self.transport.write(body)

    def _pump_blob(self) -> None:
        assert self.transport is not None
        while self.blob_left and not self.paused:
            n = min(self.blob_left, len(BLOCK))
            self.transport.write(BLOCK[:n])
            self.blob_left -= n
        if not self.blob_left:
            self._finish()

    def _finish(self) -> None:
        self.request = None
        if self.close_after and self.transport is not None:
            self.transport.close()


def _loopback(host: str) -> str:
    if not ipaddress.ip_address(host).is_loopback:
        raise SystemExit(f"bench servers bind to loopback only, not {host}")
    return host


async def serve(specs: list[tuple[str, int, str]]) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for host, port, name in specs:
        servers.append(
            await loop.create_server(
                lambda name=name: HttpProtocol(name), _loopback(host), port, backlog=1024
            )
        )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def parse_spec(text: str) -> tuple[str, int, str]:
    address, _, name = text.partition("=")
    host, _, port = address.rpartition(":")
    return host, int(port), name or address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.httpserver", description=__doc__)
    parser.add_argument("listen", nargs="+", metavar="HOST:PORT=NAME")
    args = parser.parse_args(argv)
    asyncio.run(serve([parse_spec(s) for s in args.listen]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
