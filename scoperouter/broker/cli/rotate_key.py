"""``scoperouter broker rotate-key``: re-encrypt every stored secret with the newest key."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import guard, load, open_store
from scoperouter.broker.config import BrokerConfigError

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Re-encrypt every stored secret with the first (newest) of the configured keys. Rotation: put a new
key first ($SCOPEROUTER_BROKER_SECRET_KEYS=new,old or the keys file), restart the replicas, run
rotate-key, then remove the old key. --generate prints a new key and touches nothing.
"""

EPILOG = """\
example:
  export SCOPEROUTER_BROKER_SECRET_KEYS=$(scoperouter broker rotate-key --generate),$OLD
  scoperouter broker rotate-key --config /etc/scoperouter/broker.yaml
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    rotate = sub.add_parser(
        "rotate-key",
        help="re-encrypt every stored secret with the newest key",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rotate.add_argument("--config", metavar="FILE", help="broker config (YAML)")
    rotate.add_argument("--generate", action="store_true", help="print a new key and exit")
    rotate.set_defaults(func=guard(run))
    return rotate


def run(args: argparse.Namespace) -> int:
    from scoperouter.broker.secrets import Secrets, generate_key

    if args.generate:
        print(generate_key())
        return 0
    if not args.config:
        raise BrokerConfigError("--config is required (or --generate)")
    config = load(args)
    secrets = Secrets(config.secret_keys())
    store = open_store(config)
    try:
        count = store.rotate_secrets(secrets.rotate)
    finally:
        store.dispose()
    print(f"re-encrypted {count} secret(s) with the newest key")
    return 0
