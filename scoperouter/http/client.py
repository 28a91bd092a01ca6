"""One exchange with an upstream, for every request the router sends (a client's request to
one cloud, and each part of ``A & B`` / ``A | B``), as aiohttp's ``connector.connect()`` is
one way to a connection for every caller.

:func:`exchange`: take an idle pooled connection or open one (the connect timeout bounds it),
write the head, send the body while waiting for the answer (an upstream may answer before the
body is complete: its answer is taken), pass informational answers on, and return the final
answer's head with the connection carrying its body. A request without a body that finds its
*reused* connection closed before any answer (the peer had closed it) is sent once more on a
new connection if its method is idempotent. The response timeout runs while the router waits
for the upstream (its answer, or room in its window for the body), restarted by each chunk
sent; the pool's sweep expires it. The client's own faults (its body fails or stops, it goes
away) end the exchange with its exception (:class:`~.server.BodyError`,
:class:`~.server.ClientGone`), never as the upstream's.

Then :func:`relay` writes the answer to the client (hop-by-hop fields dropped, re-framed,
streamed with back-pressure), or :func:`read_whole` reads it (bounded), and :func:`finish`
gives the connection back to the pool or closes it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from scoperouter.errors import ClientGone
from scoperouter.http import heads, wire
from scoperouter.http.pool import Pool, describe_error
from scoperouter.http.request import Body, BodyError
from scoperouter.http.server import ClientConnection
from scoperouter.http.upstream import OVER_BUDGET, Head, Origin, UpstreamConnection
from scoperouter.http.wire import Fields
from scoperouter.semantics import IDEMPOTENT

Kind = Literal["connect_timeout", "unreachable", "timeout", "broken"]
# Connection's own options, and names already dropped as hop-by-hop: nothing more to drop.
_OPTIONS: Final = wire.HOP_BY_HOP | {b"close"}


class ExchangeError(Exception):
    """No (whole) answer came: `kind` says how, `reason` why in words; `connected`: a
    connection was up (the request may have reached the upstream)."""

    def __init__(self, kind: Kind, reason: str, connected: bool) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.connected = kind, reason, connected


# __init__ written out: dataclasses' is Python code even in the compiled build (one per request)
@dataclass(slots=True, eq=False, init=False)
class Answer:
    """The final answer's head, and the connection carrying its body."""

    status: int
    reason: bytes
    fields: Fields
    conn: UpstreamConnection
    sending: asyncio.Task[None] | None  # the body still being sent (answered early)

    def __init__(
        self,
        status: int,
        reason: bytes,
        fields: Fields,
        conn: UpstreamConnection,
        sending: asyncio.Task[None] | None,
    ) -> None:
        self.status, self.reason, self.fields = status, reason, fields
        self.conn, self.sending = conn, sending


