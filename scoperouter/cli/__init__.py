"""The ``scoperouter`` console script. Thin: parses arguments and delegates.

One module per command, as pip does: each registers its own parser (``register(subparsers)``,
which sets the function that runs it) and :data:`COMMANDS` says which module holds which
command. ``lab`` (the ``scoperouter-lab`` package) and ``broker`` (the ``broker`` extra) live
in their own packages and register themselves the same way; without them the command says how
to install them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from scoperouter import __version__

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Route OpenStack API requests between federated clouds by a per-request scope.

A scope says which cloud serves each service type, e.g. '{"image": "CloudTwo"}'. Clients send
it on the token (X-Auth-Token: <token>!SCOPE!<json>) or in X-Scope; each cloud's router forwards
the request to its own backend or to the router of the cloud the scope names.
"""

EPILOG = """\
examples:
  scoperouter check-config config/federation.yaml
  scoperouter route --config config/federation.yaml --cloud CloudOne \\
      --scope '{"image": "CloudTwo"}' GET http://127.0.0.2:9292/v2/images
  scoperouter serve --config config/federation.yaml --cloud CloudOne
  scoperouter status --config config/federation.yaml   # every cloud's router at a glance
  scoperouter lab up        # real OpenStack clouds on this machine, each behind a router
  scoperouter broker serve --config config/broker.yaml   # the Open Service Broker
"""

COMMANDS: dict[str, str] = {
    "serve": "scoperouter.cli.serve",
    "route": "scoperouter.cli.route",
    "check-config": "scoperouter.cli.check_config",
    "import-catalog": "scoperouter.cli.import_catalog",
    "pki": "scoperouter.cli.pki",
    "status": "scoperouter.cli.status",
    "lab": "scoperouter_lab.cli",
    "broker": "scoperouter.broker.cli",
}
"""Each command and the module that registers it, in the order ``--help`` lists them."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scoperouter",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"scoperouter {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, module in COMMANDS.items():
        package = module.partition(".")[0]
        try:
            if importlib.util.find_spec(package) is None:  # not installed: nothing to import
                raise ModuleNotFoundError(f"No module named {package!r}", name=package)
            commands = importlib.import_module(module)
        except ImportError as exc:
            missing = _NOT_INSTALLED.get(name)
            if missing is None or not missing(sub, exc):
                raise
        else:
            commands.register(sub)
    return parser


LAB_MISSING = """\
the lab is not installed: it is its own package, scoperouter-lab (a router does not need it).
From a checkout of scoperouter:

    pip install -e ./lab
"""


def _lab_missing(sub: Subparsers, exc: ImportError) -> bool:
    """`scoperouter lab ...` without the lab package: say how to get it."""
    if exc.name != "scoperouter_lab":
        return False  # the lab is there but broken: let its error show
    lab = sub.add_parser(
        "lab",
        help="real OpenStack clouds on this machine (needs the scoperouter-lab package)",
        description=LAB_MISSING,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lab.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def missing(_: argparse.Namespace) -> int:
        print(f"scoperouter lab: {LAB_MISSING}", file=sys.stderr, end="")
        return 1

    lab.set_defaults(func=missing)
    return True


def _broker_missing(sub: Subparsers, exc: ImportError) -> bool:
    """`scoperouter broker ...` without the broker's libraries (the `broker` extra)."""
    reason = str(exc)
    stub = sub.add_parser(
        "broker", help="the Open Service Broker (needs: pip install 'scoperouter[broker]')"
    )

    def missing(_: argparse.Namespace) -> int:
        print(
            f"scoperouter broker: not installed ({reason}): pip install 'scoperouter[broker]'",
            file=sys.stderr,
        )
        return 2

    stub.set_defaults(func=missing)
    return True


_NOT_INSTALLED: dict[str, Callable[[Subparsers, ImportError], bool]] = {
    "lab": _lab_missing,
    "broker": _broker_missing,
}
"""Commands of other packages: what to register when their module cannot be imported (False:
the error is not a missing install, and is raised)."""
