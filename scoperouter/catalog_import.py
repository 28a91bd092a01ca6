"""The catalog import: a federation config from the clouds' keystone endpoint lists.

Why a function of the core and not a template: the lab (`scoperouter lab up`), the operator
(`scoperouter import-catalog`) and playbooks/federation.yml all build the config from what each
keystone lists (``openstack endpoint list``), and they must agree with what the router's own
loader accepts. The rule is one:

* every endpoint of the cloud's region (disabled ones are left out) is a *backend*; the router
  advertises the same URL with its host replaced by the router's host (``router.host``) and,
  when ``router.ports`` maps it, another port: so a router on another address keeps the
  services' ports and paths;
* the router gets one frontend per distinct advertised ``scheme://host:port``, sorted by port;
* two endpoints of one service type and interface in one region are ambiguous: refused.

Pure: no I/O. The result is checked with :func:`scoperouter.config.build_catalog` by the CLI.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scoperouter.catalog import parse_url
from scoperouter.errors import ConfigError

# `openstack endpoint list -f json` columns -> the keys the import reads
_OSC_COLUMNS = {
    "Service Type": "service_type",
    "Interface": "interface",
    "URL": "url",
    "Region": "region",
    "Enabled": "enabled",
    "ID": "id",
    "region_id": "region",  # the identity API's name
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudEndpoints:
    """One cloud's endpoint list and where its router listens."""

    name: str
    region: str
    endpoints: Sequence[Mapping[str, Any]]  # service_type, interface, url, region[, enabled]
    router_host: str  # the router's address: it replaces each endpoint URL's host
    router_ports: Mapping[int, int] = field(default_factory=dict)  # backend port -> router port
    proxy_listen: str | None = None  # the services' HTTP_PROXY (host:port)
    metrics_listen: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)  # other cloud -> clouds.yaml
    service_types: Collection[str] | None = None  # None: every type of the endpoint list


def endpoint_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row with the import's keys, from the API's or `openstack endpoint list`'s columns."""
    return {_OSC_COLUMNS.get(key, key): value for key, value in row.items()}


def router_url(url: str, host: str, ports: Mapping[int, int]) -> str:
    """`url` (a backend) as the router advertises it: same scheme and path, the router's host,
    the port mapped by `ports` when it is there."""
    parsed = parse_url(url)
    port = ports.get(parsed.port, parsed.port)
    shown = f"[{host}]" if ":" in host else host
    return f"{parsed.scheme}://{shown}:{port}{parsed.path}"


