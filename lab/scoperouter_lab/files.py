"""The files a lab hands to its users: clouds.yaml and federation.yaml."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from scoperouter_lab.layout import SERVICE_PORTS, CloudSpec, LabPaths
from scoperouter_lab.templates import Secrets

DOWN_CLOUD = "CloudDown"
"""A cloud of the lab's federation config whose router never runs: its frontends are on
:data:`DOWN_HOST`, where nothing of the lab listens (connections are refused). Scopes may
name it (``{"image": "CloudDown | CloudTwo"}``: the e2e tests of failover)."""
DOWN_HOST = "127.0.0.99"

MISMATCH_SERVICE = ("key-manager", 9311)
"""A TLS lab's endpoint whose certificate does not match its address: CloudOne's federation
config (not its keystone catalog) has this service type at ``https://<backend address>:9311``,
where nothing of the lab listens. The e2e test of upstream verification
(tests/e2e/test_tls_lab.py) serves it there with a certificate of the lab's CA made for another
address; the router must refuse it (502, "TLS certificate verification failed")."""


def federation_config(
    rows_by_cloud: Mapping[CloudSpec, Sequence[Mapping[str, str]]],
    paths: LabPaths | None = None,
) -> dict[str, Any]:
    """The federation config (docs/design.md) from live keystone endpoint lists, by the
    project's catalog import (:func:`scoperouter.catalog_import.import_catalog`).

    Each row is one ``openstack endpoint list`` line (service_type, interface, url, region).
    A row already on the router (a lab brought up with routers) is first moved back onto the
    backend address; the import then advertises each backend on the router's address.

    TLS clouds (a TLS lab; `paths` says where its files are): each router's https frontends
    get its frontend certificate, its forward proxy the cloud's interception CA, and the
    routers verify every upstream with the lab's CA (``settings.ca_bundle``); the first cloud
    gets :data:`MISMATCH_SERVICE` too.
    """
    from scoperouter.catalog_import import CloudEndpoints, import_catalog

    clouds = []
    for cloud, rows in rows_by_cloud.items():
        backends = []
        for row in rows:
            stype = row["service_type"]
            if stype not in SERVICE_PORTS:
                continue
            url = row["url"].rstrip("/")
            front, back = cloud.frontend_url(stype), cloud.backend_url(stype)
            if url.startswith(front):
                url = back + url[len(front) :]
            if not url.startswith(back):
                raise ValueError(
                    f"{cloud.name}: the {stype} {row['interface']} endpoint {row['url']} is "
                    f"neither on the router ({front}) nor on the backend ({back})"
                )
            backends.append({**row, "url": url})
        others = [c for c in rows_by_cloud if c != cloud]
        tls: dict[str, Any] = {}
        if cloud.tls and paths is not None:
            cert, key = paths.tls_files(cloud, "frontend")
            ca, ca_key = paths.tls_files(cloud, "proxy-ca")
            tls = {
                "router_tls": {"cert": str(cert), "key": str(key)},
                "proxy_ca": {"ca": str(ca), "ca_key": str(ca_key)},
            }
            if cloud.index == 1:
                stype, port = MISMATCH_SERVICE
                url = f"https://{cloud.back_ip}:{port}"
                backends.append({"service_type": stype, "interface": "public", "url": url,
                                 "region": cloud.region})  # fmt: skip
        clouds.append(
            CloudEndpoints(
                name=cloud.name,
                region=cloud.region,
                endpoints=backends,
                router_host=cloud.front_ip,
                proxy_listen=cloud.proxy_listen,
                metrics_listen=cloud.metrics_listen,
                # clouds.yaml entries (written by the lab) of the router user of each other cloud
                credentials={c.name: router_entry(c) for c in others},
                **tls,
            )
        )
    if rows_by_cloud:
        clouds.append(_down_cloud())
    settings: dict[str, Any] = {"hop_limit": 8, "connect_timeout": 5.0, "response_timeout": 120.0}
    if paths is not None and any(c.tls for c in rows_by_cloud):
        settings["ca_bundle"] = str(paths.ca_cert)  # the lab's CA: every TLS upstream's
    return import_catalog(clouds, settings)


def _down_cloud() -> Any:
    """:data:`DOWN_CLOUD`: every service type a lab cloud may have, its router on
    :data:`DOWN_HOST` (nothing listens there), its backends on that host's twin."""
    from scoperouter.catalog_import import CloudEndpoints

    back = DOWN_HOST.replace("127.0.0.", "127.0.1.")
    rows = [
        {"service_type": stype, "interface": "public", "url": f"http://{back}:{port}{path}",
         "region": DOWN_CLOUD}
        for stype, (port, path) in SERVICE_PORTS.items()
    ]  # fmt: skip
    return CloudEndpoints(name=DOWN_CLOUD, region=DOWN_CLOUD, endpoints=rows, router_host=DOWN_HOST)


