"""HTTP semantics every layer of the router shares (RFC 9110; pure, no I/O): one copy each.

* :data:`IDEMPOTENT` - methods whose request may be sent again when it got no answer (9.2.2):
  the failover of ``A | B`` moves on after their failure, the exchange client retries them
  once on a fresh connection.
* :data:`HOP_BY_HOP` - fields a proxy does not pass on as they are (7.6.1), framing included
  (the router frames every message it sends itself), and ``expect`` (the router answers
  ``100-continue`` itself).
"""

from __future__ import annotations

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
HOP_BY_HOP = frozenset(
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
