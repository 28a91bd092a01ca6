"""Helpers of the e2e tests of the lab's optional services (swift, cinder, heat): skip when the
lab runs without one, sample a router's memory, make a scoped token."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from scoperouter_lab.layout import CloudSpec
from scoperouter_lab.procs import Record

from scoperouter.scope import Scope, join_token


def require_service(lab: Any, service: str) -> None:
    """Skip unless the lab runs `service` (`lab up --services all` runs every one)."""
    if service not in lab.state.get("services", ()):
        pytest.skip(f"the lab runs without {service} (scoperouter lab up --services all)")


def scoped_token(token: str, **scope: str) -> str:
    """A token with a scope appended, as the client plugin sends it."""
    return join_token(token, Scope.parse(json.dumps(scope)))


def router_record(lab: Any, cloud: CloudSpec) -> Record:
    rec = lab.process_table().get(f"{cloud.slug}-router")
    assert rec is not None and rec.alive(), f"{cloud.name}'s router is not running"
    return rec


class GroupRSS:
    """Resident memory of a lab process and its children (a router: its supervisor and its
    workers), sampled every `interval` seconds in a thread while the block runs: start, peak,
    end."""

    def __init__(self, record: Record, interval: float = 0.05) -> None:
        self.record = record
        self.interval = interval
        self.start = self.peak = self.end = record.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.record.rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> GroupRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.end = self.record.rss()
        self.peak = max(self.peak, self.end)

    def describe(self) -> str:
        mb = 2**20
        return f"{self.start / mb:.0f} MB -> peak {self.peak / mb:.0f} MB -> {self.end / mb:.0f} MB"


def wait_until(what: str, check: Callable[[], Any], timeout: float = 180) -> Any:
    """Poll `check` every second until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout:.0f} s")
        time.sleep(1)
