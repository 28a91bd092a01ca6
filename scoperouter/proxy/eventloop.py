"""The event loop of a router worker: uvloop (``settings.event_loop``, the default) or asyncio's.

uvloop (libuv's loop) runs the same asyncio code with less CPU per request. It is one of the
``router`` extra's requirements, but a router runs without it: the supervisor picks the loop
once (:func:`choose`), saying why in one warning when uvloop cannot be imported, and passes
its pick to every worker, which runs on it (:func:`run`) and names the loop it runs in its
start-up line (:func:`running`). The supervisor itself stays on asyncio's loop (child
processes and signals; no request goes through it). uvloop is imported here only, and only
when it is picked: a router without it imports every module it needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from scoperouter.catalog import EventLoop

T = TypeVar("T")


def choose(wanted: EventLoop) -> tuple[EventLoop, str | None]:
    """The loop to run for `wanted` (a ``settings.event_loop`` value), and why it is not that
    one (None when it is)."""
    if wanted != "uvloop":
        return wanted, None
    try:
        import uvloop  # noqa: F401
    except ImportError as exc:
        return "asyncio", (
            f"settings.event_loop is uvloop, but uvloop cannot be imported ({exc}): the workers "
            "run on asyncio's event loop (install scoperouter[router], or set "
            "settings.event_loop: asyncio)"
        )
    return "uvloop", None


def run(main: Coroutine[Any, Any, T], loop: EventLoop) -> T:
    """Run `main` to its end on a new event loop of the kind `loop` (as :func:`asyncio.run`)."""
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running() -> EventLoop:
    """Which kind of loop runs the caller."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"
