"""Chain: the router's addons as one mitmproxy addon that calls only the hooks they have.

mitmproxy dispatches each event to every addon in its chain (``getattr`` through a generator,
a context manager and a coroutine per addon, about 3 us each, whether or not the addon has the
hook); with ten small addons that would be most of a request's cost. The chain keeps, per hook,
the list of its addons that implement it, and calls them in order. A hook that returns an
awaitable is awaited before the next addon's runs, exactly as mitmproxy does, and only then is
the chain's own hook asynchronous. The addons stay plain mitmproxy addons (tests drive each one
with mitmproxy's ``taddons``/``tflow``); the chain changes how they are called, not what.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

HOOKS = (
    "load",
    "configure",
    "running",
    "done",
    "client_connected",
    "client_disconnected",
    "server_connect",
    "requestheaders",
    "request",
    "responseheaders",
    "response",
    "error",
    "http_connect",
)

Hook = Callable[..., Any]


class Chain:
    name = "scoperouter"

    def __init__(self, addons: Sequence[Any]) -> None:
        # Not called `addons`: mitmproxy would find them there and call every hook twice.
        self.members = tuple(addons)
        self._hooks: dict[str, tuple[Hook, ...]] = {
            name: tuple(getattr(a, name) for a in self.members if callable(getattr(a, name, None)))
            for name in HOOKS
        }

    def get(self, kind: type[Any]) -> Any:
        """The addon of this type (for the engine: reload, draining)."""
        for addon in self.members:
            if isinstance(addon, kind):
                return addon
        raise LookupError(kind.__name__)

    def _call(self, name: str, *args: Any) -> Awaitable[None] | None:
        hooks = self._hooks[name]
        for index, hook in enumerate(hooks):
            result = hook(*args)
            if result is not None and inspect.isawaitable(result):
                return _finish(result, hooks[index + 1 :], args)
        return None

    def load(self, loader: Any) -> None:
        self._call("load", loader)

    def configure(self, updated: set[str]) -> None:
        self._call("configure", updated)

    def running(self) -> Awaitable[None] | None:
        return self._call("running")

    def done(self) -> Awaitable[None] | None:
        return self._call("done")

    def client_connected(self, client: Any) -> Awaitable[None] | None:
        return self._call("client_connected", client)

    def client_disconnected(self, client: Any) -> Awaitable[None] | None:
        return self._call("client_disconnected", client)

    def server_connect(self, data: Any) -> Awaitable[None] | None:
        return self._call("server_connect", data)

    def requestheaders(self, flow: Any) -> Awaitable[None] | None:
        return self._call("requestheaders", flow)

    def request(self, flow: Any) -> Awaitable[None] | None:
        return self._call("request", flow)

    def responseheaders(self, flow: Any) -> Awaitable[None] | None:
        return self._call("responseheaders", flow)

    def response(self, flow: Any) -> Awaitable[None] | None:
        return self._call("response", flow)

    def error(self, flow: Any) -> Awaitable[None] | None:
        return self._call("error", flow)

    def http_connect(self, flow: Any) -> Awaitable[None] | None:
        return self._call("http_connect", flow)


async def _finish(pending: Awaitable[Any], rest: Sequence[Hook], args: tuple[Any, ...]) -> None:
    await pending
    for hook in rest:
        result = hook(*args)
        if result is not None and inspect.isawaitable(result):
            await result
