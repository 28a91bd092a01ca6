"""Send scoped requests from any keystoneauth1 Session or openstacksdk Connection.

keystoneauth asks the session's auth plugin for the headers of every authenticated request
(``auth.get_headers(session)``). A *scoped* plugin appends the scope to the token it returns
(``X-Auth-Token: <token>!SCOPE!<json>``) and adds ``X-Scope``. The token is what carries the
scope through the workflow: every OpenStack service forwards the user's token on the calls it
makes for the user. Requests that obtain the token (keystone ``POST /v3/auth/tokens``) are
unauthenticated and go to the user's own cloud, as they should.

Why a scoped plugin is a *subclass instance* of the plugin it scopes, not a wrapper around it:
openstacksdk and osc-lib decide what a plugin can do with ``isinstance`` (``current_user_id``,
``service_catalog``, application credentials, ``connect_as``), and code assigns attributes
such as ``auth_ref`` on the plugin. :func:`scope_auth` therefore returns a shallow copy of the
plugin whose class is ``Scoped<PluginClass>`` (the :class:`ScopedAuth` mixin first, the
plugin's own class second): every check passes, every attribute lives in one object, token
caching and re-authentication are the plugin's own.

keystoneauth session::

    from keystoneauth1 import session, loading
    from scoperouter.client import scope_auth

    auth = loading.get_plugin_loader("password").load_from_options(...)
    sess = session.Session(auth=scope_auth(auth, '{"image": "CloudTwo"}'))

openstacksdk::

    import openstack
    from scoperouter.client import scope_session

    conn = openstack.connect(cloud="cloudone")
    scope_session(conn.session, '{"image": "CloudTwo"}')
    print([image.id for image in conn.image.images()])     # CloudTwo's images

or with no code at all, for every connection to a cloud (clouds.yaml)::

    clouds:
      cloudone:
        auth: {...}
        region_name: CloudOne
        scope: {image: CloudTwo}
        vendor_hook: scoperouter.client:connection_hook

This module imports neither keystoneauth1 (it only calls the plugin API) nor mitmproxy, so it can
live in any environment that has the ``openstack`` CLI.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from scoperouter.scope import (
    CloudName,
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
    """Mixin of every scoped plugin class: ``isinstance(auth, ScopedAuth)`` tells a scoped
    plugin. Build one with :func:`scope_auth`; the classes are made on demand, one per plugin
    class (``ScopedPassword`` for keystoneauth's ``v3.Password``...).

    `scoperouter_default_cloud` fills the services the scope does not name, for every service
    type of the user's catalog (the prototype's behaviour: "local" is made explicit by the
    client).
    Without it the first router completes the scope with its own cloud, which means the same
    thing. Service types the federation does not route are carried by the routers, not used,
    so a catalog listing an extra service (an operator adding one) breaks nothing.
    """

    # Set by scope_auth on each instance (the copy is made without calling __init__).
    scoperouter_scope: Scope
    scoperouter_default_cloud: str | None
    # (the access info the completion was computed from, the completed scope)
    _scoperouter_completed: tuple[Any, Scope] | None

    def scoperouter_scope_for(self, service_types: Iterable[str]) -> Scope:
        """The scope sent when the user's catalog lists `service_types`."""
        if self.scoperouter_default_cloud is None:
            return self.scoperouter_scope
        return self.scoperouter_scope.complete(service_types, self.scoperouter_default_cloud)

    def _effective_scope(self) -> Scope:
        """The scope for the token just obtained. Identity plugins keep the access info of
        their current token in ``auth_ref`` (set by the get_headers call that precedes this);
        reading it, rather than calling get_access again, completes the scope from the very
        token being sent and never authenticates twice. Plugins without a catalog
        (keystoneauth's token_endpoint.Token, admin_token) send the scope as given: the first
        router completes the rest with its cloud (the same meaning)."""
        access = getattr(self, "auth_ref", None)
        if self.scoperouter_default_cloud is None or access is None:
            return self.scoperouter_scope
        cached = self._scoperouter_completed
        # Recomputed for each new token (re-authentication, expiry): its catalog may differ.
        if cached is None or cached[0] is not access:
            catalog = getattr(access, "service_catalog", None)
            types = (catalog.get_endpoints() if catalog else {}).keys()
            cached = self._scoperouter_completed = (access, self.scoperouter_scope_for(types))
        return cached[1]

    def get_headers(self, session: Any, **kwargs: Any) -> dict[str, str] | None:
        headers: dict[str, str] | None = super().get_headers(session, **kwargs)  # type: ignore[misc]
        if not headers or "X-Auth-Token" not in headers:
            return headers
        scope = self._effective_scope()
        if not len(scope):
            return headers
        return {
            **headers,
            "X-Auth-Token": join_token(headers["X-Auth-Token"], scope),
            "X-Scope": scope.to_json(),
        }

    def invalidate(self) -> bool:
        self._scoperouter_completed = None
        return bool(super().invalidate())  # type: ignore[misc]

    def scoperouter_unscoped(self) -> Any:
        """A copy of this plugin without the scope (its plain class)."""
        # Not copy.copy: that goes through __reduce_ex__ below, which calls this.
        base: Any = type(self).__scoped_base__  # type: ignore[attr-defined]
        plain = base.__new__(base)
        plain.__dict__.update(
            (k, v) for k, v in self.__dict__.items() if k not in _SCOPED_ATTRIBUTES
        )
        return plain

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Scoped<X> classes are made at run time and cannot be found by name: copy and pickle
        # the plain plugin and the scope, and scope it again.
        return (
            scope_auth,
            (
                self.scoperouter_unscoped(),
                self.scoperouter_scope.to_json(),
                self.scoperouter_default_cloud,
            ),
        )


