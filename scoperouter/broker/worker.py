"""Operations are run by workers that claim them with a lease (docs/broker.md, "Operations and
the worker").

A worker thread loops: claim one due operation (store.claim: guarded UPDATE, ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL), run one *pass* of it (the service's method for its kind), record the
outcome. A heartbeat thread renews the leases of the passes running in this process; a pass
whose lease could not be renewed is told so at its next ``save`` (LeaseLost) and its outcome is
dropped: the new owner's work wins. So any number of threads, processes and replicas can share
one database, and a broker SIGKILLed mid-pass loses at most that pass: the lease expires and
another worker (or the restarted broker) runs the pass again, from the progress saved so far.

What a pass can never do: run past the operation's deadline (it fails with a description of
where it stood), start after a DELETE cancelled its provision, or change an instance that a
newer operation owns now.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy.exc
from sqlalchemy.orm import Session

from scoperouter.broker import logs, metrics
from scoperouter.broker.contract import (
    BindingView,
    Done,
    Failed,
    InstanceView,
    JSONValue,
    LeaseLost,
    OperationContext,
    OperationKind,
    Outcome,
    Pending,
    PlanEntry,
)
from scoperouter.broker.runtime import Broker
from scoperouter.broker.store import Store
from scoperouter.broker.tables import (
    BOUND,
    FAILED,
    GONE,
    IN_PROGRESS,
    OP_FAILED,
    PROVISIONED,
    SUCCEEDED,
    Binding,
    Instance,
    Operation,
    utcnow,
)

log = logging.getLogger("scoperouter.broker.worker")

CANCELLABLE = ("provision", "bind")  # a DELETE stops these (OSB: "halt the creation")
STOPPED = "stopped: a delete request arrived while it ran"
BIND_RESULT_KEYS = ("endpoints", "expires_at", "renew_before")


def owner_id(role: str = "worker") -> str:
    """A lease owner name unique to this process and thread (and readable in `broker show`)."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Heartbeat:
    """Renews the leases of the passes running in this process, every `interval` seconds."""

    def __init__(self, store: Store, lease: timedelta, interval: float) -> None:
        self._store = store
        self._lease = lease
        self._interval = interval
        self._held: dict[str, str] = {}  # operation id -> owner
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="broker-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def hold(self, operation_id: str, owner: str) -> None:
        with self._lock:
            self._held[operation_id] = owner
            self._lost.discard(operation_id)

    def drop(self, operation_id: str) -> None:
        with self._lock:
            self._held.pop(operation_id, None)
            self._lost.discard(operation_id)

    def lost(self, operation_id: str) -> bool:
        with self._lock:
            return operation_id in self._lost

    def beat(self) -> None:
        with self._lock:
            held = list(self._held.items())
        for operation_id, owner in held:
            try:
                ok = self._store.renew(operation_id, owner, self._lease)
            except Exception as exc:  # the database is down: try again next beat
                log.warning("renewing the lease of %s failed: %s", operation_id, exc)
                continue
            if not ok:
                log.warning("lease of operation %s lost (another worker owns it)", operation_id)
                with self._lock:
                    self._lost.add(operation_id)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()


