"""What a client may send in a request head (and its trailers), and every refusal's answer.

No I/O. The server (:mod:`scoperouter.http.server`) and the forward proxy's guarded mitmproxy
server refuse the same heads with the same status and message: too many or too large header
fields (431), a request line too long (414), a head or a body not complete in time (408),
control characters and obs-fold (400), a request the router cannot serve as a reverse proxy
(``CONNECT`` 405, ``Upgrade`` 400, asterisk- and authority-form targets 400), a missing or
repeated ``Host`` (400, RFC 9112 3.2), a transfer coding other than ``chunked`` (501) and a
path a backend could resolve elsewhere than the router routes it (400, :func:`check_path`).
The identity fields only keystonemiddleware sets (:data:`IDENTITY_NAMES`) are dropped from a
client's head (:func:`strip_identity`), never refused.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Literal

from scoperouter.catalog import Limits
from scoperouter.http.wire import Fields

# RFC 9110 5.5: a field value with NUL, CR or LF must be refused; other controls (except HTAB)
# have no place in OpenStack's headers either. Lines are split on LF and lose their CR first.
# The reverse server leaves the check to llhttp, which refuses exactly these bytes in a value
# ("Invalid header value char", worded with CONTROL_MESSAGE; tests/unit/test_http.py tries
# each); the forward proxy's guard checks mitmproxy's lines with CONTROL.
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
CONTROL_MESSAGE = "the request head contains a control character (NUL, CR or another; RFC 9110 5.5)"
LINGER_SECONDS = 2.0  # after refusing, read and drop what the client still sends, then close
# RFC 9110 5.6.2: tchar; a Connection option or a transfer coding is a token.
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# RFC 3986 authority as a Host value: reg-name / IPv4 / [IPv6], then an optional port.
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?\Z")

TargetForm = Literal["origin", "absolute", "authority", "asterisk"]


def too_many_fields(count: int, limits: Limits) -> str:
    return (
        f"the request has {count} header fields; at most {limits.max_headers} are accepted "
        "(max_headers)"
    )


def too_large(limits: Limits) -> str:
    return (
        f"the request head (request line and header fields) is larger than "
        f"{limits.max_header_bytes} bytes (max_header_bytes)"
    )


def trailers_too_large(limits: Limits) -> str:
    return (
        f"the request's chunk headers and trailer fields are larger than "
        f"{limits.max_header_bytes} bytes (max_header_bytes)"
    )


def line_too_long(limits: Limits) -> str:
    return f"the request line is longer than {limits.max_request_line} bytes"


def too_slow(limits: Limits) -> str:
    return f"the request head was not complete after {limits.header_timeout:g}s (header_timeout)"


def body_too_slow(limits: Limits) -> str:
    return f"the request body stopped arriving: no byte for {limits.body_timeout:g}s (body_timeout)"


def obs_fold(number: int) -> str:
    return (
        f"header field {number} is a continuation line (obs-fold, RFC 9112 5.2); "
        "send each field on one line"
    )


CONNECT_MESSAGE = (
    "CONNECT is not served here: the router's frontends are not tunnels (RFC 9110 9.3.6); "
    "send the request itself"
)
UPGRADE_MESSAGE = (
    "the router does not switch protocols: send the request without Upgrade (RFC 9110 7.8)"
)
ASTERISK_MESSAGE = (
    "asterisk-form ('*') asks about a server as a whole; the router answers requests for a "
    "service's URL only"
)
BAD_ABSOLUTE_MESSAGE = "the request target is not a valid absolute URL (RFC 9112 3.2.2)"
AUTHORITY_MESSAGE = "authority-form targets are for CONNECT only (RFC 9112 3.2.3)"
FRAGMENT_MESSAGE = "a request target has no fragment ('#'; RFC 9112 3.2)"
BARE_LF_MESSAGE = "the request head ends a line with a bare LF (RFC 9112 2.2: CRLF)"
NO_HOST_MESSAGE = "an HTTP/1.1 request must have a Host header field (RFC 9112 3.2)"
MANY_HOSTS_MESSAGE = "the request has more than one Host header field (RFC 9112 3.2)"
BAD_HOST_MESSAGE = "the Host header field is not a valid authority (RFC 9112 3.2)"
TE_HTTP10_MESSAGE = "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1)"
BAD_CONNECTION_MESSAGE = "the Connection header field must be a list of tokens (RFC 9110 7.6.1)"


def unknown_version(version: str) -> str:
    return f"HTTP/{version[:16]} is not supported here: send HTTP/1.1 (or HTTP/1.0)"


def unknown_coding(value: bytes) -> str:
    shown = value[:64].decode("latin-1")
    return (
        f"transfer coding {shown!r} is not supported: only 'chunked' (RFC 9112 6.1); send the "
        "body chunked or with a Content-Length"
    )


def check_target(method: bytes, target: bytes) -> tuple[int, str] | None:
    """The refusal of a target the router cannot serve (both entries), else None."""
    form = target_form(method, target)
    if form == "asterisk":
        return 400, ASTERISK_MESSAGE
    if form == "authority" and method != b"CONNECT":
        return 400, AUTHORITY_MESSAGE
    if b"#" in target:
        return 400, FRAGMENT_MESSAGE
    return None


def target_form(method: bytes, target: bytes) -> TargetForm:
    """Which of RFC 9112 3.2's four forms a request target is in."""
    if target.startswith(b"/"):
        return "origin"
    if target == b"*":
        return "asterisk"
    if method == b"CONNECT" or b"://" not in target:
        return "authority"
    return "absolute"


