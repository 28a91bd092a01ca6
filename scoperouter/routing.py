"""The routing decision: where one request goes, as data.

``decide(facts, catalog, local_cloud)`` is a pure function of the request's method, URL and
headers, the federation catalog and the name of the cloud this router serves. It returns either a
:class:`Forward` (the target URL and the header edits) or a :class:`~scoperouter.errors.Reject`
(status and message). The mitmproxy addons apply it, ``scoperouter route`` prints it, tests
assert on it: one object, no I/O.

The rules, in order (docs/design.md has the rationale):

1. ``X-Scope-Hops`` counts the routers a request has passed; one that arrives having passed
   ``hop_limit`` of them is refused with 508, wherever it would go. Every forward carries the
   count on, to another cloud's router and to this cloud's backends alike (a "backend" that is
   in fact a router then counts the hop too).
2. The URL names a service: the catalog entry whose URL is the longest prefix of the request's
   (reverse mode: this router's frontend; forward mode: the absolute URL). No match: 404 in
   reverse mode, 403 in forward mode (the forward proxy is not an open proxy).
3. The scope comes from the token (``X-Auth-Token: <token>!SCOPE!<json>``), else ``X-Scope``;
   the token wins when both are present. Identity requests with neither may carry it on
   ``X-Subject-Token`` (token validation goes to the cloud that issued the token).
4. No scope: the request goes where it was addressed, unchanged.
5. A scope is validated (every cloud it names must exist and offer the services the federation
   routes; entries for other service types are carried, not used) and completed with this
   router's cloud for the services it does not name, so "local" keeps meaning the cloud where
   the request entered the federation. A scope the request's workflow cannot honour (placement
   or block storage named elsewhere than compute, for a compute request:
   :data:`scope.FOLLOWS`) is refused.
6. The target cloud serves the request: this cloud's backend, or the other cloud's router.
7. Keystone only sees its own tokens: the scope is stripped from ``X-Subject-Token`` always and
   from ``X-Auth-Token`` when the target is the identity service.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Final, Literal, overload

from scoperouter.catalog import Catalog, Endpoint, Match
from scoperouter.errors import Reject
from scoperouter.merge import ListPlan, ResourcePlan, plan_read
from scoperouter.prepared import Prepared, prepared_scope
from scoperouter.scope import (
    FOLLOWS,
    SCOPE_SEPARATOR,
    WHY_FOLLOWS,
    AllOf,
    CloudName,
    Expr,
    Scope,
    format_expression,
    split_token,
)

AUTH_TOKEN: Final = "x-auth-token"
SERVICE_TOKEN: Final = "x-service-token"
SUBJECT_TOKEN: Final = "x-subject-token"
SCOPE_HEADER: Final = "x-scope"
HOPS_HEADER: Final = "x-scope-hops"
FRONTEND_HEADER: Final = "x-scope-frontend"
"""On a hop over a peer link: the frontend of the peer router the request is for (the link is
one address for every service, so the receiving router needs to be told which)."""
IDENTITY: Final = "identity"

Mode = Literal["reverse", "forward"]
"""reverse: a client called one of this router's frontends; forward: a service of this cloud
used the router as its HTTP proxy (the request names an absolute URL)."""


def header_title(name: str) -> str:
    """``x-service-token`` -> ``X-Service-Token``: how headers are named to humans."""
    return "-".join(part.capitalize() for part in name.split("-"))


# Decisions and facts are plain slotted dataclasses rather than frozen ones: they are built on
# every request, and frozen construction costs ~1.5 us. Treat them as immutable all the same.
@dataclass(slots=True, kw_only=True, init=False)  # __init__ written out: see Forward
class RequestFacts:
    """What the router knows about a request when its headers have arrived."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent
    headers: Mapping[str, str]  # lower-case names
    mode: Mode = "reverse"

    # fmt: off
    def __init__(
        self, *, method: str, scheme: str, host: str, port: int, path: str,
        headers: Mapping[str, str], mode: Mode = "reverse",
    ) -> None:
        self.method, self.scheme, self.host, self.port = method, scheme, host, port
        self.path, self.headers, self.mode = path, headers, mode
    # fmt: on


