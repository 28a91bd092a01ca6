"""The limits on a request head and their answers, for both data paths (no I/O, no engine).

mitmproxy's guarded server (:class:`scoperouter.proxy.mitm.GuardedHttp1Server`) and the lean
server (:mod:`scoperouter.proxy.lean`) refuse the same heads with the same status and message:
too many or too large header fields (431), a request line too long (414), a head not complete
in time (408), control characters and obs-fold (400).
"""

from __future__ import annotations

import re

from scoperouter.catalog import Limits

# RFC 9110 5.5: a field value with NUL, CR or LF must be refused; other controls (except HTAB)
# have no place in OpenStack's headers either. Lines are split on LF and lose their CR first.
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
CONTROL_MESSAGE = "the request head contains a control character (NUL, CR or another; RFC 9110 5.5)"
# Fields a proxy does not pass on as they are (RFC 9110 7.6.1), framing included: the lean
# path writes its own; `expect` because the router answers 100-continue itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"expect",
    }
)
LINGER_SECONDS = 2.0  # after refusing, read and drop what the client still sends, then close


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


def line_too_long(limits: Limits) -> str:
    return f"the request line is longer than {limits.max_request_line} bytes"


def too_slow(limits: Limits) -> str:
    return f"the request head was not complete after {limits.header_timeout:g}s (header_timeout)"


def obs_fold(number: int) -> str:
    return (
        f"header field {number} is a continuation line (obs-fold, RFC 9112 5.2); "
        "send each field on one line"
    )


def split_request_line(line: bytes | bytearray) -> tuple[str, str]:
    """(method, path without query) of a request line, for logs; "-" for what is unreadable."""
    parts = bytes(line).split(b" ")
    method = parts[0].decode("ascii", "replace")[:16] if parts and parts[0] else "-"
    path = parts[1].partition(b"?")[0].decode("ascii", "replace")[:256] if len(parts) > 1 else "-"
    return method, path
