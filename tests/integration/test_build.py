"""The build a router runs (issue 31): its start line and ``/healthz`` name it, and
``SCOPEROUTER_PURE=1`` in its environment makes it pure whatever is installed.

    Solo   router 127.0.0.131 (image frontend, /healthz)  ->  echo backend 127.0.1.131
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import scoperouter

from .backends import EchoBackend
from .routers import Router, cloud_entry, free_port, request, start_all, stop_all, write_config

pytestmark = pytest.mark.integration

HOST = "127.0.0.131"


@pytest.fixture(scope="module")
def backend() -> Iterator[EchoBackend]:
    with EchoBackend("127.0.1.131", name="solo") as server:
        yield server


def _served(tmp_path: Path, backend: EchoBackend) -> tuple[str, str]:
    """A one-worker router started and asked once: its start line's build and /healthz's."""
    front, status = free_port(HOST), free_port(HOST)
    entry = cloud_entry(HOST, {"image": (front, "", backend.url)})
    entry["metrics"] = {"listen": f"{HOST}:{status}"}
    config = write_config(tmp_path / "solo.yaml", {"Solo": entry})
    router = Router("Solo", config, tmp_path / "solo.log", [(HOST, front), (HOST, status)])
    start_all([router])
    try:
        reply = request("GET", f"http://{HOST}:{front}/v2/images")
        assert reply.status == 200 and json.loads(reply.body)["backend"] == "solo"
        health = request("GET", f"http://{HOST}:{status}/healthz").json()
    finally:
        assert stop_all([router]) == {"Solo": 0}, router.log_text()[-3000:]
    started = next(line for line in router.log_text().splitlines() if "router of Solo:" in line)
    # "... listening on A, B; build <build line>; metrics and health on C"
    said = json.loads(started)["msg"].partition("; build ")[2].rpartition("; metrics and")[0]
    return said, health["build"]


def test_the_router_names_the_build_it_runs(tmp_path: Path, backend: EchoBackend) -> None:
    said, health = _served(tmp_path, backend)
    assert said == scoperouter.build_line()  # the router's environment is this process's
    assert health == scoperouter.build()


def test_scoperouter_pure_makes_the_router_pure(
    tmp_path: Path, backend: EchoBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCOPEROUTER_PURE", "1")
    said, health = _served(tmp_path, backend)
    assert said == "pure (SCOPEROUTER_PURE=1)" and health == "pure"
