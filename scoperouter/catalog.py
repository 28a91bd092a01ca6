"""The federation model: clouds, their router frontends and their service endpoints.

One :class:`Catalog` is built per config load and never mutated; the proxy swaps the whole object
on reload. Lookups the router makes per request are dictionary lookups, so their cost does not
grow with the number of clouds:

* ``match(host, port, path)``: which endpoint a URL targets. Index: ``(host, port)`` -> ``{path
  prefix: endpoint}``; the request path is tried from its longest segment prefix down, so the
  cost is the path depth, not the catalog size.
* ``endpoint(cloud, service_type, interface)``: where to send a request for another cloud.

The YAML format (see ``config/federation.yaml`` and docs/design.md) is one row per keystone
endpoint (service type, interface, url, region) plus the backend the router forwards to, so a
config can be generated from ``openstack endpoint list`` output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from scoperouter.errors import ConfigError

INTERFACES = ("public", "internal", "admin")
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class URL:
    """An absolute http(s) URL, normalised: lower-case host, explicit port, no trailing slash."""

    scheme: str
    host: str
    port: int
    path: str = ""

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def join(self, rest: str) -> str:
        """This URL followed by `rest` (a path remainder, possibly with a query string)."""
        return self.base + self.path + rest

    def __str__(self) -> str:
        return self.base + self.path


def parse_url(text: str) -> URL:
    """Parse an absolute http/https URL; raises ValueError with a reason."""
    if not isinstance(text, str) or not text:
        raise ValueError("expected an http:// or https:// URL")
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


def parse_hostport(text: str) -> tuple[str, int]:
    """``"127.0.0.2:3128"`` or ``"[::1]:3128"`` -> ``(host, port)``."""
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"{text!r} is not HOST:PORT")
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.lower(), int(port_text)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One keystone catalog row plus the real service behind the router."""

    cloud: str
    service_type: str
    interface: str
    url: URL  # advertised in the keystone catalog: this cloud's router frontend
    backend: URL  # the real service


@dataclass(frozen=True, slots=True)
class Frontend:
    """A reverse-proxy listener of a cloud's router."""

    url: URL
    listen_host: str
    listen_port: int
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Cloud:
    name: str
    region: str
    frontends: tuple[Frontend, ...]
    proxy_listen: tuple[str, int] | None
    endpoints: tuple[Endpoint, ...]
    # How this cloud's router authenticates in other clouds: remote cloud -> the name of a
    # clouds.yaml entry (secrets stay in clouds.yaml/secure.yaml, never in this file).
    credentials: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Settings:
    hop_limit: int = 8
    connect_timeout: float = 5.0
    response_timeout: float = 120.0
    ca_bundle: str | None = None
    verify: bool = True


@dataclass(slots=True)  # built per request: see routing.Forward on frozen dataclasses
class Match:
    """The endpoint a URL targets, whether it was addressed by its public URL or its backend,
    and the rest of the path after the endpoint's prefix (query string included).

    `versionless` is true when the request matched the endpoint's URL without its trailing
    version segment (``GET /`` for ``http://host:5000/v3``): clients do version discovery there,
    so the target is the other side's URL without its version too.
    """

    endpoint: Endpoint
    kind: str  # "public" | "backend"
    rest: str
    versionless: bool = False

    def target(self, url: URL) -> str:
        """The request's URL moved onto `url` (another URL of the same service)."""
        path = strip_version(url.path) if self.versionless else url.path
        return url.base + path + self.rest


_VERSION_SEGMENT = re.compile(r"/v\d+(\.\d+)?\Z")


def strip_version(path: str) -> str:
    """``/compute/v2.1`` -> ``/compute``; paths without a version segment are unchanged."""
    return _VERSION_SEGMENT.sub("", path)