@dataclass(frozen=True, slots=True)
class Absolute:
    """An absolute-form target split: scheme, authority (lower-case) and origin-form rest."""

    scheme: str
    authority: str
    origin_form: bytes


def split_absolute(target: bytes) -> Absolute | None:
    """``http://Host:80/a?b`` -> (``http``, ``host:80``, ``/a?b``); None when malformed."""
    scheme, _, rest = target.partition(b"://")
    end = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if not scheme.isalpha() or not authority or _HOST.match(authority) is None:
        return None  # userinfo ("@") and anything else outside an authority's characters
    origin = tail if tail.startswith(b"/") else b"/" + tail
    return Absolute(scheme.decode("ascii").lower(), authority.decode("ascii").lower(), origin)


def valid_host(value: bytes) -> bool:
    return bool(value) and _HOST.match(value) is not None


def connection_tokens(value: bytes) -> frozenset[bytes] | None:
    """The options a Connection field value names (lower-case), None when one is not a token:
    compared as bytes, never decoded (RFC 9110 5.5: field values are opaque octets)."""
    common = _COMMON_OPTIONS.get(value)
    if common is not None:
        return common
    found = set()
    for item in value.split(b","):
        item = item.strip(b" \t")
        if not item:
            continue
        if TOKEN.match(item) is None:
            return None
        found.add(item.lower())
    return frozenset(found)


_COMMON_OPTIONS = {
    value: frozenset({value.strip(b", ").lower()})
    for value in (b"keep-alive", b"Keep-Alive", b"close", b"Close", b",keep-alive", b",close")
}


def split_request_line(line: bytes | bytearray) -> tuple[str, str]:
    """(method, path without query) of a request line, for logs; "-" for what is unreadable."""
    parts = bytes(line).split(b" ")
    method = parts[0].decode("ascii", "replace")[:16] if parts and parts[0] else "-"
    path = parts[1].partition(b"?")[0].decode("ascii", "replace")[:256] if len(parts) > 1 else "-"
    return method, path


# -- paths a backend could resolve elsewhere

