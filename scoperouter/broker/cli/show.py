"""``scoperouter broker show``: one instance, its bindings, operations and leases."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load, open_store

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Show one instance (or the instance of a binding or operation id): its parameters, context, cloud
and OpenStack ids, its bindings (without credentials) and every operation with its state,
attempts, lease, deadline and originating identity.
"""

EPILOG = """\
example:
  scoperouter broker show --config /etc/scoperouter/broker.yaml 6f1c0a52-instance-id
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    show = sub.add_parser(
        "show",
        help="one instance: bindings, operations, leases",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(show)
    show.add_argument("id", metavar="ID", help="instance, binding or operation id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=guard(run))
    return show


def run(args: argparse.Namespace) -> int:
    from scoperouter.broker.describe import describe_instance

    store = open_store(load(args))
    try:
        data = describe_instance(store, args.id)
    finally:
        store.dispose()
    if data is None:
        print(f"scoperouter broker: no instance, binding or operation {args.id!r}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    print(f"instance {data['id']}  ({data['service']}, plan {data['plan_id']})")
    for key in ("state", "cloud", "resources", "parameters", "context", "active_operation"):
        value = data[key] if isinstance(data[key], str) else json.dumps(data[key])
        print(f"  {key + ':':18} {value}")
    print(f"  {'created/updated:':18} {data['created_at']} / {data['updated_at']}")
    for b in data["bindings"]:
        print(
            f"  binding {b['id']}: {b['state']} resources={json.dumps(b['resources'])}"
            + (f" expires {b['expires_at']}" if b["expires_at"] else "")
        )
    for o in data["operations"]:
        lease = (
            f" lease {o['lease_owner']} until {o['lease_expires_at']}" if o["lease_owner"] else ""
        )
        who = o["originating_identity"]
        by = f" by {who['platform']} {json.dumps(who['value'])}" if who else ""
        print(
            f"  {o['kind']:11} {o['id']}: {o['state']} ({o['attempts']} pass(es), deadline "
            f"{o['deadline_at']}){lease}{by}\n      {o['description']}"
        )
    return 0
