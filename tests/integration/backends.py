"""Small HTTP servers that stand in for OpenStack services in the integration tests and benches.

* :class:`EchoBackend` answers every request (HTTP, or HTTPS with a certificate) with a JSON
  description of what it received (backend name, method, path, headers, body length and
  sha256), reading request bodies as a stream so a 100 MB upload costs no memory.
  ``GET <prefix>/blob/<n>`` answers ``n`` deterministic bytes (:func:`blob_sha256` gives
  their hash), written as a stream;
  ``<prefix>/sleep/<seconds>`` answers after that long (at most 30 s).
* :class:`SilentServer` accepts connections and never answers (a hung upstream: 504).
* :class:`RawServer` answers every connection with fixed bytes (an invalid upstream: 502).
* :class:`RecordingBackend` records what reaches it byte for byte (fields as sent, trailers,
  bodies, incomplete messages), for the hostile-input tests and the fuzz harness.

Everything binds to loopback addresses only. Usable as a library (``EchoBackend("127.0.1.2")
.start()``) or as a program::

    python -m tests.integration.backends 127.0.1.2:5000 127.0.1.2:9292 --name CloudOne
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.server
import ipaddress
import json
import signal
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

CHUNK = 64 * 1024
_PATTERN = bytes(range(256)) * (CHUNK // 256 + 1)


def blob_chunks(n: int) -> Iterator[bytes]:
    """The deterministic content of ``/blob/<n>``: 64 KiB blocks, each rotated by its index."""
    i = 0
    while n > 0:
        size = min(CHUNK, n)
        offset = i % 256
        yield _PATTERN[offset : offset + size]
        n -= size
        i += 1


def blob_sha256(n: int) -> str:
    digest = hashlib.sha256()
    for chunk in blob_chunks(n):
        digest.update(chunk)
    return digest.hexdigest()


def _check_loopback(host: str) -> None:
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"test servers bind to loopback only, not {host}")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _EchoServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> tuple[int, str]:
        """Read the request body as a stream; (length, sha256)."""
        digest = hashlib.sha256()
        length = 0
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                remaining = size
                while remaining:
                    data = self.rfile.read(min(CHUNK, remaining))
                    if not data:
                        raise ConnectionError("client went away")
                    digest.update(data)
                    remaining -= len(data)
                length += size
                self.rfile.readline()
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining:
                data = self.rfile.read(min(CHUNK, remaining))
                if not data:
                    raise ConnectionError("client went away")
                digest.update(data)
                length += len(data)
                remaining -= len(data)
        return length, digest.hexdigest()

    def _handle(self) -> None:
        length, sha = self._body()
        path = self.path
        blob = path.partition("?")[0].rsplit("/blob/", 1)
        if self.command in ("GET", "HEAD") and len(blob) == 2 and blob[1].isdigit():
            self._send_blob(int(blob[1]))
            return
        sleep = path.partition("?")[0].rsplit("/sleep/", 1)
        if len(sleep) == 2:
            self.server.seen.append({"backend": self.server.name, "path": path, "sleeping": True})
            time.sleep(min(float(sleep[1]), 30.0))
        seen = {
            "backend": self.server.name,
            "method": self.command,
            "path": path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body_length": length,
            "body_sha256": sha,
        }
        self.server.seen.append(seen)
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_blob(self, n: int) -> None:
        self.server.seen.append(
            {
                "backend": self.server.name,
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.command == "HEAD":
            return
        for chunk in blob_chunks(n):
            self.wfile.write(chunk)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class _EchoServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], name: str) -> None:
        self.name = name
        self.seen: deque[dict[str, Any]] = deque(maxlen=1000)
        super().__init__(address, _Handler)


class EchoBackend:
    """A threaded HTTP/1.1 echo service on a loopback address (port 0: any free port); HTTPS
    with `tls` (a server context: its certificate and key)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "backend",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        _check_loopback(host)
        self._server = _EchoServer((host, port), name)
        if tls is not None:  # each connection's handshake in its own thread, on first read
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread: threading.Thread | None = None
        self.host = host
        self.port: int = self._server.server_address[1]
        self.name = name
        self.scheme = "http" if tls is None else "https"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def seen(self) -> deque[dict[str, Any]]:
        """What the backend received, oldest first (JSON-like dicts, as it answered)."""
        return self._server.seen

    def start(self) -> EchoBackend:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"backend {self.name}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> EchoBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SilentServer:
    """Accepts TCP connections but never reads from them or answers (a hung service)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        _check_loopback(host)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        self._conns.append(conn)  # kept open, never read, never answered

    def start(self) -> SilentServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._sock.close()

    def __enter__(self) -> SilentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RawServer(SilentServer):
    """Answers every connection with fixed bytes (e.g. an invalid HTTP response) and closes."""

    def __init__(self, reply: bytes, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.reply = reply

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(self.reply)


class _ListHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ListServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        self.server.seen.append(
            (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        )
        ids = self.server.ids
        one = url.path.rstrip("/").removeprefix("/v2/images/")
        if one != url.path.rstrip("/"):  # GET /v2/images/<id>: glance's image, or 404
            if one in ids or one in self.server.extra:
                self._send(200, {"id": one, "name": f"image {one}", "owner": self.server.name})
            else:
                self._send(404, {"code": 404, "title": "Not Found", "message": f"No image {one}"})
            return
        start = ids.index(query["marker"]) + 1 if "marker" in query else 0
        size = min(int(query.get("limit", self.server.cap)), self.server.cap)
        page = ids[start : start + size]
        body: dict[str, Any] = {"images": [{"id": i, "name": f"image {i}"} for i in page]}
        if "pad" in query and body["images"]:  # a large answer: the first image this long
            body["images"][0]["pad"] = "x" * int(query["pad"])
        if self.server.name in query.get("slow", "").split(","):  # this cloud answers late
            time.sleep(float(query.get("delay", "2")))
        if start + size < len(ids):
            body["next"] = f"/v2/images?marker={page[-1]}"
        self._send(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append(
            (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        )
        self._send(201, {"created": self.server.name})

    do_DELETE = do_POST

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ListServer(http.server.ThreadingHTTPServer):
    """A glance-like image list (``GET /v2/images`` with ``limit``/``marker`` paging, at most
    `cap` a page, a ``next`` link) of `ids`, each image also by id (``GET /v2/images/<id>``,
    404 for another id; `extra` ids are found by id but not listed); ``POST``/``DELETE``
    answer 201 naming it. What it received is in ``seen``. A list's query may ask for a large
    answer (``pad=N``: the first image gets N more bytes) or a late one (``slow=<its name,
    ...>&delay=S``)."""

    daemon_threads = True

    def __init__(
        self, host: str, name: str, ids: list[str], cap: int, extra: tuple[str, ...] = ()
    ) -> None:
        super().__init__((host, 0), _ListHandler)
        self.host, self.name, self.ids, self.cap, self.extra = host, name, ids, cap, extra
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server_port}"

    def start(self) -> ListServer:
        threading.Thread(target=self.serve_forever, name=f"list {self.name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.integration.backends",
        description="Run echo backends on loopback addresses until SIGINT/SIGTERM.",
    )
    parser.add_argument("listen", nargs="+", metavar="HOST:PORT", help="loopback address to serve")
    parser.add_argument("--name", default="backend", help="name reported in the JSON answers")
    args = parser.parse_args(argv)
    servers = []
    for spec in args.listen:
        host, _, port = spec.rpartition(":")
        backend = EchoBackend(host, int(port), name=f"{args.name}@{spec}").start()
        servers.append(backend)
        print(f"serving {backend.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    for backend in servers:
        backend.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


@dataclass
class Received:
    """One request as a :class:`RecordingBackend` received it."""

    method: str = ""
    target: bytes = b""
    version: str = ""
    fields: list[tuple[bytes, bytes]] = field(default_factory=list)  # the head's, as sent
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)  # its first bytes (keep_body of them)
    body_length: int = 0
    complete: bool = False  # the whole message came (else the connection ended first)

    def values(self, name: bytes) -> list[bytes]:
        """The values of the head's fields called `name` (any case)."""
        return [value for key, value in self.fields if key.lower() == name.lower()]


