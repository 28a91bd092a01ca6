"""The URLs routing makes, taken apart (no I/O)."""

from __future__ import annotations


def split_url(url: str) -> tuple[str, str, int, str]:
    """``http://h:1/p?q`` -> ``("http", "h", 1, "/p?q")``, for the URLs routing makes
    (``scheme://host:port`` then the path, kept byte for byte; IPv6 hosts in brackets)."""
    scheme, sep, rest = url.partition("://")
    hostport, slash, path = rest.partition("/")
    host, colon, port = hostport.rpartition(":")
    if not sep or not colon or not host or not port.isdigit():
        raise ValueError(f"not a routed URL: {url!r}")
    return scheme, host.strip("[]"), int(port), slash + path if slash else "/"


def base_url(url: str) -> str:
    """``http://h:1/p?q`` -> ``http://h:1``: an upstream, as clients and logs name it."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"
