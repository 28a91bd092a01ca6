"""What one request costs the worker besides its bytes, through a real worker (its reverse
server, pipeline and upstream pool) in front of a scripted backend (tests/unit/test_http.py's
rig), on a client connection kept alive: no system call to find the event loop, no object
built by a dataclass-generated ``__init__`` (Python code even in the compiled build).

Each is looked at over requests that follow a first one (which opened the upstream connection:
a connect is once per connection), without the worker's sweep (once per tick, not per request).
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

from .test_http import HOST, Rig, ok, rig, statuses

GET = b'GET /v2/images?limit=1 HTTP/1.1\r\nHost: x\r\nX-Scope: {"image": "Solo"}\r\n\r\n'
PUT = b"PUT /v2/images/1/file HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


async def _answers(loop: asyncio.AbstractEventLoop, sock: socket.socket, count: int) -> bytes:
    """`count` whole answers (each with a Content-Length) read off `sock` with the loop's own
    socket calls (asyncio's streams and wait_for would ask for the running loop themselves)."""
    got = b""
    while True:
        rest, done = got, 0
        while done < count:
            head, sep, rest = rest.partition(b"\r\n\r\n")
            found = _LENGTH.search(head)
            if not sep or found is None or len(rest) < int(found.group(1)):
                break
            rest, done = rest[int(found.group(1)) :], done + 1
        if done == count:
            return got
        data = await loop.sock_recv(sock, 65536)
        if not data:
            return got
        got += data


_Send = Callable[[], Awaitable[bytes]]
"""A GET, then a PUT with its body, on the kept-alive client connection; their answers."""


def _after_a_first_request(tmp_path: Path, window: Callable[[_Send], Awaitable[bytes]]) -> bytes:
    """`window(send)` (which watches while it sends) run once a first GET was answered on the
    client connection `send` uses; what `window` returns."""
    got: list[bytes] = []

    async def main() -> None:
        async with rig(tmp_path, ok(), sweep=False) as r:
            got.append(await asyncio.wait_for(_exchange(r, window), 10))

    asyncio.run(main())
    return got[0]


async def _exchange(r: Rig, window: Callable[[_Send], Awaitable[bytes]]) -> bytes:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, (HOST, r.port))
    try:
        await loop.sock_sendall(sock, GET)
        assert statuses(await _answers(loop, sock, 1)) == [200]

        async def send() -> bytes:
            await loop.sock_sendall(sock, GET)
            first = await _answers(loop, sock, 1)
            await loop.sock_sendall(sock, PUT)
            return first + await _answers(loop, sock, 1)

        return await window(send)
    finally:
        sock.close()


def test_a_request_never_asks_asyncio_for_the_running_loop(tmp_path: Path) -> None:
    """``asyncio.get_running_loop()`` makes a ``getpid()`` system call at every call (CPython
    checks for a fork): the connections keep their loop (from ``connection_made``)."""
    calls: list[str] = []
    real = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        calls.append("".join(traceback.format_stack(limit=4)[:-1]))
        return real()

    async def window(send: _Send) -> bytes:
        # asyncio's own modules call it as events.get_running_loop; ours as asyncio's
        asyncio.get_running_loop = asyncio.events.get_running_loop = counted
        try:
            return await send()
        finally:
            asyncio.get_running_loop = asyncio.events.get_running_loop = real

    got = _after_a_first_request(tmp_path, window)
    assert statuses(got) == [200, 200]
    assert calls == [], "\n".join(calls)


def test_a_request_builds_nothing_with_a_dataclass_generated_init(tmp_path: Path) -> None:
    made: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_name == "__init__" and "__create_fn__" in code.co_qualname:
            kind = type(frame.f_locals.get("self"))
            if kind.__module__.startswith("scoperouter."):  # not the scripted backend's
                made.append(f"{kind.__module__}.{kind.__qualname__}")

    async def window(send: _Send) -> bytes:
        sys.setprofile(profile)
        try:
            return await send()
        finally:
            sys.setprofile(None)

    got = _after_a_first_request(tmp_path, window)
    assert statuses(got) == [200, 200]
    assert made == []
