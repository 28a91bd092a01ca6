"""``scoperouter serve``: run the router of one cloud."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from scoperouter.cli.common import cores, load, positive_int

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Run the router of one cloud: a reverse proxy on each of the cloud's frontends (and its peer
link) and, if the config gives proxy.listen, a forward proxy for the cloud's services
(HTTP_PROXY), in --workers processes on the same ports. SIGHUP reloads the config without
dropping connections (an invalid new config is refused and the old one keeps routing);
SIGTERM stops accepting and lets requests in flight finish. With metrics.listen in the
config, /metrics (Prometheus) and /healthz are served there.
"""

EPILOG = """\
example:
  scoperouter check-config /etc/scoperouter/federation.yaml --cloud CloudOne
  scoperouter serve --config /etc/scoperouter/federation.yaml --cloud CloudOne --workers 2
  kill -HUP <the supervisor's pid>     # reload the config file
"""


ROUTER_MODULES = ("httptools", "prometheus_client", "mitmproxy")
"""What the router's processes import beyond the base install: setup.cfg's `router` extra (the
HTTP server's parser, /metrics, the forward proxy)."""

MISSING = "scoperouter serve: the router is not installed ({}): pip install 'scoperouter[router]'"


def missing_modules() -> list[str]:
    """The modules of :data:`ROUTER_MODULES` this installation lacks (none are imported)."""
    return [name for name in ROUTER_MODULES if not _installed(name)]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # an import hook refusing it (the tests' blocker)
        return False


def register(sub: Subparsers) -> argparse.ArgumentParser:
    missing = missing_modules()
    if missing:
        return _register_missing(sub, missing)
    serve = sub.add_parser(
        "serve",
        help="run the router of one cloud",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", required=True, metavar="FILE", help="federation config (YAML)")
    serve.add_argument(
        "--cloud",
        metavar="NAME",
        default=os.environ.get("SCOPEROUTER_CLOUD"),
        help="the cloud this router serves (default: $SCOPEROUTER_CLOUD, or the only cloud)",
    )
    serve.add_argument(
        "--watch", action="store_true", help="also reload when the config file changes"
    )
    serve.add_argument(
        "--workers",
        type=positive_int,
        default=cores(),
        metavar="N",
        help="worker processes sharing the listeners (SO_REUSEPORT); a dead one is replaced "
        "(default: the number of cores, %(default)s here)",
    )
    serve.add_argument(
        "--drain",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may take to finish (default %(default)s)",
    )
    serve.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="INFO logs one line per request (default)",
    )
    serve.add_argument(
        "--log-format",
        default="json",
        choices=["json", "text"],
        help="one JSON object per line (default), or text for a terminal",
    )
    serve.set_defaults(func=run)
    return serve


def _register_missing(sub: Subparsers, missing: list[str]) -> argparse.ArgumentParser:
    """`serve` on a base install (the client's): every invocation, --help included, says in
    one line which extra to install and exits 2 (so `scoperouter lab up` sees no router)."""
    stub = sub.add_parser(
        "serve",
        help="run the router of one cloud (needs: pip install 'scoperouter[router]')",
        add_help=False,
        prefix_chars="\0",  # no option: every argument, --help included, goes to `args`
    )
    stub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def not_installed(_: argparse.Namespace) -> int:
        print(MISSING.format("no " + ", ".join(missing)), file=sys.stderr)
        return 2

    stub.set_defaults(func=not_installed)
    return stub


def run(args: argparse.Namespace) -> int:
    catalog = load(args.config, args.cloud)
    if catalog is None:
        return 2
    cloud = args.cloud
    if cloud is None:
        if len(catalog.clouds) != 1:
            print(
                "scoperouter: --cloud is required when the config has several clouds "
                f"({', '.join(sorted(catalog.clouds))})",
                file=sys.stderr,
            )
            return 2
        cloud = next(iter(catalog.clouds))
    from scoperouter.proxy import Options, serve
    from scoperouter.router import logs

    logs.setup(args.log_level, args.log_format, cloud)
    return serve(
        Options(
            config_path=args.config,
            cloud=cloud,
            workers=args.workers,
            watch=args.watch,
            drain=args.drain,
            log_level=args.log_level,
            log_format=args.log_format,
        )
    )
