"""UpstreamHealth: a circuit breaker per upstream (another cloud's router, or a backend).

An upstream that refuses connections, does not connect or answer in time, or breaks its answer,
``breaker.failures`` times in a row, is marked *down* for ``breaker.down_for`` seconds: requests
for it are answered at once with 503 naming the cloud, instead of each waiting for the same
timeout (a frozen peer router would otherwise cost every request the full response timeout).
When the time is up, the next request is let through as a probe (the others keep failing fast
for another period); its answer marks the upstream up again, its failure keeps it down.
Faults of the client (it went away, it sent a malformed body) say nothing about the upstream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from scoperouter.errors import Reject
from scoperouter.router.config import RouterConfig
from scoperouter.router.targets import base_url
from scoperouter.routing import Forward

Kind = Literal["peer", "backend"]


@dataclass(slots=True)
class Upstream:
    """What the router knows about one upstream (scheme://host:port)."""

    address: str
    cloud: str
    kind: Kind
    service: str
    failures: int = 0  # consecutive
    down_until: float = 0.0  # time.monotonic(); 0: up
    reason: str = ""  # the last failure

    @property
    def name(self) -> str:
        if self.kind == "peer":
            return f"the router of {self.cloud} ({self.address})"
        return f"the {self.service} service of {self.cloud}"  # backend addresses stay private


Listener = Callable[[Upstream, bool], None]


class UpstreamHealth:
    def __init__(self, config: RouterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.upstreams: dict[str, Upstream] = {}
        self._listeners: list[Listener] = []

    def on_change(self, listener: Listener) -> None:
        """Call `listener(upstream, up)` whenever an upstream goes down or comes back."""
        self._listeners.append(listener)

    def _upstream(self, decision: Forward) -> Upstream:
        address = base_url(decision.url)
        upstream = self.upstreams.get(address)
        if upstream is None:
            kind: Kind = "peer" if decision.remote else "backend"
            upstream = Upstream(address, decision.cloud, kind, decision.service_type)
            self.upstreams[address] = upstream
        return upstream

    def admit(self, decision: Forward) -> Reject | None:
        """None if a request may go to the decision's upstream now, else the fast refusal."""
        if not self.upstreams:  # none ever failed (the common case: no URL to take apart)
            return None
        upstream = self.upstreams.get(base_url(decision.url))
        if upstream is None or not upstream.down_until:
            return None
        now = self.clock()
        if now >= upstream.down_until:
            # This request probes it; the others keep failing fast meanwhile.
            upstream.down_until = now + self.config.current().settings.breaker.down_for
            return None
        return Reject(
            503,
            f"{upstream.name} is marked down ({upstream.reason}); requests for it fail "
            f"fast for {upstream.down_until - now:.1f}s more, then one is let through "
            "to probe it",
        )

    def succeeded(self, decision: Forward) -> None:
        """The upstream answered (response headers came back)."""
        if not self.upstreams:
            return
        upstream = self.upstreams.get(base_url(decision.url))
        if upstream is not None and (upstream.failures or upstream.down_until):
            was_down = bool(upstream.down_until)
            upstream.failures, upstream.down_until, upstream.reason = 0, 0.0, ""
            if was_down:
                self._changed(upstream, True)

    def failed(self, decision: Forward, timed_out: str | None, error: str) -> None:
        """The upstream failed (not the client: callers leave the client's faults out, and
        a routing loop, the config's fault)."""
        upstream = self._upstream(decision)
        upstream.failures += 1
        upstream.reason = failure_reason(timed_out, error)
        breaker = self.config.current().settings.breaker
        if upstream.failures >= breaker.failures:
            was_up = not upstream.down_until
            upstream.down_until = self.clock() + breaker.down_for
            if was_up:
                self._changed(upstream, False)

    def _changed(self, upstream: Upstream, up: bool) -> None:
        for listener in self._listeners:
            listener(upstream, up)

    def down(self) -> list[Upstream]:
        return [u for u in self.upstreams.values() if u.down_until]


def failure_reason(timed_out: str | None, error: str) -> str:
    if timed_out == "connect":
        return "it did not accept a connection in time"
    if timed_out == "response":
        return "it did not answer in time"
    if "Connect call failed" in error or "refused" in error.lower():
        return "it refused the connection"
    return "its answer failed"
