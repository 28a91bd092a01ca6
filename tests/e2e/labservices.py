"""Helpers of the e2e tests of the lab's optional services (swift, cinder, heat): skip when the
lab runs without one (fail under CI=true), find a router's process record, make a scoped
token."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from scoperouter_lab.layout import CloudSpec
from scoperouter_lab.procs import Record

from scoperouter.scope import Scope, join_token
from tests.ci import missing


def require_service(lab: Any, service: str) -> None:
    """Skip unless the lab runs `service` (`lab up --services all` runs every one); under
    CI=true a failure: .ci/run's lab runs every service its steps test."""
    if service not in lab.state.get("services", ()):
        missing(f"the lab runs without {service} (scoperouter lab up --services all)")


def scoped_token(token: str, **scope: str) -> str:
    """A token with a scope appended, as the client plugin sends it."""
    return join_token(token, Scope.parse(json.dumps(scope)))


def router_record(lab: Any, cloud: CloudSpec) -> Record:
    rec = lab.process_table().get(f"{cloud.slug}-router")
    assert rec is not None and rec.alive(), f"{cloud.name}'s router is not running"
    return rec


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
