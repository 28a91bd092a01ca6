"""The verdict of ``python -m bench.kills``: what the platform was told, what the broker's store
holds and what the fake service's "cloud" (a folder, tests/broker/fakes.py) holds, compared.

:func:`observe` reads a store and a cloud folder into an :class:`Observed`; :func:`verdicts`
turns it, with the platform's view (:class:`PlatformView`), the operations' outcomes and the
kills, into PASS/MISS rows. Pure functions of what they are given, so a test can plant each
fault (a lost record, a duplicate, an orphan, a stuck operation) and see its MISS.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.report import Target
from scoperouter.broker.store import Store
from scoperouter.broker.tables import (
    BINDING,
    BOUND,
    DEPROVISIONING,
    GONE,
    IN_PROGRESS,
    PROVISIONED,
    PROVISIONING,
    UNBINDING,
    UPDATING,
    Binding,
    Instance,
    Operation,
)

EXAMPLES = 5
# what the platform accepts as the end of an operation it polled: `succeeded`, or 410 Gone for
# the two deletions (the record is gone: last_operation of it answers 410, as OSB allows)
FINISHED = {"succeeded"}
GONE_OK = {"deprovision", "unbind"}
# where a kill fell (kills.py decides it from the store just before the SIGKILL)
WHERE = (
    "in the request",  # sent, not answered yet: the platform re-sends it
    "in a pass",  # the killed process held the operation's lease
    "between passes",  # in progress, no lease (released for its next pass, or not yet claimed)
    "in the other replica's pass",  # PostgreSQL: the lease was the other replica's
    "after the operation",  # it had finished already: a kill between operations
)


@dataclass
class PlatformBinding:
    instance_id: str
    exists: bool
    password: str | None = None  # the credentials the platform received


@dataclass
class PlatformView:
    """What the platform was told: every instance and binding it believes exists (or was
    deleted), with the credentials it holds."""

    instances: dict[str, bool] = field(default_factory=dict)  # id -> exists
    bindings: dict[str, PlatformBinding] = field(default_factory=dict)

    def live_instances(self) -> set[str]:
        return {i for i, exists in self.instances.items() if exists}

    def live_bindings(self) -> set[str]:
        return {b for b, v in self.bindings.items() if v.exists}


@dataclass
class OpResult:
    """One operation as the platform saw it end."""

    kind: str
    instance_id: str
    binding_id: str | None
    operation: str | None
    state: str  # succeeded, failed, gone (410), timeout, error
    description: str = ""
    killed: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.state in FINISHED or (self.state == "gone" and self.kind in GONE_OK)


@dataclass
class Kill:
    index: int
    kind: str
    target: str  # which broker: "broker" (SQLite), "replica0", "replica1", "replica1+replica0"
    delay_s: float
    where: str = ""
    pids: list[int] = field(default_factory=list)
    died: bool = False  # each targeted process was alive and SIGKILL ended it
    restart_s: float | None = None
    at: float = 0.0  # time.time() of the SIGKILL
    operation: str | None = None
    finished_by: str = ""  # see FINISHERS


# who recorded the end of a killed operation (from the brokers' logs)
FINISHERS = ("the killed process, before the kill", "the restarted process", "the other replica")
NO_OPERATION = "none the platform knows (the request, sent again, was answered at once)"


@dataclass
class Observed:
    """The store's rows and the cloud's folder after the run (the brokers stopped)."""

    instances: dict[str, str] = field(default_factory=dict)  # id -> state
    bindings: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (instance, state)
    in_progress: list[str] = field(default_factory=list)  # "kind id: description"
    held: list[str] = field(default_factory=list)  # rows still naming an active operation
    journal: list[str] = field(default_factory=list)
    cloud: dict[str, str] = field(default_factory=dict)  # file name -> content


def observe(store: Store, state_dir: Path) -> Observed:
    out = Observed()
    with store.read() as session:
        for instance in session.query(Instance).all():
            out.instances[instance.id] = instance.state
            if instance.active_operation_id is not None:
                out.held.append(f"instance {instance.id}: {instance.active_operation_id}")
            elif instance.state in (PROVISIONING, UPDATING, DEPROVISIONING):
                out.held.append(f"instance {instance.id}: {instance.state}")
        for binding in session.query(Binding).all():
            out.bindings[binding.id] = (binding.instance_id, binding.state)
            if binding.state in (BINDING, UNBINDING):
                out.held.append(f"binding {binding.id}: {binding.state}")
        for op in session.query(Operation).filter(Operation.state == IN_PROGRESS).all():
            out.in_progress.append(f"{op.kind} {op.id}: {op.description}")
    if state_dir.exists():
        for path in sorted(state_dir.iterdir()):
            if path.name == "journal":
                out.journal = path.read_text().splitlines()
            elif path.name.startswith(("instance-", "binding-")):
                out.cloud[path.name] = path.read_text()
    return out


def duplicates(journal: Iterable[str]) -> tuple[int, list[str]]:
    """Replay the cloud's journal: a create of a resource that exists (not deleted since its
    last create) is a second resource for one instance or binding. Returns (creates, the
    duplicates)."""
    live: Counter[str] = Counter()
    creates = 0
    found = []
    for line in journal:
        what, _, rest = line.partition(" ")
        ident = rest.split(" ", 1)[0]
        if what in ("create", "create-binding"):
            creates += 1
            key = f"{what} {ident}"
            if live[key]:
                found.append(f"{key} again ({live[key] + 1} at once)")
            live[key] += 1
        elif what in ("delete", "delete-binding"):
            key = f"create{what[len('delete') :]} {ident}"
            live[key] = max(0, live[key] - 1)
    return creates, found


def _examples(items: list[str]) -> str:
    shown = ", ".join(items[:EXAMPLES])
    return shown + (f" (+{len(items) - EXAMPLES})" if len(items) > EXAMPLES else "")


def _measured(count: int, of: str, items: list[str]) -> str:
    return f"{count} {of}" + (f": {_examples(items)}" if items else "")


def verdicts(
    platform: PlatformView,
    results: list[OpResult],
    observed: Observed,
    kills: list[Kill],
    kills_planned: int,
    log_problems: Mapping[str, list[str]] | None = None,
) -> list[Target]:
    rows: list[Target] = []

    # the kills themselves: each found a live broker and ended it
    died = sum(1 for k in kills if k.died)
    rows.append(
        Target(
            "SIGKILLs delivered",
            f"{kills_planned}, each ending a live broker",
            f"{died} of {len(kills)} sent" + ("" if kills_planned else ": none planned"),
            died == kills_planned == len(kills) if kills_planned else None,
        )
    )

    # records: the platform's view against the store, both ways
    live = {i for i, s in observed.instances.items() if s != GONE}
    lost = [
        f"instance {i} ({observed.instances.get(i, 'no record')})"
        for i in sorted(platform.live_instances())
        if observed.instances.get(i) != PROVISIONED
    ]
    lost += [
        f"binding {b} ({observed.bindings.get(b, ('', 'no record'))[1]})"
        for b in sorted(platform.live_bindings())
        if observed.bindings.get(b, ("", ""))[1] != BOUND
    ]
    unknown = [
        f"instance {i} ({observed.instances[i]})"
        for i in sorted(live)
        if i not in platform.live_instances()
    ]
    live_bindings = sorted(b for b, (_, s) in observed.bindings.items() if s != GONE)
    unknown += [
        f"binding {b} ({observed.bindings[b][1]})"
        for b in live_bindings
        if b not in platform.live_bindings()
    ]
    n_inst, n_bind = len(platform.live_instances()), len(platform.live_bindings())
    rows.append(
        Target(
            "0 lost records",
            "every instance/binding the platform was told exists is in the store",
            _measured(len(lost), f"lost of {n_inst} instances, {n_bind} bindings", lost),
            not lost,
        )
    )
    rows.append(
        Target(
            "0 unknown records",
            "every live record in the store is one the platform was told exists",
            _measured(len(unknown), f"unknown of {len(live)} live instances", unknown),
            not unknown,
        )
    )

    # the cloud: one resource per instance/binding ever, none without a record, none missing
    creates, dups = duplicates(observed.journal)
    rows.append(
        Target(
            "0 duplicates in the cloud",
            "one resource per instance/binding at a time (the journal replayed)",
            _measured(len(dups), f"duplicates in {creates} creates", dups),
            not dups,
        )
    )
    orphans = []
    for name in sorted(observed.cloud):
        kind, _, ident = name.partition("-")
        if kind == "instance" and observed.instances.get(ident, GONE) == GONE:
            orphans.append(name)
        if kind == "binding" and observed.bindings.get(ident, ("", GONE))[1] == GONE:
            orphans.append(name)
    rows.append(
        Target(
            "0 orphans in the cloud",
            "no resource without a live record",
            _measured(len(orphans), f"orphans of {len(observed.cloud)} resources", orphans),
            not orphans,
        )
    )
    missing = [f"instance-{i}" for i in sorted(platform.live_instances())]
    missing = [m for m in missing if m not in observed.cloud]
    wrong = []
    for b in sorted(platform.live_bindings()):
        held = platform.bindings[b].password
        there = observed.cloud.get(f"binding-{b}")
        if there is None:
            missing.append(f"binding-{b}")
        elif held != there:
            wrong.append(f"binding {b}")
    rows.append(
        Target(
            "resources behind the records",
            "each live instance/binding has its resource; the credentials the platform "
            "holds are the cloud's",
            _measured(len(missing), "missing", missing)
            + "; "
            + _measured(len(wrong), "credentials not the cloud's", wrong),
            not missing and not wrong,
        )
    )

    # operations: none left in progress, every one (the interrupted ones above all) succeeded
    stuck = observed.in_progress + observed.held
    stuck += [
        f"{r.kind} {r.operation or r.instance_id}: still in progress when the platform gave up"
        for r in results
        if r.state == "timeout"
    ]
    rows.append(
        Target(
            "0 operations left in progress",
            "none in the store, no row naming an active one, none the platform gave up on",
            _measured(len(stuck), "in progress", stuck),
            not stuck,
        )
    )
    interrupted = [r for r in results if r.killed]
    bad = [f"{r.kind} {r.instance_id}: {r.state}: {r.description}" for r in interrupted if not r.ok]
    rows.append(
        Target(
            "interrupted operations succeeded",
            "each finishes `succeeded` (not failed on restart)",
            f"{len(interrupted) - len(bad)} of {len(interrupted)}"
            + (f": {_examples(bad)}" if bad else "")
            + ("" if interrupted else ": no operation was interrupted"),
            not bad if interrupted else None,
        )
    )
    others = [
        f"{r.kind} {r.instance_id}: {r.state}: {r.description}"
        for r in results
        if not r.killed and not r.ok
    ]
    rows.append(
        Target(
            "every other operation succeeded",
            "the set-up's, the binds before a deprovision, the orphan mitigation's",
            f"{len(results) - len(interrupted) - len(others)} of {len(results) - len(interrupted)}"
            + (f": {_examples(others)}" if others else ""),
            not others,
        )
    )
    if log_problems is not None:
        problems = [f"{name}: {line}" for name, lines in log_problems.items() for line in lines]
        rows.append(
            Target(
                "brokers' logs",
                "0 tracebacks, 0 ERROR lines",
                _measured(len(problems), "found", problems),
                not problems,
            )
        )
    return rows


def where_counts(kills: list[Kill]) -> dict[str, int]:
    counts = Counter(k.where for k in kills)
    return {w: counts[w] for w in WHERE if counts[w]} | {
        w: n for w, n in counts.items() if w not in WHERE
    }


def finisher(kill: Kill, logs: Mapping[str, str]) -> str:
    """Which process recorded the end of the killed operation: the worker's line
    ``<kind> <operation>: succeeded: ...`` (or failed) in a broker's log (the restarted
    process writes to its predecessor's log), and when (local time, as the log's)."""
    if kill.operation is None:  # the platform never learnt its id: answered 200 when re-sent
        return NO_OPERATION
    needle = f" {kill.operation}: "
    for name, text in logs.items():
        for line in text.splitlines():
            if needle not in line or " scoperouter.broker.worker " not in line:
                continue
            if not any(f"{needle}{state}:" in line for state in ("succeeded", "failed")):
                continue
            if name not in kill.target.split("+"):
                return FINISHERS[2]
            try:
                when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                return "unknown"
            return FINISHERS[0] if when < kill.at else FINISHERS[1]
    return "unknown"


def scan_log(text: str) -> list[str]:
    """A broker log's problems: traceback headers and ERROR/CRITICAL lines (its format:
    ``time LEVEL logger [request id] message``)."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 4)
        level = parts[2] if len(parts) > 2 else ""
        if line.startswith("Traceback") or level in ("ERROR", "CRITICAL"):
            out.append(line.strip()[:300])
    return out


def as_dict(item: Any) -> dict[str, Any]:
    return asdict(item)
