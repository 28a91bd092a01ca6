"""Reading a federation config: YAML file -> validated :class:`~scoperouter.catalog.Catalog`.

Every error is a :class:`~scoperouter.errors.ConfigError` whose location is ``FILE: key.path``,
so ``scoperouter check-config`` and a refused reload say exactly what to fix. Beyond the shape
of the document, the loader refuses what would make a router misbehave at run time: endpoint
URLs off the cloud's frontends, a URL shared by two services, and a backend that is in fact a
router of the federation (requests would loop).

The format is documented in config/federation.yaml and docs/design.md.
"""

from __future__ import annotations

import gc
import json
import logging
import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import yaml

from scoperouter.catalog import (
    EVENT_LOOPS,
    INTERFACES,
    URL,
    Breaker,
    Catalog,
    Cloud,
    Combine,
    Endpoint,
    Frontend,
    Limits,
    Peers,
    Settings,
    let_threads_run,
    parse_hostport,
    parse_url,
    untemplated,
)
from scoperouter.errors import ConfigError

logger = logging.getLogger("scoperouter")

OBSOLETE_DATA_PATH = "data_path"
"""A setting of earlier versions (``lean`` or ``mitmproxy``): the router now has one reverse
data path, its own HTTP server (what ``lean`` was). ``lean`` is accepted with a warning."""

__all__ = ["build_catalog", "load_catalog", "parse_catalog", "read_config"]

POOL_WARM_MAX = 64  # settings.peers.warm: at most this many connections opened ahead per peer
BUSY_POLL_MAX = 1000  # settings.busy_poll_us: at most a millisecond of polling after I/O


def load_catalog(
    path: str | Path, *, source: str | None = None, base_dir: Path | None = None
) -> Catalog:
    """Read and validate a federation config file; raises ConfigError naming the key.

    `source` names the file in errors and `base_dir` resolves its relative paths (both default
    to the file's own): a router worker reads the copy its supervisor checked, as the original.
    """
    path = Path(path)
    return parse_catalog(read_config(path), source or str(path), base_dir or path.parent)


def read_config(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror}") from None


# libyaml's loader when PyYAML has it (its wheels do): the same safe schema, ~4x faster.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_document(text: str) -> Any:
    """A config file's document. JSON is YAML too; a file written as JSON (a big federation's,
    generated: 20 MB at 10,000 clouds) is read by the JSON parser, tens of times faster than a
    YAML parser; anything else, or JSON that does not parse, by YAML (whose error is shown)."""
    if text.lstrip()[:1] == "{":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader: SafeLoader or libyaml's


