"""The worker's budget of bytes buffered for combined requests, and its settings."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scoperouter.catalog import Combine
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError
from scoperouter.router.budget import Budget


def test_leases_share_the_worker_budget_and_give_it_back() -> None:
    budget = Budget()
    one, two = budget.lease(100), budget.lease(100)
    assert one.reserve(60) and two.reserve(30) and budget.used == 90
    assert not two.reserve(20)  # 110 > 100: refused, while `one` holds part of it
    assert two.refused and two.crowded and not one.refused
    assert not two.reserve(1)  # refused once, refused for good
    two.release()
    assert budget.used == 60 and two.held == 0
    assert not two.reserve(1) and budget.used == 60  # late pieces of a released request
    assert one.reserve(40) and budget.used == 100
    one.release()
    assert budget.used == 0


def test_a_request_alone_over_the_budget_is_not_crowded() -> None:
    budget = Budget()
    lease = budget.lease(100)
    assert lease.reserve(100) and not lease.reserve(1)
    assert lease.refused and not lease.crowded  # waiting would not help: no Retry-After
    lease.release()
    assert budget.used == 0


def test_a_limit_lowered_by_a_reload_applies_to_the_next_lease() -> None:
    budget = Budget()
    old = budget.lease(100)
    assert old.reserve(80)
    assert not budget.lease(50).reserve(1)  # 81 > 50
    old.release()
    assert budget.lease(50).reserve(50)


MINIMAL: dict[str, Any] = {
    "version": 1,
    "clouds": {
        "CloudOne": {
            "frontends": [{"url": "http://127.0.0.2:9292"}],
            "services": {
                "image": {
                    "public": {"url": "http://127.0.0.2:9292", "backend": "http://127.0.1.2:9292"}
                }
            },
        }
    },
}


def test_settings_combine_defaults_and_values() -> None:
    assert build_catalog(MINIMAL).settings.combine == Combine(
        max_parts=16, max_clouds=16, buffer_mib=256
    )
    doc = copy.deepcopy(MINIMAL)
    doc["settings"] = {"combine": {"max_parts": 4, "max_clouds": 2, "buffer_mib": 64}}
    assert build_catalog(doc).settings.combine == Combine(max_parts=4, max_clouds=2, buffer_mib=64)


@pytest.mark.parametrize(
    ("key", "value"), [("max_parts", 0), ("max_clouds", 1.5), ("buffer_mib", "256"), ("x", 1)]
)
def test_settings_combine_refuses_what_it_cannot_use(key: str, value: object) -> None:
    doc = copy.deepcopy(MINIMAL)
    doc["settings"] = {"combine": {key: value}}
    with pytest.raises(ConfigError) as caught:
        build_catalog(doc)
    assert "settings.combine" in caught.value.location


def test_a_trim_is_scheduled_once_and_runs() -> None:
    import asyncio

    from scoperouter.router import budget

    async def main() -> int:
        budget.trim_soon()
        budget.trim_soon()  # coalesced
        scheduled = len(budget._pending)
        await asyncio.sleep(budget.TRIM_DELAY + 0.2)
        return scheduled

    if budget._TRIM is None:  # not glibc: nothing to hand back
        pytest.skip("no malloc_trim here")
    assert asyncio.run(main()) == 1
    assert budget._pending == {}
    assert asyncio.run(main()) == 1  # a new loop: scheduled again
