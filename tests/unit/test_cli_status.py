"""`scoperouter status`'s lines, problems, skew and table from fake status documents (real
routers: tests/integration/test_status.py; the lab: tests/e2e/test_status.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from scoperouter.catalog import Frontend, parse_url
from scoperouter.cli.status import (
    Row,
    address_of,
    problems,
    row_of,
    skew,
    table_rows,
)
from scoperouter.cli.table import format_table
from scoperouter.config import load_catalog

from .conftest import SAMPLE

NOW = 1_000_000.0


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cloud": "CloudOne",
        "status": "ok",
        "version": "0.1.0",
        "workers": {"running": 2, "wanted": 2},
        "traffic": {"requests_per_second": 4.5, "error_ratio": 0.01, "p99_seconds": 0.25},
        "config": {"generation": 3, "digest": "abcdef012345"},
        "peer_links": {"up": 1, "total": 1},
        "breakers_open": 0,
        "upstreams": [{"upstream": "http://b:1", "up": True, "breaker_open": False}],
        "certificates": [
            {"role": "peer_ca", "subject": "ca", "not_after": NOW + 400 * 86400},
            {"role": "peer_cert", "subject": "one", "not_after": NOW + 10 * 86400},
        ],
    }
    doc.update(changes)
    return doc


def test_a_line_from_a_status_document() -> None:
    row = row_of("CloudOne", "127.0.0.2:9180", _doc(), NOW)
    assert (row.router, row.workers_running, row.workers_wanted) == ("up", 2, 2)
    assert (row.generation, row.digest) == (3, "abcdef012345")
    assert (row.next_expiry_days, row.next_expiry) == (10.0, "peer_cert one")
    assert table_rows([row]) == [
        ["CloudOne", "up", "2/2", "4.50", "1.00%", "250 ms", "1/1", "0", "10 d",
         "3 abcdef012345"],
    ]  # fmt: skip
    # a certificate expiring within the threshold is a problem, not beyond it
    assert problems([row], 14) == ["CloudOne: certificate peer_cert one expires in 10 days"]
    assert problems([row], 7) == []


def test_whatever_a_router_answers_is_checked_and_shortened() -> None:
    hostile = "\x1b]0;owned\x07" + "x" * 200
    doc = _doc(
        status=hostile,
        workers="many",
        traffic={"requests_per_second": "fast", "p99_seconds": True},
        config={"generation": 1.5, "digest": ["x"]},
        upstreams=[{"upstream": hostile, "up": False}, "junk"],
        certificates=[{"not_after": "soon"}, None],
    )
    row = row_of("CloudOne", "h:1", doc, NOW)
    assert row.status is not None and "\x1b" not in row.status and len(row.status) == 64
    assert row.workers_running is None and row.requests_per_second is None
    assert row.p99_seconds is None and row.generation is None and row.next_expiry is None
    assert row.upstreams_down == [row.status]
    assert problems([row], 14) == [f"CloudOne: upstream {row.status} down"]


def test_down_and_unmonitored_routers() -> None:
    down = Row("CloudTwo", "down", address="127.0.0.3:9180", error="connection refused")
    unmonitored = Row("CloudDown", "unmonitored", error="no metrics.listen")
    assert problems([down, unmonitored], 14) == [
        "CloudTwo: router down at 127.0.0.3:9180 (connection refused)"
    ]
    rows = table_rows([down])
    assert rows[0][:2] == ["CloudTwo", "down (connection refused)"] and set(rows[0][2:]) == {"-"}


def test_skew_is_flagged_between_routers_that_are_up() -> None:
    one = row_of("CloudOne", "a", _doc(), NOW)
    two = row_of("CloudTwo", "b", _doc(config={"generation": 1, "digest": "999999999999"}), NOW)
    down = Row("CloudThree", "down", digest="000000000000")
    assert skew([one, two, down]) == ["config skew: 999999999999: CloudTwo; abcdef012345: CloudOne"]
    assert skew([one, dataclasses.replace(two, digest=one.digest)]) == []
    three = dataclasses.replace(one, cloud="CloudThree", version="0.2.0")
    assert skew([one, three]) == ["version skew: 0.1.0: CloudOne; 0.2.0: CloudThree"]


def test_the_table_is_boxed_as_osc_prints_it() -> None:
    assert format_table(("A", "Bee"), [["x", 1], ["long value", ""]]) == (
        "+------------+-----+\n"
        "| A          | Bee |\n"
        "+------------+-----+\n"
        "| x          | 1   |\n"
        "| long value |     |\n"
        "+------------+-----+"
    )


def test_a_wildcard_listen_address_is_asked_on_the_clouds_host() -> None:
    one = load_catalog(SAMPLE).clouds["CloudOne"]
    assert address_of(one) == ("127.0.0.2", 9180)
    wildcard = dataclasses.replace(one, metrics_listen=("0.0.0.0", 9180))
    assert address_of(wildcard) == ("127.0.0.2", 9180)
    assert address_of(dataclasses.replace(one, metrics_listen=None)) is None
    front = Frontend(parse_url("http://router.example:5000"), "0.0.0.0", 5000)
    other = dataclasses.replace(one, metrics_listen=("::", 9), frontends=(front,))
    assert address_of(other) == ("router.example", 9)