def router_entry(cloud: CloudSpec) -> str:
    return f"{cloud.slug}-router"


SecretsOf = Secrets | Mapping[CloudSpec, Secrets]


def _secrets(secrets: SecretsOf, cloud: CloudSpec) -> Secrets:
    return secrets if isinstance(secrets, Secrets) else secrets[cloud]


def _entry(
    cloud: CloudSpec,
    routed: bool,
    user: str,
    password: str | None,
    project: str,
    cacert: Path | None = None,
) -> dict[str, Any]:
    auth = {
        "auth_url": cloud.endpoint_url("identity", routed),
        "username": user,
        **({"password": password} if password is not None else {}),
        "project_name": project,
        "user_domain_name": "Default",
        "project_domain_name": "Default",
    }
    entry: dict[str, Any] = {
        "auth": auth,
        "region_name": cloud.region,
        "interface": "public",
        "identity_api_version": 3,
    }
    if cloud.tls and cacert is not None:
        entry["cacert"] = str(cacert)  # the lab's CA: the routers' and services' https
    return entry


def clouds_config(
    clouds: Sequence[CloudSpec], secrets: SecretsOf, routed: bool, cacert: Path | None = None
) -> dict[str, Any]:
    """`<cloud>` (demo user, demo project), `<cloud>-alt` (alt_demo, a second ordinary user),
    `<cloud>-admin`, `<cloud>-router` (the user the routers of the other clouds use there:
    service role only). The lab user's file: every entry has the password of its own cloud
    only. TLS clouds' entries name `cacert` (the lab's CA)."""
    out: dict[str, dict[str, Any]] = {}
    for cloud in clouds:
        sec = _secrets(secrets, cloud)
        out[cloud.slug] = _entry(cloud, routed, "demo", sec.demo, "demo", cacert)
        out[f"{cloud.slug}-alt"] = _entry(
            cloud, routed, "alt_demo", sec.alt_demo, "alt_demo", cacert
        )
        out[f"{cloud.slug}-admin"] = _entry(cloud, routed, "admin", sec.admin, "admin", cacert)
        out[router_entry(cloud)] = _entry(
            cloud, routed, "scoperouter", sec.router, "service", cacert
        )
    return {"clouds": out}


def router_clouds_config(
    others: Sequence[CloudSpec], secrets: SecretsOf, routed: bool, cacert: Path | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """clouds.yaml and secure.yaml of one router: the `<cloud>-router` entry of each other cloud
    it reaches (its federation `credentials`), the passwords in secure.yaml only. Nothing else:
    a router's configuration holds no admin password, of its own cloud or another."""
    clouds = {
        router_entry(c): _entry(c, routed, "scoperouter", None, "service", cacert) for c in others
    }
    secure = {router_entry(c): {"auth": {"password": _secrets(secrets, c).router}} for c in others}
    return {"clouds": clouds}, {"clouds": secure}


def dump(data: Mapping[str, Any], header: str) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
