"""The catalog import: a federation config from the clouds' keystone endpoint lists.

Why a function of the core and not a template: the lab (`scoperouter lab up`), the operator
(`scoperouter import-catalog`) and playbooks/federation.yml all build the config from what each
keystone lists (``openstack endpoint list``), and they must agree with what the router's own
loader accepts. The rule is one:

* every endpoint of the cloud's region (disabled ones are left out) is a *backend*; the router
  advertises the same URL with its host replaced by the router's host (``router.host``, or
  ``router.hosts[interface]``: the router *as* the internal endpoint on an address of its own)
  and, when ``router.ports`` maps it, another port: so a router on another address keeps the
  services' ports and paths;
* the router gets one frontend per distinct advertised ``scheme://host:port``, sorted by port;
  an https one (a TLS cloud's endpoints) with the certificate and key its host has
  (``router.tls``, else :class:`TlsFiles`' pattern);
* two endpoints of one service type and interface in one region are ambiguous: refused.

The forward proxy intercepts TLS (``proxy: {ca, ca_key}``) where the cloud's input says so or
:class:`TlsFiles` gives every cloud with a proxy a CA (``import-catalog --proxy-ca``).

Peer links (the router-to-router hops, TLS verified with the federation's CA) are added when
asked: :class:`PeerLinks` (``import-catalog --peer-port``) gives every cloud one, at
``https://<router host>:<port>`` with the certificate and key files each router's host has
(a path pattern; ``{cloud}`` and ``{slug}`` name the cloud), and ``settings.peers.ca``; a
cloud's own ``peer`` block (its address, a listen address, its files) wins over the pattern.
Without either, the config has no peer link and the routers reach each other on their
frontends, as before peer links existed.

Pure: no I/O. The result is checked with :func:`scoperouter.config.build_catalog` by the CLI.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scoperouter.catalog import INTERFACES, parse_url
from scoperouter.errors import ConfigError

# Where the deployment tooling puts a router's peer-link files (the Ansible role's
# scoperouter_etc_dir): the defaults of `import-catalog --peer-*`.
PEER_CERT = "/etc/scoperouter/peer.crt"
PEER_KEY = "/etc/scoperouter/peer.key"
PEER_CA = "/etc/scoperouter/federation-ca.crt"
# The https frontends' certificate and key, and the forward proxy's CA (TLS interception).
FRONTEND_CERT = "/etc/scoperouter/frontend.crt"
FRONTEND_KEY = "/etc/scoperouter/frontend.key"
PROXY_CA = "/etc/scoperouter/proxy-ca.crt"
PROXY_CA_KEY = "/etc/scoperouter/proxy-ca.key"

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
    router_hosts: Mapping[str, str] = field(default_factory=dict)  # interface -> its address
    router_tls: Mapping[str, str] | None = None  # the https frontends' {cert, key}
    proxy_listen: str | None = None  # the services' HTTP_PROXY (host:port)
    proxy_ca: Mapping[str, str] | None = None  # {ca, ca_key}: the forward proxy intercepts TLS
    metrics_listen: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)  # other cloud -> clouds.yaml
    service_types: Collection[str] | None = None  # None: every type of the endpoint list
    peer: Mapping[str, Any] | None = None  # its peer block, or what it gives of it (url, ...)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerLinks:
    """A peer link for every cloud of an import: `port` on each router's host (unless the
    cloud's own peer block gives its url), TLS with the files `cert` and `key` (patterns:
    ``{cloud}`` is the cloud's name, ``{slug}`` the name in lower case; paths as the router's
    host has them) and the federation's CA `ca` (``settings.peers.ca``; None: as the settings
    say)."""

    port: int | None = None
    cert: str = PEER_CERT
    key: str = PEER_KEY
    ca: str | None = PEER_CA


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """Where each router's host has the files of a TLS cloud (patterns: ``{cloud}``, ``{slug}``
    as for :class:`PeerLinks`): the https frontends' certificate and key, and, when
    `proxy_ca` is given, the CA every cloud's forward proxy intercepts TLS with (the
    services' ``HTTPS_PROXY``)."""

    frontend_cert: str = FRONTEND_CERT
    frontend_key: str = FRONTEND_KEY
    proxy_ca: str | None = None
    proxy_ca_key: str = PROXY_CA_KEY


