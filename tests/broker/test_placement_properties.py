"""placement.rank under hypothesis: what holds for any capacities, demands and counts."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scoperouter.broker.contract import Capacity
from scoperouter.broker.placement import (
    Demand,
    Explicit,
    MostFree,
    Spread,
    Unavailable,
    free_after,
    rank,
    too_small,
)

CLASSES = ("VCPU", "MEMORY_MB", "DISK_GB")
NAMES = [f"Cloud{i}" for i in range(6)]
NOW = datetime(2026, 1, 1, tzinfo=UTC)

amounts = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def capacities(draw: st.DrawFn, cloud: str) -> Capacity:
    total: dict[str, float] = {}
    free: dict[str, float] = {}
    for rc in CLASSES:
        if draw(st.booleans()) or rc == "VCPU":
            total[rc] = draw(st.floats(min_value=0, max_value=1e6))
            free[rc] = draw(st.floats(min_value=0, max_value=1)) * total[rc]
    largest = None
    if draw(st.booleans()):  # what one allocation can take on one host (max_unit, free)
        largest = {rc: draw(st.floats(min_value=0, max_value=1)) * free[rc] for rc in free}
    return Capacity(cloud=cloud, total=total, free=free, largest=largest, read_at=NOW)


@st.composite
def federations(draw: st.DrawFn) -> dict[str, Capacity | Unavailable]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    out: dict[str, Capacity | Unavailable] = {}
    for name in names:
        if draw(st.integers(0, 5)) == 0:
            out[name] = Unavailable(name, "capacity unreadable")
        else:
            out[name] = draw(capacities(name))
    return out


demands = st.builds(
    lambda v, m, d: Demand({"VCPU": v, "MEMORY_MB": m, "DISK_GB": d}), amounts, amounts, amounts
)
placed_counts = st.dictionaries(st.sampled_from(NAMES), st.integers(0, 50))
strategies_ = st.sampled_from([MostFree(), Spread()])
# what is tested is rank(), not how fast inputs are drawn on a machine shared with a lab
relaxed = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)


@relaxed
@given(federations(), strategies_, demands, placed_counts)
def test_every_cloud_is_either_a_candidate_or_excluded_with_a_reason(
    snaps, strategy, demand, placed
):
    ranking = rank(snaps, strategy, demand, placed)
    candidates = [c.cloud for c in ranking.candidates]
    excluded = [u.cloud for u in ranking.excluded]
    assert sorted(candidates + excluded) == sorted(snaps)
    assert all(u.reason for u in ranking.excluded)


@relaxed
@given(federations(), strategies_, demands, placed_counts)
def test_candidates_fit_and_excluded_do_not(snaps, strategy, demand, placed):
    ranking = rank(snaps, strategy, demand, placed)
    for candidate in ranking.candidates:
        snapshot = snaps[candidate.cloud]
        assert isinstance(snapshot, Capacity)
        for rc, amount in demand.positive().items():
            assert snapshot.free[rc] >= amount
            if snapshot.largest is not None:  # some host takes it in one allocation
                assert snapshot.largest[rc] >= amount
        assert 0.0 <= candidate.free_after <= 1.0
    for unavailable in ranking.excluded:
        snapshot = snaps[unavailable.cloud]
        assert isinstance(snapshot, Unavailable) or too_small(snapshot, demand) is not None


@relaxed
@given(federations(), demands)
def test_most_free_never_ranks_a_fuller_cloud_first(snaps, demand):
    ranking = rank(snaps, MostFree(), demand)
    fractions = [c.free_after for c in ranking.candidates]
    assert fractions == sorted(fractions, reverse=True)


@relaxed
@given(federations(), demands, placed_counts)
def test_spread_orders_by_placed_then_most_free(snaps, demand, placed):
    ranking = rank(snaps, Spread(), demand, placed)
    keys = [(c.placed, -c.free_after) for c in ranking.candidates]
    assert keys == sorted(keys)
    assert all(c.placed == placed.get(c.cloud, 0) for c in ranking.candidates)


@relaxed
@given(federations(), st.sampled_from(NAMES), demands)
def test_explicit_yields_at_most_the_named_cloud(snaps, name, demand):
    ranking = rank(snaps, Explicit(name), demand)
    assert [c.cloud for c in ranking.candidates] in ([], [name])
    assert len(ranking.candidates) + len(ranking.excluded) == 1


@relaxed
@given(federations(), demands, st.randoms())
def test_ranking_does_not_depend_on_input_order_except_ties(snaps, demand, rnd):
    names = list(snaps)
    rnd.shuffle(names)
    shuffled = {name: snaps[name] for name in names}
    first = rank(snaps, MostFree(), demand)
    second = rank(shuffled, MostFree(), demand)
    assert {c.cloud for c in first.candidates} == {c.cloud for c in second.candidates}
    assert [c.free_after for c in first.candidates] == [c.free_after for c in second.candidates]


@relaxed
@given(capacities("CloudA"), demands, st.floats(min_value=0, max_value=1))
def test_more_free_capacity_never_lowers_free_after(snapshot, demand, extra):
    more = Capacity(
        cloud=snapshot.cloud,
        total=snapshot.total,
        free={rc: f + (snapshot.total[rc] - f) * extra for rc, f in snapshot.free.items()},
        largest=snapshot.largest,
        read_at=NOW,
    )
    assert free_after(more, demand) >= free_after(snapshot, demand)
    if too_small(snapshot, demand) is None:
        assert too_small(more, demand) is None
