"""``openstack --os-scope JSON``: the python-openstackclient plugin.

Installed through OSC's plugin entry point (``openstack.cli.extension: scope``). It adds the
global option ``--os-scope`` (default ``$OS_SCOPE``; per-service ``$OS_SCOPE_<SERVICE>`` fill the
services it does not name; a ``scope:`` mapping in a clouds.yaml cloud entry works too, e.g.
``scope: {image: CloudTwo}``).

How the scope reaches the requests: OSC builds its keystoneauth session in
``osc_lib.clientmanager.ClientManager.setup_auth`` and offers plugins no hook after that. So this
module wraps that one method (:func:`install`), once, at plugin load: after the original has
built the session, its auth plugin is replaced by a scoped copy
(:func:`scoperouter.client.scope_auth`). The scope is validated there, before any request is
sent; a bad scope stops the command with one line saying what is wrong. Nothing else is
patched; ``requests`` is untouched.

Defaults: services the scope does not name are filled with the cloud's region name
(``--os-region-name`` / clouds.yaml ``region_name``), as the OpenStackoid prototype did; the lab
names each cloud after its region. Without a region, the first router fills them with its own
cloud, which means the same thing.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from scoperouter.client import (
    SCOPE_ENV,
    ScopedAuth,
    config_scope_text,
    scope_from_sources,
    scope_session,
)
from scoperouter.scope import ScopeError

LOG = logging.getLogger(__name__)

# OSC plugin module interface (see openstackclient.common.clientmanager.get_plugin_modules).
API_NAME = "scope"
API_VERSION_OPTION = "os_scope_api_version"
DEFAULT_API_VERSION = "1"
API_VERSIONS = ("1",)


def make_client(instance: Any) -> Any:
    """OSC asks every plugin for a client; ours is the scoped auth of the session (or None)."""
    auth = getattr(instance.session, "auth", None)
    return auth if isinstance(auth, ScopedAuth) else None


class ScopeOption:
    """The raw ``--os-scope`` text. Deliberately not a ``str``: openstack.config expands every
    string option with ``str.format(**config)``, which the braces of a JSON scope break. It is
    validated in :func:`_wrap_session`, so a bad scope gets our one-line error, not argparse's."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"ScopeOption({self.text!r})"


def build_option_parser(parser: Any) -> Any:
    parser.add_argument(
        "--os-scope",
        metavar="<scope>",
        type=ScopeOption,
        default=os.environ.get(SCOPE_ENV),
        help='Scope for every request, e.g. \'{"image": "CloudTwo"}\': which cloud of the '
        "federation serves each service type. A value may name several clouds: "
        '"A & B" uses every one (reads: lists merged, one resource by id from the cloud '
        'that has it), "A | B" the first that works; '
        "& binds tighter than |, parentheses group (env: OS_SCOPE; per service: "
        "OS_SCOPE_IMAGE=...). Services it does not name are served by the cloud of "
        "--os-region-name; identity must stay the credentials' cloud.",
    )
    return parser


def _wrap_session(manager: Any) -> None:
    """Put the user's scope on the manager's session (idempotent)."""
    session = getattr(manager, "session", None)
    if session is None or isinstance(session.auth, ScopedAuth):
        return
    # --os-scope / $OS_SCOPE, else a ``scope:`` mapping in the cloud's clouds.yaml entry.
    text = config_scope_text(getattr(manager._cli_options, "config", {}) or {})
    region = getattr(manager._cli_options, "region_name", None) or None
    try:
        scope = scope_from_sources(text)
        if not len(scope):
            return
        scope_session(session, scope, default_cloud=region)
    except ScopeError as exc:
        from osc_lib import exceptions

        raise exceptions.CommandError(f"invalid --os-scope: {exc.message}") from None
    manager.auth = session.auth
    LOG.debug("scope for this command: %s (defaults: %s)", scope.to_json(), region)


def install() -> bool:
    """Wrap osc-lib's ClientManager.setup_auth once; returns False if osc-lib is absent."""
    try:
        from osc_lib import clientmanager
    except ImportError:
        return False
    original = clientmanager.ClientManager.setup_auth
    if getattr(original, "_scoperouter", False):
        return True

    @functools.wraps(original)
    def setup_auth(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _wrap_session(self)
        return result

    setup_auth._scoperouter = True  # type: ignore[attr-defined]
    clientmanager.ClientManager.setup_auth = setup_auth  # type: ignore[method-assign]
    return True


install()