def _fill(pattern: str, cloud: str) -> str:
    return pattern.replace("{cloud}", cloud).replace("{slug}", cloud.lower())


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
    clouds: Sequence[CloudEndpoints],
    settings: Mapping[str, Any] | None = None,
    peers: PeerLinks | None = None,
    tls: TlsFiles | None = None,
) -> dict[str, Any]:
    """The federation config (a dict in the format of config/federation.yaml); with peer
    links for every cloud when `peers` is given, and for the clouds that give a `peer`; the
    https frontends' and the forward proxies' TLS files from `tls` where a cloud gives none."""
    files = tls or TlsFiles()
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
            host = cloud.router_hosts.get(interface, cloud.router_host)
            try:
                advertised = router_url(backend, host, cloud.router_ports)
            except ValueError as exc:
                raise ConfigError(entry, str(exc)) from None
            services.setdefault(stype, {})[interface] = {"url": advertised, "backend": backend}
            parsed = parse_url(advertised)
            fronts[(f"{parsed.port:05d}", parsed.base)] = None
        if not services:
            raise ConfigError(where, f"no endpoint in region {cloud.region}")
        frontend_tls = dict(cloud.router_tls) if cloud.router_tls else None
        if frontend_tls is None:
            name = cloud.name
            frontend_tls = {"cert": _fill(files.frontend_cert, name)}
            frontend_tls["key"] = _fill(files.frontend_key, name)
        data: dict[str, Any] = {
            "region": cloud.region,
            "frontends": [
                {"url": base, "tls": dict(frontend_tls)}
                if base.startswith("https:")
                else {"url": base}
                for _, base in sorted(fronts)
            ],
        }
        if cloud.proxy_listen:
            data["proxy"] = {"listen": cloud.proxy_listen}
            if cloud.proxy_ca:
                data["proxy"].update(ca=cloud.proxy_ca["ca"], ca_key=cloud.proxy_ca["ca_key"])
            elif files.proxy_ca is not None:
                data["proxy"]["ca"] = _fill(files.proxy_ca, cloud.name)
                data["proxy"]["ca_key"] = _fill(files.proxy_ca_key, cloud.name)
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
    given = {cloud.name: cloud.peer for cloud in clouds if cloud.peer is not None}
    for cloud in clouds:
        # A router on several addresses: its peer link on router.host (not an interface's)
        spec = given.get(cloud.name) or {}
        if cloud.router_hosts and peers is not None and peers.port and not spec.get("url"):
            given[cloud.name] = {**spec, "url": f"https://{_shown(cloud.router_host)}:{peers.port}"}
    return add_peer_links(config, peers, given)


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def add_peer_links(
    config: dict[str, Any],
    links: PeerLinks | None,
    given: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """`config` with a peer link for every cloud when `links` is given, else for the clouds
    `given` names (cloud -> what its peer block gives: url, listen, tls); the CA of `links` in
    ``settings.peers.ca``. A link's default url is ``https://<the host of the cloud's first
    frontend>:<links.port>`` (the router's host)."""
    given = given or {}
    added = False
    for name, cloud in config["clouds"].items():
        spec = given.get(name)
        if spec is None and links is None:
            continue
        spec = spec or {}
        pattern = links or PeerLinks()
        where = f"clouds.{name}.peer"
        url = spec.get("url")
        if url is None:
            if pattern.port is None:
                raise ConfigError(
                    f"{where}.url",
                    "no address for the peer link: give its url, or a port on the router's "
                    "host for every cloud (import-catalog --peer-port)",
                )
            host = parse_url(cloud["frontends"][0]["url"]).host
            url = f"https://{_shown(host)}:{pattern.port}"
        if not isinstance(url, str):
            raise ConfigError(f"{where}.url", "expected https://host:port")
        block: dict[str, Any] = {"url": url}
        if spec.get("listen"):
            block["listen"] = spec["listen"]
        tls = spec.get("tls")
        if tls is None and url.startswith("https:"):
            slug = name.lower()
            fill = {"{cloud}": name, "{slug}": slug}
            cert, key = pattern.cert, pattern.key
            for mark, value in fill.items():
                cert, key = cert.replace(mark, value), key.replace(mark, value)
            tls = {"cert": cert, "key": key}
        if tls is not None:
            block["tls"] = dict(tls)
        # the peer block right after the frontends, as in config/federation.yaml
        keys = [k for k in cloud if k != "peer"]
        at = keys.index("frontends") + 1 if "frontends" in keys else len(keys)
        items = [(k, cloud[k]) for k in keys]
        cloud.clear()
        cloud.update([*items[:at], ("peer", block), *items[at:]])
        added = True
    if added and links is not None and links.ca is not None:
        settings = config["settings"] = dict(config.get("settings") or {})
        settings["peers"] = {**(settings.get("peers") or {}), "ca": links.ca}
        # settings before clouds, as in config/federation.yaml
        config["clouds"] = config.pop("clouds")
    return config


def import_request(data: Any) -> tuple[list[CloudEndpoints], dict[str, Any] | None]:
    """Read the input of `scoperouter import-catalog` (parsed YAML/JSON); errors name the key.

    ``{"settings": {...}, "clouds": {NAME: {"region", "router": {"host", "ports", "hosts":
    {INTERFACE: HOST}, "tls": {"cert", "key"}}, "proxy": {"listen", "ca", "ca_key"}, "metrics":
    {"listen"}, "credentials", "service_types", "peer": {"url", "listen", "tls": {"cert",
    "key"}}, "endpoints": [...], "services": [...]}}}``: endpoint
    rows as `openstack endpoint list -f json` prints them, or as the identity API's
    ``/v3/endpoints`` lists them (``service_id``, ``region_id``) with ``services`` (its
    ``/v3/services``) to name their types.
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
    keys |= {"services", "peer"}
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
        hosts = router.get("hosts") or {}
        if not isinstance(hosts, Mapping) or not all(
            k in INTERFACES and isinstance(v, str) and v for k, v in hosts.items()
        ):
            raise ConfigError(f"{where}.router.hosts", "expected interface: address")
        router_tls = router.get("tls")
        if router_tls is not None:
            router_tls = _files(router_tls, f"{where}.router.tls", ("cert", "key"))
        proxy = spec.get("proxy") or {}
        if not isinstance(proxy, Mapping):
            raise ConfigError(f"{where}.proxy", "expected {listen, ca, ca_key}")
        proxy_ca = None
        if "ca" in proxy or "ca_key" in proxy:
            proxy_ca = _files(
                {k: proxy.get(k) for k in ("ca", "ca_key")}, f"{where}.proxy", ("ca", "ca_key")
            )
        peer = spec.get("peer")
        if peer is not None:
            peer = _peer_request(peer, f"{where}.peer")
        clouds.append(
            CloudEndpoints(
                name=str(name),
                region=str(spec.get("region") or name),
                endpoints=endpoints,
                router_host=router["host"],
                router_ports=ports,
                router_hosts=dict(hosts),
                router_tls=router_tls,
                proxy_listen=proxy.get("listen"),
                proxy_ca=proxy_ca,
                metrics_listen=(spec.get("metrics") or {}).get("listen"),
                credentials=dict(spec.get("credentials") or {}),
                service_types=None if types is None else list(types),
                peer=peer,
            )
        )
    return clouds, None if settings is None else dict(settings)


def _files(data: Any, where: str, keys: tuple[str, ...]) -> dict[str, str]:
    """``{cert: PATH, key: PATH}`` (or other `keys`) in the input: every one a path."""
    if (
        not isinstance(data, Mapping)
        or set(data) != set(keys)
        or not all(isinstance(v, str) and v for v in data.values())
    ):
        raise ConfigError(where, "expected {" + ", ".join(f"{k}: PATH" for k in keys) + "}")
    return {k: str(data[k]) for k in keys}


def _peer_request(data: Any, where: str) -> dict[str, Any]:
    """A cloud's ``peer`` in the input: what it gives of its peer block (url, listen, tls);
    the config's loader checks the values."""
    if not isinstance(data, Mapping):
        raise ConfigError(where, "expected a mapping (url, listen, tls)")
    extra = set(data) - {"url", "listen", "tls"}
    if extra:
        raise ConfigError(f"{where}.{sorted(extra)[0]}", "unknown key (expected url, listen, tls)")
    for key in ("url", "listen"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{where}.{key}", "expected a string")
    tls = data.get("tls")
    if tls is not None and (
        not isinstance(tls, Mapping)
        or set(tls) != {"cert", "key"}
        or not all(isinstance(v, str) and v for v in tls.values())
    ):
        raise ConfigError(f"{where}.tls", "expected {cert: PATH, key: PATH}")
    return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items() if v}


def _with_type(row: Mapping[str, Any], types_by_id: Mapping[Any, Any]) -> Mapping[str, Any]:
    """An API endpoint row (service_id) with its service type, from the service list."""
    if "service_type" in row or "Service Type" in row or "service_id" not in row:
        return row
    stype = types_by_id.get(row["service_id"])
    return {**row, "service_type": stype} if stype else row
