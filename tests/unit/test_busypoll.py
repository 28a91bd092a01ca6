"""A worker's busy polling (scoperouter/proxy/busypoll.py, ``settings.busy_poll_us``): it
polls for its window after I/O, never while another task waits for a core, stops when the
machine gets busy, and is off where the running count cannot be read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.catalog import Settings
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError
from scoperouter.proxy import busypoll
from scoperouter.proxy.busypoll import BusyPoll

from .conftest import SAMPLE


def _loadavg(path: Path, running: int) -> None:
    path.write_text(f"0.50 0.40 0.30 {running}/180 4242\n")


async def _until(condition: Callable[[], bool], seconds: float = 2.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        await asyncio.sleep(0.001)


def _run(
    tmp_path: Path, running: int, window: float, scenario: Callable[[BusyPoll, Path], Any]
) -> None:
    """`scenario(poll, path)` on a loop, the poll's running count read from `path` (written
    with `running` first), 2 cores, `window` seconds."""
    path = tmp_path / "loadavg"
    _loadavg(path, running)

    async def main() -> None:
        poll = BusyPoll.open(asyncio.get_running_loop(), str(path), cores=2)
        assert poll is not None
        poll.window = window
        await scenario(poll, path)

    asyncio.run(main())


def test_polls_for_its_window_after_io_then_sleeps(tmp_path: Path) -> None:
    async def scenario(poll: BusyPoll, path: Path) -> None:
        started = time.monotonic()
        poll.poke()
        assert poll.polling
        await _until(lambda: not poll.polling)
        assert time.monotonic() - started >= 0.02  # the whole window
        assert poll.turns > 1  # the loop turned while it polled (no sleep of 20 ms)
        poll.close()

    _run(tmp_path, 1, 0.02, scenario)


def test_each_poke_extends_the_window(tmp_path: Path) -> None:
    async def scenario(poll: BusyPoll, path: Path) -> None:
        started = time.monotonic()
        poll.poke()
        await asyncio.sleep(0.02)
        poll.poke()  # I/O again: 30 ms from now
        await _until(lambda: not poll.polling)
        assert time.monotonic() - started >= 0.05
        poll.close()

    # this worker and one other task: a core to spare on 2
    _run(tmp_path, 2, 0.03, scenario)


def test_no_polling_while_another_task_waits_for_a_core(tmp_path: Path) -> None:
    async def scenario(poll: BusyPoll, path: Path) -> None:
        poll.poke()
        assert not poll.polling
        _loadavg(path, running=1)
        poll.poke()  # the refusal is kept a millisecond: not read at every request
        assert not poll.polling
        await asyncio.sleep(busypoll.REFUSAL_SECONDS * 2)
        poll.poke()
        assert poll.polling
        poll.close()

    _run(tmp_path, 3, 1.0, scenario)  # 3 running on 2 cores: one waits


def test_polling_stops_when_the_machine_gets_busy(tmp_path: Path) -> None:
    async def scenario(poll: BusyPoll, path: Path) -> None:
        poll.poke()
        await asyncio.sleep(0.01)
        assert poll.polling
        _loadavg(path, running=4)
        await _until(lambda: not poll.polling, seconds=1.0)  # at the next turn
        poll.close()

    _run(tmp_path, 1, 10.0, scenario)


def test_a_closed_poll_stops(tmp_path: Path) -> None:
    async def scenario(poll: BusyPoll, path: Path) -> None:
        poll.poke()
        poll.close()
        await _until(lambda: not poll.polling, seconds=1.0)

    _run(tmp_path, 1, 10.0, scenario)


@pytest.mark.parametrize("content", [None, "", "garbage\n", "0.1 0.1 0.1 x/10 1\n"])
def test_off_where_the_running_count_cannot_be_read(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "loadavg"
    if content is not None:
        path.write_text(content)

    async def main() -> None:
        assert BusyPoll.open(asyncio.get_running_loop(), str(path)) is None

    asyncio.run(main())


def test_this_machine_has_a_running_count() -> None:
    """The router's machines are Linux: /proc/loadavg is there (else busy polling is off)."""

    async def main() -> None:
        poll = BusyPoll.open(asyncio.get_running_loop())
        assert poll is not None
        running = poll.running()
        assert running is not None and running >= 1  # this test is running
        poll.close()

    asyncio.run(main())


def _with(tmp_path: Path, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    data.setdefault("settings", {})["busy_poll_us"] = value
    return data


def test_the_setting_defaults_to_200_microseconds(tmp_path: Path) -> None:
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    (data.get("settings") or {}).pop("busy_poll_us", None)
    catalog = build_catalog(data, source="f.yaml", base_dir=tmp_path)
    assert catalog.settings.busy_poll_us == Settings().busy_poll_us == 200


@pytest.mark.parametrize("value", [0, 1, 1000])
def test_the_setting_takes_0_to_1000(tmp_path: Path, value: int) -> None:
    catalog = build_catalog(_with(tmp_path, value), source="f.yaml", base_dir=tmp_path)
    assert catalog.settings.busy_poll_us == value


@pytest.mark.parametrize("value", [-1, 1001, "200", 2.5, True, None])
def test_the_setting_refuses_anything_else(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        build_catalog(_with(tmp_path, value), source="f.yaml", base_dir=tmp_path)
    assert "settings.busy_poll_us" in str(info.value)
    assert "must be an integer from 0 to 1000" in str(info.value)


def test_a_worker_pokes_at_a_request_read_and_its_answer_written(tmp_path: Path) -> None:
    """The worker's wiring (proxy/worker.py): its connections poke the poll when a request's
    bytes come and when its answer goes out; 0 in the setting (a reload) stops the calls."""
    from dataclasses import replace

    from .test_http import ok, rig, statuses

    path = tmp_path / "loadavg"
    _loadavg(path, running=1)

    async def main() -> None:
        async with rig(tmp_path, ok()) as r:
            worker = r.worker
            assert worker.reverse.state.on_io is None  # no poll until the worker serves
            worker.busy_poll = BusyPoll.open(asyncio.get_running_loop(), str(path), cores=2)
            assert worker.busy_poll is not None
            worker._configure_busy_poll(worker.config.current())
            assert worker.busy_poll.window == Settings().busy_poll_us / 1e6
            pokes: list[float] = []
            poke = worker.busy_poll.poke
            worker.reverse.state.on_io = lambda: (pokes.append(time.monotonic()), poke())[1]
            got = await r.exchange(b"GET /v2/images HTTP/1.1\r\nHost: x\r\n\r\n", wait=0.3)
            assert statuses(got) == [200]
            assert len(pokes) >= 2  # the request read, the answer written
            catalog = worker.config.current()
            off = replace(catalog, settings=replace(catalog.settings, busy_poll_us=0))
            worker._configure_busy_poll(off)
            assert worker.reverse.state.on_io is None
            worker._configure_busy_poll(catalog)
            assert worker.reverse.state.on_io == worker.busy_poll.poke
            worker.busy_poll.close()

    asyncio.run(main())
