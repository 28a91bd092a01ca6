"""``scoperouter broker list``: every instance with its state and latest operation."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load, open_store, print_table

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
List the instances in the database (gone ones with --all), with their service, plan, cloud, state
and latest operation. Secrets are never shown.
"""

EPILOG = """\
example:
  scoperouter broker list --config /etc/scoperouter/broker.yaml --all
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    lst = sub.add_parser(
        "list",
        help="every instance with its state and latest operation",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(lst)
    lst.add_argument("--all", action="store_true", help="include deprovisioned instances")
    lst.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    lst.set_defaults(func=guard(run))
    return lst


def run(args: argparse.Namespace) -> int:
    from scoperouter.broker.describe import list_instances

    store = open_store(load(args))
    try:
        rows = list_instances(store, include_gone=args.all)
    finally:
        store.dispose()
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print("no instances")
        return 0
    header = ("INSTANCE", "SERVICE", "CLOUD", "STATE", "BINDINGS", "LAST OPERATION")
    table = [
        (
            r["id"],
            r["service"],
            r["cloud"] or "-",
            r["state"],
            str(r["bindings"]),
            f"{r['operation_state']}: {r['description']}"[:70],
        )
        for r in rows
    ]
    print_table(header, table)
    return 0
