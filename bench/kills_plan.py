"""``bench.kills``'s plan: the operations and the kill points, drawn from ``--seed``."""

from __future__ import annotations

import random
from typing import Any

from bench.kills_verdict import PlatformView

KINDS = ("provision", "update", "bind", "unbind", "deprovision")
REQUEST_SHARE = 0.15  # kills aimed at the request itself (within its first 50 ms)
# PostgreSQL: kills that take every replica at once (a restarted one must then finish the
# operation; otherwise the other replica, up all along, takes it as soon as the lease expires)
EVERY_REPLICA_SHARE = 0.3


class Planner:
    """The operations and kill points, drawn from one seeded generator in a fixed order."""

    def __init__(self, rng: random.Random, view: PlatformView) -> None:
        self.rng = rng
        self.view = view
        self.kept: set[str] = set()  # the set-up's instances and bindings: never deleted
        self.sizes: dict[str, int] = {}
        self.killed: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.params: dict[str, dict[str, Any]] = {}
        self.count = 0
        self.with_bindings = 0  # deprovisions of an instance with bindings left
        self.prelude: list[tuple[str, dict[str, Any]]] = []  # unkilled, before the next kill

    def new_id(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count:03d}"

    def provision_params(self, quick: bool = False) -> dict[str, Any]:
        r = self.rng
        if quick:  # one pass, no wait after the create; its updates still take a while
            return {"size": 1, "sleep": round(r.uniform(0.05, 0.4), 3)}
        return {
            "size": 1,
            "steps": r.randint(1, 3),
            "sleep": round(r.uniform(0.05, 0.4), 3),
            "sleep_after": round(r.uniform(0.0, 0.4), 3),
            "deprovision_sleep": round(r.uniform(0.1, 0.6), 3),
        }

    def bind_params(self, quick: bool = False) -> dict[str, Any]:
        r = self.rng
        if quick:
            return {}
        return {
            "sleep": round(r.uniform(0.05, 0.4), 3),
            "sleep_after": round(r.uniform(0.0, 0.4), 3),
            "unbind_sleep": round(r.uniform(0.1, 0.5), 3),
        }

    def next(self) -> tuple[str, dict[str, Any], float]:
        """The next killed operation: (kind, spec, how long it should take, seconds)."""
        r = self.rng
        provisioned = sorted(i for i in self.view.live_instances())
        deletable = [i for i in provisioned if i not in self.kept]
        bound = sorted(b for b in self.view.live_bindings() if b not in self.kept)
        possible = ["provision"]
        possible += ["update", "bind"] if provisioned else []
        possible += ["deprovision"] if deletable else []
        possible += ["unbind"] if bound else []
        least = min(self.killed[k] for k in possible)
        kind = r.choice([k for k in possible if self.killed[k] == least])
        self.killed[kind] += 1
        if kind == "provision":
            instance = self.new_id("i")
            params = self.provision_params()
            self.params[instance] = params
            self.sizes[instance] = 1
            window = params["steps"] * (params["sleep"] + 0.05) + params["sleep_after"]
            return kind, {"instance": instance, "parameters": params}, window
        if kind == "update":
            instance = r.choice(provisioned)
            size = self.sizes.get(instance, 1) + r.randint(1, 9)
            self.sizes[instance] = size
            sleep = float(self.params.get(instance, {}).get("sleep", 0.0))
            return kind, {"instance": instance, "parameters": {"size": size}}, sleep
        if kind == "bind":
            instance = r.choice(provisioned)
            binding = self.new_id("b")
            params = self.bind_params()
            self.params[binding] = params
            window = params["sleep"] + params["sleep_after"]
            return kind, {"instance": instance, "binding": binding, "parameters": params}, window
        if kind == "unbind":
            binding = r.choice(bound)
            instance = self.view.bindings[binding].instance_id
            window = float(self.params.get(binding, {}).get("unbind_sleep", 0.0))
            return kind, {"instance": instance, "binding": binding}, window
        instance = r.choice(deletable)
        # half the deprovisions are of an instance with a binding the platform did not unbind
        # (OSB allows it; the service must remove its credential with the instance): bound
        # first, without a kill, when it has none
        if r.random() < 0.5:
            self.with_bindings += 1
            bound_to = {v.instance_id for v in self.view.bindings.values() if v.exists}
            if instance not in bound_to:
                binding = self.new_id("b")
                spec = {"instance": instance, "binding": binding, "parameters": {}}
                self.prelude.append(("bind", spec))
        window = float(self.params.get(instance, {}).get("deprovision_sleep", 0.0))
        return kind, {"instance": instance}, window

    def kill_delay(self, window: float) -> tuple[float, float, bool]:
        """(seconds after the request is sent, a draw to pick a replica when nothing else
        does, whether every replica goes): a share of the kills within the request's first
        50 ms, the rest anywhere in the operation (and a little after)."""
        u, d, pick = self.rng.random(), self.rng.random(), self.rng.random()
        every = self.rng.random() < EVERY_REPLICA_SHARE
        if u < REQUEST_SHARE:
            return d * 0.05, pick, every
        return d * (window + 0.1), pick, every