def parse_catalog(text: str, source: str, base_dir: Path) -> Catalog:
    """The catalog of a config file's text (`source` names it in errors)."""
    try:
        data = parse_document(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(where, f"not valid YAML: {problem}") from None
    return build_catalog(data, source=source, base_dir=base_dir)


def build_catalog(data: Any, source: str = "<config>", base_dir: Path | None = None) -> Catalog:
    """Validate the parsed YAML document and build the Catalog."""
    loader = _Loader(base_dir or Path.cwd())
    # Building makes a few objects per endpoint and frees none: the cyclic collector would
    # scan them all again and again as they accumulate (60 % of the time at 10,000 clouds).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return loader.catalog(data)
    except ConfigError as exc:
        if exc.location.startswith(source):
            raise
        raise ConfigError(f"{source}: {exc.location}", exc.message) from None
    finally:
        if collecting:
            gc.enable()


def _count(value: Any, where: str, maximum: int) -> int:
    """An integer from 0 to `maximum`, else ConfigError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise ConfigError(where, f"must be an integer from 0 to {maximum}, not {value!r}")
    return value


def _number(value: Any, where: str, *, integer: bool = False) -> float:
    """A positive, finite number (an integer if asked), else ConfigError."""
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if not ok or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigError(where, f"must be {kind}, not {value!r}")
    return float(value)


# The keys of the sections read once per cloud, service or endpoint (made once, not per call)
_CLOUD_REQUIRED = frozenset({"frontends", "services"})
_CLOUD_KEYS = frozenset(
    {"region", "frontends", "proxy", "metrics", "services", "credentials", "peer"}
)
_INTERFACE_KEYS = frozenset(INTERFACES)
_FRONTEND_REQUIRED = frozenset({"url"})
_FRONTEND_KEYS = frozenset({"url", "listen", "tls"})
_ENDPOINT_KEYS = frozenset({"url", "backend"})
_LISTEN_KEYS = frozenset({"listen"})
_PROXY_KEYS = frozenset({"listen", "ca", "ca_key"})


class _Loader:
    """Walks the document keeping the key path, so every error says exactly where it is."""

    def __init__(self, base_dir: Path) -> None:
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
        clouds: dict[str, Cloud] = {}
        for n, (name, body) in enumerate(clouds_doc.items()):
            let_threads_run(n)  # (a reload reads the file in a thread of a serving worker)
            clouds[str(name)] = self.cloud(str(name), body, f"clouds.{name}")
        for cloud in clouds.values():
            for remote in cloud.credentials:
                if remote not in clouds or remote == cloud.name:
                    raise ConfigError(
                        f"clouds.{cloud.name}.credentials.{remote}",
                        "must be another cloud of this federation",
                    )
        _refuse_router_backends(clouds)
        _check_peer_links(clouds, settings)
        return Catalog(clouds, settings)

    def settings(self, data: Any, where: str) -> Settings:
        allowed = set(Settings.__dataclass_fields__) | {OBSOLETE_DATA_PATH}
        doc = self._mapping(data, where, allowed=allowed)
        defaults = Settings()
        hop_limit = int(
            _number(doc.get("hop_limit", defaults.hop_limit), f"{where}.hop_limit", integer=True)
        )
        timeouts: dict[str, float] = {}
        for key in ("connect_timeout", "response_timeout"):
            timeouts[key] = _number(doc.get(key, getattr(defaults, key)), f"{where}.{key}")
        for key in ("peer_connect_timeout", "peer_response_timeout"):
            # A peer's timeouts default to the backends' (the same keys without "peer_").
            value = doc.get(key, timeouts[key.removeprefix("peer_")])
            timeouts[key] = _number(value, f"{where}.{key}")
        verify = doc.get("verify", True)
        if not isinstance(verify, bool):
            raise ConfigError(f"{where}.verify", f"must be true or false, not {verify!r}")
        _obsolete_data_path(doc, where)
        ca_bundle = doc.get("ca_bundle")
        if ca_bundle is not None:
            ca_bundle = self._file(ca_bundle, f"{where}.ca_bundle")
        event_loop = doc.get("event_loop", defaults.event_loop)
        if event_loop not in EVENT_LOOPS:
            choices = " or ".join(EVENT_LOOPS)
            raise ConfigError(f"{where}.event_loop", f"must be {choices}, not {event_loop!r}")
        busy_poll_us = _count(
            doc.get("busy_poll_us", defaults.busy_poll_us), f"{where}.busy_poll_us", BUSY_POLL_MAX
        )
        return Settings(
            hop_limit=hop_limit,
            busy_poll_us=busy_poll_us,
            ca_bundle=ca_bundle,
            verify=verify,
            limits=self.limits(doc.get("limits") or {}, f"{where}.limits"),
            breaker=self.breaker(doc.get("breaker") or {}, f"{where}.breaker"),
            peers=self.peers(doc.get("peers") or {}, f"{where}.peers"),
            combine=self.combine(doc.get("combine") or {}, f"{where}.combine"),
            event_loop=event_loop,
            **timeouts,
        )

    def peers(self, data: Any, where: str) -> Peers:
        doc = self._mapping(data, where, allowed=set(Peers.__dataclass_fields__))
        defaults = Peers()
        ca = doc.get("ca")
        if ca is not None:
            ca = self._file(ca, f"{where}.ca")
        warm = _count(doc.get("warm", defaults.warm), f"{where}.warm", POOL_WARM_MAX)
        plain = doc.get("plain", defaults.plain)
        if not isinstance(plain, bool):
            raise ConfigError(f"{where}.plain", f"must be true or false, not {plain!r}")
        return Peers(ca=ca, warm=warm, plain=plain)

    def limits(self, data: Any, where: str) -> Limits:
        doc = self._mapping(data, where, allowed=set(Limits.__dataclass_fields__))
        defaults = Limits()
        values: dict[str, Any] = {}
        for key in ("max_headers", "max_header_bytes", "max_request_line"):
            value = doc.get(key, getattr(defaults, key))
            values[key] = int(_number(value, f"{where}.{key}", integer=True))
        for key in ("header_timeout", "idle_timeout", "body_timeout"):
            values[key] = _number(doc.get(key, getattr(defaults, key)), f"{where}.{key}")
        if values["max_request_line"] > values["max_header_bytes"]:
            raise ConfigError(
                f"{where}.max_request_line", "must not be larger than max_header_bytes"
            )
        return Limits(**values)

    def combine(self, data: Any, where: str) -> Combine:
        doc = self._mapping(data, where, allowed=set(Combine.__dataclass_fields__))
        defaults = Combine()
        values = {
            key: int(_number(doc.get(key, getattr(defaults, key)), f"{where}.{key}", integer=True))
            for key in ("max_parts", "max_clouds", "buffer_mib")
        }
        return Combine(**values)

    def breaker(self, data: Any, where: str) -> Breaker:
        doc = self._mapping(data, where, allowed=set(Breaker.__dataclass_fields__))
        defaults = Breaker()
        failures = doc.get("failures", defaults.failures)
        return Breaker(
            failures=int(_number(failures, f"{where}.failures", integer=True)),
            down_for=_number(doc.get("down_for", defaults.down_for), f"{where}.down_for"),
        )

    def cloud(self, name: str, data: Any, where: str) -> Cloud:
        if not name or any(c in name for c in " &|()\"'"):
            raise ConfigError(
                where, "a cloud name cannot be empty or contain spaces, quotes, & | ( )"
            )
        doc = self._mapping(
            data,
            where,
            required=_CLOUD_REQUIRED,
            allowed=_CLOUD_KEYS,
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
        services = self._mapping(doc["services"], f"{where}.services")
        origins = {(f.url.scheme, f.url.host, f.url.port) for f in frontends}
        endpoints = []
        for service_type, interfaces in services.items():
            st_where = f"{where}.services.{service_type}"
            for interface, body in self._mapping(
                interfaces, st_where, allowed=_INTERFACE_KEYS
            ).items():
                endpoints.append(
                    self.endpoint(
                        name,
                        str(service_type),
                        interface,
                        body,
                        frontends,
                        origins,
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
        peer = None if doc.get("peer") is None else self.frontend(doc["peer"], f"{where}.peer")
        if peer is not None:
            taken = {(f.listen_host, f.listen_port) for f in frontends}
            taken |= {(f.url.host, f.url.port) for f in frontends}
            proxy = self._listen(doc.get("proxy"), f"{where}.proxy", _PROXY_KEYS)
            if proxy is not None:
                taken.add(proxy)
            if (peer.listen_host, peer.listen_port) in taken or (
                peer.url.host,
                peer.url.port,
            ) in taken:
                raise ConfigError(
                    f"{where}.peer",
                    "the peer link needs an address of its own (not a frontend's or the "
                    "forward proxy's)",
                )
        proxy_ca, proxy_ca_key = self.proxy_ca(doc.get("proxy"), f"{where}.proxy")
        return Cloud(
            name=name,
            region=region,
            frontends=frontends,
            endpoints=tuple(endpoints),
            proxy_listen=self._listen(doc.get("proxy"), f"{where}.proxy", _PROXY_KEYS),
            proxy_ca=proxy_ca,
            proxy_ca_key=proxy_ca_key,
            metrics_listen=self._listen(doc.get("metrics"), f"{where}.metrics"),
            credentials=credentials,
            peer=peer,
        )

    def frontend(self, data: Any, where: str) -> Frontend:
        doc = self._mapping(data, where, required=_FRONTEND_REQUIRED, allowed=_FRONTEND_KEYS)
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
        origins: AbstractSet[tuple[str, str, int]],
        where: str,
    ) -> Endpoint:
        """`origins`: the frontends' (scheme, host, port)."""
        doc = self._mapping(data, where, required=_ENDPOINT_KEYS, allowed=_ENDPOINT_KEYS)
        url, template = untemplated(self._url(doc["url"], f"{where}.url"))
        backend, backend_template = untemplated(self._url(doc["backend"], f"{where}.backend"))
        if template != backend_template:
            raise ConfigError(
                f"{where}.backend",
                f"its templated part {backend_template or '(none)'!r} differs from the url's "
                f"{template or '(none)'!r}: the router forwards the path after the fixed part "
                "unchanged, so both must end alike",
            )
        if (url.scheme, url.host, url.port) not in origins:
            listed = ", ".join(str(f.url) for f in frontends)
            raise ConfigError(
                f"{where}.url", f"{url} is not on one of this cloud's frontends ({listed})"
            )
        return Endpoint(cloud, service_type, interface, url, backend)

    def _listen(
        self, data: Any, where: str, allowed: AbstractSet[str] = _LISTEN_KEYS
    ) -> tuple[str, int] | None:
        """``{listen: HOST:PORT}`` (the proxy and metrics sections), or None when absent."""
        if data is None:
            return None
        doc = self._mapping(data, where, required=_LISTEN_KEYS, allowed=allowed)
        return self._hostport(doc["listen"], f"{where}.listen")

    def proxy_ca(self, data: Any, where: str) -> tuple[str | None, str | None]:
        """The forward proxy's CA for TLS interception (``proxy: {ca, ca_key}``): both files,
        or neither. Only the cloud's own router reads them (and checks them: they exist, the
        key's mode), so other routers' hosts need not have them."""
        if data is None:
            return None, None
        doc = self._mapping(data, where, required=_LISTEN_KEYS, allowed=_PROXY_KEYS)
        if ("ca" in doc) != ("ca_key" in doc):
            given, missing = ("ca", "ca_key") if "ca" in doc else ("ca_key", "ca")
            raise ConfigError(f"{where}.{missing}", f"required with {given} (TLS interception)")
        if "ca" not in doc:
            return None, None
        return self._path(doc["ca"], f"{where}.ca"), self._path(doc["ca_key"], f"{where}.ca_key")

    def _mapping(
        self,
        data: Any,
        where: str,
        required: AbstractSet[str] = frozenset(),
        allowed: AbstractSet[str] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(data, dict):
            kind = "nothing" if data is None else type(data).__name__
            raise ConfigError(where or "(top level)", f"expected a mapping, found {kind}")
        if required and not data.keys() >= required:
            missing = sorted(set(required) - data.keys())
            raise ConfigError(where or "(top level)", f"missing key(s): {', '.join(missing)}")
        if allowed is not None and not data.keys() <= allowed:
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
        path = Path(self._path(value, where))
        if not path.is_file():
            raise ConfigError(where, f"no such file: {path}")
        return str(path)

    def _path(self, value: Any, where: str) -> str:
        """A file's path (relative: to the config file), whether or not it is there."""
        if not isinstance(value, str) or not value:
            raise ConfigError(where, "expected a file path")
        return str(Path(value) if Path(value).is_absolute() else self.base_dir / value)


def _check_peer_links(clouds: Mapping[str, Cloud], settings: Settings) -> None:
    """Router-to-router hops are TLS unless the config says otherwise: once a cloud has a
    peer link, every cloud needs one with https (other routers would reach it in plain HTTP),
    unless ``settings.peers.plain`` allows it; a plain http peer link needs it too."""
    if settings.peers.plain:
        return
    for cloud in clouds.values():
        if cloud.peer is not None and cloud.peer.url.scheme != "https":
            raise ConfigError(
                f"clouds.{cloud.name}.peer.url",
                "a peer link in plain HTTP needs settings.peers.plain: true (router-to-router "
                "traffic is TLS unless the config says otherwise)",
            )
    linked = sorted(name for name, cloud in clouds.items() if cloud.peer is not None)
    if not linked:
        return  # no peer link at all: routers reach each other on the frontends (see README)
    for cloud in clouds.values():
        if cloud.peer is None and any(f.url.scheme == "http" for f in cloud.frontends):
            raise ConfigError(
                f"clouds.{cloud.name}",
                f"no peer link: the routers of {', '.join(linked)} would reach {cloud.name}'s "
                "router in plain HTTP on its frontends; give it a peer "
                "{url: https://..., tls: {cert, key}}, or set settings.peers.plain: true",
            )


def _refuse_router_backends(clouds: Mapping[str, Cloud]) -> None:
    """A backend must be a real service: one at an address where a router of the federation
    answers would send every request back into the federation (a loop the hop count would
    only stop after hop_limit passes)."""
    routers: dict[tuple[str, int], str] = {}
    for n, cloud in enumerate(clouds.values()):
        let_threads_run(n)  # (a reload reads the file in a thread of a serving worker)
        routers.update(dict.fromkeys(cloud.listen_addresses(), cloud.name))
    for n, cloud in enumerate(clouds.values()):
        let_threads_run(n)
        for ep in cloud.endpoints:
            owner = routers.get((ep.backend.host, ep.backend.port))
            if owner is not None:
                raise ConfigError(
                    f"clouds.{cloud.name}.services.{ep.service_type}.{ep.interface}.backend",
                    f"{ep.backend.base} is where the router of {owner} listens, not a service: "
                    "requests sent there would come back (routing loop)",
                )


def _obsolete_data_path(doc: Mapping[str, Any], where: str) -> None:
    value = doc.get(OBSOLETE_DATA_PATH)
    if value is None:
        return
    if value != "lean":
        raise ConfigError(
            f"{where}.{OBSOLETE_DATA_PATH}",
            f"{value!r} is no longer available: the router serves its frontends and peer "
            "links with its own HTTP server (mitmproxy carries the forward proxy only); "
            "remove this setting",
        )
    logger.warning(
        "%s.%s is obsolete (the router has one data path, what 'lean' was); remove it",
        where,
        OBSOLETE_DATA_PATH,
    )