class WorkerContext(OperationContext):
    """What a service sees in one pass; every write is guarded by the lease."""

    def __init__(
        self,
        broker: Broker,
        op: Operation,
        instance: Instance,
        binding: Binding | None,
        plan: PlanEntry,
        owner: str,
        heartbeat: Heartbeat,
    ) -> None:
        self._broker = broker
        self._store = broker.store
        self._owner = owner
        self._heartbeat = heartbeat
        self._progress: dict[str, Any] = dict(op.progress or {})
        self.operation_id = op.id
        self.kind = op.kind  # type: ignore[assignment]
        request = op.request or {}
        self.instance = instance_view(instance)
        self.binding = (
            BindingView(
                id=binding.id,
                instance_id=binding.instance_id,
                parameters=dict(binding.parameters or {}),
                context=dict(binding.context or {}),
                predecessor_binding_id=binding.predecessor_binding_id,
                resources=dict(binding.resources or {}),
            )
            if binding is not None
            else None
        )
        if op.kind == "update":
            self.parameters = dict(request.get("parameters", instance.parameters) or {})
            self.context = dict(request.get("context") or instance.context or {})
        elif binding is not None:
            self.parameters = dict(binding.parameters or {})
            self.context = dict(binding.context or {})
        else:
            self.parameters = dict(instance.parameters or {})
            self.context = dict(instance.context or {})
        self.plan = plan
        self.originating_identity = op.originating_identity
        self.request_identity = op.request_identity
        self.deadline = op.deadline_at
        self.clouds = broker.clouds
        self.identity = broker.identity
        self.log = logging.LoggerAdapter(
            logging.getLogger(f"scoperouter.broker.services.{instance.service_name}"),
            {"operation": op.id},
        )

    @property
    def progress(self) -> Mapping[str, Any]:
        return dict(self._progress)

    @property
    def cancelled(self) -> bool:
        if self.kind not in CANCELLABLE:
            return False
        with self._store.read() as session:
            op = self._store.operation(session, self.operation_id)
            return bool(op is None or op.cancel_requested)

    @property
    def stopping(self) -> bool:
        return self._heartbeat.lost(self.operation_id) or self.cancelled

    def _check(self) -> None:
        if self._heartbeat.lost(self.operation_id):
            raise LeaseLost(f"lease of operation {self.operation_id} lost")

    def save(self, **progress: JSONValue) -> None:
        self._check()
        with self._store.write() as session:
            op = self._store.owned(session, self.operation_id, self._owner)
            merged = {**(op.progress or {}), **progress}
            op.progress = merged
        self._progress = merged

    def set_cloud(self, cloud: str) -> None:
        self._check()
        with self._store.write() as session:
            self._store.owned(session, self.operation_id, self._owner)
            instance = self._store.instance(session, self.instance.id)
            if instance is not None:
                instance.cloud = cloud
        self.instance = dataclasses.replace(self.instance, cloud=cloud)

    def set_resources(self, **ids: JSONValue) -> None:
        self._check()
        with self._store.write() as session:
            self._store.owned(session, self.operation_id, self._owner)
            if self.binding is not None:
                row: Instance | Binding | None = self._store.binding(session, self.binding.id)
            else:
                row = self._store.instance(session, self.instance.id)
            if row is not None:
                row.resources = {**(row.resources or {}), **ids}
                merged = dict(row.resources)
        if self.binding is not None:
            self.binding = dataclasses.replace(self.binding, resources=merged)
        else:
            self.instance = dataclasses.replace(self.instance, resources=merged)

    def describe(self, text: str) -> None:
        try:
            self._check()
            with self._store.write() as session:
                self._store.owned(session, self.operation_id, self._owner).description = text
        except LeaseLost:
            raise
        except Exception as exc:  # a description is not worth failing the pass for
            log.warning("%s: description not saved: %s", self.operation_id, logs.short_error(exc))

    def instance_of(self, instance_id: str) -> InstanceView | None:
        with self._store.read() as session:
            row = self._store.instance(session, instance_id)
            return instance_view(row) if row is not None and row.state == PROVISIONED else None

    @property
    def secrets(self) -> Mapping[str, Any]:
        with self._store.read() as session:
            instance = self._store.instance(session, self.instance.id)
            token = instance.secrets if instance is not None else None
        return self._broker.secrets.decrypt(token) if token else {}

    def keep_secrets(self, **values: JSONValue) -> None:
        self._check()
        with self._store.write() as session:
            self._store.owned(session, self.operation_id, self._owner)
            instance = self._store.instance(session, self.instance.id)
            if instance is None:
                return
            kept = self._broker.secrets.decrypt(instance.secrets) if instance.secrets else {}
            kept.update(values)
            kept = {k: v for k, v in kept.items() if v is not None}
            instance.secrets = self._broker.secrets.encrypt(kept) if kept else None


def instance_view(instance: Instance) -> InstanceView:
    """What a service may see of an instance row."""
    return InstanceView(
        id=instance.id,
        service_id=instance.service_id,
        plan_id=instance.plan_id,
        parameters=dict(instance.parameters or {}),
        context=dict(instance.context or {}),
        cloud=instance.cloud,
        resources=dict(instance.resources or {}),
        service_name=instance.service_name,
    )


