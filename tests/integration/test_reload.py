"""Reloading the federation config: SIGHUP and --watch swap the catalog; an invalid file is
refused and the old config keeps routing; a listener change asks for a restart."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from .backends import EchoBackend
from .routers import Router, cloud_entry, free_port, request, start_all, stop_all, write_config

pytestmark = pytest.mark.integration

HOST = "127.0.0.10"


@dataclass
class Setup:
    router: Router
    config: Path
    url: str
    old: EchoBackend
    new: EchoBackend
    port: int

    def write(self, backend: EchoBackend, port: int | None = None) -> None:
        """Rewrite the config with `backend` behind the image frontend (atomically)."""
        entry = cloud_entry(HOST, {"image": (port or self.port, "", backend.url)})
        tmp = write_config(self.config.with_suffix(".tmp"), {"Solo": entry})
        os.replace(tmp, self.config)

    def backend_name(self) -> str:
        reply = request("GET", self.url + "/v2/images")
        assert reply.status == 200, reply
        return reply.json()["backend"]


def _setup(tmp_path: Path, watch: bool) -> Iterator[Setup]:
    old = EchoBackend("127.0.1.10", name="old").start()
    new = EchoBackend("127.0.1.10", name="new").start()
    port = free_port(HOST)
    config = tmp_path / "solo.yaml"
    router = Router("Solo", config, tmp_path / "solo.log", [(HOST, port)], watch=watch)
    setup = Setup(router, config, f"http://{HOST}:{port}", old, new, port)
    setup.write(old)
    start_all([router])
    try:
        yield setup
    finally:
        codes = stop_all([router])
        old.stop()
        new.stop()
        assert codes == {"Solo": 0}, router.log_text()


@pytest.fixture
def solo(tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(tmp_path, watch=False)


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(tmp_path, watch=True)


def test_sighup_reload_switches_backend(solo: Setup) -> None:
    assert solo.backend_name() == "old"
    solo.write(solo.new)
    solo.router.signal(signal.SIGHUP)
    solo.router.wait_for_log("reloaded")
    assert solo.backend_name() == "new"


def test_invalid_config_is_refused_and_old_one_keeps_routing(solo: Setup) -> None:
    solo.config.write_text("version: 1\nclouds: [this is: not, a mapping\n")
    solo.router.signal(signal.SIGHUP)
    log = solo.router.wait_for_log("reload refused")
    assert "not valid YAML" in log
    assert solo.backend_name() == "old"
    # A valid YAML file that drops this router's cloud is refused as well.
    other = cloud_entry("127.0.0.11", {"image": (free_port("127.0.0.11"), "", solo.new.url)})
    write_config(solo.config, {"Other": other})
    solo.router.signal(signal.SIGHUP)
    solo.router.wait_for_log("reload refused", count=2)
    assert solo.backend_name() == "old"
    # And a good file afterwards is taken.
    solo.write(solo.new)
    solo.router.signal(signal.SIGHUP)
    solo.router.wait_for_log("reloaded")
    assert solo.backend_name() == "new"


def test_reload_keeps_open_connections(solo: Setup) -> None:
    import http.client

    conn = http.client.HTTPConnection(HOST, solo.port, timeout=10)
    try:
        conn.request("GET", "/before")
        first = conn.getresponse()
        first.read()
        solo.write(solo.new)
        solo.router.signal(signal.SIGHUP)
        solo.router.wait_for_log("reloaded")
        conn.request("GET", "/after")  # same client connection, new catalog
        second = conn.getresponse()
        assert second.status == 200
        assert second.read().count(b'"backend": "new"') == 1
    finally:
        conn.close()


def test_listener_change_is_refused_until_a_restart(solo: Setup) -> None:
    new_port = free_port(HOST)
    solo.write(solo.new, port=new_port)
    solo.router.signal(signal.SIGHUP)
    log = solo.router.wait_for_log("reload refused")
    assert "listeners of Solo changed" in log and "restart the router" in log
    # Nothing of the new file is applied: the old config keeps routing, whole.
    assert solo.backend_name() == "old"


def test_watch_reloads_when_the_file_changes(watched: Setup) -> None:
    assert watched.backend_name() == "old"
    watched.write(watched.new)
    watched.router.wait_for_log("reloaded", timeout=10)
    assert watched.backend_name() == "new"


def test_sigterm_lets_a_request_in_flight_finish(solo: Setup) -> None:
    import threading
    import time

    result: dict[str, object] = {}

    def slow() -> None:
        result["reply"] = request("GET", solo.url + "/sleep/1.0")

    client = threading.Thread(target=slow)
    client.start()
    deadline = time.monotonic() + 10
    while not any(item.get("sleeping") for item in solo.old.seen):  # forwarded, in flight
        assert time.monotonic() < deadline, solo.router.log_text()
        time.sleep(0.02)
    assert solo.router.stop() == 0
    client.join(timeout=10)
    reply = result["reply"]
    assert reply.status == 200, reply  # type: ignore[attr-defined]


def test_requests_are_answered_while_a_big_config_reloads(tmp_path: Path) -> None:
    """A worker reads a reloaded config in a thread: its requests go on being answered while
    it does (a 4,000-cloud file takes a while), where reading it on the event loop answered
    none until the new catalog was in. Answers are counted between the worker's 'reloading'
    and 'reloaded' lines (one worker, so nothing else could answer)."""
    backend = EchoBackend("127.0.1.10", name="big").start()
    port = free_port(HOST)
    config = tmp_path / "big.json"
    clouds = {"Solo": cloud_entry(HOST, {"image": (port, "", backend.url)})}
    for i in range(4000):  # names only, never resolved
        name = f"Big{i:04d}"
        clouds[name] = cloud_entry(
            f"router.{name.lower()}.example",
            {st: (9000 + n, "/v1", f"http://ctl.{name.lower()}.example:{9000 + n}/v1")
             for n, st in enumerate(("image", "compute", "volume"))},
        )  # fmt: skip
    config.write_text(json.dumps({"version": 1, "clouds": clouds}))
    router = Router("Solo", config, tmp_path / "big.log", [(HOST, port)], workers=1)
    start_all([router])
    answered: list[float] = []
    stop = threading.Event()

    def client() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        while not stop.is_set():
            conn.request("GET", "/v2/images")
            reply = conn.getresponse()
            reply.read()
            if reply.status == 200:
                answered.append(time.time())

    thread = threading.Thread(target=client, daemon=True)
    try:
        thread.start()
        while not answered:
            time.sleep(0.01)
        config.write_text(config.read_text())  # the same catalog, read again
        router.signal(signal.SIGHUP)
        router.wait_for_log("reloaded", timeout=120)
        stop.set()
        thread.join(30)
    finally:
        stop.set()
        codes = stop_all([router])
        backend.stop()
    assert codes == {"Solo": 0}, router.log_text()
    lines = [json.loads(line) for line in router.log_text().splitlines() if line.startswith("{")]
    start, end = (
        _ts(next(r for r in lines if r["msg"].startswith(word)))
        for word in ("reloading", "reloaded")
    )
    during = [t for t in answered if start < t < end]
    assert end - start > 0.05, "the reload was too quick to tell"  # 4,000 clouds: never here
    assert len(during) >= 3, (f"{len(during)} answers in the {end - start:.2f} s of the reload",)


def _ts(record: dict[str, str]) -> float:
    return datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
