"""The reverse proxies ``python -m bench.floor`` compares with the router (bench code only).

    python -O -m bench.floor_servers mitm --listen HOST:PORT --upstream http://HOST:PORT
    python -O -m bench.floor_servers lean --listen HOST:PORT --upstream http://HOST:PORT

Each runs in one process and accepts on a socket bound with ``SO_REUSEPORT``, so that starting
the same command twice gives two processes sharing the port (as ``scoperouter serve --workers
2`` does).

* ``mitm``: the least an embedded mitmproxy reverse proxy needs: a ``Master`` with
  ``Proxyserver``, ``NextLayer`` and ``TlsConfig`` only, the router's connection options
  (``connection_strategy=lazy``, ``stream_large_bodies=1m``, ``keep_host_header``, HTTP/1.1
  only), ``gc.freeze()`` after start-up as the router does, no addon of ours. What mitmproxy
  itself costs per request.
* ``lean``: an asyncio reverse proxy on ``httptools`` (the llhttp parser uvicorn uses): one
  ``asyncio.Protocol`` per client connection, the request parsed by llhttp, sent upstream over a
  keep-alive connection from a pool the process owns, the response parsed by llhttp and written
  back with its ``Content-Length``. HTTP/1.1, ``Content-Length`` or chunked bodies, no
  pipelining, no TLS, no streaming (bodies are buffered): a prototype to measure the floor of a
  Python data path, not a product. It runs on the event loop the router's workers run
  (``--loop``, by default the router's default: uvloop when it can be imported), so that the
  floor and the router differ by what the router does, not by their loop.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

# the router's lean data path's list (the prototype it grew from drops the same fields)
from scoperouter.http.wire import HOP_BY_HOP
from scoperouter.proxy import eventloop

# the lean proxy's loop: the router workers' default (uvloop where it can be imported)
LEAN_LOOP = eventloop.choose("uvloop")[0]
REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


def reuse_port_socket(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (with Nagle on, a response written in two parts waits ~40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


# ------------------------------------------------------------------------------------ mitm


async def run_mitm(sock: socket.socket, upstream: str) -> None:
    from mitmproxy import master, options
    from mitmproxy.addons import next_layer, proxyserver, tlsconfig
    from mitmproxy.proxy import mode_servers

    async def listen(self: Any, host: str, port: int) -> list[asyncio.Server]:
        return [await asyncio.start_server(self.handle_stream, sock=sock)]

    mode_servers.AsyncioServerInstance.listen = listen  # type: ignore[method-assign]
    host, port = sock.getsockname()[:2]
    with tempfile.TemporaryDirectory(prefix="bench-mitm-") as confdir:
        opts = options.Options()
        m = master.Master(opts, with_termlog=False)
        m.addons.add(proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig())
        opts.update(
            confdir=confdir,
            mode=[f"reverse:{upstream}@{host}:{port}"],
            connection_strategy="lazy",
            stream_large_bodies="1m",
            keep_host_header=True,
            http2=False,
            http3=False,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, m.shutdown)
        gc.freeze()  # as the router does: start-up's objects out of the collector's sight
        await m.run()


# ------------------------------------------------------------------------------------ lean


class Pool:
    """Idle keep-alive connections to the upstream, owned by the process."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[Upstream] = []

    async def send(self, request: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        while self.idle:
            conn = self.idle.pop()
            if conn.open:
                try:
                    return await conn.exchange(request, self)
                except ConnectionError:
                    continue  # a reused connection the upstream closed: try another
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(Upstream, self.host, self.port)
        return await conn.exchange(request, self)


class Upstream(asyncio.Protocol):
    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.waiter: asyncio.Future[Any] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("upstream closed"))

    async def exchange(
        self, request: bytes, pool: Pool
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        assert self.transport is not None
        self.headers, self.body = [], []
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        keep_alive = await self.waiter
        status = self.parser.get_status_code()
        if keep_alive and self.open:
            pool.idle.append(self)
        else:
            self.transport.close()
        return status, b"", self.headers, b"".join(self.body)

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(ConnectionError(str(exc)))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # Asked here: once the callback returns, llhttp's state is the next message's.
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.parser.should_keep_alive())


class Client(asyncio.Protocol):
    """One client connection: parse a request, forward it, answer, wait for the next."""

    def __init__(self, pool: Pool) -> None:
        import httptools

        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.task: asyncio.Future[None] | None = None  # the request being forwarded

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.transport.pause_reading()  # one request at a time (no pipelining)
        method = self.parser.get_method()
        keep_alive = self.parser.should_keep_alive()
        body = b"".join(self.body)
        lines = [method + b" " + self.url + b" HTTP/1.1"]
        lines += [n + b": " + v for n, v in self.headers if n.lower() not in HOP_BY_HOP]
        lines.append(b"content-length: " + str(len(body)).encode())
        request = b"\r\n".join(lines) + b"\r\n\r\n" + body
        self.task = asyncio.ensure_future(self.forward(request, keep_alive))

    async def forward(self, request: bytes, keep_alive: bool) -> None:
        assert self.transport is not None
        try:
            status, _, headers, body = await self.pool.send(request)
        except (OSError, ConnectionError):
            self.transport.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            self.transport.close()
            return
        lines = [b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Unknown"))]
        lines += [n + b": " + v for n, v in headers if n.lower() not in HOP_BY_HOP]
        lines.append(b"content-length: " + str(len(body)).encode())
        if not keep_alive:
            lines.append(b"connection: close")
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        if keep_alive:
            self.transport.resume_reading()
        else:
            self.transport.close()


async def run_lean(sock: socket.socket, upstream: str) -> None:
    parts = urlsplit(upstream)
    pool = Pool(parts.hostname or "127.0.0.1", parts.port or 80)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(pool), sock=sock)
    print(f"lean httptools proxy on {eventloop.running()}", file=sys.stderr, flush=True)
    gc.freeze()
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set_result, None)
    async with server:
        await stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_servers")
    parser.add_argument("kind", choices=["mitm", "lean"])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--upstream", required=True, metavar="URL")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default=LEAN_LOOP,
        help="lean: the event loop (default: the router workers' default, uvloop when installed)",
    )
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    sock = reuse_port_socket(host, int(port))
    runners: dict[str, Callable[[socket.socket, str], Any]] = {
        "mitm": run_mitm,
        "lean": run_lean,
    }
    serve = runners[args.kind](sock, args.upstream)
    eventloop.run(serve, args.loop if args.kind == "lean" else "asyncio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
