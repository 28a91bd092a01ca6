"""`scoperouter broker ...`: serve the OSB API and operate the broker's state.

`scoperouter/cli/__init__.py` calls :func:`register`; ``python -m scoperouter.broker`` runs
:func:`main` standalone. One module per command, as the router's CLI (``scoperouter/cli/``):
each registers its own parser (``register(subparsers)``, which sets the function that runs it)
and :data:`COMMANDS` says which module holds which command. The operator commands read and
write the database the config names; only ``serve`` and ``repair`` (drift) reach the clouds,
through their routers.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

# The broker extra's libraries (pydantic, through the config), imported with this package: the
# console script imports it to register `broker` and, without the extra, registers a stub that
# says what to install (scoperouter/cli/__init__.py) instead of failing in `register`.
import scoperouter.broker.cli.common  # noqa: F401

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
The Open Service Broker (OSB 2.17) of the federation: platforms (Cloud Foundry, Kubernetes,
OpenShift) provision OpenStack resources through it; it places them in the clouds and reaches
every cloud through its router. State lives in a database (SQLite file, or PostgreSQL for
several replicas); secrets in it are encrypted (MultiFernet).
"""

EPILOG = """\
examples:
  scoperouter broker db upgrade --config /etc/scoperouter/broker.yaml
  scoperouter broker serve --config /etc/scoperouter/broker.yaml
  scoperouter broker list --config /etc/scoperouter/broker.yaml
  scoperouter broker status --config /etc/scoperouter/broker.yaml
  scoperouter broker repair --config /etc/scoperouter/broker.yaml
"""

COMMANDS: dict[str, str] = {
    "serve": "scoperouter.broker.cli.serve",
    "list": "scoperouter.broker.cli.list_instances",
    "show": "scoperouter.broker.cli.show",
    "status": "scoperouter.broker.cli.status",
    "repair": "scoperouter.broker.cli.repair",
    "purge": "scoperouter.broker.cli.purge",
    "db": "scoperouter.broker.cli.db",
    "rotate-key": "scoperouter.broker.cli.rotate_key",
}
"""Each broker command and the module that registers it, in the order ``--help`` lists them."""


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add `broker` and its subcommands to a parent parser's subcommands."""
    broker = subparsers.add_parser(
        "broker",
        help="the Open Service Broker of the federation (serve, operate)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = broker.add_subparsers(dest="broker_command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return broker


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scoperouter")
    sub = parser.add_subparsers()
    register(sub)
    args = parser.parse_args(["broker", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
