"""The chaos run's verdict (``python -m bench.chaos``): pure functions of what the run recorded.

A client request ends in one of the outcomes of :data:`OUTCOMES`; a broker operation in one of
:data:`OP_STATES`. :func:`classify_answer` turns an HTTP answer into an outcome,
:func:`verdicts` turns a :class:`Record` (requests, operations, faults, the repair report, the
logs' findings) into PASS, MISS or INCONCLUSIVE rows (nothing measured it: an empty run fails)
and :func:`render` prints the summary. Every goal is here
(and in bench/README.md, "Under faults").
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.report import Target, table, targets_table
from bench.soak_verdict import LogFindings

# What a client request ended with. The first four are clean ends (what an OpenStack CLI user
# may see while things fail: its answer, an error it can print, "unable to establish
# connection" while the router it talks to is down or restarting, a connection closed under
# it by a SIGKILLed worker); the last three are the MISSes.
OK = "ok"  # 2xx with the JSON the request deserves
JSON_ERROR = "JSON error"  # >= 400 with a JSON error body
REFUSED = "refused"  # no connection: the entry router is down or restarting
DROPPED = "dropped"  # the connection closed or was reset before an answer
HANG = "hang"  # no complete answer within the deadline
NON_JSON = "non-JSON error"  # >= 400 whose body is not JSON
WRONG = "wrong answer"  # 2xx that is not what the request deserves (a partial & list...)
OUTCOMES = (OK, JSON_ERROR, REFUSED, DROPPED, HANG, NON_JSON, WRONG)
CLEAN = (OK, JSON_ERROR, REFUSED, DROPPED)

# What a broker operation ended with.
SUCCEEDED = "succeeded"
FAILED = "failed"
GONE = "gone"  # last_operation answered 410: an unbind or deprovision that succeeded
STUCK = "stuck"  # still "in progress" (or unknown) past its deadline and the slack
REJECTED = "rejected"  # the broker never accepted it (a JSON error answer to the request)
OP_STATES = (SUCCEEDED, FAILED, GONE, STUCK, REJECTED)
EXAMPLES = 5


def json_error(content_type: str, body: bytes) -> bool:
    """Whether an error body is JSON (the router's ``{"error": {...}}``, or a service's own
    OpenStack JSON error, which the clients print just the same)."""
    if "json" not in content_type.split(";")[0].strip().lower():
        return False
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return isinstance(document, dict) and bool(document)


def classify_answer(
    status: int, content_type: str, body: bytes, elapsed: float, deadline: float
) -> str:
    """The outcome of a complete answer. An answer later than the deadline is a hang: the
    client gave up before it (a CLI's timeout)."""
    if elapsed > deadline:
        return HANG
    if status >= 400:
        return JSON_ERROR if json_error(content_type, body) else NON_JSON
    if not 200 <= status < 300:
        return WRONG
    try:
        json.loads(body)
    except ValueError:
        return WRONG
    return OK


@dataclass
class Record:
    """Everything the run saw; the verdicts are functions of it."""

    duration: float
    deadline: float
    seed: int
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, outcome)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)  # (kind, status)
    examples: dict[str, list[str]] = field(default_factory=dict)  # outcome -> examples
    slowest: float = 0.0  # the longest a request took, seconds
    operations: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    repair: dict[str, Any] | None = None  # `broker repair --json`, None: not run
    repair_error: str = ""
    # instances the drain could not remove; records the database holds at the end (operations
    # in progress, instances not gone, bindings not unbound)
    leftovers: list[str] = field(default_factory=list)
    logs: dict[str, LogFindings] = field(default_factory=dict)
    broker_non_json: int = 0  # the brokers' error answers that were not JSON objects

    def broker_error(self, detail: str) -> None:
        self.broker_non_json += 1
        examples = self.examples.setdefault("broker non-JSON error", [])
        if len(examples) < EXAMPLES:
            examples.append(detail[:400])

    def request(self, kind: str, outcome: str, detail: str = "", status: int = 0) -> None:
        self.requests[(kind, outcome)] += 1
        if status:
            self.statuses[(kind, status)] += 1
        if outcome not in (OK, JSON_ERROR):
            examples = self.examples.setdefault(outcome, [])
            if len(examples) < EXAMPLES:
                examples.append(f"{kind}: {detail}"[:400])

    def outcomes(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for (_, outcome), n in self.requests.items():
            out[outcome] += n
        return out

    def op_states(self) -> Counter[str]:
        return Counter(op["state"] for op in self.operations)


def drift(report: dict[str, Any] | None) -> list[str]:
    """What `broker repair --json` found wrong: orphans, missing resources, clouds it could not
    read, errors (each as a short line)."""
    if report is None:
        return ["broker repair did not run"]
    out = []
    for key in ("orphans", "missing", "unchecked", "errors"):
        for item in report.get(key) or []:
            out.append(f"{key}: {json.dumps(item, sort_keys=True, default=str)[:200]}")
    return out


def verdicts(record: Record) -> list[Target]:
    """The chaos run's assertions, each PASS, MISS or INCONCLUSIVE (nothing measured it)."""
    got = record.outcomes()
    total = sum(got.values())
    rows = [
        Target(
            "every client request ended in time",
            f"0 hangs (deadline {record.deadline:g} s)",
            f"{total:,} requests: {got[HANG]} hangs; slowest {record.slowest:.1f} s"
            if total
            else "no request sent",
            got[HANG] == 0 if total else None,
        ),
        Target(
            "errors are clean JSON",
            "0 non-JSON errors (clients' and brokers'), 0 wrong answers",
            f"{got[JSON_ERROR]} JSON errors, {got[NON_JSON]} non-JSON, {got[WRONG]} wrong; "
            f"brokers: {record.broker_non_json} non-JSON" + ("" if total else "; no request sent"),
            got[NON_JSON] == 0 and got[WRONG] == 0 and record.broker_non_json == 0
            if total
            else None,
        ),
    ]
    states = record.op_states()
    undescribed = [
        op
        for op in record.operations
        if op["state"] in (FAILED, REJECTED) and not str(op.get("description") or "").strip()
    ]
    rows.append(
        Target(
            "every broker operation ended",
            "0 stuck; every failure described",
            f"{len(record.operations)} operations: "
            + ", ".join(f"{states[s]} {s}" for s in OP_STATES if states[s])
            + f"; {len(undescribed)} failures without a description"
            + ("" if record.operations else ": none run"),
            states[STUCK] == 0 and not undescribed if record.operations else None,
        )
    )
    found = drift(record.repair)
    if record.repair_error:
        found.append(f"repair: {record.repair_error}")
    found += [f"left over: {x}" for x in record.leftovers]
    rows.append(
        Target(
            "no drift afterwards (broker repair)",
            "0 orphans, 0 missing, every cloud read; every instance gone, no record in progress",
            "none" if not found else f"{len(found)}: {found[0]}",
            not found,
        )
    )
    tracebacks = {name: f.tracebacks for name, f in record.logs.items() if f.tracebacks}
    rows.append(
        Target(
            "routers' and brokers' logs",
            "0 tracebacks",
            ", ".join(f"{n}: {c}" for n, c in sorted(tracebacks.items()))
            or ("0 tracebacks" if record.logs else "no log read"),
            not tracebacks if record.logs else None,
        )
    )
    kinds = Counter(f["kind"] for f in record.faults if f.get("done"))
    done = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    failed = [f for f in record.faults if not f.get("done")]
    rows.append(
        Target(
            "the faults happened",
            "each planned fault done",
            f"{sum(kinds.values())} done ({done})"
            + (f"; {len(failed)} not done: {failed[0].get('error', '')[:120]}" if failed else "")
            + ("" if record.faults else ": none planned"),
            not failed if record.faults else None,
        )
    )
    return rows


def render(record: Record, rows: list[Target]) -> str:
    kinds = sorted({kind for kind, _ in record.requests})
    per_kind = [[kind] + [f"{record.requests[(kind, o)]:,}" for o in OUTCOMES] for kind in kinds]
    parts = [
        f"chaos run: {record.duration:g} s of traffic, seed {record.seed}",
        "",
        table(["request", *OUTCOMES], per_kind),
        "",
        table(
            ["t (s)", "fault", "target", "took (s)", "done"],
            [
                [
                    f"{f['t']:.0f}",
                    f["kind"],
                    f.get("target", ""),
                    f"{f.get('took', 0):.1f}",
                    "yes" if f.get("done") else f"no: {f.get('error', '')[:60]}",
                ]
                for f in record.faults
            ],
            align="rllrl",
        ),
    ]
    ops = Counter((op["kind"], op["state"]) for op in record.operations)
    if ops:
        names = sorted({k for k, _ in ops})
        parts += [
            "",
            table(
                ["broker operation", *OP_STATES],
                [[k] + [str(ops[(k, s)]) for s in OP_STATES] for k in names],
            ),
        ]
    for outcome, examples in sorted(record.examples.items()):
        parts += ["", f"{outcome}, first examples:"] + [f"  {e}" for e in examples]
    odd = [op for op in record.operations if op["state"] in (STUCK, FAILED, REJECTED)]
    if odd:
        parts += ["", "broker operations that did not succeed (first 10):"]
        parts += [
            f"  {op['kind']} {op['instance']}: {op['state']}: {str(op.get('description'))[:200]}"
            for op in odd[:10]
        ]
    for name, findings in sorted(record.logs.items()):
        if findings.examples:
            parts += ["", f"{name}'s log, first findings:"]
            parts += [f"  {e[:300]}" for e in findings.examples]
    parts += ["", targets_table(rows)]
    return "\n".join(parts)
