"""``scoperouter serve``: run the router of one cloud."""

from __future__ import annotations

import argparse
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


def register(sub: Subparsers) -> argparse.ArgumentParser:
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