# __init__ written out: dataclasses' is Python even compiled (decide() 1.30 -> 0.66 us mypyc)
@dataclass(slots=True, kw_only=True, init=False)
class Forward:
    """Send the request to `url` with these header edits."""

    cloud: str  # the cloud that serves the request
    service_type: str
    interface: str
    remote: bool  # True: `url` is another cloud's router; False: a backend of this cloud
    url: str
    set_headers: Mapping[str, str] = field(default_factory=dict)
    scope: Scope | None = None
    # Cross-cloud identity (applied by the proxy, which does the I/O):
    # headers carrying a token of THIS cloud's service that the target cloud never issued; the
    # router checks each is a valid local service token, then replaces it with its own token for
    # the target cloud (X-Service-Token of nova -> glance; X-Auth-Token of a token validation).
    swap_tokens: frozenset[str] = frozenset()
    # A token validation answered by another cloud's keystone: its catalog lists that cloud's
    # region only; the proxy adds this region's name to each endpoint so local services, which
    # filter the catalog by their own region, find the endpoints (no OpenStack code patched).
    catalog_region: str | None = None

    # fmt: off
    def __init__(
        self, *, cloud: str, service_type: str, interface: str, remote: bool, url: str,
        set_headers: Mapping[str, str] | None = None, scope: Scope | None = None,
        swap_tokens: frozenset[str] = frozenset(), catalog_region: str | None = None,
    ) -> None:
        self.cloud, self.service_type, self.interface = cloud, service_type, interface
        self.remote, self.url, self.scope = remote, url, scope
        self.set_headers = {} if set_headers is None else set_headers  # None: a new dict
        self.swap_tokens, self.catalog_region = swap_tokens, catalog_region
    # fmt: on


Decision = Forward | Reject


def hop_count(headers: Mapping[str, str], catalog: Catalog) -> int | Reject:
    """The routers this request has passed (``X-Scope-Hops``), or why it is refused."""
    hops_text = headers.get(HOPS_HEADER, "0")
    if not (hops_text.isascii() and hops_text.isdigit()) or len(hops_text) > 4:
        return Reject(400, f"invalid {HOPS_HEADER} header {hops_text[:20]!r}: expected a count")
    hops = int(hops_text)
    limit = catalog.settings.hop_limit
    if hops >= limit:
        return Reject(
            508,
            f"routing loop: the request already crossed {hops} routers (hop_limit {limit}); "
            "check that the routers' federation configs agree and that no backend is a router",
        )
    return hops


@overload
def decide(
    facts: RequestFacts, catalog: Catalog, local_cloud: str, combined: Literal[False] = False
) -> Decision: ...
@overload
def decide(
    facts: RequestFacts, catalog: Catalog, local_cloud: str, combined: Literal[True]
) -> Decision | Combined: ...
def decide(
    facts: RequestFacts, catalog: Catalog, local_cloud: str, combined: bool = False
) -> Decision | Combined:
    """The routing decision for one request (pure; see the module docstring for the rules).

    A scope entry that combines clouds (``A & B``, ``A | B``) is answered 501 unless the
    caller runs fan-out and failover (``combined=True``, as both data paths and ``scoperouter
    route`` do): then the decision is a :class:`FanOut` or a :class:`Failover` (or the 400 for
    a request ``&`` cannot serve)."""
    headers = facts.headers
    # No X-Scope-Hops: a client's request, the common case (hop_limit is at least 1).
    hops = 0 if HOPS_HEADER not in headers else hop_count(headers, catalog)
    if isinstance(hops, Reject):
        return hops
    match = catalog.match(facts.host, facts.port, facts.path)
    if match is None:
        return _no_service(facts, local_cloud)
    endpoint = match.endpoint

    # Keystone must only ever see its own tokens: strip the scope from the subject token on
    # every path, scoped or not.
    subject = headers.get(SUBJECT_TOKEN)
    base_headers: dict[str, str] = {
        HOPS_HEADER: _HOP_TEXT[hops + 1] if hops < _HOP_TEXT_MAX else str(hops + 1)
    }
    if subject is not None and SCOPE_SEPARATOR in subject:
        base_headers[SUBJECT_TOKEN] = split_token(subject)[0]
    service_type = endpoint.service_type
    # The scope: on the token (the common case), else in X-Scope, else on X-Subject-Token.
    token: str | None = None
    scope_text: str | None = None
    found = ""
    auth = headers.get(AUTH_TOKEN)
    if auth is not None:
        token, found, scope_text = auth.partition(SCOPE_SEPARATOR)
        source = "X-Auth-Token"
    if not found:
        scope_text, source = _other_scope(headers, service_type)
    if scope_text is None:
        return _unscoped(match, catalog, local_cloud, base_headers, headers)

    prepared = catalog.memo.get(scope_text) or prepared_scope(scope_text, catalog, local_cloud)
    if type(prepared) is str:
        return Reject(400, f"invalid scope in {source}: {prepared}")
    assert isinstance(prepared, Prepared)
    if service_type in prepared.unfollowed:
        return _unfollowed(prepared.scope, service_type)
    # A service neither the scope nor this cloud names: the cloud the client addressed.
    expr = prepared.entries.get(service_type) or CloudName(endpoint.cloud)
    base_headers[SCOPE_HEADER] = prepared.json
    if token is not None:
        base_headers[AUTH_TOKEN] = (
            token if service_type == IDENTITY else token + prepared.token_suffix
        )
    if type(expr) is CloudName:
        # One cloud, the common case: inline rather than a call to _forward_to() (+0.6k
        # instructions per decision); combined expressions pay it, once per cloud.
        target = expr.name
        if target == local_cloud:
            local = (
                endpoint
                if endpoint.cloud == local_cloud
                else catalog.endpoint(local_cloud, service_type, endpoint.interface)
            )
            if local is None:  # _validate checked the cloud offers the service; be safe anyway
                return Reject(400, f"{local_cloud} has no {service_type} service")
            return _to_backend(match, local, base_headers, prepared.scope)
        remote = catalog.endpoint(target, service_type, endpoint.interface)
        if remote is None:
            return Reject(400, f"{target} has no {service_type} service")
        return _to_router(
            match, remote, base_headers, headers, catalog, local_cloud, prepared.scope
        )
    if not combined:
        return Reject(501, not_implemented_message(service_type, expr))
    # Not a closure here: its free variables would make decide()'s locals cells (slower).
    return _combined(
        expr,
        facts,
        service_type,
        partial(_one_of, match, base_headers, headers, catalog, local_cloud, prepared, token),
    )


