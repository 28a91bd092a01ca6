"""The checks of ``python -m bench.kills`` (bench/kills_verdict.py) can fail: on a real store
(SQLite) and a cloud folder as the fake service leaves them, a clean end state passes every
row, and each planted fault (a lost record, an unknown one, a duplicate, an orphan, a missing
resource, a credential that is not the cloud's, a stuck operation, an interrupted operation
that failed, a kill that hit nothing, an ERROR in a log) makes its row, and only its row, MISS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bench.kills import DbRun, summary
from bench.kills_verdict import (
    FINISHERS,
    NO_OPERATION,
    Kill,
    OpResult,
    PlatformBinding,
    PlatformView,
    duplicates,
    finisher,
    observe,
    scan_log,
    verdicts,
)
from scoperouter.broker.store import Store
from scoperouter.broker.tables import (
    BOUND,
    GONE,
    IN_PROGRESS,
    PROVISIONED,
    SUCCEEDED,
    Binding,
    Instance,
    Operation,
    new_operation_id,
    utcnow,
)
from tests.broker import fakes


@dataclass
class World:
    store: Store
    cloud: Path
    platform: PlatformView = field(default_factory=PlatformView)
    results: list[OpResult] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    logs: dict[str, list[str]] = field(default_factory=dict)

    def instance(self, ident: str, state: str = PROVISIONED) -> None:
        with self.store.write() as session:
            session.add(
                Instance(
                    id=ident,
                    service_id=fakes.SERVICE_ID,
                    plan_id=fakes.PLAN_ID,
                    service_name="fake",
                    parameters={},
                    context={},
                    resources={},
                    state=state,
                    request_hash="-",
                )
            )

    def binding(self, ident: str, instance: str, state: str = BOUND) -> None:
        with self.store.write() as session:
            session.add(
                Binding(
                    id=ident,
                    instance_id=instance,
                    service_id=fakes.SERVICE_ID,
                    plan_id=fakes.PLAN_ID,
                    parameters={},
                    context={},
                    state=state,
                    request_hash="-",
                )
            )

    def operation(self, kind: str, instance: str, state: str = SUCCEEDED) -> str:
        op_id = new_operation_id(kind)
        with self.store.write() as session:
            session.add(
                Operation(
                    id=op_id,
                    kind=kind,
                    instance_id=instance,
                    state=state,
                    request_hash="-",
                    deadline_at=utcnow() + timedelta(hours=1),
                )
            )
        return op_id

    def resource(self, name: str, content: str = "{}") -> None:
        (self.cloud / name).write_text(content)

    def journal(self, *lines: str) -> None:
        with (self.cloud / "journal").open("a") as f:
            f.writelines(line + "\n" for line in lines)

    def rows(self, planned: int = 2) -> dict[str, bool | None]:
        observed = observe(self.store, self.cloud)
        found = verdicts(self.platform, self.results, observed, self.kills, planned, self.logs)
        return {row.name: row.ok for row in found}


@pytest.fixture
def world(sqlite_url: str, tmp_path: Path) -> World:
    """A clean end state: i1 provisioned with binding b1 (killed mid-provision and mid-bind,
    both succeeded), i2 provisioned then deprovisioned; the cloud holds i1 and b1 only."""
    cloud = tmp_path / "cloud"
    cloud.mkdir()
    w = World(Store(sqlite_url), cloud)
    w.instance("i1")
    w.binding("b1", "i1")
    w.instance("i2", GONE)
    for kind, instance in (("provision", "i1"), ("bind", "i1"), ("provision", "i2")):
        w.operation(kind, instance)
    w.operation("deprovision", "i2")
    w.resource("instance-i1")
    w.resource("binding-b1", "secret-1")
    w.journal("create i1", "pass i1 0 1 0 0", "create-binding b1", "create i2", "delete i2")
    w.platform.instances = {"i1": True, "i2": False}
    w.platform.bindings = {"b1": PlatformBinding("i1", True, "secret-1")}
    w.results = [
        OpResult("provision", "i1", None, "op-1", "succeeded", killed=True),
        OpResult("bind", "i1", "b1", "op-2", "succeeded", killed=True),
        OpResult("provision", "i2", None, "op-3", "succeeded"),
        OpResult("deprovision", "i2", None, "op-4", "gone"),
    ]
    w.kills = [
        Kill(0, "provision", "broker", 0.3, "in a pass", [1], True),
        Kill(1, "bind", "broker", 0.1, "in the request", [2], True),
    ]
    w.logs = {"broker": []}
    return w


def test_a_clean_end_state_passes_every_row(world: World) -> None:
    rows = world.rows()
    assert len(rows) == 10
    assert all(ok is True for ok in rows.values()), rows


def _lost(w: World) -> None:  # the platform got 202 + succeeded; the store has no such row
    w.platform.instances["i3"] = True  # (so its resource is missing too)


def _lost_binding(w: World) -> None:  # the platform holds credentials of a binding now failed
    w.binding("b2", "i1", state="failed")
    w.platform.bindings["b2"] = PlatformBinding("i1", True, "x")
    w.resource("binding-b2", "x")


def _unknown(w: World) -> None:  # a live record the platform was never told of
    w.instance("i4")
    w.resource("instance-i4")


def _duplicate(w: World) -> None:  # a second create of i1 while the first exists
    w.journal("create i1")


def _orphan(w: World) -> None:  # a resource of a deprovisioned instance left in the cloud
    w.resource("instance-i2")


def _orphan_binding(w: World) -> None:  # a credential with no record at all
    w.resource("binding-b9", "y")


def _missing(w: World) -> None:  # the record lives, the resource is gone
    (w.cloud / "instance-i1").unlink()


def _wrong_credentials(w: World) -> None:  # the cloud's credential is not the platform's
    w.resource("binding-b1", "secret-2")


def _stuck(w: World) -> None:  # an operation still in progress after the run
    w.operation("update", "i1", IN_PROGRESS)


def _held(w: World) -> None:  # the instance still names an operation as its active one
    with w.store.write() as session:
        row = w.store.instance(session, "i1")
        assert row is not None
        row.active_operation_id = "update-0123"


def _gave_up(w: World) -> None:  # the platform polled until its timeout
    w.results.append(OpResult("update", "i1", None, "op-5", "timeout"))


def _failed_on_restart(w: World) -> None:  # an interrupted operation marked failed
    w.results.append(
        OpResult("update", "i1", None, "op-6", "failed", "failed on restart", killed=True)
    )


def _other_failed(w: World) -> None:
    w.results.append(OpResult("bind", "i1", "b4", "op-7", "error", "answered 500"))


def _missed_kill(w: World) -> None:  # the SIGKILL found no live broker
    w.kills[1].died = False


def _log_error(w: World) -> None:
    w.logs["broker"] = scan_log(
        "2026-11-28 01:52:36,739 INFO scoperouter.broker [request -] serving\n"
        "2026-11-28 01:52:37,001 ERROR scoperouter.broker.worker [request -] worker loop error\n"
        "Traceback (most recent call last):\n"
    )


LOST = "0 lost records"
STUCK = "0 operations left in progress"
ORPHANS = "0 orphans in the cloud"
BEHIND = "resources behind the records"
OTHERS = "every other operation succeeded"


@pytest.mark.parametrize(
    ("plant", "rows"),
    [
        # a lost record has no resource (missing too) or one without a record (an orphan too)
        (_lost, {LOST, BEHIND}),
        (_lost_binding, {LOST}),
        (_unknown, {"0 unknown records"}),
        (_duplicate, {"0 duplicates in the cloud"}),
        (_orphan, {ORPHANS}),
        (_orphan_binding, {ORPHANS}),
        (_missing, {BEHIND}),
        (_wrong_credentials, {BEHIND}),
        (_stuck, {STUCK}),
        (_held, {STUCK}),
        (_gave_up, {STUCK, OTHERS}),  # and an operation that did not succeed
        (_failed_on_restart, {"interrupted operations succeeded"}),
        (_other_failed, {OTHERS}),
        (_missed_kill, {"SIGKILLs delivered"}),
        (_log_error, {"brokers' logs"}),
    ],
)
def test_each_planted_fault_is_a_miss_of_its_row(
    world: World, plant: Callable[[World], None], rows: set[str]
) -> None:
    plant(world)
    got = world.rows()
    assert {name for name, ok in got.items() if ok is False} == rows, got


def test_fewer_kills_than_planned_is_a_miss(world: World) -> None:
    assert world.rows(planned=3)["SIGKILLs delivered"] is False


def test_the_journal_replay_counts_a_replaced_credential_once() -> None:
    """A bind re-run after a crash deletes the credential whose secret was lost and makes a
    new one: no duplicate. A create with no delete between: one."""
    replaced = ["create-binding b1", "delete-binding b1", "create-binding b1"]
    assert duplicates(replaced) == (2, [])
    assert duplicates(["create-binding b1", "create-binding b1"]) == (
        2,
        ["create-binding b1 again (2 at once)"],
    )
    assert duplicates(["create i1", "delete i1", "create i1", "pass i1 0 1 2 3"]) == (2, [])


def test_who_finished_a_killed_operation_is_read_from_the_logs() -> None:
    line = (
        "2026-11-28 01:52:47,704 INFO scoperouter.broker.worker [request r] "
        "bind bind-1: succeeded: bound\n"
    )
    at = datetime.strptime("2026-11-28 01:52:46,000", "%Y-%m-%d %H:%M:%S,%f").timestamp()
    kill = Kill(0, "bind", "replica0", 0.1, "in a pass", [1], True, at=at, operation="bind-1")
    assert finisher(kill, {"replica0": "", "replica1": line}) == FINISHERS[2]
    assert finisher(kill, {"replica0": line, "replica1": ""}) == FINISHERS[1]
    kill.at += 2.0  # the line was written before the SIGKILL
    assert finisher(kill, {"replica0": line, "replica1": ""}) == FINISHERS[0]
    kill.target = "replica1+replica0"  # both killed: whoever wrote it was restarted
    kill.at -= 2.0
    assert finisher(kill, {"replica0": "", "replica1": line}) == FINISHERS[1]
    assert finisher(kill, {"replica0": "", "replica1": ""}) == "unknown"
    kill.operation = None  # a request killed, sent again and answered 200: no operation id
    assert finisher(kill, {"replica0": line, "replica1": line}) == NO_OPERATION


def test_a_run_without_kills_is_inconclusive_and_fails(world: World) -> None:
    """No kill planned, none sent, nothing interrupted: the rows that judge the kills cannot
    be computed; the run exits 1 (it used to PASS "0 of 0 sent")."""
    world.kills = []
    world.results = [r for r in world.results if not r.killed]
    observed = observe(world.store, world.cloud)
    rows = verdicts(world.platform, world.results, observed, world.kills, 0, world.logs)
    got = {row.name: row.ok for row in rows}
    assert got["SIGKILLs delivered"] is None
    assert got["interrupted operations succeeded"] is None
    status, lines = summary([DbRun("sqlite", rows=rows)])
    assert status == 1
    assert "INCONCLUSIVE: SIGKILLs delivered: 0 of 0 sent: none planned" in "\n".join(lines)