class Runner:
    """Runs passes of operations for one broker (shared by worker threads and the API's
    inline synchronous binds)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        cfg = broker.config.worker
        self.lease = timedelta(seconds=cfg.lease_seconds)
        self.heartbeat = Heartbeat(broker.store, self.lease, cfg.heartbeat_seconds)
        self.max_retry = cfg.max_retry_seconds

    def run_pass(self, operation_id: str, owner: str, *, release: bool = True) -> Outcome | None:
        """One pass of an operation whose lease `owner` holds. Records the outcome: Done and
        Failed finish the operation; Pending (or an error) gives it back for later (unless
        `release` is False: the caller keeps the lease and calls again). Returns the outcome,
        or None when the lease was lost or the operation was already finished."""
        with self.store.read() as session:
            op = self.store.operation(session, operation_id)
            if op is None or op.state != IN_PROGRESS or op.lease_owner != owner:
                return None
            instance = self.store.instance(session, op.instance_id)
            binding = self.store.binding(session, op.binding_id) if op.binding_id else None
        if instance is None:
            return None
        with logs.identity(op.request_identity):
            return self._run(op, instance, binding, owner, release)

    def _run(
        self,
        op: Operation,
        instance: Instance,
        binding: Binding | None,
        owner: str,
        release: bool,
    ) -> Outcome | None:
        now = utcnow()
        if op.kind in CANCELLABLE and op.cancel_requested:
            return self._finish(op, owner, Failed(STOPPED))
        if now >= op.deadline_at:
            where = f" (last: {op.description})" if op.description else ""
            return self._finish(
                op,
                owner,
                Failed(
                    f"{op.kind} did not finish before its deadline "
                    f"{op.deadline_at.isoformat(timespec='seconds')}Z "
                    f"after {op.attempts} attempt(s){where}"
                ),
            )
        plan_id = (op.request or {}).get("plan_id") or instance.plan_id
        ref = self.broker.plan(instance.service_id, plan_id)
        if ref is None:
            return self._finish(
                op, owner, Failed(f"service {instance.service_id} plan {plan_id} is not offered")
            )
        ctx = WorkerContext(self.broker, op, instance, binding, ref.plan, owner, self.heartbeat)
        method = getattr(ref.service, op.kind)
        self.heartbeat.hold(op.id, owner)
        try:
            log.info("%s %s: pass %d", op.kind, op.id, op.attempts)
            metrics.passed()
            try:
                outcome: Outcome = method(ctx)
            except LeaseLost as exc:
                log.warning("%s %s: stopped: %s", op.kind, op.id, exc)
                return None
            except Exception as exc:
                metrics.retried()
                delay = min(self.max_retry, 2.0 ** min(op.attempts, 10))
                log.warning("%s %s: pass failed, retrying in %.0fs: %s", op.kind, op.id, delay, exc)
                outcome = Pending(f"retrying after an error: {logs.short_error(exc)}", delay)
            if self.heartbeat.lost(op.id):
                log.warning("%s %s: lease lost during the pass; outcome dropped", op.kind, op.id)
                return None
            if isinstance(outcome, Pending):
                if ctx.cancelled:
                    return self._finish(op, owner, Failed(STOPPED))
                if release:
                    when = utcnow() + timedelta(seconds=max(outcome.retry_after, 0.0))
                    try:
                        self.store.release(
                            op.id, owner, not_before=when, description=outcome.description
                        )
                    except LeaseLost:
                        return None
                else:
                    self._describe(op.id, owner, outcome.description)
                return outcome
            return self._finish(op, owner, outcome)
        finally:
            self.heartbeat.drop(op.id)

    def _describe(self, operation_id: str, owner: str, description: str) -> None:
        with self.store.write() as session:
            self.store.owned(session, operation_id, owner).description = description

    def _finish(self, op: Operation, owner: str, outcome: Done | Failed) -> Outcome | None:
        """Record the end of an operation and its effect on the instance/binding, in one
        transaction guarded by the lease."""
        try:
            with self.store.write() as session:
                row = self.store.owned(session, op.id, owner)
                now = utcnow()
                row.state = SUCCEEDED if isinstance(outcome, Done) else OP_FAILED
                row.description = outcome.description
                row.finished_at = now
                row.lease_owner = None
                row.lease_expires_at = None
                instance = self.store.instance(session, row.instance_id)
                if instance is not None:
                    self._apply(session, row, instance, outcome)
                service = instance.service_name if instance is not None else "-"
        except LeaseLost:
            return None
        metrics.finished(service, op.kind, row.state, (now - row.created_at).total_seconds())
        log.info("%s %s: %s: %s", op.kind, op.id, row.state, outcome.description)
        return outcome

    def _apply(self, session: Session, op: Operation, instance: Instance, outcome: Outcome) -> None:
        ok = isinstance(outcome, Done)
        owns = instance.active_operation_id == op.id
        if owns:
            instance.active_operation_id = None
        binding = self.store.binding(session, op.binding_id) if op.binding_id else None
        if op.kind == "provision" and owns:
            instance.state = PROVISIONED if ok else FAILED
        elif op.kind == "update" and owns:
            if ok:
                request = op.request or {}
                if request.get("plan_id"):
                    instance.plan_id = request["plan_id"]
                if "parameters" in request:
                    instance.parameters = request["parameters"]
                if request.get("maintenance_version"):
                    instance.maintenance_version = request["maintenance_version"]
                if request.get("context"):
                    instance.context = request["context"]
            instance.state = PROVISIONED
        elif op.kind == "deprovision" and owns:
            instance.state = GONE if ok else FAILED
            if ok:
                instance.secrets = None
                for other in self.store.bindings_of(session, instance.id):
                    other.state = GONE
                    other.credentials = None
        elif op.kind == "bind" and binding is not None:
            if ok and isinstance(outcome, Done):
                result = dict(outcome.result or {})
                credentials = result.get("credentials")
                if credentials is None:
                    credentials = {k: v for k, v in result.items() if k not in BIND_RESULT_KEYS}
                binding.credentials = self.broker.secrets.encrypt(credentials)
                binding.endpoints = result.get("endpoints")
                binding.expires_at = _naive(result.get("expires_at"))
                binding.renew_before = _naive(result.get("renew_before"))
                binding.state = BOUND
            elif binding.state != GONE:
                binding.state = FAILED
        elif op.kind == "unbind" and binding is not None:
            if ok:
                binding.state = GONE
                binding.credentials = None
            else:
                binding.state = FAILED

    def finish_now(self, operation_id: str, owner: str, outcome: Done | Failed) -> None:
        with self.store.read() as session:
            op = self.store.operation(session, operation_id)
        if op is not None:
            self._finish(op, owner, outcome)


def _naive(value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime) and value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value if isinstance(value, datetime) else None


class Worker:
    """`threads` threads claiming and running operations until stop()."""

    def __init__(self, broker: Broker, runner: Runner | None = None) -> None:
        self.broker = broker
        self.runner = runner or Runner(broker)
        self.config = broker.config.worker
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._pending_wake = False
        self._threads: list[threading.Thread] = []

    def start(self, threads: int | None = None) -> None:
        count = self.config.threads if threads is None else threads
        if count <= 0:
            return
        self.runner.heartbeat.start()
        for index in range(count):
            thread = threading.Thread(
                target=self._loop,
                args=(owner_id(f"worker{index}"),),
                daemon=True,
                name=f"broker-worker-{index}",
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.notify()
        for thread in self._threads:
            thread.join(timeout=timeout)
        self.runner.heartbeat.stop()

    def notify(self) -> None:
        """A new operation is due: wake a waiting thread now instead of at its next poll."""
        with self._wake:
            self._pending_wake = True
            self._wake.notify()

    def _wait(self) -> None:
        with self._wake:
            if not self._pending_wake:
                self._wake.wait(self.config.poll_seconds)
            self._pending_wake = False

    def _loop(self, owner: str) -> None:
        failures = 0  # consecutive claims the database refused
        while not self._stop.is_set():
            try:
                ran = self.run_one(owner)
            except sqlalchemy.exc.OperationalError as exc:
                # The database is down or restarting (a PostgreSQL failover, a restart): one
                # line when it starts and one when it is back, and claims backing off up to
                # max_retry_seconds meanwhile, instead of a traceback at every poll.
                failures += 1
                if failures == 1:
                    log.warning(
                        "worker: the database is unavailable, claims paused (retrying with "
                        "backoff up to %gs): %s",
                        self.config.max_retry_seconds,
                        _first_line(exc),
                    )
                delay = self.config.poll_seconds * 2 ** min(failures, 16)
                self._stop.wait(min(delay, self.config.max_retry_seconds))
                continue
            except Exception:
                log.exception("worker loop error")
                ran = False
                self._stop.wait(self.config.poll_seconds)
            if failures:
                log.warning("worker: the database is available again after %d failed claims",
                            failures)  # fmt: skip
                failures = 0
            if not ran:
                self._wait()

    def run_one(self, owner: str, kinds: tuple[OperationKind, ...] | None = None) -> bool:
        """Claim and run one pass; False when nothing was due."""
        operation_id = self.broker.store.claim(owner, self.runner.lease, kinds)
        if operation_id is None:
            return False
        self.runner.run_pass(operation_id, owner)
        return True

    def drain(self, owner: str | None = None, *, limit: int = 1000, wait: float = 5.0) -> int:
        """Run passes in this thread until no operation is due or will be within `wait`
        seconds (tests and `broker repair`); returns the number of passes run."""
        owner = owner or owner_id("drain")
        count = 0
        while count < limit:
            if self.run_one(owner):
                count += 1
                continue
            due = self.broker.store.next_due()
            if due is None or (due - utcnow()).total_seconds() > wait:
                break
            time.sleep(max(0.0, min(wait, (due - utcnow()).total_seconds())) + 0.001)
        return count


__all__ = ["Heartbeat", "Runner", "Worker", "WorkerContext", "instance_view", "owner_id"]


def _first_line(exc: BaseException) -> str:
    """The driver's message of a database error, without SQLAlchemy's background link."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__