def _one_of(
    match: Match,
    base_headers: dict[str, str],
    headers: Mapping[str, str],
    catalog: Catalog,
    local_cloud: str,
    prepared: Prepared,
    token: str | None,
    cloud: str,
) -> Forward | Reject:
    """One cloud of a combined expression. The scope it carries on names that cloud alone
    for the service (and for the services that follow it, see FOLLOWS): the next router must
    deliver the request, not combine it again (two routers fanning out to each other would
    multiply it until the hop limit)."""
    service_type = match.endpoint.service_type
    combined = prepared.entries.get(service_type)
    narrowed: dict[str, Expr] = {service_type: CloudName(cloud)}
    for follower, leader in FOLLOWS.items():  # placement goes where its compute goes
        if leader == service_type and prepared.entries.get(follower) == combined:
            narrowed[follower] = CloudName(cloud)
    scope = Scope.of({**prepared.entries, **narrowed})
    set_headers = dict(base_headers)
    scope_json = scope.to_json()
    set_headers[SCOPE_HEADER] = scope_json
    if token is not None and service_type != IDENTITY:
        set_headers[AUTH_TOKEN] = token + SCOPE_SEPARATOR + scope_json
    return _forward_to(cloud, match, set_headers, headers, catalog, local_cloud, scope)


def not_implemented_message(service_type: str, expr: Expr) -> str:
    """The 501 of ``decide(..., combined=False)`` for a combined expression: a caller that
    cannot run fan-out/failover (both data paths and ``scoperouter route`` do)."""
    return (
        f"scope for {service_type!r} is {format_expression(expr)!r}: combining clouds "
        "with '&' or '|' is not supported here; name one cloud"
    )


def _forward_to(
    target: str,
    match: Match,
    base_headers: dict[str, str],
    headers: Mapping[str, str],
    catalog: Catalog,
    local_cloud: str,
    scope: Scope,
) -> Forward | Reject:
    """The request sent to one cloud of a combined expression: this cloud's backend, or
    `target`'s router (decide() has the same steps inline for a single cloud)."""
    endpoint = match.endpoint
    service_type = endpoint.service_type
    if target == local_cloud:
        local = (
            endpoint
            if endpoint.cloud == local_cloud
            else catalog.endpoint(local_cloud, service_type, endpoint.interface)
        )
        if local is None:  # _validate checked the cloud offers the service; be safe anyway
            return Reject(400, f"{local_cloud} has no {service_type} service")
        return _to_backend(match, local, base_headers, scope)

    remote = catalog.endpoint(target, service_type, endpoint.interface)
    if remote is None:
        return Reject(400, f"{target} has no {service_type} service")
    return _to_router(match, remote, base_headers, headers, catalog, local_cloud, scope)


