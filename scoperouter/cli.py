"""The ``scoperouter`` console script. Thin: parses arguments and delegates.

Subcommands: ``serve`` (run a cloud's router), ``route`` (print the routing decision for one
request, sending nothing), ``check-config`` (validate a federation config), ``import-catalog``
(a config from the clouds' keystone endpoint lists), ``lab`` (a lab of
real OpenStack clouds on this machine) and ``broker`` (the Open Service Broker).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scoperouter import __version__
from scoperouter.catalog import DEFAULT_PORTS, Catalog
from scoperouter.catalog_import import PEER_CA, PEER_CERT, PEER_KEY
from scoperouter.config import load_catalog
from scoperouter.errors import ConfigError, Reject
from scoperouter.pki import CA_DAYS, RENEW_DAYS, VALID_DAYS
from scoperouter.routing import (
    AUTH_TOKEN,
    SUBJECT_TOKEN,
    Combined,
    Failover,
    FanOut,
    Forward,
    Mode,
    RequestFacts,
    decide,
    header_title,
)
from scoperouter.scope import SCOPE_SEPARATOR, split_token

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
  scoperouter lab up        # real OpenStack clouds on this machine, each behind a router
  scoperouter broker serve --config config/broker.yaml   # the Open Service Broker
"""


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

    serve = sub.add_parser(
        "serve",
        help="run the router of one cloud",
        description="Run the router of one cloud: a reverse proxy on each of the cloud's "
        "frontends and, if the config gives proxy.listen, a forward proxy for the cloud's "
        "services (HTTP_PROXY), in --workers processes on the same ports. SIGHUP reloads the "
        "config without dropping connections (an invalid new config is refused and the old "
        "one keeps routing); SIGTERM stops accepting and lets requests in flight finish. With "
        "metrics.listen in the config, /metrics (Prometheus) and /healthz are served there.",
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
        type=_positive_int,
        default=_cores(),
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
    serve.set_defaults(func=cmd_serve)

    route = sub.add_parser(
        "route",
        help="print the routing decision for one request (sends nothing)",
        description="Print where the router of CLOUD would send one request: the target URL "
        "and the header changes, or the error the client would get. Nothing is sent. Token "
        "values are never printed.",
        epilog="exit status: 0 forwarded, 1 refused (the error is printed), 2 bad usage/config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    route.add_argument("--config", required=True, metavar="FILE", help="federation config (YAML)")
    route.add_argument("--cloud", required=True, metavar="NAME", help="whose router decides")
    route.add_argument("--scope", metavar="JSON", help='scope, e.g. \'{"image": "CloudTwo"}\'')
    route.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a request header (repeatable)",
    )
    route.add_argument(
        "--mode",
        choices=["auto", "reverse", "forward"],
        default="auto",
        help="reverse: URL is one of the cloud's frontends; forward: HTTP_PROXY use; "
        "auto (default): reverse when the URL is on a frontend of CLOUD",
    )
    route.add_argument("--json", action="store_true", help="print the decision as JSON")
    route.add_argument("method", metavar="METHOD", help="GET, POST, ...")
    route.add_argument("url", metavar="URL", help="the URL the client calls")
    route.set_defaults(func=cmd_route)

    check = sub.add_parser(
        "check-config",
        help="validate a federation config",
        description="Validate a federation config. Prints a summary, or the first problem as "
        "FILE: key.path: what is wrong, and exits 1.",
    )
    check.add_argument("config", metavar="FILE")
    check.add_argument("--cloud", metavar="NAME", help="also check that this cloud is defined")
    check.set_defaults(func=cmd_check_config)

    imp = sub.add_parser(
        "import-catalog",
        help="build a federation config from the clouds' keystone endpoint lists",
        description=IMPORT_DESCRIPTION,
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
        'TLS between the routers (README: "Peer links"). Any of these gives every cloud a '
        "peer link (a cloud's own peer: in FILE wins); without them, none (the routers reach "
        "each other on their frontends).",
    )
    links.add_argument(
        "--peer-port",
        type=_port,
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
    imp.set_defaults(func=cmd_import_catalog)

    pki = sub.add_parser(
        "pki",
        help="the certificates of the peer links: a federation CA, a router's certificate",
        description=PKI_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pki_sub = pki.add_subparsers(title="commands", metavar="COMMAND")
    ca = pki_sub.add_parser(
        "ca",
        help="make a federation CA (kept when it is valid)",
        description="Make a CA in --cert and --key (mode 0600), or keep the one there while "
        "it is valid for more than --renew-days. Prints what it did, never the key.",
    )
    ca.add_argument("--cert", required=True, metavar="FILE", help="the CA certificate")
    ca.add_argument("--key", required=True, metavar="FILE", help="its key (mode 0600)")
    ca.add_argument("--name", default="federation CA", help="its subject: CN=scoperouter NAME")
    ca.add_argument("--days", type=_positive_int, default=CA_DAYS, help="default %(default)s")
    ca.add_argument("--renew-days", type=int, default=RENEW_DAYS, help="default %(default)s")
    ca.set_defaults(func=cmd_pki_ca)
    iss = pki_sub.add_parser(
        "issue",
        help="make a router's peer-link certificate, signed by the CA (kept when valid)",
        description="Make a key (mode 0600) and a TLS server certificate for ADDRESS... (the "
        "host of the router's peer link url: an IP or a DNS name) signed by the CA; or keep "
        "them while they are signed by that CA, for exactly these addresses, their key matches "
        "and they are valid for more than --renew-days. Prints what it did, never a key.",
    )
    iss.add_argument("--ca-cert", required=True, metavar="FILE", help="the CA certificate")
    iss.add_argument("--ca-key", required=True, metavar="FILE", help="its key (- for stdin)")
    iss.add_argument("--cert", required=True, metavar="FILE", help="the certificate to make")
    iss.add_argument("--key", required=True, metavar="FILE", help="its key (mode 0600)")
    iss.add_argument("--name", default="peer link", help="its subject: CN=scoperouter NAME")
    iss.add_argument("--days", type=_positive_int, default=VALID_DAYS, help="default %(default)s")
    iss.add_argument("--renew-days", type=int, default=RENEW_DAYS, help="default %(default)s")
    iss.add_argument("--force", action="store_true", help="make them anew (a rotation)")
    iss.add_argument("addresses", nargs="+", metavar="ADDRESS")
    iss.set_defaults(func=cmd_pki_issue)
    chk = pki_sub.add_parser(
        "check",
        help="say whether a certificate is still good (exit 1: it would be made again)",
        description="Exit 0 when `pki issue` with these arguments would keep the certificate; "
        "else print why and exit 1 (for monitoring: a certificate within --renew-days of its "
        "end fails).",
    )
    chk.add_argument("--ca-cert", required=True, metavar="FILE", help="the CA certificate")
    chk.add_argument("--cert", required=True, metavar="FILE", help="the certificate")
    chk.add_argument("--key", required=True, metavar="FILE", help="its key")
    chk.add_argument("--renew-days", type=int, default=RENEW_DAYS, help="default %(default)s")
    chk.add_argument("addresses", nargs="+", metavar="ADDRESS")
    chk.set_defaults(func=cmd_pki_check)
    pki.set_defaults(func=lambda _args: _usage(pki))

    if importlib.util.find_spec("scoperouter_lab") is None:
        _lab_missing(sub)
    else:
        from scoperouter_lab import cli as lab_cli

        lab_cli.register(sub)
    try:
        from scoperouter.broker import cli as broker_cli
    except ImportError as exc:  # the broker's libraries are the `broker` extra
        missing = str(exc)
        stub = sub.add_parser(
            "broker", help="the Open Service Broker (needs: pip install 'scoperouter[broker]')"
        )
        stub.set_defaults(func=lambda _args: _missing_broker(missing))
    else:
        broker_cli.register(sub)
    return parser


def _missing_broker(reason: str) -> int:
    print(
        f"scoperouter broker: not installed ({reason}): pip install 'scoperouter[broker]'",
        file=sys.stderr,
    )
    return 2


LAB_MISSING = """\
the lab is not installed: it is its own package, scoperouter-lab (a router does not need it).
From a checkout of scoperouter:

    pip install -e ./lab
"""


def _lab_missing(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`scoperouter lab ...` without the lab package: say how to get it."""
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


def _load(path: str, cloud: str | None = None) -> Catalog | None:
    try:
        catalog = load_catalog(path)
    except ConfigError as exc:
        print(f"scoperouter: invalid config: {exc}", file=sys.stderr)
        return None
    if cloud is not None and cloud not in catalog.clouds:
        print(
            f"scoperouter: cloud {cloud!r} is not in {path} "
            f"(clouds: {', '.join(sorted(catalog.clouds))})",
            file=sys.stderr,
        )
        return None
    return catalog


IMPORT_DESCRIPTION = """\
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
      proxy: {listen: 127.0.0.2:3128}          # optional: the services' HTTP_PROXY
      metrics: {listen: 127.0.0.2:9180}        # optional
      credentials: {CloudTwo: router-at-cloudtwo}   # optional clouds.yaml entries
      service_types: [identity, image]         # optional: only these
      endpoints:                               # `openstack endpoint list -f json`, or /v3/endpoints
        - {service_type: image, interface: public, url: "http://10.0.0.5:9292", region: CloudOne}

example:
  openstack --os-cloud one-admin endpoint list -f json   # -> the endpoints of CloudOne
  scoperouter import-catalog clouds.yaml -o federation.yaml
"""


def cmd_import_catalog(args: argparse.Namespace) -> int:
    import yaml

    from scoperouter.catalog_import import PeerLinks, import_catalog, import_request

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
    base = Path(args.output).resolve().parent if args.output else Path.cwd()
    try:
        clouds, settings = import_request(data)
        config = import_catalog(clouds, settings, peers)
        missing = _check_imported(config, f"config imported from {source}", base)
    except ConfigError as exc:
        print(f"scoperouter: {source}: {exc}", file=sys.stderr)
        return 1
    if missing:
        print(
            "scoperouter: note: the peer links' files are not there yet (each router's host "
            "needs its own before check-config and serve; `scoperouter pki` makes them): "
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
    """Validate an imported config as check-config would where the routers run; the peer
    links' files (each router's, on its own host; the CA) need not be here yet: those missing
    are checked as if they were (empty stand-ins) and returned."""
    import copy
    import tempfile

    from scoperouter.config import build_catalog

    config = copy.deepcopy(config)
    named: list[tuple[dict[str, Any], str]] = []
    for cloud in (config.get("clouds") or {}).values():
        tls = (cloud.get("peer") or {}).get("tls") if isinstance(cloud, dict) else None
        if isinstance(tls, dict):
            named += [(tls, "cert"), (tls, "key")]
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


PKI_DESCRIPTION = """\
The certificates of the peer links (the router-to-router hops, TLS verified with the
federation's CA: README "Peer links"): one CA per federation, and for each router a certificate
for the host of its peer link url, signed by that CA. Files are kept while they are good, so
running the same command again changes nothing; keys are written mode 0600 and never printed.

example (a CA, then CloudOne's router's certificate for its peer link at
https://router.cloudone.example.org:9443):
  scoperouter pki ca --cert ca.crt --key ca.key
  scoperouter pki issue --ca-cert ca.crt --ca-key ca.key \\
      --cert cloudone-peer.crt --key cloudone-peer.key router.cloudone.example.org
  scoperouter pki check --ca-cert ca.crt --cert cloudone-peer.crt --key cloudone-peer.key \\
      router.cloudone.example.org
"""


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _pki_error(exc: Exception) -> int:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    print(f"scoperouter pki: {text}{where}", file=sys.stderr)
    return 1


def _pki_done(cert: Path, made: str | None, about: str) -> int:
    """What `pki ca` / `pki issue` did (`made`: why it was made; None: kept), never a key."""
    print(f"{'made' if made else 'kept'} {cert}: {about}" + (f" (was: {made})" if made else ""))
    return 0


def cmd_pki_ca(args: argparse.Namespace) -> int:
    from scoperouter import pki

    cert, key = Path(args.cert), Path(args.key)
    try:
        made = pki.ensure_ca(cert, key, name=args.name, days=args.days, renew_days=args.renew_days)
        about = pki.describe(cert.read_bytes())
    except (OSError, pki.PkiError) as exc:
        return _pki_error(exc)
    return _pki_done(cert, made, about)


def cmd_pki_issue(args: argparse.Namespace) -> int:
    from scoperouter import pki

    cert, key = Path(args.cert), Path(args.key)
    try:
        ca_cert = Path(args.ca_cert).read_bytes()
        ca_key = sys.stdin.buffer.read() if args.ca_key == "-" else Path(args.ca_key).read_bytes()
        made = pki.ensure_certificate(
            cert,
            key,
            ca_cert_pem=ca_cert,
            ca_key_pem=ca_key,
            addresses=args.addresses,
            name=args.name,
            days=args.days,
            renew_days=args.renew_days,
            force=args.force,
        )
        about = pki.describe(cert.read_bytes())
    except (OSError, pki.PkiError) as exc:
        return _pki_error(exc)
    return _pki_done(cert, made, about)


def cmd_pki_check(args: argparse.Namespace) -> int:
    from scoperouter import pki

    cert = Path(args.cert)
    try:
        ca_cert = Path(args.ca_cert).read_bytes()
        problem = pki.certificate_problem(
            cert, Path(args.key), ca_cert, args.addresses, args.renew_days
        )
        about = None if problem else pki.describe(cert.read_bytes())
    except (OSError, pki.PkiError) as exc:
        return _pki_error(exc)
    if problem:
        print(f"{cert}: would be made again: {problem}")
        return 1
    print(f"{cert}: good: {about}")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    catalog = _load(args.config, args.cloud)
    if catalog is None:
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
            extras.append(f"forward proxy {cloud.proxy_listen[0]}:{cloud.proxy_listen[1]}")
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


def cmd_serve(args: argparse.Namespace) -> int:
    catalog = _load(args.config, args.cloud)
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


def _cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def cmd_route(args: argparse.Namespace) -> int:
    catalog = _load(args.config, args.cloud)
    if catalog is None:
        return 2
    parts = urlsplit(args.url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        print(f"scoperouter: {args.url!r} is not an http(s) URL", file=sys.stderr)
        return 2
    headers: dict[str, str] = {}
    for raw in args.header:
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            print(f"scoperouter: header {raw!r} is not 'Name: value'", file=sys.stderr)
            return 2
        headers[name.strip().lower()] = value.strip()
    if args.scope is not None:
        headers["x-scope"] = args.scope
    host = parts.hostname.lower()
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    mode: Mode
    if args.mode == "auto":
        frontends = {(f.url.host, f.url.port) for f in catalog.clouds[args.cloud].frontends}
        mode = "reverse" if (host, port) in frontends else "forward"
    else:
        mode = args.mode
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    facts = RequestFacts(
        method=args.method.upper(),
        scheme=parts.scheme,
        host=host,
        port=port,
        path=path,
        headers=headers,
        mode=mode,
    )
    decision = decide(facts, catalog, args.cloud, combined=True)
    print(render_decision(facts, decision, args.cloud, as_json=args.json))
    return 1 if isinstance(decision, Reject) else 0


def _mask(name: str, value: str) -> str:
    """Never print a token: keep only the scope part of token headers."""
    if name in (AUTH_TOKEN, SUBJECT_TOKEN):
        _, scope = split_token(value)
        return "<token>" if scope is None else f"<token>{SCOPE_SEPARATOR}{scope}"
    return value


def render_decision(
    facts: RequestFacts,
    decision: Forward | Reject | Combined,
    cloud: str,
    as_json: bool = False,
) -> str:
    """The decision for humans (or as JSON), with token values masked."""
    request = f"{facts.method} {facts.scheme}://{facts.host}:{facts.port}{facts.path}"
    if isinstance(decision, FanOut | Failover):
        return _render_combined(facts, decision, cloud, request, as_json)
    if isinstance(decision, Reject):
        body = json.loads(decision.body())
        if as_json:
            return json.dumps(
                {
                    "request": request,
                    "mode": facts.mode,
                    "router": cloud,
                    "decision": "reject",
                    "status": decision.status,
                    "body": body,
                }
            )
        return (
            f"request:  {request} ({facts.mode} mode, router of {cloud})\n"
            f"decision: reject {decision.status} {decision.title}\n"
            f"body:     {json.dumps(body)}"
        )
    edits = {header_title(k): _mask(k, v) for k, v in decision.set_headers.items()}
    if as_json:
        return json.dumps(
            {
                "request": request,
                "mode": facts.mode,
                "router": cloud,
                "decision": "forward",
                "cloud": decision.cloud,
                "service_type": decision.service_type,
                "interface": decision.interface,
                "remote": decision.remote,
                "target": decision.url,
                "set_headers": edits,
                "swap_tokens": sorted(header_title(h) for h in decision.swap_tokens),
                "catalog_region": decision.catalog_region,
            }
        )
    lines = [
        f"request:  {request} ({facts.mode} mode, router of {cloud})",
        f"service:  {decision.service_type} ({decision.interface})",
        f"decision: forward to {decision.cloud} "
        + ("(its router)" if decision.remote else "(local backend)"),
        f"target:   {decision.url}",
    ]
    if decision.scope is not None:
        lines.append(f"scope:    {decision.scope.to_json()}")
    lines.extend(f"set:      {k}: {v}" for k, v in edits.items())
    lines.extend(
        f"swap:     {header_title(h)}: checked with {cloud}'s keystone (service role), then "
        f"replaced by the router's own token for {decision.cloud}"
        for h in sorted(decision.swap_tokens)
    )
    if decision.catalog_region:
        lines.append(
            f"answer:   catalog endpoints of a token validation twinned into region "
            f"{decision.catalog_region}"
        )
    return "\n".join(lines)


_FANOUT = "each cloud's list at once, merged; reads of a list only"
_FAILOVER = (
    "tried in order: the next after a connection error, a 5xx or a timeout; a cloud the "
    "router marks down is skipped"
)


def _render_combined(
    facts: RequestFacts, decision: Combined, cloud: str, request: str, as_json: bool
) -> str:
    """A fan-out or failover: every part or candidate with its cloud and target URL."""
    if as_json:
        return json.dumps(
            {"request": request, "mode": facts.mode, "router": cloud}
            | _combined_json(decision, None)
        )
    kind = "fan-out" if isinstance(decision, FanOut) else "failover"
    lines = [
        f"request:  {request} ({facts.mode} mode, router of {cloud})",
        f"service:  {decision.service_type}",
        f"decision: {kind} {decision.expression} ("
        + (_FANOUT if isinstance(decision, FanOut) else _FAILOVER)
        + ")",
    ]
    lines += _combined_lines(decision, None, "  ")
    return "\n".join(lines)


def _steps(
    decision: Combined, query: str | None
) -> list[tuple[str, Forward | Combined, str | None]]:
    """(label, part, the query it is sent with) of a fan-out's parts or a failover's
    candidates; a fan-out gives each part its own query (limit, that cloud's marker)."""
    if isinstance(decision, FanOut):
        return [(label, part, decision.plan.query_for(label)) for label, part in decision.parts]
    return [
        (c.cloud if isinstance(c, Forward) else c.expression, c, query) for c in decision.candidates
    ]


def _target(forward: Forward, query: str | None) -> str:
    return forward.url if query is None else forward.url.partition("?")[0] + query


def _combined_lines(decision: Combined, query: str | None, indent: str) -> list[str]:
    lines = []
    for number, (label, part, part_query) in enumerate(_steps(decision, query), 1):
        bullet = "-" if isinstance(decision, FanOut) else f"{number}."
        if isinstance(part, Forward):
            where = "its router" if part.remote else "local backend"
            swaps = "".join(f", swaps {header_title(h)}" for h in sorted(part.swap_tokens))
            lines.append(
                f"{indent}{bullet} {part.cloud} ({where}{swaps}): {_target(part, part_query)}"
            )
        else:
            kind = "fan-out" if isinstance(part, FanOut) else "failover"
            lines.append(f"{indent}{bullet} {label} ({kind}):")
            lines += _combined_lines(part, part_query, indent + "   ")
    return lines


def _combined_json(decision: Combined, query: str | None) -> dict[str, Any]:
    steps = []
    for label, part, part_query in _steps(decision, query):
        if isinstance(part, Forward):
            steps.append(
                {
                    "label": label,
                    "decision": "forward",
                    "cloud": part.cloud,
                    "remote": part.remote,
                    "target": _target(part, part_query),
                    "set_headers": {
                        header_title(k): _mask(k, v) for k, v in part.set_headers.items()
                    },
                    "swap_tokens": sorted(header_title(h) for h in part.swap_tokens),
                }
            )
        else:
            steps.append({"label": label} | _combined_json(part, part_query))
    fanout = isinstance(decision, FanOut)
    return {
        "decision": "fanout" if fanout else "failover",
        "service_type": decision.service_type,
        "expression": decision.expression,
        "parts" if fanout else "candidates": steps,
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
