"""The federation model: clouds, their router frontends and their service endpoints.

One :class:`Catalog` is built per config load and never mutated; the proxy swaps the whole object
on reload. Lookups the router makes per request are dictionary lookups, so their cost does not
grow with the number of clouds:

* ``match(host, port, path)``: which endpoint a URL targets. Index: ``(host, port)`` -> ``{path
  prefix: endpoint}``; the request path is tried from its longest segment prefix down, so the
  cost is the path depth, not the catalog size.
* ``endpoint(cloud, service_type, interface)``: where to send a request for another cloud.

Reading and validating the YAML file that describes a federation is :mod:`scoperouter.config`;
this module is the model it builds, with no I/O.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from scoperouter.errors import ConfigError

INTERFACES = ("public", "internal", "admin")
EventLoop = Literal["uvloop", "asyncio"]
EVENT_LOOPS: tuple[EventLoop, ...] = ("uvloop", "asyncio")
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True, init=False)
class URL:
    """An absolute http(s) URL, normalised: lower-case host, explicit port, no trailing slash."""

    scheme: str
    host: str
    port: int
    path: str = ""
    # "scheme://host:port", computed once: every forwarded request's URL starts with it.
    base: str = field(init=False, repr=False, compare=False)

    def __init__(self, scheme: str, host: str, port: int, path: str = "") -> None:
        # Written out: compiled, each object.__setattr__ is a store into the object, where the
        # dataclass's __init__ runs interpreted (300,000 URLs at 10,000 clouds). Still frozen.
        object.__setattr__(self, "scheme", scheme)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "path", path)
        bracketed = f"[{host}]" if ":" in host else host
        object.__setattr__(self, "base", f"{scheme}://{bracketed}:{port}")

    def join(self, rest: str) -> str:
        """This URL followed by `rest` (a path remainder, possibly with a query string)."""
        return self.base + self.path + rest

    def __str__(self) -> str:
        return self.base + self.path


# The URLs a federation config is made of, ``(https?)://([a-z0-9.-]+)(:[0-9]{1,5})?(/...)?``
# (a 10,000-cloud config has 300,000), read by string methods: no urlsplit, no regular
# expression. Anything else (IPv6, user info, upper case, whitespace, non-ASCII...) takes
# urlsplit's path, which says what is wrong when something is.
_HOST_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.-"


def parse_url(text: str) -> URL:
    """Parse an absolute http/https URL; raises ValueError with a reason."""
    if not isinstance(text, str) or not text:
        raise ValueError("expected an http:// or https:// URL")
    simple = _parse_simple_url(text)
    return simple if simple is not None else _parse_any_url(text)


def _parse_simple_url(text: str) -> URL | None:
    """:func:`parse_url` of a URL of the common form (above) as urlsplit reads it, else None."""
    if text.startswith("http://"):
        scheme, start = "http", 7
    elif text.startswith("https://"):
        scheme, start = "https", 8
    else:
        return None
    end = text.find("/", start)
    authority, path = (text[start:], "") if end < 0 else (text[start:end], text[end:])
    if not (path.isascii() and path.isprintable()) or " " in path or "?" in path or "#" in path:
        return None  # control characters, whitespace, non-ASCII, a query or fragment
    host, colon, port_text = authority.partition(":")
    if not host or host.strip(_HOST_CHARS) or not host.strip("."):
        return None  # empty, another character, or only dots
    digits = 0 < len(port_text) <= 5 and port_text.isascii() and port_text.isdigit()
    port = int(port_text) if digits else 0
    if (colon and not digits) or port > 65535:
        return None
    return URL(scheme, host, port or DEFAULT_PORTS[scheme], path.rstrip("/"))


def _parse_any_url(text: str) -> URL:
    """:func:`parse_url` by urlsplit, whatever the URL's form."""
    parts = urlsplit(text)
    if parts.scheme not in DEFAULT_PORTS:
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError(f"{text!r} has no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r} must not have a query or fragment")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise ValueError(f"{text!r} has an invalid port") from None
    return URL(parts.scheme, parts.hostname.lower(), port, parts.path.rstrip("/"))


