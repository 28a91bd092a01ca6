"""HTTP/1.1 on the wire: heads rendered, error answers, hop-by-hop fields, chunk framing.

One copy of each, for the server side and the client side alike. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from scoperouter import semantics
from scoperouter.errors import error_body, status_title

Fields = list[tuple[bytes, bytes]]
"""Header fields as received: (name, value) bytes, in order, names as sent."""

HOP_BY_HOP: Final = frozenset(name.encode() for name in semantics.HOP_BY_HOP)
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
# Methods OpenStack's APIs use (swift's COPY included): the Allow field of a 405.
ALLOW_FIELD: Final = (b"Allow", b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, COPY")
LAST_CHUNK: Final = b"0\r\n\r\n"


def render(
    status: int, reason: str, fields: Iterable[tuple[bytes, bytes]], body: bytes = b""
) -> bytes:
    """An HTTP/1.1 response head (and `body`, whose framing `fields` must say)."""
    parts = [f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")]
    _append_fields(parts, fields)
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


def render_request(method: str, target: str, fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    """An HTTP/1.1 request head (`fields` say its body's framing)."""
    parts = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
    _append_fields(parts, fields)
    parts.append(b"\r\n")
    return b"".join(parts)


def _append_fields(parts: list[bytes], fields: Iterable[tuple[bytes, bytes]]) -> None:
    """Each field's name, separator, value and line end appended to `parts` (joined once by
    the caller): compiled, 0.45 against 0.72 us for a five-field head formatted per field."""
    for name, value in fields:
        parts.append(name)
        parts.append(b": ")
        parts.append(value)
        parts.append(b"\r\n")


def error_response(
    status: int,
    message: str,
    close: bool,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> bytes:
    """An answer the router makes itself: OpenStack JSON with the standard reason phrase."""
    body = error_body(status, message)
    fields = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body))]
    fields += extra
    if close:
        fields.append((b"Connection", b"close"))
    return render(status, status_title(status), fields, body)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def field_map(fields: Fields) -> dict[bytes, bytes]:
    """Lower-case name -> value, repeated fields joined with ``, `` (RFC 9110 5.3)."""
    found: dict[bytes, bytes] = {}
    for name, value in fields:
        key = name.lower()
        found[key] = found[key] + b", " + value if key in found else value
    return found


def bodiless(method: str, status: int) -> bool:
    """An answer that carries no body, whatever its head says (RFC 9110 6.4.1)."""
    return method == "HEAD" or status in (204, 304) or status < 200
