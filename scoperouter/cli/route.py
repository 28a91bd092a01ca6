"""``scoperouter route``: print where a cloud's router would send one request, sending
nothing (the target URL and header edits, each part of a fan-out or candidate of a failover, or
the error the client would get). Token values are never printed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scoperouter.catalog import DEFAULT_PORTS
from scoperouter.cli.common import load
from scoperouter.errors import Reject
from scoperouter.merge import ListPlan
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

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers


EPILOG = """\
examples:
  scoperouter route --config config/federation.yaml --cloud CloudOne \\
      --scope '{"image": "CloudTwo"}' GET http://127.0.0.2:9292/v2/images
  scoperouter route --config config/federation.yaml --cloud CloudOne --json \\
      -H 'X-Auth-Token: TOKEN!SCOPE!{"image": "CloudOne & CloudTwo"}' \\
      GET http://127.0.0.2:9292/v2/images

exit status: 0 forwarded, 1 refused (the error is printed), 2 bad usage/config
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    route = sub.add_parser(
        "route",
        help="print the routing decision for one request (sends nothing)",
        description="Print where the router of CLOUD would send one request: the target URL "
        "and the header changes, or the error the client would get. Nothing is sent. Token "
        "values are never printed.",
        epilog=EPILOG,
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
    route.set_defaults(func=run)
    return route


def run(args: argparse.Namespace) -> int:
    catalog = load(args.config, args.cloud)
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


_FANOUT = "each cloud's list at once, merged"
_FIND = "each cloud asked at once; the one that has it answers, 404 if none, 409 if several"
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
        f"decision: {kind} {decision.expression} (" + _describe(decision) + ")",
    ]
    lines += _combined_lines(decision, None, "  ")
    return "\n".join(lines)


def _describe(decision: Combined) -> str:
    if not isinstance(decision, FanOut):
        return _FAILOVER
    return _FANOUT if isinstance(decision.plan, ListPlan) else _FIND


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