# A dot-segment ("." or "..", each dot literal or %2E: RFC 3986 3.3, 5.2.4), an encoded slash,
# a backslash: one search of the whole target (most have none), a hit in the query ignored.
_PATH_HAZARD = re.compile(rb"/(?:\.|%2e){1,2}(?=[/?]|\Z)|%2f|\\", re.IGNORECASE)
DOT_SEGMENT_MESSAGE = (
    "the request path has a '.' or '..' segment (or one percent-encoded, '%2E'): the router "
    "routes a path as it is sent and does not forward one a backend could resolve to another "
    "service; send the path with its dot-segments removed (RFC 3986 5.2.4)"
)
ENCODED_SLASH_MESSAGE = (
    "the request path has an encoded slash ('%2F'): the router routes a path as it is sent and "
    "does not forward one a backend could split elsewhere"
)
BACKSLASH_MESSAGE = (
    "the request path has a backslash, which is not a URI character (RFC 3986 2): "
    "percent-encode it ('%5C')"
)


def check_path(target: bytes) -> str | None:
    """The refusal of an origin-form target whose path a backend could resolve to another
    route than the router's: a dot-segment (literal or ``%2E``), ``%2F``, a backslash; else
    None. (``%5C`` passes: it names a backslash in a name, e.g. a swift object's, and no
    backend splits a path on it.)"""
    found = _PATH_HAZARD.search(target)
    if found is None:
        return None
    query = target.find(b"?")
    if 0 <= query < found.start():
        return None  # the first hit is in the query: the path has none
    hit = found.group()
    if hit == b"\\":
        return BACKSLASH_MESSAGE
    return ENCODED_SLASH_MESSAGE if hit.lower() == b"%2f" else DOT_SEGMENT_MESSAGE


# -- identity fields only keystonemiddleware sets

# keystonemiddleware's auth_token sets these for the service behind it and pops them from every
# request first (auth_token/_request.py, _all_auth_headers: remove_auth_headers); its
# external_oauth2_token did not (CVE-2026-22797, OSSA-2026-001). OpenStack-System-Scope is set
# by the same _set_auth_headers (not in its removal list): no client sends it either.
_IDENTITY_TEMPLATE = (
    "domain-id",
    "domain-name",
    "project-id",
    "project-name",
    "project-domain-id",
    "project-domain-name",
    "user-id",
    "user-name",
    "user-domain-id",
    "user-domain-name",
    "roles",
)
IDENTITY_FIELDS: tuple[str, ...] = (
    "x-service-catalog",
    "x-identity-status",
    "x-service-identity-status",
    "x-is-admin-project",
    "x-role",  # keystonemiddleware's deprecated names
    "x-user",
    "x-tenant-id",
    "x-tenant-name",
    "x-tenant",
    *(f"x-{name}" for name in _IDENTITY_TEMPLATE),
    *(f"x-service-{name}" for name in _IDENTITY_TEMPLATE),
    "openstack-system-scope",
)


def _spellings(name: str) -> list[str]:
    """`name` with each "-" also as "_": a WSGI server turns both into "_" in the environ
    (``X_Roles`` is ``HTTP_X_ROLES`` too), so each spelling reaches keystonemiddleware's key."""
    parts = name.split("-")
    return [
        "".join(itertools.chain.from_iterable(zip(parts, (*joins, ""), strict=True)))
        for joins in itertools.product("-_", repeat=len(parts) - 1)
    ]


# Lower-case, every spelling -> the name as keystonemiddleware writes it (lower-case, "-").
IDENTITY_NAMES: dict[str, str] = {
    spelling: name for name in IDENTITY_FIELDS for spelling in _spellings(name)
}


def strip_identity(fields: Fields, headers: dict[str, str]) -> tuple[Fields, tuple[str, ...]]:
    """The head's `fields` without an identity field (any case, any spelling, every repeat),
    those names taken out of `headers` too (in place), and the names dropped (as
    keystonemiddleware writes them, sorted): for a head where
    ``not IDENTITY_NAMES.keys().isdisjoint(headers)``."""
    names = IDENTITY_NAMES
    dropped = sorted({names[key] for key in headers if key in names})
    for key in [key for key in headers if key in names]:
        del headers[key]
    kept = [field for field in fields if field[0].decode("latin-1").lower() not in names]
    return kept, tuple(dropped)