_TEMPLATE = re.compile(r"[%$]\(")


def untemplated(url: URL) -> tuple[URL, str]:
    """A keystone endpoint URL whose path ends in substitutions, as object storage's and
    orchestration's do (``/v1/AUTH_%(project_id)s``, ``/v1/$(tenant_id)s``): the URL of its
    fixed part (``/v1``) and the templated rest (``/AUTH_%(project_id)s``, empty when there is
    none). Keystone fills the template in each token's catalog, so requests arrive with the
    project's own segment there: the router matches the fixed part and forwards the rest of
    the path unchanged."""
    found = _TEMPLATE.search(url.path) if "(" in url.path else None  # (most URLs have none)
    if found is None:
        return url, ""
    cut = url.path.rfind("/", 0, found.start())
    return URL(url.scheme, url.host, url.port, url.path[:cut]), url.path[cut:]


def parse_hostport(text: str) -> tuple[str, int]:
    """``"127.0.0.2:3128"`` or ``"[::1]:3128"`` -> ``(host, port)``."""
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"{text!r} is not HOST:PORT")
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.lower(), int(port_text)


@dataclass(frozen=True, slots=True, init=False)
class Endpoint:
    """One keystone catalog row plus the real service behind the router."""

    cloud: str
    service_type: str
    interface: str
    url: URL
    """What the keystone catalog advertises: on one of this cloud's router frontends."""
    backend: URL
    """The real service, where the router sends this cloud's requests (never a router's
    address: that would be a routing loop)."""

    def __init__(
        self, cloud: str, service_type: str, interface: str, url: URL, backend: URL
    ) -> None:
        object.__setattr__(self, "cloud", cloud)
        object.__setattr__(self, "service_type", service_type)
        object.__setattr__(self, "interface", interface)
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "backend", backend)


