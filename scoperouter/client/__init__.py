"""Send scoped requests from any keystoneauth1 Session or openstacksdk Connection.

keystoneauth asks the session's auth plugin for the headers of every authenticated request
(``auth.get_headers(session)``). :class:`ScopedAuth` wraps any auth plugin and appends the scope
to the token it returns (``X-Auth-Token: <token>!SCOPE!<json>``) and adds ``X-Scope``. The token
is what carries the scope through the workflow: every OpenStack service forwards the user's
token on the calls it makes for the user. Requests that obtain the token (keystone
``POST /v3/auth/tokens``) are unauthenticated and go to the user's own cloud, as they should.

keystoneauth session::

    from keystoneauth1 import session, loading
    from scoperouter.client import ScopedAuth
    from scoperouter.scope import Scope

    auth = loading.get_plugin_loader("password").load_from_options(...)
    sess = session.Session(auth=ScopedAuth(auth, Scope.parse('{"image": "CloudTwo"}')))

openstacksdk::

    import openstack
    from scoperouter.client import scope_session

    conn = openstack.connect(cloud="cloudone")
    scope_session(conn.session, '{"image": "CloudTwo"}')
    print([image.id for image in conn.image.images()])     # CloudTwo's images

This module imports neither keystoneauth1 (it only calls the plugin API) nor mitmproxy, so it can
live in any environment that has the ``openstack`` CLI.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from scoperouter.scope import (
    Cloud,
    Expr,
    Scope,
    ScopeError,
    format_expression,
    join_token,
    parse_expression,
)

SCOPE_ENV = "OS_SCOPE"
SCOPE_ENV_PREFIX = "OS_SCOPE_"


def env_name(service_type: str) -> str:
    """``object-store`` -> ``OS_SCOPE_OBJECT_STORE``."""
    return SCOPE_ENV_PREFIX + service_type.upper().replace("-", "_")


def scope_from_sources(
    text: str | None,
    environ: Mapping[str, str] | None = None,
) -> Scope:
    """The user's scope: the JSON text (``--os-scope`` or ``$OS_SCOPE``) first, then
    ``$OS_SCOPE_<SERVICE>`` variables for the services it does not name.

    Raises ScopeError with a one-line message naming the source that is wrong.
    """
    environ = os.environ if environ is None else environ
    entries: dict[str, Expr] = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(SCOPE_ENV_PREFIX) or not value:
            continue
        service_type = name[len(SCOPE_ENV_PREFIX) :].lower().replace("_", "-")
        try:
            entries[service_type] = parse_expression(value)
        except ScopeError as exc:
            raise ScopeError(f"${name}: {exc.message}") from None
    if text:
        scope = Scope.parse(text)
        entries.update(scope)
    return Scope.of(entries)


class ScopedAuth:
    """A keystoneauth1 auth plugin wrapper that puts a scope on every authenticated request.

    Everything but ``get_headers`` is delegated to the wrapped plugin, so sessions, adapters,
    openstacksdk and version discovery behave exactly as with the plugin alone.

    `default_cloud` fills the services the scope does not name, for every service type of the
    user's catalog (the prototype's behaviour: "local" is made explicit by the client). Without
    it the first router completes the scope with its own cloud, which means the same thing.
    """

    def __init__(self, auth: Any, scope: Scope, default_cloud: str | None = None) -> None:
        identity = scope.get("identity")
        if default_cloud is not None and identity is not None and identity != Cloud(default_cloud):
            # The token comes from the cloud the user authenticates with; keystone anywhere else
            # would answer an opaque 401 for every request. Say so before sending anything.
            raise ScopeError(
                f"identity is {format_expression(identity)!r} but your credentials are for "
                f"{default_cloud!r}: your token is valid there only; leave identity out"
            )
        self._auth = auth
        self._scope = scope
        self._default_cloud = default_cloud
        self._complete: Scope | None = None

    @property
    def wrapped(self) -> Any:
        return self._auth

    def scope_for(self, service_types: Iterable[str]) -> Scope:
        if self._default_cloud is None:
            return self._scope
        return self._scope.complete(service_types, self._default_cloud)

    def _effective_scope(self, session: Any) -> Scope:
        if self._complete is None:
            service_types: Iterable[str] = ()
            # Plugins without a catalog (keystoneauth's token_endpoint.Token, admin_token)
            # have no get_access: only the services the scope names are set, the first
            # router completes the rest with its cloud (the same meaning).
            get_access = getattr(self._auth, "get_access", None)
            if self._default_cloud is not None and get_access is not None:
                access = get_access(session)
                catalog = getattr(access, "service_catalog", None)
                service_types = (catalog.get_endpoints() if catalog else {}).keys()
            self._complete = self.scope_for(service_types)
        return self._complete

    def get_headers(self, session: Any, **kwargs: Any) -> dict[str, str] | None:
        headers = self._auth.get_headers(session, **kwargs)
        if not headers or "X-Auth-Token" not in headers:
            return headers
        scope = self._effective_scope(session)
        if not len(scope):
            return headers
        return {
            **headers,
            "X-Auth-Token": join_token(headers["X-Auth-Token"], scope),
            "X-Scope": scope.to_json(),
        }

    def invalidate(self) -> bool:
        self._complete = None
        return bool(self._auth.invalidate())

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: delegate the whole plugin API.
        return getattr(self._auth, name)


def scope_session(session: Any, scope: Scope | str, default_cloud: str | None = None) -> Any:
    """Make every authenticated request of `session` carry `scope`; returns the session.

    Works on a keystoneauth1 Session and on ``openstack.connection.Connection.session``.
    Calling it again replaces the scope.
    """
    if isinstance(scope, str):
        scope = Scope.parse(scope)
    auth = session.auth
    if isinstance(auth, ScopedAuth):
        auth = auth.wrapped
    session.auth = ScopedAuth(auth, scope, default_cloud)
    return session


__all__ = [
    "SCOPE_ENV",
    "ScopedAuth",
    "env_name",
    "scope_from_sources",
    "scope_session",
]
