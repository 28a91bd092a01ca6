"""The URLs routing makes, taken apart (no I/O)."""

from __future__ import annotations

from typing import Final


def split_url(url: str) -> tuple[str, str, int, str]:
    """``http://h:1/p?q`` -> ``("http", "h", 1, "/p?q")``, for the URLs routing makes
    (``scheme://host:port`` then the path, kept byte for byte; IPv6 hosts in brackets). The
    upstream's part is parsed once per upstream (memoised: a catalog names few)."""
    cut = url.find("://")
    slash = url.find("/", cut + 3) if cut >= 0 else -1
    base = url[:slash] if slash >= 0 else url
    found = _BASES.get(base)
    if found is None:
        found = _split_base(base, url)
        if len(_BASES) >= 1024:
            _BASES.clear()
        _BASES[base] = found
    return found[0], found[1], found[2], url[slash:] if slash >= 0 else "/"


_BASES: Final[dict[str, tuple[str, str, int]]] = {}


def _split_base(base: str, url: str) -> tuple[str, str, int]:
    """``http://h:1`` -> ``("http", "h", 1)``; ValueError naming `url` when it is not one."""
    scheme, sep, hostport = base.partition("://")
    host, colon, port = hostport.rpartition(":")
    if not sep or not colon or not host or not port.isdigit():
        raise ValueError(f"not a routed URL: {url!r}")
    return scheme, host.strip("[]"), int(port)


def base_url(url: str) -> str:
    """``http://h:1/p?q`` -> ``http://h:1``: an upstream, as clients and logs name it."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"