async def exchange(
    pool: Pool,
    origin: Origin,
    head: bytes,
    *,
    method: str,
    body: Body | bytes | None = None,
    chunked: bool = False,
    connect_timeout: float,
    response_timeout: float,
    client: ClientConnection | None = None,
    informational: Callable[[Head], None] | None = None,
) -> Answer:
    """Send `head` and `body` to `origin`; the final answer (:class:`ExchangeError` when none
    came). `body` is the client's (streamed; `chunked`: framed so) or bytes sent whole; while
    `client` is served, its going away gives the exchange up."""
    streamed = isinstance(body, Body)
    for attempt in (1, 2):
        conn = pool.take(origin)
        reused = conn is not None
        if conn is None:
            try:
                conn = await pool.connect(origin, connect_timeout)
            except TimeoutError:
                raise ExchangeError(
                    "connect_timeout",
                    f"it did not accept a connection within {connect_timeout:g}s",
                    connected=False,
                ) from None
            except (OSError, ssl.SSLError) as exc:
                raise ExchangeError("unreachable", describe_error(exc), connected=False) from None
        conn.reset(skip_body=method == "HEAD")
        sending: asyncio.Task[None] | None = None
        if isinstance(body, Body):
            conn.write(head)
            sending = conn.event_loop().create_task(_send(body, conn, chunked, response_timeout))
        else:
            conn.write(head + body if body else head)
            conn.deadline = time.monotonic() + response_timeout
        if client is not None:
            client.relay = conn
        try:
            while True:  # until the final answer's head is in, or the connection failed (0)
                await conn.wait()
                status = _final_status(conn, informational)
                if status or _failed(conn, sending, client):
                    break
        except BaseException:
            _give_up(conn, sending, "the exchange was given up")
            raise
        finally:
            if client is not None:
                client.relay = None
        if status:
            status, reason, fields = conn.heads.popleft()
            conn.deadline = None  # the head came: relay or read_whole watch the body
            return Answer(status, reason, fields, conn, sending)
        _give_up(conn, sending, conn.error or "no answer")
        # Sent again only when nothing could have reached the upstream twice: a reused
        # connection the peer had closed, no byte of an answer, a body held whole or none.
        retry = reused and attempt == 1 and not streamed and not conn.received
        if not (retry and method in IDEMPOTENT and not conn.timed_out):
            if conn.timed_out:
                raise ExchangeError(
                    "timeout", f"it did not answer within {response_timeout:g}s", connected=True
                )
            raise ExchangeError("broken", conn.error or "no answer", connected=True)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


async def _send(body: Body, conn: UpstreamConnection, chunked: bool, timeout: float) -> None:
    """The client's body to the upstream, as it comes. The response timeout runs only while
    the upstream is waited for (a slow client is the body timeout's)."""
    try:
        while True:
            conn.deadline = None
            data = await body.get()
            conn.deadline = time.monotonic() + timeout
            if data is None:
                if chunked:
                    conn.write(wire.LAST_CHUNK)
                return
            conn.write(wire.chunk(data) if chunked else data)
            await conn.drain()
    except (BodyError, ClientGone):
        conn.fail("the client's request body failed")
        raise
    except ConnectionError:
        return  # the upstream stopped reading: its answer (or error) tells the rest


def _final_status(conn: UpstreamConnection, informational: Callable[[Head], None] | None) -> int:
    """The final answer's status once its head is in (informational ones passed on), else 0."""
    while conn.heads:
        status = conn.heads[0][0]
        if status >= 200:
            return status
        interim = conn.heads.popleft()
        if informational is not None:
            informational(interim)
    return 0


def _failed(
    conn: UpstreamConnection, sending: asyncio.Task[None] | None, client: ClientConnection | None
) -> bool:
    """Whether the exchange ended without an answer; the client's own faults are raised."""
    if sending is not None and sending.done() and sending.exception() is not None:
        raise sending.exception()  # type: ignore[misc]
    if client is not None and client.closed:
        raise ClientGone()
    return conn.error is not None or conn.complete


def _give_up(conn: UpstreamConnection, sending: asyncio.Task[None] | None, why: str) -> None:
    if sending is not None and not sending.done():
        sending.cancel()
    conn.fail(why)


async def read_whole(
    answer: Answer, timeout: float, reserve: Callable[[int], bool] | None = None
) -> bytes:
    """The answer's whole body (at most upstream.WHOLE_MAX: :class:`ExchangeError` past it,
    or when it breaks off or does not end within `timeout`). `reserve`, when given, is asked
    for every piece's size before it is kept; its False fails the exchange (upstream's
    ``OVER_BUDGET``)."""
    conn = answer.conn
    if reserve is not None:
        if not reserve(conn.pending_size):
            raise ExchangeError("broken", OVER_BUDGET, connected=True)
        conn.reserve = reserve
    conn.keep_whole = True
    conn.deadline = time.monotonic() + timeout
    conn.resume_reading()
    while not conn.complete and conn.error is None:
        await conn.wait()
    conn.deadline = None
    if conn.error is not None and not conn.complete:
        conn.take_body()  # dropped now, not when the connection object is collected
        if conn.timed_out:
            raise ExchangeError(
                "timeout", f"its answer did not end within {timeout:g}s", connected=True
            )
        raise ExchangeError("broken", conn.error, connected=True)
    return conn.take_body()


