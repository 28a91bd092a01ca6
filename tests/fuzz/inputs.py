"""Fuzzed request bytes, reproducible from a seed (no I/O).

Each input is one client connection: a request built from parts (method, target, version,
fields, framing, body, trailers), often followed by a clean request that closes the connection
(so a complete input ends quickly), then byte-level mutations. The parts lean on the families
of public request-smuggling material: defparam/smuggler's ``Transfer-Encoding`` gadgets (a
control or special byte before, inside or after the name, the colon or the value; ``X: X``
neighbours with bare CR/LF), CL.TE / TE.CL / TE.TE conflicts and doubled fields, obs-fold,
bare LF, NUL and obs-text in values, absolute, asterisk and authority-form targets,
``CONNECT`` and ``Upgrade``; bodies carry a request in their bytes and trailers carry fields a
router must never put in a head.

Every request names its input in ``X-Scope-Request-Id: fz<n>`` and in its path
(``/v2/images/fz<n>``), so what a backend receives is tied to an input; trailers carry
``X-Canary-Trailer`` and bodies ``X-Canary-Body``: a backend that sees either in a head
received what nobody routed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

CANARY_TRAILER = b"X-Canary-Trailer"
CANARY_BODY = b"X-Canary-Body"
Where = Literal["frontend", "proxy"]

_SPECIAL = [*range(0x01, 0x21), 0x7F, 0x80, 0xA0, 0xFF]
_METHODS = [b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS", b"COPY"]
_ODD_METHODS = [b"CONNECT", b"get", b"G\x00T", b"GET\t", b"TRACE", b"PRI", b"X" * 40, b""]
_VERSIONS = [b"HTTP/1.1"] * 12 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b"HTTP/9", b"", b"HTTP"]


@dataclass(frozen=True, slots=True)
class Input:
    n: int
    data: bytes  # sent as is
    where: Where  # the image frontend, or the forward proxy (absolute-form targets)
    stall: bool  # the connection stays open after the data: a deadline must end it
    family: str  # what it tries, for the report


def rid(n: int) -> bytes:
    return b"fz%d" % n


def generate(seed: int, n: int, front: bytes, backend: bytes) -> Input:
    """Input `n` of the run `seed`. `front`: the frontend's authority (``host:port``);
    `backend`: the backend's authority (forward-proxy targets)."""
    rng = random.Random(seed * 1_000_003 + n)
    where: Where = "proxy" if rng.random() < 0.15 else "frontend"
    family = rng.choice(
        ["plain", "te-gadget", "cl-te", "te-cl", "double-cl", "trailers", "target", "fields"]
    )
    eol = b"\r\n" if rng.random() < 0.95 else b"\n"
    method = rng.choice(_METHODS) if rng.random() < 0.93 else rng.choice(_ODD_METHODS)
    path = b"/v2/images/%s" % rid(n)
    target = _target(rng, family, where, path, front, backend)
    version = rng.choice(_VERSIONS)
    line = b" ".join(p for p in (method, target, version) if p) if rng.random() < 0.97 else b"X"
    fields = [
        b"Host: " + (backend if where == "proxy" else front),
        b"X-Scope-Request-Id: " + rid(n),
    ]
    if rng.random() < 0.2:
        fields.append(b'X-Auth-Token: t!SCOPE!{"image": "CloudTwo"}')  # a hop to CloudTwo
    body, framing = _body(rng, family, n, eol)
    fields += framing
    fields += _more_fields(rng, family, front)
    rng.shuffle(fields)
    head = line + eol + b"".join(f + eol for f in fields) + eol
    data = head + body
    if rng.random() < 0.15:
        data = _mutate(rng, data)
    stall = rng.random() < 0.04
    if stall:
        data = data[: rng.randrange(1, max(2, len(data)))]
    elif rng.random() < 0.8:
        data += (
            b"GET /v2/images/%se HTTP/1.1\r\nHost: %s\r\nX-Scope-Request-Id: %se\r\n"
            b"Connection: close\r\n\r\n"
            % (rid(n), front if where == "frontend" else backend, rid(n))
        )
    return Input(n, data, where, stall, family)


def _target(
    rng: random.Random, family: str, where: Where, path: bytes, front: bytes, backend: bytes
) -> bytes:
    if where == "proxy":
        return b"http://" + backend + path
    if family != "target":
        return path + (b"?limit=2" if rng.random() < 0.3 else b"")
    return rng.choice(
        [
            b"http://" + front + path,
            b"http://evil.example" + path,
            b"HTTP://" + front.upper() + path,
            b"http://u:p@" + front + path,
            b"*",
            b"evil.example:443",
            b"81" + path,
            path + b"#frag",
            path + b"/../../etc",
            path + bytes([rng.choice(_SPECIAL)]) + b"x",
            b"/" + b"a" * rng.choice([100, 20000]),
            b"",
        ]
    )