RECORDED_BODY = 1 << 20
RECORDED_RAW = 4 << 20


class _Recorder(asyncio.Protocol):
    def __init__(self, backend: RecordingBackend) -> None:
        import httptools

        self.backend = backend
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.current: Received | None = None
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.backend.connections += 1

    def data_received(self, data: bytes) -> None:
        import httptools

        backend = self.backend
        if len(backend.raw) < RECORDED_RAW:
            backend.raw += data[: RECORDED_RAW - len(backend.raw)]
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            backend.errors.append(f"{type(exc).__name__}: {exc}")
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.current is not None and not self.current.complete:
            self.backend.requests.append(self.current)  # what came before the end
        self.current = None

    def on_message_begin(self) -> None:
        self.current = Received()
        self.answered = False

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.current.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        (self.current.trailers if self.current.method else self.current.fields).append(
            (name, value)
        )

    def on_headers_complete(self) -> None:
        current = self.current
        assert current is not None
        current.method = self.parser.get_method().decode("ascii", "replace")
        current.version = self.parser.get_http_version()
        early = self.backend.early(current)
        if early is not None and self.transport is not None:
            self.transport.write(early)
            self.answered = True

    def on_body(self, body: bytes) -> None:
        current = self.current
        assert current is not None
        current.body_length += len(body)
        keep = self.backend.keep_body
        if len(current.body) < keep:
            current.body += body[: keep - len(current.body)]

    def on_message_complete(self) -> None:
        current = self.current
        assert current is not None and self.transport is not None
        current.complete = True
        self.backend.requests.append(current)
        self.current = None
        if not self.answered:
            body = json.dumps(
                {"backend": self.backend.name, "received": current.body_length}
            ).encode()
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )


def _no_early_answer(received: Received) -> bytes | None:
    return None


class RecordingBackend:
    """A raw HTTP/1.1 backend that records what reaches it, byte for byte: the head's fields
    as sent, trailer fields, the body, whether each message was complete, every byte received
    (:attr:`raw`) and what its own parser refused (:attr:`errors`). It answers each complete
    request 200 with a small JSON body, or, when `early` returns bytes for a head, those
    bytes at once (an upstream that answers before the body is in). Bodies are kept up to
    `keep_body` bytes (their length is always counted). An asyncio server in a thread of its
    own; loopback only."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        name: str = "recorder",
        early: Callable[[Received], bytes | None] = _no_early_answer,
        keep_body: int = RECORDED_BODY,
    ) -> None:
        _check_loopback(host)
        self.host, self.name, self.early, self.keep_body = host, name, early, keep_body
        self.port = 0
        self.requests: list[Received] = []
        self.raw = bytearray()
        self.errors: list[str] = []
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RecordingBackend:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            self._loop.create_server(lambda: _Recorder(self), self.host, 0), self._loop
        )
        self._server = future.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def clear(self) -> None:
        self.requests.clear()
        self.raw.clear()
        self.errors.clear()

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
