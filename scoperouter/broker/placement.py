"""Where an instance goes: capacity snapshots + strategy + demand -> ordered candidate clouds.

Pure (no I/O): the server service reads each cloud's capacity through its router
(:meth:`~scoperouter.broker.clouds.FederationClouds.capacity`), finds the plan's flavor there,
counts what this broker already placed, and asks :func:`rank` for the clouds to try, best
first. It then tries them in that order: a cloud that refuses (no valid host, quota) is skipped
for the next one, so a ranking is a preference, not a promise.

Strategies (the ``where`` parameter of ``openstack-server``, parsed by :func:`parse_where`):

- ``{"cloud": "CloudOne"}``: that cloud only.
- ``{"scope": {"compute": "CloudOne", "image": "CloudTwo"}}``: the compute cloud only; the scope
  is what the broker's connection uses, so the other services go where it says.
- ``{"strategy": "most-free"}``: every cloud, the one with the largest fraction of the demanded
  resources left after placing the instance first. The fraction of a cloud is that of its
  scarcest demanded resource class (a cloud with plenty of VCPU but little memory left is only
  as free as its memory).
- ``{"strategy": "spread"}``: every cloud, the one holding the fewest instances of this broker
  first; ties go to the most free.

Whatever the strategy, a cloud whose capacity could not be read, which lacks what the instance
needs (the flavor), or whose free capacity is smaller than the demand is not a candidate; the
reason is kept (:attr:`Ranking.excluded`) so the operation's description can say why the
instance did not go there. Free capacity is a sum over a cloud's resource providers, checked
with what one allocation can take from a single provider (its inventory's ``max_unit``, capped
by that provider's free amount: :attr:`Capacity.largest`), class by class. So it is a necessary
condition, not a sufficient one: nova may still find no single host with every class at once,
which is a refusal the service handles by trying the next candidate. Remaining ties are broken
by the order of the clouds in the broker config, so a ranking is deterministic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scoperouter.broker.contract import Capacity
from scoperouter.scope import CloudName, Scope, ScopeError

VCPU = "VCPU"
MEMORY_MB = "MEMORY_MB"
DISK_GB = "DISK_GB"

STRATEGIES = ("most-free", "spread")


class PlacementError(ValueError):
    """A `where` parameter that cannot be used: `field` is its path (``where.scope.compute``),
    so the API can answer 400 naming it."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class Demand:
    """What one instance takes from a cloud, per placement resource class."""

    resources: Mapping[str, float]

    @classmethod
    def of_flavor(
        cls, *, vcpus: int, ram_mb: int, disk_gb: int, ephemeral_gb: int = 0, swap_mb: int = 0
    ) -> Demand:
        """A flavor's demand as nova asks placement for it: root + ephemeral disk + swap
        (rounded up to whole GB) in DISK_GB."""
        disk = disk_gb + ephemeral_gb + math.ceil(swap_mb / 1024)
        return cls({VCPU: float(vcpus), MEMORY_MB: float(ram_mb), DISK_GB: float(disk)})

    def positive(self) -> dict[str, float]:
        """The resource classes actually demanded (amount > 0)."""
        return {rc: amount for rc, amount in self.resources.items() if amount > 0}

    def __str__(self) -> str:
        return ", ".join(f"{_num(a)} {rc}" for rc, a in self.positive().items()) or "nothing"


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A cloud that cannot be a candidate whatever the strategy, and why (its capacity could not
    be read, it has no such flavor, ...)."""

    cloud: str
    reason: str


Snapshot = Capacity | Unavailable


@dataclass(frozen=True, slots=True)
class Explicit:
    """``{"cloud": NAME}``: one named cloud."""

    cloud: str


@dataclass(frozen=True, slots=True)
class Scoped:
    """``{"scope": {...}}``: the scope's compute cloud, reached with the scope."""

    scope: Scope

    @property
    def cloud(self) -> str:
        expr = self.scope["compute"]
        assert isinstance(expr, CloudName)  # parse_where guarantees it
        return expr.name


@dataclass(frozen=True, slots=True)
class MostFree:
    """``{"strategy": "most-free"}``."""


@dataclass(frozen=True, slots=True)
class Spread:
    """``{"strategy": "spread"}``."""


Strategy = Explicit | Scoped | MostFree | Spread


