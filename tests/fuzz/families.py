"""The families of a fuzz run: their share of the time and of the inputs, the minimum each
must send, and the invariants that are arithmetic (no I/O, unit-tested in
tests/unit/test_fuzz_harness.py).

* ``raw``: raw request bytes at the frontends and the plain forward proxy (:mod:`.inputs`);
* ``tunnel``: the same bytes inside TLS tunnels the forward proxy intercepts (:mod:`.tunnel`);
* ``scope``: list reads with ``&``/``|`` scope expressions (:mod:`.scopes`);
* ``osb``: OSB requests with hostile parameters at a broker with an Ansible pack (:mod:`.osb`).

A family that sent fewer inputs than its minimum fails the run with the reason: a gate that
ran nothing is a failure, not a pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("raw", "tunnel", "scope", "osb")
# Shares of --seconds and --inputs (of the selected families). The OSB family's inputs are
# slower (a broker round trip, some an Ansible run): its share of the inputs is small.
TIME_WEIGHTS = {"raw": 45, "tunnel": 20, "scope": 12, "osb": 23}
INPUT_WEIGHTS = {"raw": 70, "tunnel": 15, "scope": 14, "osb": 1}
# The least each family must send in a run of the CI's size (.ci/run: --seconds 100 on a
# loaded 2-core machine sends several times these); a smaller --inputs lowers them.
MINIMUM = {"raw": 2000, "tunnel": 300, "scope": 300, "osb": 100}


@dataclass
class Family:
    name: str
    seconds: float  # its share of --seconds
    quota: int  # its share of --inputs
    minimum: int
    inputs: int = 0
    elapsed: float = 0.0
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    first_broken: int | None = None  # the lowest input that broke an invariant: how soon

    def violation(self, seed: int, n: int | None, text: str) -> None:
        """A broken invariant, said with what reproduces it."""
        where = f"input {n} " if n is not None else ""
        if n is not None and (self.first_broken is None or n < self.first_broken):
            self.first_broken = n
        again = f" (--family {self.name} --seed {seed} --only {n} --show)" if n is not None else ""
        self.violations.append(f"[{self.name}] {where}{text}{again}")


def select(text: str) -> list[str]:
    """``--family raw,scope`` -> the families in run order; ``all`` is every one."""
    names = FAMILIES if text == "all" else tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"unknown family {unknown or text!r}: choose from {', '.join(FAMILIES)}")
    return [x for x in FAMILIES if x in names]


def plan(names: Iterable[str], seconds: float, inputs: int, only: bool) -> dict[str, Family]:
    """Each selected family with its share of the time and of the inputs, and its minimum
    (none for a single ``--only`` input)."""
    names = list(names)
    time_total = sum(TIME_WEIGHTS[x] for x in names)
    input_total = sum(INPUT_WEIGHTS[x] for x in names)
    families = {}
    for name in names:
        quota = 1 if only else max(1, inputs * INPUT_WEIGHTS[name] // input_total)
        minimum = 0 if only else min(MINIMUM[name], quota)
        share = seconds * TIME_WEIGHTS[name] / time_total
        families[name] = Family(name, share, quota, minimum)
    return families


def minimum_gate(family: Family) -> str | None:
    """The reason the family fails for having sent too little, or None."""
    if family.inputs >= family.minimum:
        return None
    return (
        f"[{family.name}] sent {family.inputs} inputs in {family.elapsed:.0f} s, fewer than its "
        f"minimum {family.minimum}: a gate that ran nothing (or too little) is a failure"
    )


_CLOUD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def distinct_clouds(expression: str) -> int:
    """How many distinct clouds an expression names, whatever their case: the most backend
    requests one list read with it may cost."""
    return len({name.casefold() for name in _CLOUD.findall(expression)})


def amplification(named: Mapping[int, int], received: Mapping[int, int]) -> list[tuple[int, str]]:
    """Inputs whose client request cost more backend requests than the clouds it named:
    (input, why) for each; `named`: input -> distinct clouds, `received`: input -> backend
    requests counted at the recording backends."""
    return [
        (n, f"{received[n]} backend requests for one request naming {named.get(n, 0)} cloud(s)")
        for n in sorted(received)
        if received[n] > named.get(n, 0)
    ]


def rss_back(before: Mapping[str, float], after: Mapping[str, float], slack: float) -> list[str]:
    """Workers whose RSS (MB) did not come back within `slack` of where it was."""
    return [
        f"{worker}: RSS {before[worker]:.1f} -> {after[worker]:.1f} MB (more than +{slack:g})"
        for worker in sorted(after)
        if before.get(worker) and after[worker] - before[worker] > slack
    ]
