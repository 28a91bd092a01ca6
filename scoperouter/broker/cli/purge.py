"""``scoperouter broker purge``: forget deprovisioned instances (database only)."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load, open_store

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Delete the records of instances deprovisioned more than --older-than days ago (their operations
and bindings too), or of one instance (--instance; --force for one that is not gone: its cloud
resources are NOT removed, deprovision it first). A purged id can be provisioned again.
"""

EPILOG = """\
examples:
  scoperouter broker purge --config /etc/scoperouter/broker.yaml --older-than 30
  scoperouter broker purge --config /etc/scoperouter/broker.yaml --instance 6f1c0a52-id
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    purge = sub.add_parser(
        "purge",
        help="forget deprovisioned instances (database only)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(purge)
    purge.add_argument("--older-than", type=float, default=7.0, metavar="DAYS")
    purge.add_argument("--instance", metavar="ID")
    purge.add_argument("--force", action="store_true")
    purge.set_defaults(func=guard(run))
    return purge


def run(args: argparse.Namespace) -> int:
    from scoperouter.broker.tables import FAILED, GONE, utcnow

    store = open_store(load(args))
    try:
        if args.instance:
            with store.read() as session:
                instance = store.instance(session, args.instance)
            if instance is None:
                print(f"no instance {args.instance!r}")
                return 1
            if instance.state not in (GONE, FAILED) and not args.force:
                print(
                    f"instance {args.instance} is {instance.state}: deprovision it first, or "
                    "--force to forget it (its cloud resources stay)",
                    file=sys.stderr,
                )
                return 1
            store.forget_instance(args.instance)
            print(f"forgot instance {args.instance}")
            return 0
        ids = store.gone_before(utcnow() - timedelta(days=args.older_than))
        for ident in ids:
            store.forget_instance(ident)
        print(
            f"forgot {len(ids)} instance(s) deprovisioned more than {args.older_than:g} day(s) ago"
        )
        return 0
    finally:
        store.dispose()
