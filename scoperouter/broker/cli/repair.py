"""``scoperouter broker repair``: report drift between the database and the clouds; re-drive
an operation."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load, open_store
from scoperouter.broker.config import BrokerConfig

if TYPE_CHECKING:
    from scoperouter.broker.store import Store
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Reconcile the database with the clouds. Without options: list what every service finds in
the clouds tagged as this broker's (projects, servers, images, application credentials) and
report drift both ways: resources no live instance/binding owns (orphans), and live
instances/bindings whose resources are missing. Each service reads each cloud on its own: a
cloud that cannot be read is reported as `unchecked` (nothing is claimed missing there, and
repair never acts on it). Exit 1 when there is drift (or a service failed); else 3 when some
cloud could not be checked; 0 when every cloud was read and matches.
With --redrive ID (an operation, or an instance's latest operation): make a stuck operation
due now with a fresh lease and deadline, or restart a failed one.
"""

EPILOG = """\
examples:
  scoperouter broker repair --config /etc/scoperouter/broker.yaml --json
  scoperouter broker repair --config /etc/scoperouter/broker.yaml --redrive 6f1c0a52-op-id
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    repair = sub.add_parser(
        "repair",
        help="report drift between the database and the clouds; re-drive an operation",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(repair)
    repair.add_argument("--redrive", metavar="ID", help="operation or instance id")
    repair.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="with --redrive: the new deadline from now (default: the service's for the kind)",
    )
    repair.add_argument("--json", action="store_true", help="the drift report as JSON")
    repair.set_defaults(func=guard(run))
    return repair


def run(args: argparse.Namespace) -> int:
    config = load(args)
    if args.redrive:
        store = open_store(config)
        try:
            return redrive(store, config, args.redrive, args.deadline)
        finally:
            store.dispose()
    from scoperouter.broker.drift import drift
    from scoperouter.broker.runtime import Broker

    open_store(config).dispose()
    broker = Broker(config)
    try:
        report = drift(broker)
    finally:
        broker.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for line in report["lines"]:
            print(line)
    if report["orphans"] or report["missing"] or report["errors"]:
        return 1
    return 3 if report["unchecked"] else 0


def redrive(store: Store, config: BrokerConfig, ident: str, deadline: float | None) -> int:
    """Make operation `ident` (or instance `ident`'s latest) due now; prints what it did."""
    from scoperouter.broker.config import DEFAULT_DEADLINES

    with store.read() as session:
        op = store.operation(session, ident)
        if op is None:
            instance = store.instance(session, ident)
            op = store.last_operation(session, ident) if instance else None
        owner = store.instance(session, op.instance_id) if op is not None else None
        service_name = owner.service_name if owner is not None else ""
    if op is None:
        print(f"scoperouter broker: no operation or instance {ident!r}", file=sys.stderr)
        return 1
    service = config.services.get(service_name)
    seconds = deadline or (service.deadline(op.kind) if service else DEFAULT_DEADLINES[op.kind])
    result = store.redrive(op.id, timedelta(seconds=seconds))
    print(f"{op.kind} {op.id}: {result}")
    return 0
