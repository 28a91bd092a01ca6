"""RouterConfig: the federation config and the cloud this router serves.

:meth:`RouterConfig.load` reads and validates the file (an unusable config is a
:class:`~scoperouter.errors.ConfigError`: the router does not start). :meth:`RouterConfig.reload`
re-reads it on SIGHUP: a bad file is refused and the current config keeps routing. The catalog
is one immutable object swapped whole, so a request sees the old or the new config, never a mix;
parts that derive state from it subscribe to each change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from scoperouter.catalog import Catalog
from scoperouter.config import load_catalog
from scoperouter.errors import ConfigError
from scoperouter.router.listeners import Listener, listener_signature, listeners_for

logger = logging.getLogger("scoperouter")

Subscriber = Callable[[Catalog], None]


class RouterConfig:
    """`source` names the config in messages and `base_dir` resolves its relative paths, when
    the file read is a copy (a worker reads the one its supervisor checked)."""

    def __init__(self, source: str | None = None, base_dir: Path | None = None) -> None:
        self.source = source
        self.base_dir = base_dir
        self.catalog: Catalog | None = None
        self.cloud = ""
        self.path = ""
        self.listeners: tuple[Listener, ...] = ()
        # Where this router answers: routing never sends a request there (it would loop).
        self.own_addresses: frozenset[tuple[str, int]] = frozenset()
        self._subscribers: list[Subscriber] = []

    def load(self, path: str, cloud: str) -> None:
        """Load `path` for `cloud` (ConfigError when it cannot be used)."""
        catalog = self._load(path)
        if cloud not in catalog.clouds:
            raise ConfigError(
                self.source or path,
                f"cloud {cloud!r} is not defined (clouds: {', '.join(sorted(catalog.clouds))})",
            )
        self.path, self.cloud = path, cloud
        self._install(catalog, listeners_for(catalog, cloud))

    def _load(self, path: str) -> Catalog:
        return load_catalog(path, source=self.source, base_dir=self.base_dir)

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call `subscriber(catalog)` now (if a config is loaded) and on every change."""
        self._subscribers.append(subscriber)
        if self.catalog is not None:
            subscriber(self.catalog)

    def current(self) -> Catalog:
        """The current catalog (a router only handles requests once one is loaded)."""
        assert self.catalog is not None, "no federation config loaded"
        return self.catalog

    def _install(self, catalog: Catalog, listeners: tuple[Listener, ...]) -> None:
        self.listeners = listeners
        own = set(catalog.clouds[self.cloud].listen_addresses())
        own |= {(item.host, item.port) for item in listeners}
        own |= {(f.url.host, f.url.port) for f in (i.frontend for i in listeners) if f is not None}
        self.own_addresses = frozenset(own)
        for subscriber in self._subscribers:
            subscriber(catalog)
        self.catalog = catalog  # one assignment: requests see the old or the new catalog

    def reload(self) -> bool:
        """Re-read the config file; on any problem keep the current catalog (logged). True if
        swapped."""
        catalog = self.read()
        return catalog is not None and self.apply(catalog)

    def read(self) -> Catalog | None:
        """The config file's catalog, read and checked (None when refused, logged): the part of
        a reload that touches nothing in use, which a worker runs in a thread."""
        try:
            catalog = self._load(self.path)
            if self.cloud not in catalog.clouds:
                raise ConfigError(self.path, f"cloud {self.cloud!r} is no longer defined")
        except ConfigError as exc:
            logger.error("reload refused, keeping the current config: %s", exc)
            return None
        return catalog

    def apply(self, catalog: Catalog) -> bool:
        """Swap in `catalog` (from :meth:`read`); True if swapped."""
        new = listeners_for(catalog, self.cloud)
        if listener_signature(new) != listener_signature(self.listeners):
            # The sockets cannot change in place (the supervisor refuses such a reload first).
            logger.error(
                "reload refused, keeping the current config: the listeners or certificates of "
                "%s changed; restart the router to apply it",
                self.cloud,
            )
            return False
        try:
            self._install(catalog, new)
        except Exception:  # a subscriber failed: the old config stays whole
            logger.exception("reload failed; the current config stays in use")
            return False
        logger.info("reloaded %s: %s", self.source or self.path, catalog.describe())
        return True