_SCOPED_ATTRIBUTES = frozenset(
    {"scoperouter_scope", "scoperouter_default_cloud", "_scoperouter_completed"}
)
_SCOPED_CLASSES: dict[type, type] = {}
_SCOPED_CLASSES_LOCK = threading.Lock()


def _scoped_class(plugin_class: type) -> type:
    scoped = _SCOPED_CLASSES.get(plugin_class)
    if scoped is None:
        with _SCOPED_CLASSES_LOCK:
            scoped = _SCOPED_CLASSES.get(plugin_class)
            if scoped is None:
                scoped = type(
                    f"Scoped{plugin_class.__name__}",
                    (ScopedAuth, plugin_class),
                    {"__scoped_base__": plugin_class, "__module__": __name__},
                )
                _SCOPED_CLASSES[plugin_class] = scoped
    return scoped


def scope_auth(auth: Any, scope: Scope | str, default_cloud: str | None = None) -> Any:
    """A scoped copy of the keystoneauth plugin `auth` (a scoped one is re-scoped).

    The copy shares the plugin's current token, so no new authentication is needed, and is an
    instance of the plugin's own class. Raises ScopeError for a bad scope, or when the scope
    sends identity elsewhere than the cloud of the credentials (`default_cloud`).
    """
    if isinstance(scope, str):
        scope = Scope.parse(scope)
    identity = scope.get("identity")
    if default_cloud is not None and identity is not None and identity != CloudName(default_cloud):
        # The token comes from the cloud the user authenticates with; keystone anywhere else
        # would answer an opaque 401 for every request. Say so before sending anything.
        raise ScopeError(
            f"identity is {format_expression(identity)!r} but your credentials are for "
            f"{default_cloud!r}: your token is valid there only; leave identity out"
        )
    plain = auth.scoperouter_unscoped() if isinstance(auth, ScopedAuth) else auth
    scoped = copy.copy(plain)
    try:
        scoped.__class__ = _scoped_class(type(plain))
    except TypeError as exc:  # e.g. a plugin class with __slots__
        raise TypeError(f"cannot scope a {type(plain).__name__} plugin: {exc}") from None
    scoped.scoperouter_scope = scope
    scoped.scoperouter_default_cloud = default_cloud
    scoped._scoperouter_completed = None
    return scoped


def scope_session(session: Any, scope: Scope | str, default_cloud: str | None = None) -> Any:
    """Make every authenticated request of `session` carry `scope`; returns the session.

    Works on a keystoneauth1 Session and on ``openstack.connection.Connection.session``.
    Calling it again replaces the scope (the same scope again changes nothing).
    """
    if isinstance(scope, str):
        scope = Scope.parse(scope)
    auth = session.auth
    if (
        isinstance(auth, ScopedAuth)
        and auth.scoperouter_scope == scope
        and auth.scoperouter_default_cloud == default_cloud
    ):
        return session
    session.auth = scope_auth(auth, scope, default_cloud)
    return session


def config_scope_text(config: Mapping[str, Any]) -> str | None:
    """The ``scope`` of a cloud's configuration (clouds.yaml entry, or ``--os-scope`` as
    loaded by openstack.config) as JSON text: a mapping, a JSON string, or an object holding
    the text in ``.text`` (the OSC option, see :mod:`scoperouter.client.osc`)."""
    value = config.get("scope")
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    text = getattr(value, "text", value)
    return text if isinstance(text, str) else json.dumps(text)


def connection_hook(conn: Any) -> None:
    """openstacksdk ``vendor_hook``: scope every connection to a cloud from its configuration.

    In clouds.yaml: ``vendor_hook: scoperouter.client:connection_hook`` beside ``scope:`` (and
    ``$OS_SCOPE`` / ``$OS_SCOPE_<SERVICE>`` as for the CLI); services the scope does not name
    are the cloud's ``region_name``. A connection made from another (``connect_as``,
    ``connect_as_project``) is scoped the same way. A bad scope stops the connection before any
    request is sent (openstacksdk's ConfigException).
    """
    config = conn.config
    region = config.get_region_name() or None
    try:
        scope = scope_from_sources(config_scope_text(config.config))
        if len(scope):
            scope_session(conn.session, scope, default_cloud=region)
    except ScopeError as exc:
        # openstacksdk turns a ValueError raised by a hook into a warning about the hook's
        # name and goes on unscoped; a configuration error must stop the connection.
        from openstack.exceptions import ConfigException

        raise ConfigException(f"invalid scope for cloud {config.name!r}: {exc.message}") from None


__all__ = [
    "SCOPE_ENV",
    "ScopedAuth",
    "config_scope_text",
    "connection_hook",
    "env_name",
    "scope_auth",
    "scope_from_sources",
    "scope_session",
]
