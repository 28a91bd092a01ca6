"""The ``tunnel`` family: fuzzed raw requests inside TLS tunnels the forward proxy intercepts.

Each input is one connection to CloudOne's forward proxy (its ``proxy.ca`` is an interception
CA the client trusts): ``CONNECT`` to a destination of the catalog (the image frontend or its
backend), the TLS handshake verified against that CA, then the bytes of a raw input of
:mod:`.inputs` (smuggling shapes, Host mismatches, ``Upgrade``...), often with its target
rewritten in absolute form (the tunnel's own authority or another one). Some inputs send the
request in clear instead of TLS.

What must hold: the CONNECT to a catalog destination is answered 200 and the handshake
succeeds; every answer is OpenStack JSON when the router makes it; every connection is
answered or closed within the deadline; and what a backend receives from a tunnel is what the
access log shows: the same origin-form target (the path the log has after the tunnel's
``https://host:port``) and the backend's own Host.
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any

from tests.fuzz.inputs import generate, rid
from tests.integration.backends import Received

# Input N of the family is raw input BASE + N of the same seed: its request id ``fz<BASE+N>``
# tells its backend requests from the raw family's.
BASE = 1_000_000_000
_AUTHORITIES = [b"127.0.8.99:80", b"evil.example", b"127.0.0.1:22", b"[::1]:8080", b"u:p@%s"]


@dataclass(frozen=True, slots=True)
class TunnelInput:
    n: int
    target: bytes  # the CONNECT authority (host:port)
    data: bytes  # sent inside the tunnel
    cleartext: bool  # sent without TLS after the 200
    stall: bool
    family: str


_ID = re.compile(rb"fz(\d{10,})")


def owner(received: Received) -> int | None:
    """The tunnel input a backend request belongs to (by its request id, else by the id in
    its target), or None."""
    ids = received.values(b"x-scope-request-id")
    for text in [*ids[:1], received.target]:
        if found := _ID.search(text):
            n = int(found.group(1))
            return n - BASE if n >= BASE else None
    return None


def tunnel_input(seed: int, n: int, targets: list[bytes]) -> TunnelInput:
    rng = random.Random(seed * 7_000_003 + n)
    target = rng.choice(targets)
    item = generate(seed, BASE + n, target, target)
    data, family = item.data, item.family
    path = b"/v2/images/" + rid(BASE + n)
    if rng.random() < 0.3:  # absolute form inside the tunnel: its own authority, or another
        authority = rng.choice([target, *_AUTHORITIES]).replace(b"%s", target)
        scheme = rng.choice([b"http://", b"https://", b"HTTPS://"])
        data = data.replace(path, scheme + authority + path, 1)
        family = "absolute-in-tunnel"
    cleartext = rng.random() < 0.08
    return TunnelInput(n, target, data, cleartext, item.stall, family)


def client_context(ca: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca)


async def exchange(
    proxy: tuple[str, int], item: TunnelInput, context: ssl.SSLContext, deadline: float
) -> tuple[bytes, bytes, float | None, str | None]:
    """(the CONNECT answer, what came back inside, seconds from the last byte sent to the
    close or None when not closed within `deadline`, what failed on the way or None)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*proxy), 5)
    except (OSError, TimeoutError) as exc:
        return b"", b"", 0.0, f"connect to the proxy failed: {exc}"
    host = item.target.rpartition(b":")[0].decode()
    got = bytearray()
    try:
        writer.write(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (item.target, item.target))
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), deadline)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            return b"", b"", None, f"no answer to CONNECT: {exc!r}"
        if not head.startswith(b"HTTP/1.1 200"):
            rest = await _read_all(reader, deadline)
            return head + rest[0], b"", rest[1], None
        if not item.cleartext:
            try:
                await asyncio.wait_for(writer.start_tls(context, server_hostname=host), deadline)
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                return head, b"", 0.0, f"TLS handshake with the interception CA failed: {exc!r}"
        try:
            writer.write(item.data)
            await writer.drain()
        except OSError:
            pass
        body, seconds = await _read_all(reader, deadline)
        got += body
        return head, bytes(got), seconds, None
    finally:
        writer.close()


async def _read_all(reader: asyncio.StreamReader, deadline: float) -> tuple[bytes, float | None]:
    sent = time.monotonic()
    got = bytearray()
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), deadline):
            got += chunk
            if time.monotonic() - sent > deadline:
                return bytes(got), None
    except TimeoutError:
        return bytes(got), None
    except (OSError, ssl.SSLError):
        pass
    return bytes(got), time.monotonic() - sent


def check_received(received: Received, access: dict[Any, list[dict[str, Any]]]) -> str | None:
    """What is wrong with a request a backend received from a tunnel, or None: its target is
    the origin-form path the access log shows after the tunnel's ``https://host:port``, and
    its Host that authority (the one the client was allowed to reach)."""
    ids = received.values(b"x-scope-request-id")
    what = f"backend got {received.method} {received.target[:120]!r}"
    if not received.target.startswith(b"/"):
        return f"{what}: not origin-form, as the frontends would never forward"
    hosts = [h.decode("latin-1").lower() for h in received.values(b"host")]
    path = received.target.partition(b"?")[0].decode("latin-1")
    for entry in access.get(ids[0].decode("latin-1"), ()) if ids else ():
        logged, authority = str(entry.get("path", "")), None
        if "://" in logged:  # https://host:port/path: the tunnel's authority, then the path
            authority, _, rest = logged.split("://", 1)[1].partition("/")
            logged = "/" + rest
        if entry.get("method") != received.method or logged.partition("?")[0] != path:
            continue
        if authority is not None and hosts != [authority.lower()]:
            return f"{what} with Host {hosts[:2]!r} where the access log has {authority!r}"
        return None
    return f"{what} that its router's access log does not show (same method and target)"