@dataclass(frozen=True, slots=True)
class FanOut:
    """``A & B`` on a read: every part is asked at once (its request's query from
    ``plan.query_for(label)``), and ``merge.merge_list(plan, ...)`` makes the answer of a list,
    ``merge.find_one(plan, ...)`` the answer of one resource.

    A part is one cloud (a Forward) or ``A | B`` inside the merge (a Failover); a part's label
    in the plan (and in the merged marker) is its expression text."""

    service_type: str
    expression: str
    parts: tuple[tuple[str, Forward | Failover], ...]  # (label, how to reach it), in order
    plan: ListPlan | ResourcePlan


@dataclass(frozen=True, slots=True)
class Failover:
    """``A | B``: try the candidates left to right (``scoperouter.failover`` says when to move
    on); a candidate is one cloud (a Forward) or ``A & B`` inside the failover (a FanOut)."""

    service_type: str
    expression: str
    candidates: tuple[Forward | FanOut, ...]


Combined = FanOut | Failover


def _part(
    part: Expr, facts: RequestFacts, service_type: str, one: Callable[[str], Forward | Reject]
) -> Forward | Combined | Reject:
    if isinstance(part, CloudName):
        return one(part.name)
    return _combined(part, facts, service_type, one)


def _combined(
    expr: Expr,
    facts: RequestFacts,
    service_type: str,
    one: Callable[[str], Forward | Reject],
) -> Combined | Reject:
    """The fan-out or failover decision for a combined expression (decide(combined=True))."""
    assert not isinstance(expr, CloudName)  # decide() and _part() handle a single cloud
    text = format_expression(expr)
    if isinstance(expr, AllOf):
        labels = tuple(format_expression(part) for part in expr.parts)
        plan = plan_read(service_type, facts.method, facts.path, labels, facts.headers)
        if isinstance(plan, Reject):
            return plan
        parts: list[tuple[str, Forward | Failover]] = []
        for label, part in zip(labels, expr.parts, strict=True):
            decision = _part(part, facts, service_type, one)
            if isinstance(decision, Reject):
                return decision
            assert not isinstance(decision, FanOut)  # the parser flattens A & (B & C)
            parts.append((label, decision))
        return FanOut(service_type, text, tuple(parts), plan)
    candidates: list[Forward | FanOut] = []
    for part in expr.parts:
        decision = _part(part, facts, service_type, one)
        if isinstance(decision, Reject):
            return decision
        assert not isinstance(decision, Failover)  # the parser flattens A | (B | C)
        candidates.append(decision)
    return Failover(service_type, text, tuple(candidates))


# X-Scope-Hops values, made once (a hop count is small: hop_limit is 8 by default).
_HOP_TEXT_MAX: Final = 64
_HOP_TEXT: Final = tuple(str(n) for n in range(_HOP_TEXT_MAX + 1))


def _to_backend(
    match: Match, local: Endpoint, set_headers: dict[str, str], scope: Scope | None = None
) -> Forward:
    """Deliver to a backend of this cloud."""
    return Forward(
        cloud=local.cloud,
        service_type=local.service_type,
        interface=local.interface,
        remote=False,
        url=match.target(local.backend),
        set_headers=set_headers,
        scope=scope,
    )


def _to_router(
    match: Match,
    remote: Endpoint,
    set_headers: dict[str, str],
    headers: Mapping[str, str],
    catalog: Catalog,
    local_cloud: str,
    scope: Scope | None = None,
) -> Forward:
    """Send to another cloud's router, marking the identity edits the proxy must make."""
    swaps, region = _identity_edits(headers, remote.service_type, catalog, local_cloud)
    url = match.target(remote.url)
    peer = catalog.clouds[remote.cloud].peer
    if peer is not None:
        # The peer link: the same request, sent to the peer router's link address, naming the
        # frontend it is for (a copy: fan-out parts share the dict they were given).
        base = remote.url.base
        url = peer.url.base + url[len(base) :]
        set_headers = {**set_headers, FRONTEND_HEADER: base}
    return Forward(
        cloud=remote.cloud,
        service_type=remote.service_type,
        interface=remote.interface,
        remote=True,
        url=url,
        set_headers=set_headers,
        scope=scope,
        swap_tokens=swaps,
        catalog_region=region,
    )


def _other_scope(headers: Mapping[str, str], service_type: str) -> tuple[str | None, str]:
    """The scope of a request whose token carries none: (scope text or None, its header)."""
    scope_header = headers.get(SCOPE_HEADER)
    if scope_header is not None:
        return scope_header, "X-Scope"
    if service_type == IDENTITY and (subject := headers.get(SUBJECT_TOKEN)) is not None:
        _, scope_text = split_token(subject)
        if scope_text is not None:
            return scope_text, "X-Subject-Token"
    return None, ""


