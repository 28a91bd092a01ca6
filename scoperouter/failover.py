"""``A | B``: which cloud to try next, and when (pure, no I/O).

The candidates are tried left to right. A failure moves to the next candidate only when it
says something about the *cloud*, never about the request:

* the connection was refused, broke, or did not open in time, before anything was sent:
  any request moves on (nothing happened there);
* the cloud answered 5xx, did not answer in time, or broke its answer after the request was
  sent: only an *idempotent* request moves on (``GET``, ``HEAD``, ``OPTIONS``, ``PUT``,
  ``DELETE``; RFC 9110 9.2.2); a ``POST`` may have taken effect, so its failure is the answer;
* any 1xx-4xx answer is the answer (a 404 from the first cloud does not ask the second: the
  scope said to use the first one that works, and it works).

A cloud the router already knows to be down is skipped without waiting: the engine supplies
an :data:`IsDown` predicate backed by its peer health (the circuit breaker of
``scoperouter.router.health`` keys upstreams by ``scheme://host:port`` of
``Forward.url``), and reports each outcome back so that one failure serves every later request
(:data:`Report`). When every candidate is skipped the answer is a 503 naming each.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from scoperouter.routing import Forward
from scoperouter.semantics import IDEMPOTENT

IsDown = Callable[[Forward], str | None]
"""The engine's peer health: why the upstream of this forward is marked down, or None when
it may be tried."""

Report = Callable[[Forward, str | None], None]
"""Told the outcome of each attempt: None when the upstream answered (even with an error
status below 500), else why it failed, in words. The engine feeds its circuit breaker."""


class Failure(enum.Enum):
    """How an attempt failed, as the engine's send function saw it."""

    NOT_SENT = "it refused the connection or did not accept one in time"  # nothing was sent
    TIMEOUT = "it did not answer in time"  # the request was sent
    BROKEN = "its answer failed"  # the connection broke after the request was sent
    ERROR_STATUS = "it answered with a server error"  # 5xx


def classify(status: int | None, failure: Failure | None) -> Failure | None:
    """The failure an attempt's outcome means (None: the attempt is the answer)."""
    if failure is not None:
        return failure
    if status is not None and status >= 500:
        return Failure.ERROR_STATUS
    return None


def moves_on(method: str, failure: Failure | None) -> bool:
    """Whether the next candidate is tried after this outcome."""
    if failure is None:
        return False
    return failure is Failure.NOT_SENT or method.upper() in IDEMPOTENT


C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Skipped(Generic[C]):
    """A candidate left out because the engine's peer health marks it down."""

    candidate: C
    reason: str


def candidates(
    items: Sequence[C], is_down: Callable[[C], str | None] | None = None
) -> tuple[list[C], list[Skipped[C]]]:
    """The candidates to try, in order, and those skipped as down (the engine's predicate,
    e.g. an :data:`IsDown` on Forwards). When every one is down none is tried and the caller
    answers 503: letting a probe through after the down period is the engine breaker's call,
    made in its predicate."""
    if is_down is None:
        return list(items), []
    tried: list[C] = []
    skipped: list[Skipped[C]] = []
    for item in items:
        reason = is_down(item)
        if reason is None:
            tried.append(item)
        else:
            skipped.append(Skipped(item, reason))
    return tried, skipped


def all_down_message(skipped: Sequence[Skipped[Forward]]) -> str:
    """The 503's message when no candidate may be tried."""
    names = " | ".join(s.candidate.cloud for s in skipped)
    reasons = "; ".join(f"{s.candidate.cloud}: {s.reason}" for s in skipped)
    return f"{names}: every cloud is marked down ({reasons}); retry later"


def exhausted_message(service_type: str, tried: Sequence[tuple[str, str]]) -> str:
    """The message when every candidate failed: `tried` is (cloud, why) in order."""
    names = " | ".join(cloud for cloud, _ in tried)
    reasons = "; ".join(f"{cloud}: {why}" for cloud, why in tried)
    return f"{names} for {service_type!r}: no cloud answered ({reasons})"