def parse_where(where: Mapping[str, Any] | None, clouds: tuple[str, ...]) -> Strategy:
    """The strategy a ``where`` parameter asks for; None means ``most-free``. Checks what the
    JSON schema cannot: cloud names against the federation (`clouds`), the scope's syntax, and
    that a scope names the compute cloud as one cloud (the broker has to know where to enter
    the federation; fan-out expressions cannot be placed). Raises PlacementError."""
    if where is None:
        return MostFree()
    keys = sorted(where)
    if len(keys) != 1 or keys[0] not in ("cloud", "scope", "strategy"):
        raise PlacementError(
            "where", 'expected exactly one of "cloud", "scope" or "strategy", got ' + repr(keys)
        )
    key = keys[0]
    value = where[key]
    if key == "cloud":
        if value not in clouds:
            raise PlacementError("where.cloud", _unknown_cloud(value, clouds))
        return Explicit(str(value))
    if key == "strategy":
        if value == "most-free":
            return MostFree()
        if value == "spread":
            return Spread()
        raise PlacementError("where.strategy", f"expected one of {list(STRATEGIES)}, got {value!r}")
    if not isinstance(value, Mapping):
        raise PlacementError("where.scope", 'expected an object like {"compute": "CloudOne"}')
    try:
        scope = Scope.parse(json.dumps(dict(value)))
    except ScopeError as exc:
        raise PlacementError("where.scope", exc.message) from None
    if "compute" not in scope:
        raise PlacementError(
            "where.scope", 'must name the compute cloud, e.g. {"compute": "CloudOne", ...}'
        )
    for service_type, expr in scope.items():
        if not isinstance(expr, CloudName):
            raise PlacementError(
                f"where.scope.{service_type}", "expected one cloud name (fan-out cannot be placed)"
            )
        if expr.name not in clouds:
            raise PlacementError(f"where.scope.{service_type}", _unknown_cloud(expr.name, clouds))
    return Scoped(scope)


# ---------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class Candidate:
    """A cloud to try. `scope`: the routing scope the strategy asks for (None: the service's
    own choice); `free_after`: fraction of the scarcest demanded resource left after placing;
    `placed`: instances of this broker already there."""

    cloud: str
    free_after: float
    placed: int
    scope: Scope | None = None


@dataclass(frozen=True, slots=True)
class Ranking:
    candidates: tuple[Candidate, ...]
    excluded: tuple[Unavailable, ...] = field(default=())

    def why_not(self) -> str:
        """One line: why the excluded clouds are not candidates ("" when none is)."""
        return "; ".join(f"{u.cloud}: {u.reason}" for u in self.excluded)


# ------------------------------------------------------------------------------- rank


def rank(
    snapshots: Mapping[str, Snapshot],
    strategy: Strategy,
    demand: Demand | Mapping[str, Demand],
    placed: Mapping[str, int] | None = None,
) -> Ranking:
    """Order the clouds of `snapshots` (config order: the last tie-breaker) for `strategy`.

    `demand` is one Demand, or one per cloud (a flavor of the same name may differ between
    clouds; a cloud missing from the mapping is excluded). `placed`: instances this broker
    already has in each cloud (``spread``; missing clouds count 0)."""
    placed = placed or {}
    order = {cloud: index for index, cloud in enumerate(snapshots)}
    if isinstance(strategy, Explicit | Scoped):
        named = strategy.cloud
        considered = [named]
        excluded = [] if named in snapshots else [Unavailable(named, "not a cloud of the broker")]
    else:
        considered = list(snapshots)
        excluded = []
    fitting: list[Candidate] = []
    for cloud in considered:
        snapshot = snapshots.get(cloud)
        if snapshot is None:
            continue
        if isinstance(snapshot, Unavailable):
            excluded.append(snapshot)
            continue
        wanted = demand if isinstance(demand, Demand) else demand.get(cloud)
        if wanted is None:
            excluded.append(Unavailable(cloud, "no demand known for it"))
            continue
        reason = too_small(snapshot, wanted)
        if reason is not None:
            excluded.append(Unavailable(cloud, reason))
            continue
        fitting.append(
            Candidate(
                cloud=cloud,
                free_after=free_after(snapshot, wanted),
                placed=max(0, int(placed.get(cloud, 0))),
                scope=strategy.scope if isinstance(strategy, Scoped) else None,
            )
        )
    if isinstance(strategy, Spread):
        fitting.sort(key=lambda c: (c.placed, -c.free_after, order[c.cloud]))
    else:
        fitting.sort(key=lambda c: (-c.free_after, order[c.cloud]))
    return Ranking(tuple(fitting), tuple(excluded))


def too_small(capacity: Capacity, demand: Demand) -> str | None:
    """Why `capacity` cannot take `demand` (the first resource class short), or None."""
    for rc, amount in demand.positive().items():
        total = capacity.total.get(rc, 0.0)
        if total <= 0:
            return f"has no {rc}"
        free = capacity.free.get(rc, 0.0)
        if free < amount:
            return f"too small: {_num(free)} {rc} free, {_num(amount)} needed"
        if capacity.largest is not None:
            one = capacity.largest.get(rc, 0.0)
            if one < amount:
                return (
                    f"no host can take {_num(amount)} {rc}: at most {_num(one)} in one "
                    "allocation (placement max_unit and free per host)"
                )
    return None


def free_after(capacity: Capacity, demand: Demand) -> float:
    """The fraction (0..1) of the scarcest demanded resource class left once `demand` is placed;
    with no positive demand, of the scarcest resource class the cloud has."""
    wanted = demand.positive()
    classes = wanted or {rc: 0.0 for rc in capacity.total}
    fractions = [
        (capacity.free.get(rc, 0.0) - amount) / capacity.total[rc]
        for rc, amount in classes.items()
        if capacity.total.get(rc, 0.0) > 0
    ]
    if not fractions:
        return 0.0
    return max(0.0, min(1.0, min(fractions)))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _unknown_cloud(name: object, clouds: tuple[str, ...]) -> str:
    return f"{name!r} is not a cloud of this broker (has: {', '.join(clouds)})"