def _unfollowed(scope: Scope, service_type: str) -> Reject:
    """The 400 for a request of `service_type` whose scope names a follower of it elsewhere
    (the first such follower, by name)."""
    leader = scope[service_type]
    follower = min(
        f for f, lead in FOLLOWS.items() if lead == service_type and scope.get(f, leader) != leader
    )
    return Reject(
        400,
        f"the scope names {format_expression(scope[follower])!r} for {follower} but "
        f"{format_expression(leader)!r} for {service_type}: {WHY_FOLLOWS[follower]}, so "
        f"{follower} cannot be moved away from {service_type}; name the same cloud for both, "
        f"or leave {follower} out",
    )


def _unscoped(
    match: Match,
    catalog: Catalog,
    local_cloud: str,
    set_headers: dict[str, str],
    headers: Mapping[str, str],
) -> Forward:
    """No scope: deliver where the client addressed it, touching nothing but the hop count
    (and a scope left on X-Subject-Token)."""
    endpoint: Endpoint = match.endpoint
    # Only this cloud's backends are reached directly; another cloud's service, even addressed
    # by its backend URL, is reached through that cloud's router (its token checks, its logs).
    if endpoint.cloud == local_cloud:
        return _to_backend(match, endpoint, set_headers)
    return _to_router(match, endpoint, set_headers, headers, catalog, local_cloud)


def _identity_edits(
    headers: Mapping[str, str], service_type: str, catalog: Catalog, local_cloud: str
) -> tuple[frozenset[str], str | None]:
    """For a request leaving this cloud: which tokens to swap, and whether to rewrite the
    catalog region of a token validation's answer (see Forward.swap_tokens/catalog_region)."""
    swaps = _SWAP_SERVICE if SERVICE_TOKEN in headers else _NO_SWAPS
    if service_type != IDENTITY:
        return swaps, None
    subject = headers.get(SUBJECT_TOKEN)
    auth = headers.get(AUTH_TOKEN)
    if subject is None or auth is None:
        return swaps, None
    # A local service (keystonemiddleware) validating a token another cloud issued: its own
    # token means nothing there. A client validating its own token needs no swap.
    if split_token(auth)[0] != split_token(subject)[0]:
        swaps = swaps | {AUTH_TOKEN}
    return swaps, catalog.clouds[local_cloud].region


_NO_SWAPS: Final[frozenset[str]] = frozenset()
_SWAP_SERVICE: Final = frozenset({SERVICE_TOKEN})


CONNECT_REFUSED = (
    "CONNECT tunnels are not supported by the forward proxy of {cloud} (it has no proxy.ca to "
    "intercept TLS with): send plain http:// requests through it, or call the https frontend "
    "directly"
)


def tunnel(host: str, port: int, catalog: Catalog, local_cloud: str) -> Reject | None:
    """A ``CONNECT host:port`` on the forward proxy (a service's ``HTTPS_PROXY``): None when it
    is intercepted (its TLS terminated with a certificate for `host` signed by the cloud's
    ``proxy.ca``, each request inside routed like a plain one), else the 403.

    Intercepted: the destinations the forward proxy routes in plain HTTP, every host:port
    where the catalog publishes an endpoint URL (a router's frontend: what keystone
    advertises) or a backend (a service reached directly: kolla's internal endpoints, an
    ``auth_url`` in a service's config). Anything else stays a 403: the proxy is no open
    proxy, and never makes a certificate for a host outside the catalog."""
    cloud = catalog.clouds.get(local_cloud)
    if cloud is None or cloud.proxy_ca is None:
        return Reject(403, CONNECT_REFUSED.format(cloud=local_cloud))
    if not catalog.published(host, port):
        return Reject(
            403,
            f"CONNECT {host[:200]}:{port}: not a destination of the federation catalog; the "
            f"forward proxy of {local_cloud} only opens tunnels to catalog destinations",
        )
    return None


def _no_service(facts: RequestFacts, local_cloud: str) -> Reject:
    path = facts.path.partition("?")[0]
    if facts.mode == "forward":
        return Reject(
            403,
            f"{facts.scheme}://{facts.host}:{facts.port}{path} is not an endpoint of the "
            "federation catalog; this proxy only reaches catalog destinations",
        )
    return Reject(404, f"no service of {local_cloud} is published at {path}")