@dataclass(frozen=True)
class Catalog:
    clouds: Mapping[str, Cloud]
    settings: Settings = field(default_factory=Settings)
    _by_location: dict[tuple[str, int], dict[str, tuple[Endpoint, str, bool]]] = field(
        init=False, repr=False, compare=False
    )
    _by_target: dict[tuple[str, str, str], Endpoint] = field(init=False, repr=False, compare=False)
    service_types: frozenset[str] = field(init=False, compare=False)
    # Memo for pure functions of this catalog (routing's prepared scopes). Lives and dies with
    # the catalog, so a reload never sees answers computed for the previous config.
    memo: dict[Any, Any] = field(init=False, repr=False, compare=False, default_factory=dict)
    _types_of: dict[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_location: dict[tuple[str, int], dict[str, tuple[Endpoint, str, bool]]] = {}
        by_target: dict[tuple[str, str, str], Endpoint] = {}
        for cloud in self.clouds.values():
            for ep in cloud.endpoints:
                by_target[(cloud.name, ep.service_type, ep.interface)] = ep
                for kind, url in (("public", ep.url), ("backend", ep.backend)):
                    prefixes = by_location.setdefault((url.host, url.port), {})
                    prefixes[url.path] = _prefer(prefixes.get(url.path), (ep, kind, False), url)
        # Second pass, so an exact URL always beats another endpoint's version-less form.
        for cloud in self.clouds.values():
            for ep in cloud.endpoints:
                for kind, url in (("public", ep.url), ("backend", ep.backend)):
                    bare = strip_version(url.path)
                    prefixes = by_location[(url.host, url.port)]
                    if bare != url.path and bare not in prefixes:
                        prefixes[bare] = (ep, kind, True)
        object.__setattr__(self, "_by_location", by_location)
        object.__setattr__(self, "_by_target", by_target)
        object.__setattr__(self, "service_types", frozenset(st for _, st, _ in by_target))
        types_of: dict[str, set[str]] = {}
        for cloud_name, service_type, _ in by_target:
            types_of.setdefault(cloud_name, set()).add(service_type)
        object.__setattr__(
            self, "_types_of", {name: frozenset(types) for name, types in types_of.items()}
        )

    def match(self, host: str, port: int, path: str) -> Match | None:
        """The endpoint whose URL is the longest segment prefix of `path` at host:port."""
        prefixes = self._by_location.get((host.lower(), port))
        if prefixes is None:
            return None
        # Candidates are segment prefixes of the path ("/v2/images/x" -> "/v2/images" -> "/v2"
        # -> ""), so "/image" never matches "/images"; each is one dict lookup.
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


def _prefer(
    existing: tuple[Endpoint, str, bool] | None, new: tuple[Endpoint, str, bool], url: URL
) -> tuple[Endpoint, str, bool]:
    """Two endpoints at one URL: fine when they are interfaces of one service (public wins)."""
    if existing is None:
        return new
    (old_ep, old_kind, _), (new_ep, new_kind, _) = existing, new
    if (old_ep.cloud, old_ep.service_type) != (new_ep.cloud, new_ep.service_type):
        raise ConfigError(
            f"clouds.{new_ep.cloud}.services.{new_ep.service_type}.{new_ep.interface}",
            f"{url} is also the {old_kind} URL of {old_ep.service_type} in {old_ep.cloud}; "
            "the router could not tell the two apart",
        )
    if old_kind != new_kind:
        # A public URL that is also a backend URL would make the router forward to itself.
        raise ConfigError(
            f"clouds.{new_ep.cloud}.services.{new_ep.service_type}.{new_ep.interface}",
            f"{url} is both a router URL and a backend URL",
        )
    new_better = _INTERFACE_RANK[new_ep.interface] < _INTERFACE_RANK[old_ep.interface]
    return new if new_better else existing


# --------------------------------------------------------------------------- loading


def load_catalog(path: str | Path) -> Catalog:
    """Read and validate a federation config file; raises ConfigError naming the key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(where, f"not valid YAML: {problem}") from None
    return build_catalog(data, source=str(path), base_dir=path.parent)


def build_catalog(data: Any, source: str = "<config>", base_dir: Path | None = None) -> Catalog:
    """Validate the parsed YAML document and build the Catalog."""
    loader = _Loader(source, base_dir or Path.cwd())
    try:
        return loader.catalog(data)
    except ConfigError as exc:
        if exc.location.startswith(source):
            raise
        raise ConfigError(f"{source}: {exc.location}", exc.message) from None


class _Loader:
    """Walks the document keeping the key path, so every error says exactly where it is."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir

    def catalog(self, data: Any) -> Catalog:
        doc = self._mapping(
            data, "", required={"clouds"}, allowed={"version", "settings", "clouds"}
        )
        if doc.get("version", 1) != 1:
            raise ConfigError("version", f"unsupported version {doc['version']!r} (expected 1)")
        settings = self.settings(doc.get("settings") or {}, "settings")
        clouds_doc = self._mapping(doc["clouds"], "clouds")
        if not clouds_doc:
            raise ConfigError("clouds", "at least one cloud is required")
        clouds = {
            str(name): self.cloud(str(name), body, f"clouds.{name}")
            for name, body in clouds_doc.items()
        }
        for cloud in clouds.values():
            for remote in cloud.credentials:
                if remote not in clouds or remote == cloud.name:
                    raise ConfigError(
                        f"clouds.{cloud.name}.credentials.{remote}",
                        "must be another cloud of this federation",
                    )
        return Catalog(clouds, settings)

    def settings(self, data: Any, where: str) -> Settings:
        doc = self._mapping(data, where, allowed=set(Settings.__dataclass_fields__))
        defaults = Settings()
        hop_limit = doc.get("hop_limit", defaults.hop_limit)
        if not isinstance(hop_limit, int) or isinstance(hop_limit, bool) or hop_limit < 1:
            raise ConfigError(
                f"{where}.hop_limit", f"must be a positive integer, not {hop_limit!r}"
            )
        timeouts = {}
        for key in ("connect_timeout", "response_timeout"):
            value = doc.get(key, getattr(defaults, key))
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value <= 0:
                raise ConfigError(
                    f"{where}.{key}", f"must be a positive number of seconds, not {value!r}"
                )
            timeouts[key] = float(value)
        verify = doc.get("verify", True)
        if not isinstance(verify, bool):
            raise ConfigError(f"{where}.verify", f"must be true or false, not {verify!r}")
        ca_bundle = doc.get("ca_bundle")
        if ca_bundle is not None:
            ca_bundle = self._file(ca_bundle, f"{where}.ca_bundle")
        return Settings(hop_limit, ca_bundle=ca_bundle, verify=verify, **timeouts)

    def cloud(self, name: str, data: Any, where: str) -> Cloud:
        if not name or any(c in name for c in " &|()\"'"):
            raise ConfigError(
                where, "a cloud name cannot be empty or contain spaces, quotes, & | ( )"
            )
        doc = self._mapping(
            data,
            where,
            required={"frontends", "services"},
            allowed={"region", "frontends", "proxy", "services", "credentials"},
        )
        region = doc.get("region", name)
        if not isinstance(region, str) or not region:
            raise ConfigError(f"{where}.region", "must be a non-empty string")
        frontends_doc = doc["frontends"]
        if not isinstance(frontends_doc, list) or not frontends_doc:
            raise ConfigError(f"{where}.frontends", "must be a non-empty list of {url: ...}")
        frontends = tuple(
            self.frontend(f, f"{where}.frontends[{i}]") for i, f in enumerate(frontends_doc)
        )
        proxy_listen = None
        if doc.get("proxy") is not None:
            proxy_doc = self._mapping(
                doc["proxy"], f"{where}.proxy", required={"listen"}, allowed={"listen"}
            )
            proxy_listen = self._hostport(proxy_doc["listen"], f"{where}.proxy.listen")
        services = self._mapping(doc["services"], f"{where}.services")
        endpoints = []
        for service_type, interfaces in services.items():
            st_where = f"{where}.services.{service_type}"
            for interface, body in self._mapping(
                interfaces, st_where, allowed=set(INTERFACES)
            ).items():
                endpoints.append(
                    self.endpoint(
                        name,
                        str(service_type),
                        interface,
                        body,
                        frontends,
                        f"{st_where}.{interface}",
                    )
                )
        if not endpoints:
            raise ConfigError(f"{where}.services", "at least one service endpoint is required")
        credentials = {
            str(k): v
            for k, v in self._mapping(doc.get("credentials") or {}, f"{where}.credentials").items()
        }
        for remote, entry in credentials.items():
            if not isinstance(entry, str) or not entry:
                raise ConfigError(
                    f"{where}.credentials.{remote}", "must name a clouds.yaml entry (a string)"
                )
        return Cloud(name, region, frontends, proxy_listen, tuple(endpoints), credentials)

    def frontend(self, data: Any, where: str) -> Frontend:
        doc = self._mapping(data, where, required={"url"}, allowed={"url", "listen", "tls"})
        url = self._url(doc["url"], f"{where}.url")
        if url.path:
            raise ConfigError(
                f"{where}.url", "a frontend url is scheme://host:port, without a path"
            )
        host, port = (
            self._hostport(doc["listen"], f"{where}.listen")
            if "listen" in doc
            else (url.host, url.port)
        )
        cert = key = None
        if doc.get("tls") is not None:
            tls = self._mapping(
                doc["tls"], f"{where}.tls", required={"cert", "key"}, allowed={"cert", "key"}
            )
            cert = self._file(tls["cert"], f"{where}.tls.cert")
            key = self._file(tls["key"], f"{where}.tls.key")
        if (url.scheme == "https") != (cert is not None):
            raise ConfigError(
                f"{where}.tls",
                "an https frontend needs tls: {cert, key}; an http one must not have it",
            )
        return Frontend(url, host, port, cert, key)

    def endpoint(
        self,
        cloud: str,
        service_type: str,
        interface: str,
        data: Any,
        frontends: tuple[Frontend, ...],
        where: str,
    ) -> Endpoint:
        doc = self._mapping(data, where, required={"url", "backend"}, allowed={"url", "backend"})
        url = self._url(doc["url"], f"{where}.url")
        backend = self._url(doc["backend"], f"{where}.backend")
        if not any(
            (f.url.scheme, f.url.host, f.url.port) == (url.scheme, url.host, url.port)
            for f in frontends
        ):
            listed = ", ".join(str(f.url) for f in frontends)
            raise ConfigError(
                f"{where}.url", f"{url} is not on one of this cloud's frontends ({listed})"
            )
        return Endpoint(cloud, service_type, interface, url, backend)

    def _mapping(
        self, data: Any, where: str, required: Iterable[str] = (), allowed: set[str] | None = None
    ) -> dict[str, Any]:
        if not isinstance(data, dict):
            kind = "nothing" if data is None else type(data).__name__
            raise ConfigError(where or "(top level)", f"expected a mapping, found {kind}")
        missing = sorted(set(required) - set(data))
        if missing:
            raise ConfigError(where or "(top level)", f"missing key(s): {', '.join(missing)}")
        if allowed is not None:
            unknown = sorted(str(k) for k in data if k not in allowed)
            if unknown:
                raise ConfigError(
                    f"{where}.{unknown[0]}" if where else unknown[0],
                    f"unknown key (expected one of: {', '.join(sorted(allowed))})",
                )
        return data

    def _url(self, value: Any, where: str) -> URL:
        try:
            return parse_url(value)
        except ValueError as exc:
            raise ConfigError(where, str(exc)) from None

    def _hostport(self, value: Any, where: str) -> tuple[str, int]:
        try:
            return parse_hostport(value)
        except ValueError as exc:
            raise ConfigError(where, str(exc)) from None

    def _file(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise ConfigError(where, "expected a file path")
        path = Path(value) if Path(value).is_absolute() else self.base_dir / value
        if not path.is_file():
            raise ConfigError(where, f"no such file: {path}")
        return str(path)
