"""``scoperouter broker status``: the summary the broker's metrics give, from its database and
(when metrics are on) the running broker's metrics listener."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from scoperouter.broker.cli.common import config_arg, guard, load, open_store, print_table

if TYPE_CHECKING:
    from scoperouter.broker.config import BrokerConfig
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
What the broker's metrics say, at a glance: whether the database answers and how fast,
operations in progress and stuck (past their deadline, or with a lease that expired and no
worker took over), every operation kept by service, kind and state; and, when `metrics.enabled`,
the running broker's counters read from its listener (`metrics.listen`): worker passes and
retries, API requests by endpoint and status since it started. Exit status 1 when the database
does not answer or an operation is stuck, else 0 (for cron and CI).
"""

EPILOG = """\
example:
  scoperouter broker status --config /etc/scoperouter/broker.yaml
  scoperouter broker status --config /etc/scoperouter/broker.yaml --json
"""

LISTENER_TIMEOUT = 5.0


def register(sub: Subparsers) -> argparse.ArgumentParser:
    status = sub.add_parser(
        "status",
        help="the metrics' summary: database, operations in progress/stuck, API, worker",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(status)
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.set_defaults(func=guard(run))
    return status


def run(args: argparse.Namespace) -> int:
    from scoperouter.broker.metrics import summarise

    config = load(args)
    store = open_store(config)
    try:
        summary = summarise(store, totals=True)
    finally:
        store.dispose()
    running = listener_counters(config)
    data: dict[str, Any] = {
        "database": {
            "up": summary.database_up,
            "latency_seconds": round(summary.database_latency, 6),
            **({"error": summary.error} if summary.error else {}),
        },
        "operations": {
            "in_progress": [
                {"service": s, "kind": k, "count": n}
                for (s, k), n in sorted(summary.in_progress.items())
            ],
            "stuck": summary.stuck,
            "totals": [
                {"service": s, "kind": k, "state": t, "count": n}
                for (s, k, t), n in sorted(summary.totals.items())
            ],
        },
        "running": running,
    }
    code = 0 if summary.database_up and summary.stuck == 0 else 1
    if args.json:
        print(json.dumps(data, indent=2))
        return code
    db = data["database"]
    if db["up"]:
        print(f"database: up ({db['latency_seconds'] * 1000:.1f} ms)")
    else:
        print(f"database: DOWN ({db.get('error', '')})")
    in_progress = sum(summary.in_progress.values())
    print(f"operations: {in_progress} in progress, {summary.stuck} stuck")
    if summary.totals:
        print_table(
            ["service", "kind", "state", "count"],
            [[s, k, t, str(n)] for (s, k, t), n in sorted(summary.totals.items())],
        )
    if running.get("error"):
        print(f"running broker: {running['error']}")
    elif running:
        print(
            f"running broker (since it started): {running['worker_passes']:g} worker passes, "
            f"{running['worker_retries']:g} retries"
        )
        print_table(
            ["endpoint", "method", "status", "requests"],
            [[r["endpoint"], r["method"], r["status"], f"{r['count']:g}"] for r in running["api"]],
        )
    if code:
        print("scoperouter broker: the database does not answer or operations are stuck",
              file=sys.stderr)  # fmt: skip
    return code


def listener_counters(config: BrokerConfig) -> dict[str, Any]:
    """The running broker's counters from its metrics listener ({}: metrics are off;
    {"error": ...}: it did not answer)."""
    if not config.metrics.enabled:
        return {}
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    host, port = config.metrics.address
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{port}/metrics"
    try:
        reply = httpx.get(url, timeout=LISTENER_TIMEOUT, trust_env=False)
        reply.raise_for_status()
        families = list(text_string_to_metric_families(reply.text))
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{url} did not answer ({type(exc).__name__})"}
    out: dict[str, Any] = {"worker_passes": 0.0, "worker_retries": 0.0, "api": []}
    for family in families:
        for sample in family.samples:
            if sample.name == "scoperouter_broker_worker_passes_total":
                out["worker_passes"] = sample.value
            elif sample.name == "scoperouter_broker_worker_retries_total":
                out["worker_retries"] = sample.value
            elif sample.name == "scoperouter_broker_api_requests_total":
                out["api"].append({**sample.labels, "count": sample.value})
    out["api"].sort(key=lambda r: (r["endpoint"], r["method"], r["status"]))
    return out
