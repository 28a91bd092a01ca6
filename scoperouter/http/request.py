"""A request as the application gets it from the server: its head, checked, and its body
arriving (:class:`Body`, with back-pressure); a head refused before any request existed
(:class:`Refusal`); the ways a body fails (:class:`BodyError`).
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Protocol

from scoperouter.errors import ClientGone
from scoperouter.http.wire import Fields

HIGH_WATER = 256 * 1024  # request body bytes buffered before reading from the client pauses


class Reader(Protocol):
    """The connection a body is read from."""

    @property
    def closed(self) -> bool: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class BodyError(Exception):
    """The client's request body failed: malformed (400), too slow (408), chunk headers or
    trailers too large (431). Raised by :meth:`Body.get`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A head the server refused before the application saw a request."""

    status: int
    message: str
    method: str
    path: str
    started: float  # time.monotonic() of the head's first byte
    client_address: str | None
    extra: Fields = field(default_factory=list)  # more answer fields (Allow of a 405)


class Body:
    """A request body on its way from the client: chunks queued, reading paused while more
    than :data:`HIGH_WATER` bytes wait (resumed as they are taken)."""

    __slots__ = ("_loop", "_waiter", "chunks", "complete", "conn", "done", "error", "size")

    def __init__(self, conn: Reader, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.conn = conn
        self._loop = loop  # the connection's (else asked of asyncio when first waited for)
        # Made at the first chunk: most requests have no body (a deque holds a 528-byte block
        # from the start: allocated and freed per request, ~0.5 KB per request in flight)
        self.chunks: collections.deque[bytes] | None = None
        self.size = 0
        self.done = False
        self.complete = False  # the whole body came, well-formed: the connection may go on
        self.error: BodyError | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, data: bytes) -> None:
        chunks = self.chunks
        if chunks is None:
            chunks = self.chunks = collections.deque()
        chunks.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER:
            self.conn.pause_reading()
        self.wake()

    def finish(self, error: BodyError | None = None) -> None:
        if not self.done:
            self.done, self.error = True, error
            self.complete = error is None
        self.wake()

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> bytes | None:
        """The next chunk; None at the end (:class:`BodyError`, :class:`ClientGone`)."""
        chunks = self.chunks
        while not chunks:
            if self.done:
                if self.error is not None:
                    raise self.error
                return None
            if self.conn.closed:
                raise ClientGone()
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            await self._waiter
            chunks = self.chunks
        assert chunks is not None
        data = chunks.popleft()
        self.size -= len(data)
        if self.size <= HIGH_WATER // 2:
            self.conn.resume_reading()
        return data


# __init__ written out: dataclasses' is Python code even in the compiled build (one per request)
@dataclass(slots=True, kw_only=True, init=False)
class Request:
    """A request whose head is complete and checked (its body may still be arriving)."""

    method: str
    target: bytes  # origin-form (an absolute-form target's path and query)
    authority: str | None  # an absolute-form target's authority (lower-case), else None
    version: str  # "1.1", "1.0"
    fields: Fields  # the head's fields as received (never trailer fields)
    headers: dict[str, str]  # lower-case name -> value (utf-8, surrogateescape), joined
    connection: frozenset[bytes]  # the options Connection names (lower-case)
    keep_alive: bool  # the client's wish; the application clears it when it must close
    chunked: bool
    length: int | None  # Content-Length, if given
    body: Body
    started: float  # time.monotonic() of the head's first byte

    has_body: bool  # chunked, or a Content-Length above 0
    # identity fields dropped from the head (keystonemiddleware's names, lower-case, sorted)
    stripped: tuple[str, ...] = ()

    # fmt: off
    def __init__(
        self, *, method: str, target: bytes, authority: str | None, version: str,
        fields: Fields, headers: dict[str, str], connection: frozenset[bytes],
        keep_alive: bool, chunked: bool, length: int | None, body: Body, started: float,
        has_body: bool, stripped: tuple[str, ...] = (),
    ) -> None:
        self.method, self.target, self.authority, self.version = method, target, authority, version
        self.fields, self.headers, self.connection = fields, headers, connection
        self.keep_alive, self.chunked, self.length, self.body = keep_alive, chunked, length, body
        self.started, self.has_body, self.stripped = started, has_body, stripped
    # fmt: on
