"""HTTP semantics every layer of the router shares (RFC 9110; pure, no I/O): one copy each.

* :data:`IDEMPOTENT` - methods whose request may be sent again when it got no answer (9.2.2):
  the failover of ``A | B`` moves on after their failure, the exchange client retries them
  once on a fresh connection.
* :data:`HOP_BY_HOP` - fields a proxy does not pass on as they are (7.6.1), framing included
  (the router frames every message it sends itself), and ``expect`` (the router answers
  ``100-continue`` itself).
* :func:`header_map` - header fields as the router reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
    }
)


def header_map(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lower-case name -> value, repeated fields joined with ``, `` (RFC 9110 5.3), values
    decoded as UTF-8 with their other bytes kept (surrogateescape): in one pass."""
    found: dict[str, str] = {}
    for raw_name, raw_value in fields:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("utf-8", "surrogateescape")
        found[name] = f"{found[name]}, {value}" if name in found else value
    return found
