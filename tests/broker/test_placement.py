"""placement.py by example: strategies, exclusions and the reasons kept for descriptions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scoperouter.broker.contract import Capacity
from scoperouter.broker.placement import (
    Demand,
    Explicit,
    MostFree,
    PlacementError,
    Scoped,
    Spread,
    Unavailable,
    free_after,
    parse_where,
    rank,
    too_small,
)
from scoperouter.scope import Scope

CLOUDS = ("CloudOne", "CloudTwo", "CloudThree")
TINY = Demand.of_flavor(vcpus=1, ram_mb=64, disk_gb=1)


def cap(cloud: str, free: dict[str, float], total: dict[str, float] | None = None) -> Capacity:
    total = total or {"VCPU": 100.0, "MEMORY_MB": 1000.0, "DISK_GB": 100.0}
    return Capacity(cloud=cloud, total=total, free=free, read_at=datetime.now(UTC))


def full(cloud: str, fraction: float) -> Capacity:
    """A cloud with `fraction` of every resource class free."""
    return cap(
        cloud, {"VCPU": 100 * fraction, "MEMORY_MB": 1000 * fraction, "DISK_GB": 100 * fraction}
    )


# ------------------------------------------------------------------------------ demand


def test_flavor_demand_counts_ephemeral_and_swap_as_disk():
    demand = Demand.of_flavor(vcpus=2, ram_mb=2048, disk_gb=20, ephemeral_gb=5, swap_mb=1025)
    assert demand.resources == {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 27}
    assert str(demand) == "2 VCPU, 2048 MEMORY_MB, 27 DISK_GB"
    assert str(Demand.of_flavor(vcpus=1, ram_mb=64, disk_gb=0)) == "1 VCPU, 64 MEMORY_MB"


def test_too_small_names_the_first_short_resource():
    snapshot = cap("CloudOne", {"VCPU": 0.5, "MEMORY_MB": 10, "DISK_GB": 50})
    assert too_small(snapshot, TINY) == "too small: 0.50 VCPU free, 1 needed"
    no_disk = cap("CloudOne", {"VCPU": 5}, total={"VCPU": 5})
    assert too_small(no_disk, Demand.of_flavor(vcpus=1, ram_mb=0, disk_gb=0)) is None
    assert too_small(no_disk, TINY) == "has no MEMORY_MB"


def test_free_after_is_the_scarcest_demanded_class():
    snapshot = cap("CloudOne", {"VCPU": 90, "MEMORY_MB": 200, "DISK_GB": 100})
    demand = Demand.of_flavor(vcpus=10, ram_mb=100, disk_gb=0)
    # VCPU (90-10)/100 = 0.8, memory (200-100)/1000 = 0.1; disk not demanded
    assert free_after(snapshot, demand) == pytest.approx(0.1)
    # nothing demanded: the scarcest class the cloud has
    assert free_after(snapshot, Demand({})) == pytest.approx(0.2)


# ---------------------------------------------------------------------------- strategies


def test_most_free_orders_by_fraction_left_then_config_order():
    snapshots = {"CloudOne": full("CloudOne", 0.3), "CloudTwo": full("CloudTwo", 0.9),
                 "CloudThree": full("CloudThree", 0.3)}  # fmt: skip
    ranking = rank(snapshots, MostFree(), TINY)
    assert [c.cloud for c in ranking.candidates] == ["CloudTwo", "CloudOne", "CloudThree"]
    assert ranking.excluded == ()
    assert all(c.scope is None for c in ranking.candidates)


def test_most_free_uses_the_bottleneck_resource():
    # CloudOne has most VCPU free but hardly any memory: CloudTwo is the freer cloud
    one = cap("CloudOne", {"VCPU": 100, "MEMORY_MB": 100, "DISK_GB": 100})
    two = cap("CloudTwo", {"VCPU": 40, "MEMORY_MB": 500, "DISK_GB": 40})
    ranking = rank({"CloudOne": one, "CloudTwo": two}, MostFree(), TINY)
    assert [c.cloud for c in ranking.candidates] == ["CloudTwo", "CloudOne"]


def test_most_free_skips_a_cloud_whose_hosts_are_all_smaller_than_the_flavor():
    """CloudOne has the most free in total, spread over hosts whose max_unit (or free amount
    per host) is 4 VCPU: an 8-VCPU flavor cannot land there, so most-free must not pick it."""
    big = Demand.of_flavor(vcpus=8, ram_mb=100, disk_gb=1)
    many_small_hosts = Capacity(
        cloud="CloudOne",
        total={"VCPU": 100.0, "MEMORY_MB": 1000.0, "DISK_GB": 100.0},
        free={"VCPU": 90.0, "MEMORY_MB": 900.0, "DISK_GB": 90.0},
        largest={"VCPU": 4.0, "MEMORY_MB": 500.0, "DISK_GB": 90.0},
        read_at=datetime.now(UTC),
    )
    one_big_host = Capacity(
        cloud="CloudTwo",
        total={"VCPU": 100.0, "MEMORY_MB": 1000.0, "DISK_GB": 100.0},
        free={"VCPU": 30.0, "MEMORY_MB": 300.0, "DISK_GB": 30.0},
        largest={"VCPU": 30.0, "MEMORY_MB": 300.0, "DISK_GB": 30.0},
        read_at=datetime.now(UTC),
    )
    snapshots = {"CloudOne": many_small_hosts, "CloudTwo": one_big_host}
    ranking = rank(snapshots, MostFree(), big)
    assert [c.cloud for c in ranking.candidates] == ["CloudTwo"]
    assert ranking.why_not() == (
        "CloudOne: no host can take 8 VCPU: at most 4 in one allocation "
        "(placement max_unit and free per host)"
    )
    # a flavor within max_unit still goes to the freer cloud
    assert [c.cloud for c in rank(snapshots, MostFree(), TINY).candidates] == [
        "CloudOne",
        "CloudTwo",
    ]
    # an explicit cloud too small for one allocation is excluded with the same reason
    assert rank(snapshots, Explicit("CloudOne"), big).candidates == ()


def test_spread_prefers_fewest_placed_then_most_free():
    snapshots = {"CloudOne": full("CloudOne", 0.9), "CloudTwo": full("CloudTwo", 0.2),
                 "CloudThree": full("CloudThree", 0.5)}  # fmt: skip
    ranking = rank(snapshots, Spread(), TINY, placed={"CloudOne": 3, "CloudTwo": 1})
    assert [c.cloud for c in ranking.candidates] == ["CloudThree", "CloudTwo", "CloudOne"]
    assert [c.placed for c in ranking.candidates] == [0, 1, 3]
    tie = rank(snapshots, Spread(), TINY, placed={"CloudOne": 1, "CloudTwo": 1, "CloudThree": 1})
    assert [c.cloud for c in tie.candidates] == ["CloudOne", "CloudThree", "CloudTwo"]


def test_explicit_cloud_is_the_only_candidate_even_when_another_is_freer():
    snapshots = {"CloudOne": full("CloudOne", 0.1), "CloudTwo": full("CloudTwo", 0.9)}
    ranking = rank(snapshots, Explicit("CloudOne"), TINY)
    assert [c.cloud for c in ranking.candidates] == ["CloudOne"]
    assert ranking.excluded == ()


def test_scope_candidate_is_the_compute_cloud_and_carries_the_scope():
    scope = Scope.parse('{"compute": "CloudTwo", "image": "CloudOne"}')
    snapshots = {"CloudOne": full("CloudOne", 0.9), "CloudTwo": full("CloudTwo", 0.5)}
    ranking = rank(snapshots, Scoped(scope), TINY)
    assert [(c.cloud, c.scope) for c in ranking.candidates] == [("CloudTwo", scope)]


def test_unreadable_small_and_unknown_clouds_are_excluded_with_reasons():
    snapshots = {
        "CloudOne": Unavailable("CloudOne", "capacity of CloudOne unreadable: 503"),
        "CloudTwo": cap("CloudTwo", {"VCPU": 0, "MEMORY_MB": 1000, "DISK_GB": 100}),
        "CloudThree": full("CloudThree", 0.5),
    }
    ranking = rank(snapshots, MostFree(), TINY)
    assert [c.cloud for c in ranking.candidates] == ["CloudThree"]
    assert ranking.why_not() == (
        "CloudOne: capacity of CloudOne unreadable: 503; CloudTwo: too small: 0 VCPU free, 1 needed"
    )
    alone = rank(snapshots, Explicit("CloudTwo"), TINY)
    assert alone.candidates == () and alone.why_not().startswith("CloudTwo: too small")
    nowhere = rank(snapshots, Explicit("CloudNine"), TINY)
    assert nowhere.candidates == ()
    assert nowhere.why_not() == "CloudNine: not a cloud of the broker"


def test_demand_per_cloud_since_flavors_of_one_name_differ():
    snapshots = {"CloudOne": full("CloudOne", 0.5), "CloudTwo": full("CloudTwo", 0.5)}
    demands = {"CloudOne": Demand.of_flavor(vcpus=40, ram_mb=1, disk_gb=1), "CloudTwo": TINY}
    ranking = rank(snapshots, MostFree(), demands)
    assert [c.cloud for c in ranking.candidates] == ["CloudTwo", "CloudOne"]
    missing = rank(snapshots, MostFree(), {"CloudTwo": TINY})
    assert [c.cloud for c in missing.candidates] == ["CloudTwo"]
    assert missing.why_not() == "CloudOne: no demand known for it"


# ------------------------------------------------------------------------------- where


def test_parse_where_accepts_the_four_forms():
    assert parse_where(None, CLOUDS) == MostFree()
    assert parse_where({"cloud": "CloudTwo"}, CLOUDS) == Explicit("CloudTwo")
    assert parse_where({"strategy": "most-free"}, CLOUDS) == MostFree()
    assert parse_where({"strategy": "spread"}, CLOUDS) == Spread()
    scoped = parse_where({"scope": {"compute": "CloudOne", "image": "CloudTwo"}}, CLOUDS)
    assert isinstance(scoped, Scoped) and scoped.cloud == "CloudOne"
    assert scoped.scope.to_json() == '{"compute":"CloudOne","image":"CloudTwo"}'


@pytest.mark.parametrize(
    ("where", "field", "message"),
    [
        ({}, "where", "expected exactly one of"),
        ({"cloud": "CloudOne", "strategy": "spread"}, "where", "expected exactly one of"),
        ({"cloud": "Cloudone"}, "where.cloud", "'Cloudone' is not a cloud of this broker"),
        ({"strategy": "fullest"}, "where.strategy", "expected one of ['most-free', 'spread']"),
        ({"scope": "CloudOne"}, "where.scope", "expected an object"),
        ({"scope": {"image": "CloudTwo"}}, "where.scope", "must name the compute cloud"),
        ({"scope": {"compute": "CloudOne |"}}, "where.scope", "scope for 'compute'"),
        ({"scope": {"compute": "CloudOne | CloudTwo"}}, "where.scope.compute", "fan-out"),
        ({"scope": {"compute": "CloudOne", "image": "Nine"}}, "where.scope.image", "'Nine'"),
    ],
)
def test_parse_where_refuses_with_the_field(where, field, message):
    with pytest.raises(PlacementError) as caught:
        parse_where(where, CLOUDS)
    assert caught.value.field == field
    assert message in caught.value.message