@dataclass(frozen=True, slots=True, init=False)
class Frontend:
    """A reverse-proxy listener of a cloud's router."""

    url: URL
    """scheme://host:port, as the keystone catalog advertises it (no path)."""
    listen_host: str
    """The address it binds (``listen: HOST:PORT``; default: the url's host and port)."""
    listen_port: int
    """The port it binds (with listen_host)."""
    cert: str | None = None
    """The TLS certificate (PEM file) of an https listener: required for https, refused for
    http."""
    key: str | None = None
    """Its private key (PEM file)."""

    def __init__(
        self,
        url: URL,
        listen_host: str,
        listen_port: int,
        cert: str | None = None,
        key: str | None = None,
    ) -> None:
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "listen_host", listen_host)
        object.__setattr__(self, "listen_port", listen_port)
        object.__setattr__(self, "cert", cert)
        object.__setattr__(self, "key", key)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cloud:
    """A member of the federation: its router's listeners and the services behind it."""

    name: str
    """What scopes name: a word without spaces, quotes, ``&``, ``|`` or parentheses."""
    region: str
    """The cloud's keystone region id (default: the cloud's name)."""
    frontends: tuple[Frontend, ...]
    """The router's reverse-proxy listeners: where the keystone catalog sends clients."""
    endpoints: tuple[Endpoint, ...]
    """The cloud's keystone catalog rows, each with the real service behind it."""
    proxy_listen: tuple[str, int] | None = None
    """Where the forward proxy listens (HOST:PORT): the ``HTTP_PROXY`` of the cloud's services."""
    proxy_ca: str | None = None
    """The CA (a PEM file) the forward proxy signs its certificates with when it intercepts
    TLS: a ``CONNECT`` to a destination of the catalog (``HTTPS_PROXY`` of the cloud's
    services) is answered with a certificate for that host, made on the fly; the cloud's
    services trust this CA. One CA per cloud, not the peer links' (docs: TLS clouds). Without
    it, ``CONNECT`` is refused (403)."""
    proxy_ca_key: str | None = None
    """The key of proxy.ca (a PEM file, mode 0600, readable by the router's user only: the
    router refuses to start otherwise); required with proxy.ca. Read by this cloud's router
    only (the other routers' hosts need neither file), never written or logged."""
    metrics_listen: tuple[str, int] | None = None
    """Where ``/metrics`` (Prometheus) and ``/healthz`` are served (HOST:PORT)."""
    credentials: Mapping[str, str] = field(default_factory=dict)
    """How this cloud's router authenticates in other clouds: remote cloud -> the name of a
    clouds.yaml entry (secrets stay in clouds.yaml/secure.yaml, never in this file)."""
    peer: Frontend | None = None
    """Where the other routers of the federation reach this one (the router-to-router link:
    https with this router's certificate, verified against settings.peers.ca); without one,
    they reach it on its frontends, as clients do."""

    def listen_addresses(self) -> set[tuple[str, int]]:
        """Every address this cloud's router answers on (frontend URLs, binds, the proxy, the
        peer link)."""
        fronts = self.frontends if self.peer is None else (*self.frontends, self.peer)
        found = {(f.url.host, f.url.port) for f in fronts}
        found |= {(f.listen_host, f.listen_port) for f in fronts}
        if self.proxy_listen is not None:
            found.add(self.proxy_listen)
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What one client may send (defaults like HAProxy's and nginx's)."""

    max_headers: int = 100
    """Header fields in a request head; more -> 431."""
    max_header_bytes: int = 65536
    """Bytes of the request line and header fields; more -> 431. The bytes of a chunked body
    that are not its data (chunk headers, trailer fields) are held to it too."""
    max_request_line: int = 16384
    """Bytes of the request line (method, target and version); more -> 414. At most
    max_header_bytes."""
    header_timeout: float = 10.0
    """Seconds from the first byte of a request head to its end; slower -> 408."""
    idle_timeout: float = 60.0
    """Seconds a keep-alive connection may wait for its next request before it is closed."""
    body_timeout: float = 60.0
    """Seconds a request body may go without a byte while the router reads it; slower -> 408
    (its upstream connection is closed). Also how long an answer may wait for a client that
    reads none of it: then the connection is closed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Breaker:
    """When an upstream (another cloud's router or a backend) is marked down."""

    failures: int = 1
    """Refused connections or timeouts in a row that mark an upstream down."""
    down_for: float = 10.0
    """Seconds requests for a marked-down upstream fail fast (503), before one probe request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Peers:
    """The router-to-router links of the federation (``settings.peers``)."""

    ca: str | None = None
    """The federation's CA (a PEM file; relative: to the config file): peer links are verified
    against it only. Default: ca_bundle, else the system's CAs."""
    warm: int = 2
    """Connections each worker keeps open ahead to every peer router."""
    plain: bool = False
    """Allow plain HTTP between routers where a cloud has no TLS link."""

    def idle_seconds(self, peer_idle_timeout: float) -> float:
        """How long a pooled connection to a peer router may stay idle: shorter than the
        peer's own ``limits.idle_timeout`` (which closes it) by 10 %, at least 2 s, so the
        pool drops a connection before the peer does (and never sends on one being closed);
        half of it when it is that short."""
        margin = max(2.0, 0.1 * peer_idle_timeout)
        if peer_idle_timeout > 2 * margin:
            return peer_idle_timeout - margin
        return peer_idle_timeout / 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Combine:
    """What one request combining clouds (``A & B``, ``A | B``) may cost
    (``settings.combine``)."""

    max_parts: int = 16
    """Cloud names in the expression a request uses, after repeats are dropped (``A & A`` is
    one); more -> 400."""
    max_clouds: int = 16
    """Distinct clouds in the expression a request uses (each is asked at most once per
    request); more -> 400."""
    buffer_mib: int = 256
    """MiB each router worker may hold buffered for combined requests at once: the clouds'
    answers being merged (each at most 32 MiB) and the request bodies kept for them; a request
    that would pass it -> 503, with Retry-After when other requests hold part of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The federation-wide settings (``settings:``), shared by every router."""

    hop_limit: int = 8
    """Routers a request may cross; a request arriving past it -> 508."""
    connect_timeout: float = 5.0
    """Seconds to connect to a backend of this cloud; slower -> 504."""
    response_timeout: float = 120.0
    """Seconds to wait for a backend's response head; slower -> 504."""
    peer_connect_timeout: float = 5.0
    """Seconds to connect to another cloud's router (default: connect_timeout)."""
    peer_response_timeout: float = 120.0
    """Seconds to wait for another cloud's router's response head (default:
    response_timeout)."""
    ca_bundle: str | None = None
    """CA bundle (a PEM file; relative: to the config file) that HTTPS upstreams are verified
    against: backends, other clouds' routers, keystone for token swaps. Default: the system's
    CAs."""
    verify: bool = True
    """Verify the certificates of HTTPS upstreams (peer links included)."""
    limits: Limits = field(default_factory=Limits)
    """What one client may send."""
    breaker: Breaker = field(default_factory=Breaker)
    """When an upstream is marked down (peer health)."""
    peers: Peers = field(default_factory=Peers)
    """The router-to-router links."""
    combine: Combine = field(default_factory=Combine)
    """What one request combining clouds may cost."""
    event_loop: EventLoop = "uvloop"
    """The event loop of the router's worker processes: ``uvloop`` (libuv's, the ``router``
    extra's: less CPU per request) or ``asyncio`` (Python's own). A router without uvloop
    installed runs on asyncio's, saying why in one warning. Chosen when the router starts (a
    reload that changes it applies at the next restart)."""
    busy_poll_us: int = 200
    """Microseconds a worker keeps polling its sockets after it reads a request or writes an
    answer, instead of sleeping at once, while no other process waits for a core (Linux's
    running count, ``/proc/loadavg``): a backend or client that answers within it costs no
    wake-up (on a virtual machine, less CPU per request and much less latency at low
    concurrency). 0 turns it off (HAProxy's default; its ``busy-polling`` polls always).
    At most 1000; a reload applies it at once."""

    def __post_init__(self) -> None:
        # routing.decide lets a request without X-Scope-Hops (0 hops) through unchecked.
        if self.hop_limit < 1:
            raise ValueError(f"hop_limit must be at least 1, not {self.hop_limit}")

    def timeouts(self, remote: bool) -> tuple[float, float]:
        """(connect, response) timeouts for a backend (remote False) or a peer router."""
        if remote:
            return self.peer_connect_timeout, self.peer_response_timeout
        return self.connect_timeout, self.response_timeout


