"""The workers' event loop (``settings.event_loop``): uvloop by default, asyncio's when the
setting says so or when uvloop cannot be imported (one warning), named in each worker's
start-up line; a reload that changes it applies at the next restart. And the reset once seen
in test_combined on uvloop (:func:`scoperouter.http.flow.stream_transport`).

    Solo       router 127.0.0.81 (image frontend)  ->  echo backend 127.0.1.81
    CloudOne   router 127.0.0.82 (image frontend)  ->  list backend 127.0.1.82
    CloudTwo   router 127.0.0.83 (image frontend)  ->  list backend 127.0.1.83
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .backends import EchoBackend, ListServer
from .routers import (
    Router,
    cloud_entry,
    free_port,
    request,
    scoperouter_command,
    start_all,
    stop_all,
    token_headers,
    write_config,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.81"
SCOPE = {"X-Scope": '{"image": "Solo"}'}
FALLBACK = "uvloop cannot be imported"


@pytest.fixture(scope="module")
def backend() -> Iterator[EchoBackend]:
    with EchoBackend("127.0.1.81", name="solo") as server:
        yield server


def _config(path: Path, ports: tuple[int, int], backend: EchoBackend, **settings: Any) -> Path:
    """Solo's image frontend and its /metrics and /healthz on `ports`."""
    entry = cloud_entry(HOST, {"image": (ports[0], "", backend.url)})
    entry["metrics"] = {"listen": f"{HOST}:{ports[1]}"}
    return write_config(path, {"Solo": entry}, **settings)


def _router(tmp_path: Path, backend: EchoBackend, workers: int, **settings: Any) -> Router:
    ports = free_port(HOST), free_port(HOST)
    config = _config(tmp_path / "solo.yaml", ports, backend, **settings)
    addresses = [(HOST, port) for port in ports]
    return Router("Solo", config, tmp_path / "solo.log", addresses, workers=workers)


def _health(router: Router) -> Any:
    host, port = router.addresses[1]
    return request("GET", f"http://{host}:{port}/healthz").json()


def _answers(router: Router) -> None:
    host, port = router.addresses[0]
    reply = request("GET", f"http://{host}:{port}/v2/images", SCOPE)
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["backend"] == "solo"


def _errors(router: Router) -> list[str]:
    """The log's lines at ERROR or above."""
    lines = [json.loads(line) for line in router.log_text().splitlines() if line.startswith("{")]
    return [line["msg"] for line in lines if line["level"] in ("ERROR", "CRITICAL")]


def _loops(router: Router, workers: int) -> list[str]:
    """The loop each worker named in its start-up line."""
    router.wait_for_log("; event loop: ", count=workers)
    return [
        line.rpartition("; event loop: ")[2].split('"')[0]
        for line in router.log_text().splitlines()
        if "; event loop: " in line
    ]


def test_workers_run_on_uvloop_by_default(tmp_path: Path, backend: EchoBackend) -> None:
    router = _router(tmp_path, backend, workers=2)
    start_all([router])
    try:
        assert _loops(router, 2) == ["uvloop", "uvloop"]
        assert _health(router)["event_loop"] == "uvloop"
        _answers(router)
        # A reload that asks for asyncio keeps the workers' loop, saying so; the rest applies.
        ports = router.addresses[0][1], router.addresses[1][1]
        _config(router.config, ports, backend, event_loop="asyncio")
        router.signal(signal.SIGHUP)
        router.wait_for_log("settings.event_loop is now asyncio: the workers keep theirs")
        router.wait_for_log("reloaded", count=2)
        _answers(router)
    finally:
        assert stop_all([router]) == {"Solo": 0}, router.log_text()[-3000:]
    assert FALLBACK not in router.log_text() and _errors(router) == []


def test_the_setting_turns_it_off(tmp_path: Path, backend: EchoBackend) -> None:
    router = _router(tmp_path, backend, workers=1, event_loop="asyncio")
    start_all([router])
    try:
        assert _loops(router, 1) == ["asyncio"]
        assert _health(router)["event_loop"] == "asyncio"
        _answers(router)
    finally:
        assert stop_all([router]) == {"Solo": 0}, router.log_text()[-3000:]
    assert FALLBACK not in router.log_text() and _errors(router) == []


def test_another_loop_is_refused_naming_the_key(tmp_path: Path, backend: EchoBackend) -> None:
    ports = free_port(HOST), free_port(HOST)
    config = _config(tmp_path / "solo.yaml", ports, backend, event_loop="trio")
    done = subprocess.run(
        [*scoperouter_command(), "check-config", str(config), "--cloud", "Solo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "settings.event_loop: must be uvloop or asyncio, not 'trio'" in done.stderr


def test_without_uvloop_the_router_runs_on_asyncio_saying_why_once(
    tmp_path: Path, backend: EchoBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A uvloop that cannot be imported shadows the installed one (the router's environment
    # is the test's).
    shadow = tmp_path / "shadow" / "uvloop"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no uvloop in this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    router = _router(tmp_path, backend, workers=2)
    start_all([router])
    try:
        assert _loops(router, 2) == ["asyncio", "asyncio"]
        assert _health(router)["event_loop"] == "asyncio"
        _answers(router)
    finally:
        assert stop_all([router]) == {"Solo": 0}, router.log_text()[-3000:]
    warnings = [line for line in router.log_text().splitlines() if FALLBACK in line]
    assert len(warnings) == 1, warnings
    assert '"WARNING"' in warnings[0] and "no uvloop in this test" in warnings[0]
    assert _errors(router) == []


def test_on_uvloop_a_merged_list_crosses_both_clouds(tmp_path: Path) -> None:
    """The reset seen in test_combined on uvloop: the router's protocols asserted that their
    transport was an ``asyncio.Transport``, which uvloop's are not (same interface, no common
    class), so every connection failed in ``connection_made`` (an error in the log), its
    request never read, and the client's connection was reset. Only without ``python -O``:
    the benchmarks' routers, run with it, had no assert to fail."""
    hosts = {"CloudOne": "127.0.0.82", "CloudTwo": "127.0.0.83"}
    ids = {name: [f"{name.lower()}-{n}" for n in range(3)] for name in hosts}
    lists = {
        name: ListServer(host.replace(".0.0.", ".0.1."), name, ids[name], 10).start()
        for name, host in hosts.items()
    }
    ports = {name: free_port(host) for name, host in hosts.items()}
    config = write_config(
        tmp_path / "federation.yaml",
        {
            name: cloud_entry(host, {"image": (ports[name], "", lists[name].url)})
            for name, host in hosts.items()
        },
        event_loop="uvloop",
    )
    routers = [
        Router(name, config, tmp_path / f"{name}.log", [(host, ports[name])])
        for name, host in hosts.items()
    ]
    start_all(routers)
    try:
        for router in routers:
            assert _loops(router, 1) == ["uvloop"]
        scope = json.dumps({"image": "CloudOne & CloudTwo"})
        url = f"http://{hosts['CloudOne']}:{ports['CloudOne']}/v2/images"
        for _ in range(3):  # a new client connection each time; pooled peer connections
            reply = request("GET", url, token_headers("secret-token", scope))
            assert reply.status == 200, reply.body
            listed = [image["id"] for image in reply.json()["images"]]
            assert listed == ids["CloudOne"] + ids["CloudTwo"]
    finally:
        codes = stop_all(routers)
        for server in lists.values():
            server.stop()
    assert codes == {"CloudOne": 0, "CloudTwo": 0}, routers[0].log_text()[-3000:]
    assert [_errors(router) for router in routers] == [[], []]
