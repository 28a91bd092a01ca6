"""The router's HTTP/1.1 (scoperouter.http) in one process: a worker's reverse server and pipeline
in front of a scripted backend (parsed by llhttp), driven by raw sockets.

Framing edge cases; hostile input against real router processes, routing, limits, loops, the
breaker, streaming, TLS and workers are the integration suite's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import pytest
import yaml

from scoperouter.http.server import ClientConnection
from scoperouter.http.upstream import UpstreamConnection
from scoperouter.proxy.worker import Worker

HOST = "127.0.0.1"

Answer = Callable[["Seen"], bytes]
THEN_CLOSE = b"<then close>"  # an answer ending so: the backend closes after writing it


@dataclass
class Seen:
    method: str = ""
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Backend(asyncio.Protocol):
    """Parses requests with llhttp and writes what `answer(request)` returns."""

    def __init__(self, answer: Answer, seen: list[Seen]) -> None:
        self.answer, self.seen = answer, seen
        self.parser = httptools.HttpRequestParser(self)
        self.current = Seen()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.current.path += url.decode()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.current.body += body

    def on_message_complete(self) -> None:
        self.current.method = self.parser.get_method().decode()
        self.seen.append(self.current)
        assert self.transport is not None
        reply = self.answer(self.current)
        self.current = Seen()
        if reply.endswith(THEN_CLOSE):
            self.transport.write(reply.removesuffix(THEN_CLOSE))
            self.transport.close()
        else:
            self.transport.write(reply)


def ok(body: bytes = b'{"ok": true}') -> Answer:
    return lambda seen: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@dataclass
class Rig:
    port: int
    seen: list[Seen]
    worker: Worker

    async def exchange(self, data: bytes, *more: bytes, wait: float = 1.0) -> bytes:
        """Send `data` (then each of `more`, a moment apart: pieces of a message) on a new
        connection; everything read until the router closes it or nothing more comes for
        `wait` seconds."""
        reader, writer = await asyncio.open_connection(HOST, self.port)
        writer.write(data)
        await writer.drain()
        for piece in more:
            await asyncio.sleep(0.005)
            writer.write(piece)
            await writer.drain()
        got = await read_all(reader, wait)
        writer.close()
        return got


async def read_all(reader: asyncio.StreamReader, wait: float) -> bytes:
    got = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), wait)
        except TimeoutError:
            return got
        if not chunk:
            return got
        got += chunk


@asynccontextmanager
async def rig(tmp_path: Path, answer: Answer, *, sweep: bool = True) -> AsyncIterator[Rig]:
    """A worker in front of a backend answering with `answer`; `sweep`: the worker's sweep
    runs (every deadline checked each tick), as in a router process."""
    seen: list[Seen] = []
    loop = asyncio.get_running_loop()
    backend = await loop.create_server(lambda: Backend(answer, seen), HOST, 0)
    backend_port = backend.sockets[0].getsockname()[1]
    front = await loop.create_server(asyncio.Protocol, HOST, 0)  # a free port, then freed
    port = front.sockets[0].getsockname()[1]
    front.close()
    await front.wait_closed()
    doc = {
        "version": 1,
        "settings": {"connect_timeout": 1, "response_timeout": 2},
        "clouds": {
            "Solo": {
                "frontends": [{"url": f"http://{HOST}:{port}"}],
                "services": {
                    "image": {
                        "public": {
                            "url": f"http://{HOST}:{port}",
                            "backend": f"http://{HOST}:{backend_port}",
                        }
                    }
                },
            }
        },
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(doc))
    worker = Worker(str(path), "Solo", tmp_path)
    await worker.reverse.start([i for i in worker.config.listeners if i.frontend], {})
    sweeper = loop.create_task(worker.sweep()) if sweep else None
    try:
        yield Rig(port, seen, worker)
    finally:
        if sweeper is not None:
            sweeper.cancel()
        worker.reverse.stop_listening()
        worker.reverse.drain_step(late=True)
        worker.pool.close()
        backend.close()


def run(tmp_path: Path, answer: Answer, scenario: Callable[[Rig], Awaitable[None]]) -> None:
    async def main() -> None:
        async with rig(tmp_path, answer) as r:
            await scenario(r)

    asyncio.run(main())


def statuses(data: bytes) -> list[int]:
    """The status of each answer in `data` (the bodies here never contain a status line)."""
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def error_message(data: bytes) -> str:
    body = data.partition(b"\r\n\r\n")[2]
    return str(json.loads(body)["error"]["message"])


# ------------------------------------------------------------------------- the tests


def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    def answer(seen: Seen) -> bytes:
        body = seen.path.encode()
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def scenario(r: Rig) -> None:
        got = await r.exchange(
            b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /third HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert statuses(got) == [200, 200, 200]
        assert got.index(b"/first") < got.index(b"/second") < got.index(b"/third")
        assert [s.path for s in r.seen] == ["/first", "/second", "/third"]

    run(tmp_path, answer, scenario)


def test_a_closed_client_connection_is_freed_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """A client connection's parser calls its methods: the reference cycle goes when the
    connection is lost, so a request per connection (the openstack CLI's pattern) leaves no
    garbage for the collector (whose passes cost more the more connections are open)."""

    async def scenario(r: Rig) -> None:
        for _ in range(5):
            got = await r.exchange(b"GET /v2/images HTTP/1.1\r\nHost: x\r\n\r\n", wait=0.3)
            assert statuses(got) == [200]
        await asyncio.sleep(0.1)  # the last connection_lost
        assert not r.worker.reverse.state.connections
        assert _alive(ClientConnection) == 0

    _run_without_collector(tmp_path, ok(), scenario)


def _alive(kind: type) -> int:
    """Objects of `kind` the collector tracks (freed ones included until it runs, if in
    reference cycles)."""
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


def _run_without_collector(
    tmp_path: Path, answer: Answer, scenario: Callable[[Rig], Awaitable[None]]
) -> None:
    """:func:`run` with the cycle collector off: what the scenario frees, reference counting
    must."""
    gc.collect()
    gc.disable()
    try:
        run(tmp_path, answer, scenario)
    finally:
        gc.enable()


def test_te_with_content_length_is_refused_before_the_backend(tmp_path: Path) -> None:
    async def scenario(r: Rig) -> None:
        got = await r.exchange(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        assert statuses(got) == [400]
        assert "malformed request" in error_message(got)
        assert b"Connection: close" in got
        assert r.seen == []

    run(tmp_path, ok(), scenario)


def test_a_bad_chunk_size_is_the_clients_400(tmp_path: Path) -> None:
    async def scenario(r: Rig) -> None:
        got = await r.exchange(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n"
        )
        assert statuses(got) == [400]
        assert "malformed request" in error_message(got)

    run(tmp_path, ok(), scenario)


# Every control byte but HTAB (CR ends a line and LF splits one: llhttp refuses a lone CR as a
# malformed line), at the start, inside and at the end of a value, in a value that arrives in
# pieces: llhttp refuses them all (RFC 9110 5.5), and nothing else checks them.
_CONTROLS = [*range(0x00, 0x09), *range(0x0B, 0x0D), *range(0x0E, 0x20), 0x7F]


@pytest.mark.parametrize("byte", _CONTROLS, ids=lambda b: f"0x{b:02x}")
def test_a_control_character_in_a_header_value_is_refused(tmp_path: Path, byte: int) -> None:
    control = bytes([byte])
    values = [control + b"a", b"a" + control + b"b", b"a" + control, b"a" * 3000 + control]

    async def scenario(r: Rig) -> None:
        for value in values:
            head = b"GET /x HTTP/1.1\r\nHost: x\r\nX-A: " + value + b"\r\n\r\n"
            got = await r.exchange(*[head[i : i + 700] for i in range(0, len(head), 700)])
            assert statuses(got) == [400], value[-20:]
            assert "control character" in error_message(got)
        assert r.seen == []

    run(tmp_path, ok(), scenario)


def test_chunked_request_body_arrives_whole_and_chunked_answer_is_relayed(
    tmp_path: Path,
) -> None:
    def answer(seen: Seen) -> bytes:
        return (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(seen.body), seen.body)
        )

    async def scenario(r: Rig) -> None:
        got = await r.exchange(
            b"PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
            b"\r\n4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"
        )
        assert r.seen[0].body == b"Wikipedia"
        assert r.seen[0].headers["transfer-encoding"] == "chunked"
        head = got.partition(b"\r\n\r\n")[0]
        assert b"Transfer-Encoding: chunked" in head
        parts: list[bytes] = []

        class Sink:
            def on_body(self, data: bytes) -> None:
                parts.append(data)

        httptools.HttpResponseParser(Sink()).feed_data(got)
        assert b"".join(parts) == b"abcWikipedia"

    run(tmp_path, answer, scenario)


def test_head_204_and_304_have_no_body_and_keep_the_connection(tmp_path: Path) -> None:
    def answer(seen: Seen) -> bytes:
        if seen.method == "HEAD":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
        if seen.path == "/nothing":
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if seen.path == "/same":
            return b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"
        return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"

    async def scenario(r: Rig) -> None:
        got = await r.exchange(
            b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /same HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert statuses(got) == [200, 204, 304, 200]
        assert b"Content-Length: 5" in got.split(b"\r\n\r\n")[0]  # HEAD keeps its length
        assert got.endswith(b"\r\n\r\nhello")  # the only body is the last answer's
        assert got.count(b"hello") == 1

    run(tmp_path, answer, scenario)


def test_expect_100_continue_is_answered_before_the_body(tmp_path: Path) -> None:
    async def scenario(r: Rig) -> None:
        reader, writer = await asyncio.open_connection(HOST, r.port)
        writer.write(
            b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\n\r\n"
        )
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"body")
        got = await read_all(reader, 1.0)
        writer.close()
        assert statuses(got) == [200]
        assert r.seen[0].body == b"body"
        assert "expect" not in r.seen[0].headers  # the router answered it

    run(tmp_path, ok(), scenario)


def test_informational_answers_are_passed_on(tmp_path: Path) -> None:
    def answer(seen: Seen) -> bytes:
        return (
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        )

    async def scenario(r: Rig) -> None:
        got = await r.exchange(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert statuses(got) == [103, 200]
        assert got.endswith(b"ok")

    run(tmp_path, answer, scenario)


def test_an_answer_delimited_by_close_is_rechunked(tmp_path: Path) -> None:
    def answer(seen: Seen) -> bytes:
        return b"HTTP/1.1 200 OK\r\n\r\nuntil the end" + THEN_CLOSE

    async def scenario(r: Rig) -> None:
        got = await r.exchange(
            b"GET /x HTTP/1.1\r\nHost: x\r\n\r\nGET /y HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert statuses(got) == [200, 200]  # the client connection lives on
        assert b"Transfer-Encoding: chunked" in got.split(b"\r\n\r\n")[0]
        assert got.count(b"d\r\nuntil the end\r\n0\r\n\r\n") == 2

    run(tmp_path, answer, scenario)


def test_a_reused_connection_the_backend_closed_is_retried_for_a_get(tmp_path: Path) -> None:
    answers = iter([b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na", THEN_CLOSE])

    def answer(seen: Seen) -> bytes:
        return next(answers, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb")

    async def scenario(r: Rig) -> None:
        first = await r.exchange(b"GET /1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert first.endswith(b"a")
        # The pooled connection is closed by the backend when the next request arrives on it
        # (the race a keep-alive timeout makes): a GET is sent again on a new connection.
        second = await r.exchange(b"GET /2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert statuses(second) == [200] and second.endswith(b"b")
        assert [s.path for s in r.seen] == ["/1", "/2", "/2"]

    run(tmp_path, answer, scenario)


def test_a_post_on_such_a_connection_is_not_replayed(tmp_path: Path) -> None:
    answers = iter([b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na", THEN_CLOSE])

    def answer(seen: Seen) -> bytes:
        return next(answers, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb")

    async def scenario(r: Rig) -> None:
        await r.exchange(b"GET /1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = await r.exchange(
            b"POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        assert statuses(got) == [502]
        assert [s.path for s in r.seen] == ["/1", "/2"]

    run(tmp_path, answer, scenario)


def test_an_upstream_head_or_trailers_beyond_the_bound_fail_the_exchange(tmp_path: Path) -> None:
    """What an upstream sends is bounded as a client's is (a peer router may be hostile too):
    a head, or what a body carries besides its bytes, past HEAD_MAX (256 KiB; a read more at
    worst) fails the exchange."""

    def big(size: int) -> bytes:
        return b"X-Big: " + b"v" * size + b"\r\n"

    def answer(seen: Seen) -> bytes:
        if seen.path == "/head":
            return b"HTTP/1.1 200 OK\r\n" + big(600_000) + b"Content-Length: 0\r\n\r\n"
        chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n"
        return chunked + big(2_000_000) + b"\r\n"

    async def scenario(r: Rig) -> None:
        got = await r.exchange(b"GET /trailers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        # The answer had begun (its head and a byte relayed): the client's connection is cut.
        assert statuses(got) == [200] and b"X-Big" not in got and not got.endswith(b"0\r\n\r\n")
        got = await r.exchange(b"GET /head HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert statuses(got) == [502] and "head or trailers are larger" in error_message(got)

    run(tmp_path, answer, scenario)


def test_a_closed_upstream_connection_is_freed_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """An upstream connection's parser calls its methods too: when the pool closes its idle
    connections (after a crowd, at their idle time), they go at once, not at the collector's
    next pass (rare in a worker: its young threshold is high)."""

    async def scenario(r: Rig) -> None:
        for _ in range(3):
            got = await r.exchange(b"GET /v2/images HTTP/1.1\r\nHost: x\r\n\r\n", wait=0.3)
            assert statuses(got) == [200]
        assert _alive(UpstreamConnection) >= 1  # kept idle by the pool
        r.worker.pool.tidy(time.monotonic() + 3600)  # past their idle time: closed
        await asyncio.sleep(0.1)  # their connection_lost
        assert _alive(UpstreamConnection) == 0

    _run_without_collector(tmp_path, ok(), scenario)


def test_a_worker_hands_memory_back_after_closing_a_crowds_idle_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a tidy closes TRIM_AFTER_CLOSED idle upstream connections or more (those a crowd
    left, at their idle time), the worker trims its heap soon after; fewer: no trim."""
    from scoperouter.proxy import worker as worker_module
    from scoperouter.router import budget

    trims: list[int] = []
    monkeypatch.setattr(budget, "trim_soon", lambda: trims.append(1))

    @dataclass
    class Tidied:
        closed: int

        def tidy(self, now: float) -> int:
            return self.closed

    async def scenario(r: Rig) -> None:
        pool = r.worker.pool
        try:
            for closed in (worker_module.TRIM_AFTER_CLOSED - 1, 0):
                r.worker.pool = Tidied(closed)  # type: ignore[assignment]
                r.worker.tidy(time.monotonic())
            assert trims == []
            r.worker.pool = Tidied(worker_module.TRIM_AFTER_CLOSED)  # type: ignore[assignment]
            r.worker.tidy(time.monotonic())
            assert trims == [1]
        finally:
            r.worker.pool = pool

    run(tmp_path, ok(), scenario)


def test_worker_collector_young_threshold() -> None:
    """A worker's youngest generation is collected after GC_YOUNG_THRESHOLD new container
    objects (not CPython's 700); the older generations keep CPython's thresholds."""
    from scoperouter.proxy import worker as worker_module

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        worker_module.tune_collector()
        assert gc.get_threshold() == (worker_module.GC_YOUNG_THRESHOLD, 10, 10)
        assert worker_module.GC_YOUNG_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)
