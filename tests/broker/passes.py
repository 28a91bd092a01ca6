"""Drive a service's passes without the broker's API and worker: an in-memory OperationContext
that keeps progress, cloud and resources as the worker would, and a loop that runs passes until
an operation ends (honouring Pending's retry_after, optionally capped to keep tests quick).

The services' tests use it beside the real worker: it lets a test stop between passes
("crash"), start a fresh context from the saved progress, and look at every outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from scoperouter.broker.contract import (
    Clouds,
    Done,
    Failed,
    InstanceView,
    OperationContext,
    OperationKind,
    Outcome,
    Pending,
    PlanEntry,
    Service,
)

log = logging.getLogger("tests.broker.passes")


@dataclass
class Saved:
    """What the worker would have committed for one instance (survives a "crash")."""

    progress: dict[str, Any] = field(default_factory=dict)
    cloud: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    saves: int = 0
    secrets: dict[str, Any] = field(default_factory=dict)
    descriptions: list[str] = field(default_factory=list)


class MemoryOperation(OperationContext):
    def __init__(
        self,
        kind: OperationKind,
        instance: InstanceView,
        plan: PlanEntry,
        clouds: Clouds,
        saved: Saved | None = None,
        *,
        identity: Any = None,
        deadline: float = 600.0,
    ) -> None:
        self.operation_id = f"op-{kind}-{instance.id}"
        self.kind = kind
        self.instance = instance
        self.binding = None
        self.plan = plan
        self.parameters = instance.parameters
        self.context = instance.context
        self.originating_identity = None
        self.request_identity = None
        self.deadline = datetime.now(UTC) + timedelta(seconds=deadline)
        self.clouds = clouds
        self.identity = identity
        self.log = logging.LoggerAdapter(log, {"operation": self.operation_id})
        self.saved = saved if saved is not None else Saved()
        self.cancel = False
        self.others: dict[str, InstanceView] = {}  # instance_of: the broker's other instances

    @property
    def progress(self) -> Mapping[str, Any]:
        return self.saved.progress

    @property
    def cancelled(self) -> bool:
        return self.cancel

    def save(self, **progress: Any) -> None:
        self.saved.progress.update(progress)
        self.saved.saves += 1

    def set_cloud(self, cloud: str) -> None:
        self.saved.cloud = cloud

    def set_resources(self, **ids: Any) -> None:
        self.saved.resources.update(ids)

    def instance_of(self, instance_id: str) -> InstanceView | None:
        return self.others.get(instance_id)

    def describe(self, text: str) -> None:
        self.saved.descriptions.append(text)

    @property
    def secrets(self) -> Mapping[str, Any]:
        return dict(self.saved.secrets)

    def keep_secrets(self, **values: Any) -> None:
        self.saved.secrets.update(values)


DEFAULT_CONTEXT = {"platform": "cloudfoundry", "organization_guid": "org", "space_guid": "space"}


DEFAULT_CONTEXT = {"platform": "cloudfoundry", "organization_guid": "org", "space_guid": "space"}


def instance(
    instance_id: str,
    parameters: Mapping[str, Any],
    *,
    context: Mapping[str, Any] | None = None,
    service_id: str = "svc",
    plan_id: str = "plan",
) -> InstanceView:
    return InstanceView(
        id=instance_id,
        service_id=service_id,
        plan_id=plan_id,
        parameters=dict(parameters),
        context=dict(context or DEFAULT_CONTEXT),
        cloud=None,
        resources={},
    )


def after(view: InstanceView, saved: Saved) -> InstanceView:
    """The instance as a later operation sees it (cloud and resources recorded)."""
    return replace(view, cloud=saved.cloud, resources=dict(saved.resources))


def drive(
    service: Service,
    op: MemoryOperation,
    *,
    timeout: float = 300.0,
    max_sleep: float | None = None,
    passes: list[Outcome] | None = None,
) -> Outcome:
    """Run passes of `op` until Done or Failed (or `timeout`: AssertionError)."""
    method = getattr(service, op.kind)
    end = time.monotonic() + timeout
    while True:
        outcome: Outcome = method(op)
        if passes is not None:
            passes.append(outcome)
        if isinstance(outcome, Done | Failed):
            return outcome
        assert isinstance(outcome, Pending), outcome
        if time.monotonic() > end:
            raise AssertionError(f"{op.kind} still pending after {timeout}s: {outcome}")
        wait = outcome.retry_after if max_sleep is None else min(outcome.retry_after, max_sleep)
        time.sleep(wait)
