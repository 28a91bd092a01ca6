"""``scoperouter check-config``: validate a federation config and summarise it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from scoperouter.catalog import Catalog
from scoperouter.cli.common import load
from scoperouter.errors import ConfigError
from scoperouter.proxy.forward.intercept import signing_ca

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers


def register(sub: Subparsers) -> argparse.ArgumentParser:
    check = sub.add_parser(
        "check-config",
        help="validate a federation config",
        description="Validate a federation config. Prints a summary, or the first problem as "
        "FILE: key.path: what is wrong, and exits 1.",
        epilog="example:\n  scoperouter check-config config/federation.yaml --cloud CloudOne\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("config", metavar="FILE")
    check.add_argument(
        "--cloud",
        metavar="NAME",
        help="also check that this cloud is defined, and its forward proxy's CA as its router "
        "reads it (proxy.ca_key mode 0600)",
    )
    check.set_defaults(func=run)
    return check


def run(args: argparse.Namespace) -> int:
    catalog = load(args.config, args.cloud)
    if catalog is None:
        return 1
    if args.cloud is not None:
        try:
            signing_ca(catalog, args.cloud, args.config)
        except ConfigError as exc:
            print(f"scoperouter: invalid config: {exc}", file=sys.stderr)
            return 1
    settings = catalog.settings
    limits, breaker = settings.limits, settings.breaker
    print(f"{args.config}: OK ({catalog.describe()})")
    print(
        f"  settings: hop_limit {settings.hop_limit}; timeouts connect/response "
        f"{settings.connect_timeout:g}/{settings.response_timeout:g}s to backends, "
        f"{settings.peer_connect_timeout:g}/{settings.peer_response_timeout:g}s to peers; "
        f"limits {limits.max_headers} headers, {limits.max_header_bytes} bytes, line "
        f"{limits.max_request_line}, head {limits.header_timeout:g}s, body "
        f"{limits.body_timeout:g}s, idle {limits.idle_timeout:g}s; an upstream is down for "
        f"{breaker.down_for:g}s after "
        f"{breaker.failures} failure{'s' if breaker.failures != 1 else ''}"
    )
    print(f"  router-to-router links: {_links_summary(catalog)}")
    for cloud in catalog.clouds.values():
        services = sorted({ep.service_type for ep in cloud.endpoints})
        frontends = ", ".join(str(f.url) for f in cloud.frontends)
        extras = []
        if cloud.proxy_listen:
            intercepts = f", intercepting TLS with {cloud.proxy_ca}" if cloud.proxy_ca else ""
            extras.append(
                f"forward proxy {cloud.proxy_listen[0]}:{cloud.proxy_listen[1]}{intercepts}"
            )
        if cloud.metrics_listen:
            extras.append(f"metrics {cloud.metrics_listen[0]}:{cloud.metrics_listen[1]}")
        if cloud.peer is not None:
            extras.append(f"peer link {cloud.peer.url.base}")
        if cloud.credentials:
            extras.append(
                "credentials for "
                + ", ".join(f"{k} ({v})" for k, v in sorted(cloud.credentials.items()))
            )
        print(
            f"  {cloud.name} (region {cloud.region}): {', '.join(services)}; "
            f"frontends {frontends}" + "".join(f"; {extra}" for extra in extras)
        )
    return 0


def _links_summary(catalog: Catalog) -> str:
    """How the routers of `catalog` reach each other, in one line (check-config)."""
    settings = catalog.settings
    peers = settings.peers
    linked = [c for c in catalog.clouds.values() if c.peer is not None]
    if not linked:
        return (
            "no peer link: each router reaches the others on their frontends as advertised "
            "(plain HTTP where they are http://)"
        )
    ca = peers.ca or settings.ca_bundle or "the system's CAs"
    plain = [
        c.name for c in catalog.clouds.values() if c.peer is None or c.peer.url.scheme != "https"
    ]
    text = (
        f"peer links, TLS verified against {ca}"
        + ("" if settings.verify else " (NOT verified: settings.verify is false)")
        + f"; {peers.warm} connection{'s' if peers.warm != 1 else ''} opened ahead per peer "
        f"and worker, idle {peers.idle_seconds(settings.limits.idle_timeout):g}s"
    )
    if plain:
        text += f"; plain HTTP to {', '.join(plain)} (settings.peers.plain)"
    return text