async def relay(
    answer: Answer,
    client: ClientConnection,
    *,
    method: str,
    version: str,
    keep: bool,
    extra: Fields,
    timeout: float,
    body: bytes | None = None,
    dropped: frozenset[bytes] = wire.HOP_BY_HOP,
) -> bool:
    """Write the answer to `client`: its head without hop-by-hop fields (nor the others named
    in `dropped`, lower case, a superset of them: e.g. those `extra` sets), `extra` added, and
    its body streamed (re-framed; an upstream that sends none of it for `timeout` seconds
    while the client reads is cut off), or `body` instead when given (read whole, changed).
    Whether the client connection may carry another request. :class:`ExchangeError` when the
    upstream broke off in the middle (the client's connection must then be cut: it must not
    take a truncated body for a whole one); :class:`ClientGone`."""
    conn = answer.conn
    status = answer.status
    no_body = method == "HEAD" or status in (204, 304) or status < 200  # wire.bodiless
    # One pass over the answer's fields: the hop-by-hop ones are read, the others kept.
    length: bytes | None = None
    coding = connection = b""
    out: Fields = []
    for field in answer.fields:
        name = field[0].lower()
        if name not in dropped:
            out.append(field)
        elif name == b"content-length":
            length = field[1]
        elif name == b"transfer-encoding":
            coding += field[1]
        elif name == b"connection":
            connection += b"," + field[1]
    chunked = b"chunked" in coding.lower()
    if connection and (tokens := heads.connection_tokens(connection)):
        named = tokens - _OPTIONS  # the fields Connection names (not its own options)
        if named:
            out = [f for f in out if f[0].lower() not in named]
    out += extra
    if answer.sending is not None and not answer.sending.done():
        keep = False  # answered before the body was complete: the rest is not read
    if no_body:
        if length is not None:
            out.append((b"Content-Length", length))
    elif body is not None:
        out.append((b"Content-Length", b"%d" % len(body)))
    elif length is not None and not chunked:
        out.append((b"Content-Length", length))
        conn.framing = "length"
    elif version == "1.1":
        out.append((b"Transfer-Encoding", b"chunked"))
        conn.framing = "chunked"
    else:
        conn.framing = "raw"
        keep = False
    conn.until_close = not (length is not None or chunked or no_body or body is not None)
    if not keep:
        out.append((b"Connection", b"close"))
    head = wire.render(status, answer.reason.decode("latin-1"), out, body or b"")
    if body is not None or no_body:
        client.write(head)
    else:
        client.relay = conn
        conn.progress_timeout = timeout
        conn.deadline = time.monotonic() + timeout
        conn.start_relay(client, head)
        try:
            while not conn.complete and conn.error is None:
                await conn.wait()
        finally:
            client.relay = None
            conn.sink = None
            conn.progress_timeout = conn.deadline = None
            conn.resume_reading()
        if client.closed:
            raise ClientGone()
        if conn.error is not None and not conn.complete:
            raise ExchangeError("broken", conn.error, connected=True)
        if conn.framing == "chunked":
            client.write(wire.LAST_CHUNK)
    if client.must_drain():
        await client.drain()
    return keep


def finish(pool: Pool, answer: Answer) -> None:
    """The exchange is over: its connection goes back to the pool when it may carry another
    (the answer whole, the request body sent), else it is closed."""
    conn = answer.conn
    sending = answer.sending
    sent = sending is None or (sending.done() and not sending.cancelled())
    if sending is not None and not sending.done():
        sending.cancel()
    elif sending is not None and not sending.cancelled():
        sent = sending.exception() is None  # retrieved: its failure was the exchange's
    if sent and conn.keep_alive and conn.complete and conn.open:
        pool.give_back(conn)
    else:
        pool.returned(conn)
        conn.discard()
