"""The federation as the broker reaches it: every call goes through a cloud's router.

The broker is a *user of the routers*, exactly like the ``openstack`` CLI: for each cloud it has
a clouds.yaml entry (its own account in that cloud; secrets in clouds.yaml/secure.yaml, never in
the broker config) whose URLs are the cloud's router frontends, and it composes clouds with
scopes (``scope_session``): a server in CloudOne from an image of CloudTwo is a connection that
enters at CloudOne with the scope ``{"image": "CloudTwo"}``, and the routers do the rest.

:class:`FederationClouds` implements the :class:`~scoperouter.broker.contract.Clouds`
contract: connections (cached, thread-safe), each cloud's public identity URL (what bindings
point at) and its free capacity read from placement (cached for a few seconds, so a burst of
provisions does not read it once each).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scoperouter.broker.contract import Capacity
from scoperouter.client import scope_session

if TYPE_CHECKING:
    import requests
    from openstack.config.cloud_region import CloudRegion
    from openstack.config.loader import OpenStackConfig
    from openstack.connection import Connection

# Placement microversion for inventories and usages of resource providers (Train and later).
PLACEMENT_VERSION = "1.14"
CONNECTION_CACHE_SIZE = 64


class CloudUnavailable(RuntimeError):
    """A cloud cannot be used right now (unknown, unreachable, capacity unreadable)."""


@dataclass(frozen=True, kw_only=True)
class CloudAccess:
    """How the broker enters one cloud: `entry` names a clouds.yaml entry (the broker's
    account there, URLs on the cloud's router); `region` defaults to the entry's region_name,
    else the cloud name (the federation names clouds after their keystone regions)."""

    name: str
    entry: str
    region: str | None = None


class FederationClouds:
    """Connections to the federation's clouds through their routers.

    `config_files` / `secure_files`: clouds.yaml and secure.yaml paths (default: the usual
    openstacksdk search path, ``$OS_CLIENT_CONFIG_FILE``, ``$OS_CLIENT_SECURE_FILE``).
    `connection_factory` makes a Connection from a CloudRegion (tests and benchmarks pass their
    own; the default is openstacksdk's).
    """

    def __init__(
        self,
        access: Sequence[CloudAccess],
        *,
        config_files: Sequence[Path] | None = None,
        secure_files: Sequence[Path] | None = None,
        capacity_ttl: float = 10.0,
        connection_factory: Callable[[CloudRegion], Connection] | None = None,
    ) -> None:
        names = [a.name for a in access]
        if len(set(names)) != len(names):
            raise ValueError(f"a cloud is listed twice: {names}")
        self._access = {a.name: a for a in access}
        self._config_files = [str(p) for p in config_files] if config_files else None
        self._secure_files = [str(p) for p in secure_files] if secure_files else None
        self._capacity_ttl = capacity_ttl
        self._factory = connection_factory
        self._lock = threading.Lock()
        self._config: OpenStackConfig | None = None
        self._connections: OrderedDict[tuple[str, str | None, str | None], Connection] = (
            OrderedDict()
        )
        # cloud -> (time.monotonic() of the read, snapshot): the wall-clock read_at is for
        # humans and may jump
        self._capacity: dict[str, tuple[float, Capacity]] = {}

    # ------------------------------------------------------------------ the Clouds contract

    def names(self) -> tuple[str, ...]:
        return tuple(self._access)

    def connect(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> Connection:
        """A Connection entering the federation at `cloud`, as the broker's account, scoped to
        keystone project `project_id` (else the account's own project) and, when given, to
        the routing scope `scope` (JSON text; services it does not name stay in `cloud`).
        Connections are cached per (cloud, project, scope): tokens are reused and renewed by
        keystoneauth."""
        key = (cloud, project_id, scope)
        with self._lock:
            conn = self._connections.get(key)
            if conn is not None:
                self._connections.move_to_end(key)
                return conn
        conn = self._new_connection(cloud, project_id, scope)
        with self._lock:
            existing = self._connections.get(key)
            if existing is not None:  # another thread made one meanwhile: use one only
                return existing
            self._connections[key] = conn
            while len(self._connections) > CONNECTION_CACHE_SIZE:
                self._connections.popitem(last=False)
        return conn

    def identity_url(self, cloud: str) -> str:
        """The identity URL of the broker's clouds.yaml entry for `cloud`: the router frontend
        that keystone's catalog advertises, which is what a binding's user must call."""
        auth = self._region(cloud).config.get("auth", {})
        url = auth.get("auth_url")
        if not url:
            raise CloudUnavailable(
                f"clouds.yaml entry {self._access[cloud].entry!r} has no auth_url"
            )
        return str(url).rstrip("/")

    def region(self, cloud: str) -> str:
        """The keystone region of `cloud` (also the name its scopes use by default)."""
        access = self._get_access(cloud)
        return access.region or self._region(cloud).get_region_name() or cloud

    def session_entry(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> dict[str, Any]:
        """A clouds.yaml entry for a tool the broker runs (a playbook): a token of the broker's
        account scoped to `project_id` (else the account's project), got through the cloud's
        router, at the router, with `scope` (JSON text) applied by the client hook. The tool
        never sees the broker's password, and its token ends with the token's lifetime."""
        conn = self.connect(cloud, project_id=project_id, scope=scope)
        # the plugin's token, not the session's: a scoped session's headers carry the token
        # with the scope joined, which keystone does not know (the hook adds the scope)
        from keystoneauth1.plugin import BaseAuthPlugin

        auth = conn.session.auth
        if not isinstance(auth, BaseAuthPlugin):
            raise CloudUnavailable(f"{cloud}: the connection has no keystoneauth plugin")
        token = auth.get_token(conn.session)
        config = self._region(cloud).config
        entry: dict[str, Any] = {
            "auth_type": "v3token",
            "auth": {
                "auth_url": self.identity_url(cloud),
                "token": token,
                "project_id": project_id or conn.current_project_id,
            },
            "region_name": self.region(cloud),
            "interface": config.get("interface") or "public",
            "identity_api_version": 3,
        }
        for key in ("verify", "cacert", "cert", "key", "api_timeout"):
            if config.get(key) is not None:
                entry[key] = config[key]
        if scope is not None:
            entry["scope"] = json.loads(scope)
            entry["vendor_hook"] = "scoperouter.client:connection_hook"
        return entry

    def endpoints(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> dict[str, str]:
        """Public endpoints by service type in the token's catalog, in the cloud's region
        (the first of a type; the catalog advertises the routers' URLs)."""
        conn = self.connect(cloud, project_id=project_id, scope=scope)
        from keystoneauth1.identity.base import BaseIdentityPlugin

        auth = conn.session.auth  # an identity plugin: it holds the token's catalog
        if not isinstance(auth, BaseIdentityPlugin):
            raise CloudUnavailable(f"{cloud}: the connection's auth has no service catalog")
        found = auth.get_access(conn.session).service_catalog.get_endpoints(
            interface="public", region_name=self.region(cloud)
        )
        urls: dict[str, str] = {}
        for service_type, listed in found.items():
            first = listed[0] if listed else None
            if first and first.get("url"):
                urls[str(service_type)] = str(first["url"])
        return urls

    def capacity(self, cloud: str) -> Capacity:
        """Free capacity of `cloud` per resource class, from placement through its router:
        for each resource provider, (total - reserved) * allocation_ratio - used. Cached for
        `capacity_ttl` seconds. Raises CloudUnavailable when it cannot be read."""
        with self._lock:
            cached = self._capacity.get(cloud)
        if cached is not None and time.monotonic() - cached[0] < self._capacity_ttl:
            return cached[1]
        try:
            snapshot = self._read_capacity(cloud)
        except Exception as exc:  # any failure of a cloud is "cannot be a candidate now"
            raise CloudUnavailable(f"capacity of {cloud} unreadable: {_short(exc)}") from exc
        with self._lock:
            self._capacity[cloud] = (time.monotonic(), snapshot)
        return snapshot

    # --------------------------------------------------------------------------- internals

    def _get_access(self, cloud: str) -> CloudAccess:
        try:
            return self._access[cloud]
        except KeyError:
            known = ", ".join(self._access)
            raise CloudUnavailable(
                f"no cloud {cloud!r} in the broker config (has: {known})"
            ) from None

    def _openstack_config(self) -> OpenStackConfig:
        with self._lock:
            if self._config is None:
                from openstack import config as os_config
                from openstack.config import loader

                # load_envvars=False keeps OS_* variables (an OS_PASSWORD of whoever started
                # the broker) out of the broker's clouds, but also makes openstacksdk ignore
                # $OS_CLIENT_CONFIG_FILE / $OS_CLIENT_SECURE_FILE: those two are read here
                self._config = os_config.OpenStackConfig(
                    config_files=self._config_files
                    or search_path("OS_CLIENT_CONFIG_FILE", loader.CONFIG_FILES),
                    secure_files=self._secure_files
                    or search_path("OS_CLIENT_SECURE_FILE", loader.SECURE_FILES),
                    load_envvars=False,
                )
            return self._config

    def _region(self, cloud: str, auth: Mapping[str, Any] | None = None) -> CloudRegion:
        """The entry of `cloud` as openstacksdk reads it; `auth`: its auth section replaced."""
        access = self._get_access(cloud)
        config = self._openstack_config()
        try:
            if auth is None:
                return config.get_one(cloud=access.entry)
            return config.get_one(cloud=access.entry, auth=dict(auth))
        except Exception as exc:
            raise CloudUnavailable(
                f"clouds.yaml entry {access.entry!r} for {cloud}: {_short(exc)}"
            ) from exc

    def _new_connection(self, cloud: str, project_id: str | None, scope: str | None) -> Connection:
        auth = None
        if project_id is not None:
            # Replace whatever project the entry names (by name or id) with this one.
            base = dict(self._region(cloud).config.get("auth", {}))
            for key in ("project_name", "project_id", "project_domain_name", "project_domain_id"):
                base.pop(key, None)
            auth = {**base, "project_id": project_id}
        region = self._region(cloud, auth)
        if self._factory is not None:
            conn = self._factory(region)
        else:
            from openstack.connection import Connection

            conn = Connection(config=region)
        if scope is not None:
            scope_session(conn.session, scope, default_cloud=self.region(cloud))
        return conn

    def _read_capacity(self, cloud: str) -> Capacity:
        conn = self.connect(cloud)
        total: dict[str, float] = {}
        free: dict[str, float] = {}
        largest: dict[str, float] = {}
        providers = _json(conn.placement.get("/resource_providers", microversion=PLACEMENT_VERSION))
        for provider in providers.get("resource_providers", []):
            uuid = provider["uuid"]
            inventories = _json(
                conn.placement.get(
                    f"/resource_providers/{uuid}/inventories", microversion=PLACEMENT_VERSION
                )
            ).get("inventories", {})
            usages = _json(
                conn.placement.get(
                    f"/resource_providers/{uuid}/usages", microversion=PLACEMENT_VERSION
                )
            ).get("usages", {})
            for resource_class, inv in inventories.items():
                capacity = (inv["total"] - inv.get("reserved", 0)) * inv.get(
                    "allocation_ratio", 1.0
                )
                total[resource_class] = total.get(resource_class, 0.0) + capacity
                left = max(capacity - usages.get(resource_class, 0), 0.0)
                free[resource_class] = free.get(resource_class, 0.0) + left
                # placement refuses one allocation above max_unit (default: the total)
                one = min(float(inv.get("max_unit", capacity)), left)
                largest[resource_class] = max(largest.get(resource_class, 0.0), one)
        return Capacity(
            cloud=cloud, total=total, free=free, largest=largest, read_at=datetime.now(UTC)
        )


def _json(response: requests.Response) -> Mapping[str, Any]:
    if response.status_code != 200:
        raise CloudUnavailable(f"placement answered {response.status_code}: {response.text[:200]}")
    data = response.json()
    if not isinstance(data, Mapping):
        raise CloudUnavailable("placement answered something that is not a JSON object")
    return data


def search_path(variable: str, defaults: Sequence[str]) -> list[str]:
    """openstacksdk's files to read: the one `$variable` names first, then its usual ones."""
    named = os.environ.get(variable)
    return ([named] if named else []) + list(defaults)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]
