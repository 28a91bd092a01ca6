"""Tempest's side of a mode (see tempest_suite.py): patched into ``tempest.lib.auth`` by the
mode's ``sitecustomize.py`` in every Python process of its run, tests unchanged.

Loaded by its file path, not as ``tests.peer.tempest_hook`` (tempest's processes cannot import
the repository's tests package): it imports nothing of the repository but scoperouter's scope
model, which is installed beside tempest. It reads its orders from the JSON file named by
``$SCOPEROUTER_PEER_TEMPEST``:

* ``{"endpoints": {"http://127.0.0.2:8774": "http://127.0.1.2:8774", ...}}`` (direct): every
  base URL tempest takes from the catalog is moved from the router onto the service's backend;
* ``{"scope": "<json>", "region": "CloudOne"}`` (scoped): every authenticated request's token
  carries the scope, completed with `region` for the catalog's other service types (what
  ``scoperouter.client.connection_hook`` does for openstacksdk), and ``X-Scope`` says it too;
* ``{"network_stand_in": true}`` (every mode, while the lab's network is scoperouter's
  stand-in): when tempest's dynamic credentials delete a test class's project, the stand-in's
  refusal to delete the project's default security group (a 403 naming the stand-in) is let
  pass as tempest lets a 404 pass, so the project is deleted and the class's teardown does not
  fail in every mode for a lab limit. Any other error still fails.

``PATCHED`` records what was installed (the preflight reports it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

CONFIG_ENV = "SCOPEROUTER_PEER_TEMPEST"
PATCHED: dict[str, Any] = {}


def move(url: str, endpoints: Mapping[str, str]) -> str:
    """`url` with its origin replaced when `endpoints` maps it (else unchanged)."""
    parts = urlsplit(url)
    target = endpoints.get(f"{parts.scheme}://{parts.netloc}")
    if target is None:
        return url
    new = urlsplit(target)
    return urlunsplit((new.scheme, new.netloc, parts.path, parts.query, parts.fragment))


def catalog_types(access: Any) -> list[str]:
    """The service types of a tempest auth_data body's catalog (v3 ``catalog``, v2
    ``serviceCatalog``)."""
    if not isinstance(access, Mapping):
        return []
    catalog = access.get("catalog") or access.get("serviceCatalog") or []
    return [str(s["type"]) for s in catalog if isinstance(s, Mapping) and s.get("type")]


def scoped_headers(
    headers: Mapping[str, str], access: Any, scope_text: str, region: str | None
) -> dict[str, str]:
    """`headers` with the scope on their X-Auth-Token (unchanged without one)."""
    from scoperouter.scope import Scope, join_token

    out = dict(headers)
    token = out.get("X-Auth-Token")
    if not token:
        return out
    scope = Scope.parse(scope_text)
    if region:
        scope = scope.complete(catalog_types(access), region)
    out["X-Auth-Token"] = join_token(token, scope)
    out["X-Scope"] = scope.to_json()
    return out


def install(config: Mapping[str, Any] | None = None) -> None:
    """Patch tempest.lib.auth as the config (default: the file of $SCOPEROUTER_PEER_TEMPEST)
    says. A broken hook must not pass unnoticed: the error goes to stderr and the preflight,
    which checks what the mode's requests reach, fails the mode."""
    try:
        if config is None:
            path = os.environ.get(CONFIG_ENV)
            if not path:
                return
            config = json.loads(Path(path).read_text())
        _install(config)
    except Exception as exc:  # reported, never silently unscoped: see the preflight
        PATCHED["error"] = f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"tests.peer tempest hook not installed: {PATCHED['error']}\n")


STAND_IN_REFUSAL = "network stand-in"  # in the stand-in's 403 messages


def _install(config: Mapping[str, Any]) -> None:
    from tempest.lib import auth
    from tempest.lib import exceptions as lib_exc
    from tempest.lib.common import cred_provider

    if config.get("network_stand_in"):
        provider_cls = cred_provider.CredentialProvider
        cleanup = provider_cls.cleanup_default_secgroup
        if not getattr(cleanup, "_scoperouter_peer", False):

            def cleanup_default_secgroup(
                self: Any, client: Any, tenant: Any, _original: Any = cleanup
            ) -> None:
                try:
                    _original(self, client, tenant)
                except lib_exc.Forbidden as exc:
                    if STAND_IN_REFUSAL not in str(exc):
                        raise

            cleanup_default_secgroup._scoperouter_peer = True  # type: ignore[attr-defined]
            provider_cls.cleanup_default_secgroup = cleanup_default_secgroup  # type: ignore[method-assign]
        PATCHED["network_stand_in"] = True

    endpoints = config.get("endpoints")
    if endpoints:
        moves = dict(endpoints)
        for cls in (auth.KeystoneV3AuthProvider, auth.KeystoneV2AuthProvider):
            original = cls.base_url
            if getattr(original, "_scoperouter_peer", False):
                continue

            def base_url(
                self: Any, filters: Any, auth_data: Any = None, _original: Any = original
            ) -> str:
                return move(_original(self, filters, auth_data), moves)

            base_url._scoperouter_peer = True  # type: ignore[attr-defined]
            cls.base_url = base_url  # type: ignore[method-assign]
        PATCHED["endpoints"] = len(moves)
    scope_text = config.get("scope")
    if scope_text:
        region = config.get("region")
        provider = auth.KeystoneAuthProvider
        original = provider._decorate_request
        if not getattr(original, "_scoperouter_peer", False):

            def _decorate_request(
                self: Any,
                filters: Any,
                method: Any,
                url: Any,
                headers: Any = None,
                body: Any = None,
                auth_data: Any = None,
            ) -> Any:
                data = auth_data if auth_data is not None else self.get_auth()
                new_url, new_headers, new_body = original(
                    self, filters, method, url, headers, body, auth_data=data
                )
                access = data[1] if isinstance(data, tuple | list) and len(data) > 1 else None
                return new_url, scoped_headers(new_headers, access, scope_text, region), new_body

            _decorate_request._scoperouter_peer = True  # type: ignore[attr-defined]
            provider._decorate_request = _decorate_request  # type: ignore[method-assign]
        PATCHED["scope"] = scope_text
