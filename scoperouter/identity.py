"""Cross-cloud identity for one router: its own tokens for other clouds, and the check that a
caller's token is a valid *service* token of this cloud.

Why: when glance in CloudTwo validates a token issued by CloudOne, its keystonemiddleware sends
``X-Auth-Token: <glance's own token>`` (valid only in CloudTwo) with ``X-Subject-Token: <user
token>``; nova's calls carry ``X-Service-Token: <nova's token>`` the same way. The OpenStackoid
prototype forked keystonemiddleware and used the other cloud's admin password. Here the router
does it, without touching OpenStack:

1. the decision (``Forward.swap_tokens``) says which headers carry a local service's token on a
   request leaving this cloud;
2. :meth:`Identity.swap` checks each such token is valid **in this cloud** and carries a service
   role (so nobody can use the router to inspect other clouds' tokens with a user token);
3. and replaces it with the router's own token for the target cloud, obtained with the
   least-privileged credentials named in the federation config (``clouds.<this>.credentials.
   <target>``: a clouds.yaml entry, e.g. an application credential of a user holding only the
   ``service`` role there). Secrets live in clouds.yaml/secure.yaml or env, never in code.

The local check asks this cloud's keystone to validate the token with itself as the subject
(keystone's ``token_subject`` policy allows it), so it needs no credentials. Results are cached
(by a hash of the token, never the token) until shortly before the token expires.

Blocking clients (keystoneauth, requests) run in threads; the proxy awaits them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scoperouter.catalog import Catalog, strip_version
from scoperouter.errors import Reject
from scoperouter.routing import header_title

logger = logging.getLogger("scoperouter.identity")

SERVICE_ROLES = frozenset({"service", "admin"})
TOKEN_REFRESH_MARGIN = 120.0  # seconds before expiry when the router fetches a new token
INVALID_CACHE_SECONDS = 10.0
VALID_CACHE_SECONDS = 300.0
CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class TokenCheck:
    """What keystone said about a token: valid, with these roles, until `expires` (epoch)."""

    valid: bool
    roles: frozenset[str] = frozenset()
    expires: float = 0.0


def token_key(token: str) -> str:
    """Cache key for a token: a hash, so no token sits in memory dumps of the cache."""
    return hashlib.sha256(token.encode()).hexdigest()


class _Cache:
    """A small LRU with per-entry deadlines."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def get(self, key: str, now: float) -> Any | None:
        item = self._items.get(key)
        if item is None or item[0] <= now:
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: str, value: Any, until: float) -> None:
        self._items[key] = (until, value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def validate_with_keystone(identity_url: str, token: str, verify: bool | str) -> TokenCheck:
    """Blocking: ask keystone at `identity_url` (unversioned) to validate `token` as itself."""
    import requests  # keystoneauth1's HTTP library; imported here to keep the core import-light

    response = requests.get(
        f"{identity_url}/v3/auth/tokens?nocatalog",
        headers={"X-Auth-Token": token, "X-Subject-Token": token},
        timeout=10,
        verify=verify,
    )
    if response.status_code in (401, 403, 404):
        return TokenCheck(False)
    response.raise_for_status()
    body = response.json()["token"]
    roles = frozenset(role["name"] for role in body.get("roles", ()))
    return TokenCheck(True, roles, _parse_time(body.get("expires_at")))


def _parse_time(text: str | None) -> float:
    if not text:
        return time.time() + VALID_CACHE_SECONDS
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def token_from_clouds_yaml(entry: str) -> tuple[str, float]:
    """Blocking: a token for the clouds.yaml `entry` (and its expiry), via openstacksdk's
    config loader (clouds.yaml + secure.yaml + OS_CLIENT_CONFIG_FILE, as every OpenStack tool)."""
    import openstack.config

    region = openstack.config.OpenStackConfig().get_one(cloud=entry)
    session = region.get_session()
    auth: Any = session.auth
    access = auth.get_access(session)
    expires = access.expires.timestamp() if access.expires else time.time() + 3600
    return access.auth_token, expires


class Identity:
    """Cross-cloud identity of the router of `cloud` (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        cloud: str,
        validate: Callable[[str, str, bool | str], TokenCheck] = validate_with_keystone,
        fetch_token: Callable[[str], tuple[str, float]] = token_from_clouds_yaml,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.catalog = catalog
        self.cloud = cloud
        self._validate = validate
        self._fetch_token = fetch_token
        self._clock = clock
        self._checks = _Cache()
        self._tokens: dict[str, tuple[str, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def update(self, catalog: Catalog) -> None:
        """A reloaded config: keep caches of tokens whose credentials did not change."""
        old = self.catalog.clouds[self.cloud].credentials
        new = catalog.clouds[self.cloud].credentials
        for remote in list(self._tokens):
            if old.get(remote) != new.get(remote):
                del self._tokens[remote]
        self.catalog = catalog

    def _identity_url(self) -> str | None:
        endpoint = self.catalog.endpoint(self.cloud, "identity", "public")
        if endpoint is None:
            return None
        return endpoint.backend.base + strip_version(endpoint.backend.path)

    async def check_service_token(self, token: str) -> TokenCheck:
        """Is `token` a valid token of this cloud? (cached by hash)"""
        now = self._clock()
        key = token_key(token)
        cached: TokenCheck | None = self._checks.get(key, now)
        if cached is not None:
            return cached
        url = self._identity_url()
        if url is None:
            return TokenCheck(False)
        settings = self.catalog.settings
        verify: bool | str = (settings.ca_bundle or True) if settings.verify else False
        check = await asyncio.to_thread(self._validate, url, token, verify)
        until = (
            min(check.expires, now + VALID_CACHE_SECONDS)
            if check.valid
            else now + INVALID_CACHE_SECONDS
        )
        self._checks.put(key, check, until)
        return check

    async def token_for(self, remote: str) -> str:
        """The router's own token in `remote` (cached; refreshed before it expires)."""
        cached = self._tokens.get(remote)
        if cached is not None and cached[1] - TOKEN_REFRESH_MARGIN > self._clock():
            return cached[0]
        lock = self._locks.setdefault(remote, asyncio.Lock())
        async with lock:
            cached = self._tokens.get(remote)
            if cached is not None and cached[1] - TOKEN_REFRESH_MARGIN > self._clock():
                return cached[0]
            entry = self.catalog.clouds[self.cloud].credentials.get(remote)
            if entry is None:
                raise LookupError(remote)
            token, expires = await asyncio.to_thread(self._fetch_token, entry)
            self._tokens[remote] = (token, expires)
            logger.info("obtained a token for %s (clouds.yaml entry %r)", remote, entry)
            return token

    async def swap(
        self, headers: Mapping[str, str], swaps: frozenset[str], target: str
    ) -> dict[str, str] | Reject:
        """New values for the `swaps` headers, or the Reject the client gets."""
        edits: dict[str, str] = {}
        for header in sorted(swaps):
            title = header_title(header)
            value = headers.get(header)
            if not value:
                continue
            try:
                check = await self.check_service_token(value)
            except Exception as exc:  # keystone down, bad answer: say so, never crash
                logger.warning("cannot validate %s locally: %s", title, type(exc).__name__)
                return Reject(
                    502,
                    f"the router of {self.cloud} could not check {title} with its keystone "
                    f"before forwarding to {target}",
                )
            if not check.valid:
                return Reject(
                    401,
                    f"{title} is not a valid token of {self.cloud}; only {self.cloud}'s "
                    f"services can have their tokens carried to {target}",
                )
            if not (check.roles & SERVICE_ROLES):
                return Reject(
                    403,
                    f"{title} is not a service token of {self.cloud} (no service role); "
                    f"the router does not carry it to {target}",
                )
            try:
                edits[header] = await self.token_for(target)
            except LookupError:
                return Reject(
                    502,
                    f"the router of {self.cloud} has no credentials for {target}: set "
                    f"clouds.{self.cloud}.credentials.{target} to a clouds.yaml entry",
                )
            except Exception as exc:
                logger.warning("cannot get a token for %s: %s", target, type(exc).__name__)
                return Reject(
                    502,
                    f"the router of {self.cloud} could not authenticate in {target} "
                    f"with its credentials ({type(exc).__name__})",
                )
        return edits


def add_region(body: dict[str, Any], region: str) -> bool:
    """Make a token validation's catalog usable by services of `region`.

    The catalog came from another cloud's keystone and lists that cloud's region only; local
    services filter it by their own region name (nova's ``[glance] region_name``...). Each
    endpoint gets a twin in `region` with the same URL: the URL is the other cloud's router,
    which the scope on the token routes. Returns True if the body changed.
    """
    token = body.get("token")
    if not isinstance(token, dict) or not isinstance(token.get("catalog"), list):
        return False
    changed = False
    for service in token["catalog"]:
        endpoints = service.get("endpoints") if isinstance(service, dict) else None
        if not isinstance(endpoints, list):
            continue
        present = {
            (e.get("interface"), e.get("region_id")) for e in endpoints if isinstance(e, dict)
        }
        for endpoint in list(endpoints):
            if not isinstance(endpoint, dict) or endpoint.get("region_id") == region:
                continue
            if (endpoint.get("interface"), region) in present:
                continue
            twin = {**endpoint, "region_id": region, "region": region}
            twin["id"] = f"{endpoint.get('id', '')}-{region}"
            endpoints.append(twin)
            present.add((endpoint.get("interface"), region))
            changed = True
    return changed