def import_catalog(
    clouds: Sequence[CloudEndpoints], settings: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The federation config (a dict in the format of config/federation.yaml)."""
    out: dict[str, Any] = {}
    for cloud in clouds:
        where = f"clouds.{cloud.name}"
        if cloud.name in out:
            raise ConfigError(where, "the same cloud is imported twice")
        services: dict[str, dict[str, dict[str, str]]] = {}
        fronts: dict[tuple[str, str], None] = {}
        rows = [endpoint_row(r) for r in cloud.endpoints]
        for row in sorted(
            rows, key=lambda r: (str(r.get("service_type")), str(r.get("interface")))
        ):
            stype, interface, url = row.get("service_type"), row.get("interface"), row.get("url")
            if not (isinstance(stype, str) and isinstance(interface, str) and isinstance(url, str)):
                raise ConfigError(where, f"endpoint row without service_type/interface/url: {row}")
            if row.get("region") not in (None, "", cloud.region) or row.get("enabled") is False:
                continue
            if cloud.service_types is not None and stype not in cloud.service_types:
                continue
            entry = f"{where}.services.{stype}.{interface}"
            if interface in services.get(stype, {}):
                raise ConfigError(entry, f"two {interface} endpoints in region {cloud.region}")
            backend = url.rstrip("/")
            try:
                advertised = router_url(backend, cloud.router_host, cloud.router_ports)
            except ValueError as exc:
                raise ConfigError(entry, str(exc)) from None
            services.setdefault(stype, {})[interface] = {"url": advertised, "backend": backend}
            parsed = parse_url(advertised)
            fronts[(f"{parsed.port:05d}", parsed.base)] = None
        if not services:
            raise ConfigError(where, f"no endpoint in region {cloud.region}")
        data: dict[str, Any] = {
            "region": cloud.region,
            "frontends": [{"url": base} for _, base in sorted(fronts)],
        }
        if cloud.proxy_listen:
            data["proxy"] = {"listen": cloud.proxy_listen}
        if cloud.metrics_listen:
            data["metrics"] = {"listen": cloud.metrics_listen}
        if cloud.credentials:
            data["credentials"] = dict(cloud.credentials)
        data["services"] = services
        out[cloud.name] = data
    config: dict[str, Any] = {"version": 1}
    if settings:
        config["settings"] = dict(settings)
    config["clouds"] = out
    return config


def import_request(data: Any) -> tuple[list[CloudEndpoints], dict[str, Any] | None]:
    """Read the input of `scoperouter import-catalog` (parsed YAML/JSON); errors name the key.

    ``{"settings": {...}, "clouds": {NAME: {"region", "router": {"host", "ports"}, "proxy":
    {"listen"}, "metrics": {"listen"}, "credentials", "service_types", "endpoints": [...],
    "services": [...]}}}``: endpoint rows as `openstack endpoint list -f json` prints them, or
    as the identity API's ``/v3/endpoints`` lists them (``service_id``, ``region_id``) with
    ``services`` (its ``/v3/services``) to name their types.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("clouds"), Mapping):
        raise ConfigError("clouds", "expected a mapping of cloud names")
    unknown = set(data) - {"settings", "clouds"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown key (expected settings, clouds)")
    settings = data.get("settings")
    if settings is not None and not isinstance(settings, Mapping):
        raise ConfigError("settings", "expected a mapping")
    clouds = []
    keys = {"region", "router", "proxy", "metrics", "credentials", "service_types", "endpoints"}
    keys.add("services")
    for name, spec in data["clouds"].items():
        where = f"clouds.{name}"
        if not isinstance(spec, Mapping):
            raise ConfigError(where, "expected a mapping")
        extra = set(spec) - keys
        if extra:
            raise ConfigError(f"{where}.{sorted(extra)[0]}", "unknown key")
        router = spec.get("router")
        if not isinstance(router, Mapping) or not isinstance(router.get("host"), str):
            raise ConfigError(f"{where}.router.host", "the router's address is required")
        endpoints = spec.get("endpoints")
        if not isinstance(endpoints, list) or not all(isinstance(r, Mapping) for r in endpoints):
            raise ConfigError(f"{where}.endpoints", "expected a list of endpoint rows")
        services = spec.get("services") or []
        if not isinstance(services, list) or not all(isinstance(s, Mapping) for s in services):
            raise ConfigError(f"{where}.services", "expected a list of services (id, type)")
        types_by_id = {s.get("id"): s.get("type") for s in services}
        endpoints = [_with_type(row, types_by_id) for row in endpoints]
        try:
            ports = {int(k): int(v) for k, v in (router.get("ports") or {}).items()}
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"{where}.router.ports", "expected port: port") from None
        types = spec.get("service_types")
        clouds.append(
            CloudEndpoints(
                name=str(name),
                region=str(spec.get("region") or name),
                endpoints=endpoints,
                router_host=router["host"],
                router_ports=ports,
                proxy_listen=(spec.get("proxy") or {}).get("listen"),
                metrics_listen=(spec.get("metrics") or {}).get("listen"),
                credentials=dict(spec.get("credentials") or {}),
                service_types=None if types is None else list(types),
            )
        )
    return clouds, None if settings is None else dict(settings)


def _with_type(row: Mapping[str, Any], types_by_id: Mapping[Any, Any]) -> Mapping[str, Any]:
    """An API endpoint row (service_id) with its service type, from the service list."""
    if "service_type" in row or "Service Type" in row or "service_id" not in row:
        return row
    stype = types_by_id.get(row["service_id"])
    return {**row, "service_type": stype} if stype else row
