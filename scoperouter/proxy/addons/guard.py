"""HeadGuard: limits on what a client sends before its request reaches the router.

The limits (``settings.limits`` of the federation config) are enforced by
:class:`scoperouter.proxy.mitm.GuardedHttp1Server` while the request head is read: too many or
too large header fields (431), a request line too long (414), a head not complete in time
(408), control characters, obs-fold and framing errors (400), idle keep-alive connections
(closed). This addon keeps those limits in step with the config (a reload applies to new
heads) and hands each refusal to its sinks (the access log and the metrics), so every request
the router answers is logged and counted once, including those no hook ever sees.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from scoperouter.catalog import Catalog
from scoperouter.proxy import mitm
from scoperouter.proxy.addons.config import RouterConfig
from scoperouter.proxy.flowstate import HeadRefusal


class RefusalSink(Protocol):
    def refused(self, refusal: HeadRefusal) -> None: ...


class HeadGuard:
    def __init__(self, config: RouterConfig, sinks: Iterable[RefusalSink] = ()) -> None:
        self.sinks = tuple(sinks)
        config.subscribe(self._apply)

    @staticmethod
    def _apply(catalog: Catalog) -> None:
        mitm.set_head_limits(catalog.settings.limits)

    def running(self) -> None:
        mitm.set_refusal_handler(self.refused)

    def done(self) -> None:
        mitm.set_refusal_handler(None)

    def refused(self, refusal: HeadRefusal) -> None:
        for sink in self.sinks:
            sink.refused(refusal)
