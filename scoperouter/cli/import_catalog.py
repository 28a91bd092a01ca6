"""``scoperouter import-catalog``: a federation config from the clouds' keystone endpoint
lists (what ``scoperouter lab`` and ``playbooks/federation.yml`` use)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scoperouter.catalog_import import (
    FRONTEND_CERT,
    FRONTEND_KEY,
    PEER_CA,
    PEER_CERT,
    PEER_KEY,
    PROXY_CA,
    PROXY_CA_KEY,
)
from scoperouter.cli.common import port
from scoperouter.errors import ConfigError

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Build a federation config from each cloud's keystone endpoint list (what `openstack endpoint
list -f json` prints, or the identity API's /v3/endpoints rows with their service type). Every
endpoint of the cloud's region becomes a backend; the router advertises the same URL on its own
host (router.host), with the ports router.ports maps. The result is validated like check-config.

input (YAML or JSON):
  settings: {hop_limit: 8}          # optional, copied into the config
  clouds:
    CloudOne:
      region: CloudOne              # default: the cloud's name
      router: {host: 127.0.0.2, ports: {}}
      #   hosts: {internal: 10.0.0.2}          # optional: an interface advertised elsewhere
      #   tls: {cert: PATH, key: PATH}         # optional: the https frontends' (TLS clouds)
      proxy: {listen: 127.0.0.2:3128}          # optional: the services' HTTP_PROXY
      #   ca: PATH, ca_key: PATH               # optional: intercept TLS (HTTPS_PROXY)
      metrics: {listen: 127.0.0.2:9180}        # optional
      credentials: {CloudTwo: router-at-cloudtwo}   # optional clouds.yaml entries
      service_types: [identity, image]         # optional: only these
      endpoints:                               # `openstack endpoint list -f json`, or /v3/endpoints
        - {service_type: image, interface: public, url: "http://10.0.0.5:9292", region: CloudOne}

example:
  openstack --os-cloud one-admin endpoint list -f json   # -> the endpoints of CloudOne
  scoperouter import-catalog clouds.yaml -o federation.yaml
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    imp = sub.add_parser(
        "import-catalog",
        help="build a federation config from the clouds' keystone endpoint lists",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    imp.add_argument(
        "input",
        metavar="FILE",
        help="the clouds and their endpoint lists (YAML or JSON; - for stdin)",
    )
    imp.add_argument(
        "-o", "--output", metavar="FILE", help="write the config there (default: stdout)"
    )
    links = imp.add_argument_group(
        "peer links",
        "TLS between the routers (docs/router/peer-links.md). Any of these gives every cloud a "
        "peer link (a cloud's own peer: in FILE wins); without them, none (the routers reach "
        "each other on their frontends).",
    )
    links.add_argument(
        "--peer-port",
        type=port,
        metavar="PORT",
        help="each cloud's link at https://<its router.host>:PORT (e.g. 9443)",
    )
    links.add_argument(
        "--peer-cert",
        metavar="PATH",
        help="each router's certificate, where its host has it; {cloud} and {slug} (the name "
        f"in lower case) are replaced (default: {PEER_CERT})",
    )
    links.add_argument(
        "--peer-key", metavar="PATH", help=f"its key, the same way (default: {PEER_KEY})"
    )
    links.add_argument(
        "--peer-ca",
        metavar="PATH",
        help=f"the federation's CA, settings.peers.ca (default: {PEER_CA})",
    )
    tls = imp.add_argument_group(
        "TLS clouds",
        "Endpoints in https (docs/router/tls-clouds.md). Each https frontend gets a certificate "
        "and key, where its router's host has them ({cloud} and {slug} replaced; a cloud's own "
        "router.tls in FILE wins). --proxy-ca makes every cloud's forward proxy intercept TLS "
        "(the services' HTTPS_PROXY), signing with that cloud's CA (a cloud's own proxy.ca wins).",
    )
    tls.add_argument(
        "--frontend-cert", metavar="PATH", help=f"the https frontends' (default: {FRONTEND_CERT})"
    )
    tls.add_argument("--frontend-key", metavar="PATH", help=f"its key (default: {FRONTEND_KEY})")
    tls.add_argument(
        "--proxy-ca",
        metavar="PATH",
        help=f"the forward proxy's CA, e.g. {PROXY_CA} (default: no interception)",
    )
    tls.add_argument(
        "--proxy-ca-key", metavar="PATH", help=f"its key, mode 0600 (default: {PROXY_CA_KEY})"
    )
    imp.set_defaults(func=run)
    return imp


def run(args: argparse.Namespace) -> int:
    import yaml

    from scoperouter.catalog_import import PeerLinks, TlsFiles, import_catalog, import_request

    source = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":
            text = sys.stdin.read()
        else:
            with open(args.input) as fh:
                text = fh.read()
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        print(f"scoperouter: cannot read {source}: {exc}", file=sys.stderr)
        return 1
    peers = None
    options = (args.peer_port, args.peer_cert, args.peer_key, args.peer_ca)
    if any(option is not None for option in options):
        peers = PeerLinks(
            port=args.peer_port,
            cert=args.peer_cert or PEER_CERT,
            key=args.peer_key or PEER_KEY,
            ca=args.peer_ca or PEER_CA,
        )
    tls = TlsFiles(
        frontend_cert=args.frontend_cert or FRONTEND_CERT,
        frontend_key=args.frontend_key or FRONTEND_KEY,
        proxy_ca=args.proxy_ca,
        proxy_ca_key=args.proxy_ca_key or PROXY_CA_KEY,
    )
    base = Path(args.output).resolve().parent if args.output else Path.cwd()
    try:
        clouds, settings = import_request(data)
        config = import_catalog(clouds, settings, peers, tls)
        missing = _check_imported(config, f"config imported from {source}", base)
    except ConfigError as exc:
        print(f"scoperouter: {source}: {exc}", file=sys.stderr)
        return 1
    if missing:
        print(
            "scoperouter: note: these TLS files are not there yet (each router's host needs "
            "its own before check-config and serve; `scoperouter pki` makes them): "
            + ", ".join(missing),
            file=sys.stderr,
        )
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _check_imported(config: dict[str, Any], source: str, base: Path) -> list[str]:
    """Validate an imported config as check-config would where the routers run; the TLS files
    (peer links', https frontends', the forward proxy's CA: each router's, on its own host)
    need not be here yet: those missing are checked as if they were (empty stand-ins) and
    returned."""
    import copy
    import tempfile

    from scoperouter.config import build_catalog

    config = copy.deepcopy(config)
    named: list[tuple[dict[str, Any], str]] = []
    for cloud in (config.get("clouds") or {}).values():
        if not isinstance(cloud, dict):
            continue
        listeners = [cloud.get("peer") or {}, *(cloud.get("frontends") or [])]
        for tls in (item.get("tls") for item in listeners if isinstance(item, dict)):
            if isinstance(tls, dict):
                named += [(tls, "cert"), (tls, "key")]
        proxy = cloud.get("proxy")
        if isinstance(proxy, dict):
            named += [(proxy, key) for key in ("ca", "ca_key") if key in proxy]
    peers = (config.get("settings") or {}).get("peers")
    if isinstance(peers, dict) and peers.get("ca"):
        named.append((peers, "ca"))
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="scoperouter-import-") as tmp:
        for number, (holder, key) in enumerate(named):
            value = holder[key]
            if isinstance(value, str) and value and not (base / value).is_file():
                if value not in missing:
                    missing.append(value)
                stand_in = Path(tmp) / str(number)
                stand_in.touch()
                holder[key] = str(stand_in)
        build_catalog(config, source=source, base_dir=base)
    return missing