def _te_gadget(rng: random.Random) -> bytes:
    """A Transfer-Encoding field with a special byte somewhere (defparam/smuggler)."""
    c = bytes([rng.choice(_SPECIAL)])
    return rng.choice(
        [
            c + b"Transfer-Encoding: chunked",
            b"Transfer-Encoding" + c + b": chunked",
            b"Transfer-Encoding:" + c + b"chunked",
            b"Transfer-Encoding: chunked" + c,
            b"X: X" + c + b"Transfer-Encoding: chunked",
            b"X: X\r" + c + b"Transfer-Encoding: chunked",
            b"Transfer-Encoding: chunked\r" + c + b"X: X",
            b" Transfer-Encoding: chunked",
            b"Transfer-Encoding : chunked",
            b"Transfer-Encoding: xchunked",
            b"Transfer-Encoding: chunked, identity",
            b"Transfer-Encoding: identity, chunked",
            b'Transfer-Encoding: "chunked"',
            b"Transfer-Encoding: chunked\r\nTransfer-Encoding: x",
            b"Transfer-Encoding: CHUNKED",
        ]
    )


def _chunked(rng: random.Random, payload: bytes, eol: bytes, n: int) -> bytes:
    out = b""
    rest = payload
    while rest:
        size = rng.randint(1, max(1, len(rest)))
        piece, rest = rest[:size], rest[size:]
        ext = b";ext=" + b"e" * rng.choice([1, 100, 70000]) if rng.random() < 0.05 else b""
        out += b"%x%s%s%s%s" % (len(piece), ext, eol, piece, eol)
    out += b"0" + eol
    if rng.random() < 0.4:
        out += CANARY_TRAILER + b": " + rid(n) + eol
        out += rng.choice([b"Host: evil.example", b'X-Scope: {"image": "CloudTwo"}', b"X: y"]) + eol
        if rng.random() < 0.05:
            out += b"X-Big: " + b"v" * rng.choice([70000, 300000]) + eol
    return out + eol


def _body(rng: random.Random, family: str, n: int, eol: bytes) -> tuple[bytes, list[bytes]]:
    """The body and the framing fields that go with it (right, wrong or conflicting)."""
    smuggled = b"GET /v2/images/%ss HTTP/1.1\r\nHost: x\r\n%s: %s\r\n\r\n" % (
        rid(n),
        CANARY_BODY,
        rid(n),
    )
    payload = rng.choice([b"", b"abc", smuggled, b"0\r\n\r\n" + smuggled, b"x" * 5000])
    if family == "te-gadget":
        return _chunked(rng, payload, eol, n), [_te_gadget(rng)]
    if family == "cl-te":
        chunked = _chunked(rng, payload, eol, n)
        return chunked, [b"Content-Length: %d" % rng.randint(0, len(chunked)), _te_gadget(rng)]
    if family == "te-cl":
        chunked = _chunked(rng, payload, eol, n)
        return chunked, [b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(payload)]
    if family == "double-cl":
        return payload, [
            b"Content-Length: %d" % len(payload),
            b"Content-Length: %d" % rng.randint(0, 10),
        ]
    if family == "trailers" or (payload and rng.random() < 0.3):
        return _chunked(rng, payload, eol, n), [b"Transfer-Encoding: chunked"]
    if not payload:
        return b"", []
    length = rng.choice([b"%d" % len(payload), b"%d" % len(payload)] * 3 + [b"-1", b"0x10", b" 3"])
    return payload, [b"Content-Length: " + length]


def _more_fields(rng: random.Random, family: str, front: bytes) -> list[bytes]:
    if family != "fields" and rng.random() < 0.7:
        return [b"Connection: close"] if rng.random() < 0.5 else []
    pool = [
        b"Host: evil.example",
        b"Host: " + front,
        b"Host:",
        b"Host: a b",
        b"Connection: Upgrade\r\nUpgrade: websocket",
        b"Connection: close, X-Auth-Token",
        b"Connection: \xc3\xa9\xe2\x82\xac",
        b"Connection: keep-alive",
        b"Expect: 100-continue",
        b"X-Obs: caf\xe9",
        b"X-Nul: a\x00b",
        b"X-Vt: a\x0bb",
        b"X-Fold: a\r\n b",
        b"Bad Name: x",
        b": empty-name",
        b"X-Long: " + b"l" * rng.choice([100, 70000]),
        b"X-Scope-Hops: 99",
        b"X-Scope-Frontend: http://evil.example",
        b"Proxy-Connection: keep-alive",
        b"TE: trailers",
        b"Trailer: X-Canary-Trailer",
        b"Content-Length: 0",
    ]
    fields = [rng.choice(pool) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.03:
        fields += [b"X-Many-%d: x" % i for i in range(rng.choice([50, 150]))]
    return fields


def _mutate(rng: random.Random, data: bytes) -> bytes:
    """A few bytes flipped, inserted, removed or repeated."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        at = rng.randrange(len(out))
        choice = rng.random()
        if choice < 0.3:
            out[at] = rng.choice([*_SPECIAL, ord(":"), ord(" "), ord("\r"), ord("\n")])
        elif choice < 0.55:
            out.insert(at, rng.choice(_SPECIAL))
        elif choice < 0.8:
            del out[at]
        else:
            out[at:at] = out[at : at + rng.randint(1, 40)]
    return bytes(out)
