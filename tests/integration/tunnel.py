"""Intercepted TLS tunnels through a router's forward proxy, byte for byte (the integration
tests' and the fuzz harness's).

What a router needs for it (``tests/integration/test_forward_tls.py``'s ``setup`` is one):

* a cloud whose ``proxy`` has ``listen``, ``ca`` and ``ca_key``: an interception CA, e.g.
  ``pki.make_ca(directory, "proxy-ca")`` (it writes the key mode 0600, as the router demands);
* a catalog destination: a ``host:port`` where the catalog publishes an endpoint URL (a
  router's frontend) or a backend; anything else is a 403 to the ``CONNECT``;
* a client that trusts that CA (:func:`open_tunnel` makes its context from the CA file).

Then ``sock = open_tunnel(proxy, (host, port), ca)`` is a TLS socket inside the tunnel (the
handshake verified for `host`), on which :func:`exchange` sends raw bytes and reads what comes
back, or :func:`send_request` sends one request and reads one response.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
from pathlib import Path

from .routers import Reply


class TunnelRefused(AssertionError):
    """The proxy did not answer the ``CONNECT`` with 200."""

    def __init__(self, head: bytes) -> None:
        super().__init__(f"CONNECT refused: {head[:300]!r}")
        self.head = head


def connect(
    proxy: tuple[str, int], authority: str, timeout: float = 10.0
) -> tuple[socket.socket, bytes]:
    """``CONNECT authority`` on a new connection to `proxy`: the socket and the answer's head
    (up to its blank line; the rest, if any, stays unread)."""
    sock = socket.create_connection(proxy, timeout=timeout)
    try:
        sock.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % ((authority.encode(),) * 2))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)  # byte by byte: nothing of the tunnel read ahead
            if not chunk:
                break
            head += chunk
    except BaseException:
        sock.close()
        raise
    return sock, head


def open_tunnel(
    proxy: tuple[str, int],
    target: tuple[str, int],
    ca: Path,
    *,
    authority: str | None = None,
    server_hostname: str | None = None,
    timeout: float = 10.0,
) -> ssl.SSLSocket:
    """A TLS socket inside an intercepted tunnel to `target` through `proxy`: ``CONNECT``
    `authority` (default ``host:port`` of `target`), 200 expected (else :class:`TunnelRefused`),
    then a TLS handshake verified against `ca` for `server_hostname` (default `target`'s host)."""
    host, port = target
    sock, head = connect(proxy, authority or f"{host}:{port}", timeout)
    if not head.startswith(b"HTTP/1.1 200 "):
        sock.close()
        raise TunnelRefused(head)
    context = ssl.create_default_context(cafile=str(ca))
    try:
        return context.wrap_socket(sock, server_hostname=server_hostname or host)
    except BaseException:
        sock.close()
        raise


def exchange(sock: socket.socket, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data`, then everything that comes back until the other end closes (or
    `timeout` without a byte)."""
    sock.settimeout(timeout)
    with contextlib.suppress(OSError):  # the router may answer and close before the end
        sock.sendall(data)
    got = b""
    with contextlib.suppress(OSError):  # a timeout, or a reset after the answer
        while chunk := sock.recv(65536):
            got += chunk
    return got


def send_request(sock: socket.socket, data: bytes) -> Reply:
    """Send `data` (one request's bytes) and read one response."""
    with contextlib.suppress(OSError):
        sock.sendall(data)
    response = http.client.HTTPResponse(sock, method=data.split(b" ", 1)[0].decode("latin-1"))
    response.begin()
    body = response.read()
    fields = tuple((k.lower(), v) for k, v in response.getheaders())
    return Reply(response.status, dict(fields), body, fields)
