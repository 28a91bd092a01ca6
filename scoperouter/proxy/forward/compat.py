"""What differs between the two mitmproxy releases the forward proxy runs on.

setup.cfg's ``router`` extra installs mitmproxy 11.0.2 on Python 3.11 (mitmproxy 11.1 and later
need 3.12) and 12.3.1 on 3.12+. Every internal :mod:`~scoperouter.proxy.forward.mitm` relies on
is checked on both by ``tests/unit/test_mitm_contract.py``; what 12 changed for the router is
here, so the rest of the forward proxy reads the same on both:

* **Protocol-error codes.** mitmproxy 11's ``RequestProtocolError``/``ResponseProtocolError``
  carry an HTTP status (``code=431``); 12's carry an ``ErrorCode`` (an enum that maps itself to
  a status, or to none: then no error page). :func:`request_error_code` gives what the installed
  release takes for a client's failed body (the guarded server has answered it already: the
  code only tells mitmproxy's HTTP layers how the stream ended).
* **The CRL hook.** mitmproxy 12's ``TlsConfig`` addon answers every request whose path ends in
  ``/mitmproxy-<its CA's serial>.crl`` with its CRL (``request`` hook), before the router's
  addon sees the request. :data:`TLSCONFIG_HAS_REQUEST_HOOK` tells the router's subclass to
  switch it off: each request through the forward proxy is the router's to route.
"""

from __future__ import annotations

import importlib
from typing import Any

from mitmproxy import version
from mitmproxy.addons import tlsconfig

MITMPROXY_VERSIONS = ("11.0.2", "12.3.1")
"""The releases every item of :mod:`~scoperouter.proxy.forward.mitm` was checked against (the
contract test checks the installed one is among them): the pins of setup.cfg's ``router``."""

MITMPROXY_MAJOR = int(version.VERSION.split(".")[0])

TLSCONFIG_HAS_REQUEST_HOOK = hasattr(tlsconfig.TlsConfig, "request")
"""mitmproxy 12: ``TlsConfig.request`` serves mitmproxy's CRL (switched off by the router)."""

if MITMPROXY_MAJOR >= 12:
    # 12 only (by name: the type checker runs on either release)
    ErrorCode: Any = importlib.import_module("mitmproxy.proxy.layers.http._events").ErrorCode

    _STATUS_CODES = {
        413: ErrorCode.REQUEST_TOO_LARGE,
        431: ErrorCode.REQUEST_TOO_LARGE,
    }

    def request_error_code(status: int) -> Any:
        """The ``code`` of a ``RequestProtocolError`` for a client error answered `status`."""
        return _STATUS_CODES.get(status, ErrorCode.GENERIC_CLIENT_ERROR)

else:

    def request_error_code(status: int) -> Any:
        """The ``code`` of a ``RequestProtocolError`` for a client error answered `status`."""
        return status