class Memo:
    """A memo with a budget (in units the caller counts, e.g. characters), cleared whole when
    full: bounded memory whatever arrives, O(1) per operation."""

    __slots__ = ("_items", "_used", "budget", "get")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: dict[str, Any] = {}
        self._used = 0
        # The dict's own lookup, not a method wrapping it: one is made per routed request.
        self.get: Callable[[str], Any] = self._items.get

    def put(self, key: str, value: Any, cost: int) -> None:
        if cost > self.budget:
            return
        if self._used + cost > self.budget:
            self._items.clear()
            self._used = 0
        self._items[key] = value
        self._used += cost

    def clear(self) -> None:
        self._items.clear()
        self._used = 0

    def __len__(self) -> int:
        return len(self._items)


@dataclass(slots=True, init=False)  # built per request: see routing.Forward on __init__
class Match:
    """The endpoint a URL targets, whether it was addressed by its public URL or its backend,
    and the rest of the path after the endpoint's prefix (query string included).

    `versionless` is true when the request matched the endpoint's URL without its trailing
    version segment (``GET /`` for ``http://host:5000/v3``): clients do version discovery there,
    so the target is the other side's URL without its version too.
    """

    endpoint: Endpoint
    kind: Literal["public", "backend"]
    rest: str
    versionless: bool = False

    def __init__(
        self,
        endpoint: Endpoint,
        kind: Literal["public", "backend"],
        rest: str,
        versionless: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.kind = kind
        self.rest = rest
        self.versionless = versionless

    def target(self, url: URL) -> str:
        """The request's URL moved onto `url` (another URL of the same service)."""
        path = strip_version(url.path) if self.versionless else url.path
        return url.base + path + self.rest


def strip_version(path: str) -> str:
    """``/compute/v2.1`` -> ``/compute``; paths without a version segment are unchanged.

    The last segment: ``v``, decimal digits, perhaps a dot and decimal digits (``/v2.1``)."""
    cut = path.rfind("/v")
    if cut < 0:
        return path
    major, dot, minor = path[cut + 2 :].partition(".")
    if major.isdecimal() and (not dot or minor.isdecimal()):
        return path[:cut]
    return path


MEMO_BUDGET = 1 << 20


_Located = tuple[Endpoint, Literal["public", "backend"], bool]
# The prefixes published at one host:port: longest first when there are at most _SCAN_MAX of
# them (None otherwise), and by prefix.
_Prefixes = tuple[tuple[tuple[str, _Located], ...] | None, dict[str, _Located]]
_SCAN_MAX = 8
_Kind = Literal["public", "backend"]
_ByLocation = dict[tuple[str, int], dict[str, _Located]]
_Versioned = list[tuple[dict[str, _Located], str, _Located]]  # (prefixes, bare, located)


@dataclass(frozen=True)
class Catalog:
    clouds: Mapping[str, Cloud]
    settings: Settings = field(default_factory=Settings)
    _by_location: dict[tuple[str, int], _Prefixes] = field(init=False, repr=False, compare=False)
    _by_target: dict[tuple[str, str, str], Endpoint] = field(init=False, repr=False, compare=False)
    service_types: frozenset[str] = field(init=False, compare=False)
    # Memo for pure functions of this catalog (routing's prepared scopes). Lives and dies with
    # the catalog, so a reload never sees answers computed for the previous config.
    memo: Memo = field(
        init=False, repr=False, compare=False, default_factory=lambda: Memo(MEMO_BUDGET)
    )
    _types_of: dict[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_location: _ByLocation = {}
        by_target: dict[tuple[str, str, str], Endpoint] = {}
        types_of: dict[str, frozenset[str]] = {}
        versioned: _Versioned = []
        for n, cloud in enumerate(self.clouds.values()):
            let_threads_run(n)
            types: set[str] = set()
            for ep in cloud.endpoints:
                by_target[(cloud.name, ep.service_type, ep.interface)] = ep
                types.add(ep.service_type)
                _locate(by_location, versioned, ep, "public", ep.url)
                _locate(by_location, versioned, ep, "backend", ep.backend)
            if types:
                types_of[cloud.name] = types_of.get(cloud.name, frozenset()) | types
        # Afterwards, so an exact URL always beats another endpoint's version-less form.
        for prefixes, bare, located in versioned:
            if bare not in prefixes:
                prefixes[bare] = located
        index: dict[tuple[str, int], _Prefixes] = {}
        for n, (location, prefixes) in enumerate(by_location.items()):
            index[location] = (_ordered(prefixes), prefixes)
            let_threads_run(n, 4095)
        object.__setattr__(self, "_by_location", index)
        object.__setattr__(self, "_by_target", by_target)
        object.__setattr__(self, "service_types", frozenset(st for _, st, _ in by_target))
        object.__setattr__(self, "_types_of", types_of)

    def published(self, host: str, port: int) -> bool:
        """Whether an endpoint URL or a backend of the catalog is at host:port."""
        return (host, port) in self._by_location or (host.lower(), port) in self._by_location

    def match(self, host: str, port: int, path: str) -> Match | None:
        """The endpoint whose URL is the longest segment prefix of `path` at host:port.

        "Segment prefix": "/image" matches "/image", "/image/x" and "/image?x", never
        "/images". Few prefixes at one address (the usual case: one service per port) are
        tried longest first; many (a gateway publishing many services on one port) are found
        by walking the path's own segment prefixes down, one dict lookup each, so the cost is
        bounded by the path's depth rather than by the size of the catalog."""
        located = self._by_location.get((host, port))
        if located is None:  # hosts are indexed in lower case (a frontend's host already is)
            located = self._by_location.get((host.lower(), port))
            if located is None:
                return None
        ordered, prefixes = located
        if ordered is not None:
            for prefix, (endpoint, kind, versionless) in ordered:
                if not prefix:  # the root: last, as the shortest
                    return Match(endpoint, kind, path, versionless)
                if path.startswith(prefix):
                    end = len(prefix)
                    if len(path) == end or path[end] in "/?":
                        return Match(endpoint, kind, path[end:], versionless)
            return None
        # "/v2/images/x" -> "/v2/images" -> "/v2" -> ""
        candidate = path.partition("?")[0].rstrip("/")
        while True:
            hit = prefixes.get(candidate)
            if hit is not None:
                endpoint, kind, versionless = hit
                return Match(endpoint, kind, path[len(candidate) :], versionless)
            if not candidate:
                return None
            candidate = candidate[: max(candidate.rfind("/"), 0)]

    def endpoint(self, cloud: str, service_type: str, interface: str) -> Endpoint | None:
        """The endpoint of `service_type` in `cloud`, on `interface` or else on public."""
        found = self._by_target.get((cloud, service_type, interface))
        if found is None and interface != "public":
            found = self._by_target.get((cloud, service_type, "public"))
        return found

    def service_types_of(self, cloud: str) -> frozenset[str]:
        """The service types `cloud` offers."""
        return self._types_of.get(cloud, frozenset())

    def describe(self) -> str:
        """A one-line summary for logs."""
        n_endpoints = sum(len(c.endpoints) for c in self.clouds.values())
        return f"{len(self.clouds)} clouds, {n_endpoints} endpoints"


_INTERFACE_RANK = {name: rank for rank, name in enumerate(INTERFACES)}


def let_threads_run(n: int, mask: int = 127) -> None:
    """Let a thread waiting for the GIL have it at every `mask` + 1st `n` (a worker builds a
    reloaded catalog in a thread as it serves; compiled code keeps the GIL as long as it runs)."""
    if not n & mask:
        time.sleep(0)  # (~15 us: sched_yield is cheaper, but the GIL's waiter rarely gets it)


def _locate(
    by_location: _ByLocation, versioned: _Versioned, ep: Endpoint, kind: _Kind, url: URL
) -> None:
    """Index `url` (`ep`'s `kind` URL) by host:port and path; note its version-less form."""
    location = (url.host, url.port)
    prefixes = by_location.get(location)
    if prefixes is None:
        prefixes = by_location[location] = {}
    path = url.path
    existing = prefixes.get(path)
    located: _Located = (ep, kind, False)
    prefixes[path] = located if existing is None else _prefer(existing, located, url)
    bare = strip_version(path)
    if bare != path:
        versioned.append((prefixes, bare, (ep, kind, True)))


def _ordered(prefixes: dict[str, _Located]) -> tuple[tuple[str, _Located], ...] | None:
    """The prefixes longest first (as inserted among equals); None past _SCAN_MAX."""
    if len(prefixes) > _SCAN_MAX:
        return None
    items = tuple(prefixes.items())
    if len(items) == 1 or (len(items) == 2 and len(items[0][0]) >= len(items[1][0])):
        return items  # (most addresses: one prefix, or a versioned one and its root)
    return tuple(sorted(items, key=_longest_first))


def _longest_first(item: tuple[str, _Located]) -> int:
    return -len(item[0])


def _prefer(existing: _Located | None, new: _Located, url: URL) -> _Located:
    """Two endpoints at one URL: fine when they are interfaces of one service (public wins)."""
    if existing is None:
        return new
    (old_ep, old_kind, _), (new_ep, _, _) = existing, new
    if (old_ep.cloud, old_ep.service_type) != (new_ep.cloud, new_ep.service_type):
        raise ConfigError(
            f"clouds.{new_ep.cloud}.services.{new_ep.service_type}.{new_ep.interface}",
            f"{url} is also the {old_kind} URL of {old_ep.service_type} in {old_ep.cloud}; "
            "the router could not tell the two apart",
        )
    new_better = _INTERFACE_RANK[new_ep.interface] < _INTERFACE_RANK[old_ep.interface]
    return new if new_better else existing
