"""A request's scope text prepared for one router: parsed, validated against the federation
catalog and completed with the router's cloud, once per scope text (memoised on the catalog).

:func:`scoperouter.routing.decide` asks for it on every scoped request and reads what it
needs per request from :class:`Prepared` (computed here once); the rules it applies are
routing's (its module docstring, rule 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scoperouter.catalog import Catalog
from scoperouter.scope import SCOPE_SEPARATOR, CloudName, Expr, Scope, ScopeError, clouds_of


@dataclass(frozen=True, slots=True)
class Prepared:
    """A scope text parsed, validated and completed for one router (memoised per catalog)."""

    scope: Scope
    json: str  # scope.to_json(), sent on the token and in X-Scope
    unfollowed: frozenset[str]  # service types whose requests cannot honour this scope
    # What decide() needs per request, computed once per scope text: the entries as a plain
    # dict, and the text appended to the bare token ("!SCOPE!" + json).
    entries: dict[str, Expr] = field(init=False, repr=False, compare=False)
    token_suffix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", dict(self.scope.items()))
        object.__setattr__(self, "token_suffix", SCOPE_SEPARATOR + self.json)


def prepared_scope(text: str, catalog: Catalog, local_cloud: str) -> Prepared | str:
    """The scope text parsed, validated against the catalog and completed for `local_cloud`,
    or the one-line problem. Valid answers are memoised on the catalog object (a reload starts
    with a fresh catalog, so the memo never holds an answer computed for another config);
    refused input is never kept, and the memo has a budget (``catalog.MEMO_BUDGET`` characters
    of scope text), so distinct scopes, valid or hostile, cannot grow memory."""
    memo = catalog.memo
    prepared: Prepared | None = memo.get(text)
    if prepared is not None:
        return prepared
    try:
        scope = Scope.parse(text)
    except ScopeError as exc:
        return exc.message
    problem = _validate(scope, catalog)
    if problem is not None:
        return problem
    # Complete only with what this cloud offers: naming it for a service it lacks would make
    # the next router refuse the scope.
    completed = scope.complete(catalog.service_types_of(local_cloud), local_cloud)
    prepared = Prepared(completed, completed.to_json(), completed.unfollowed())
    memo.put(text, prepared, len(text) + len(prepared.json))
    return prepared


def _validate(scope: Scope, catalog: Catalog) -> str | None:
    """Every cloud the scope names must exist, and offer the service where the federation
    routes that service type; None when all is well.

    An entry for a service type the federation does not route is *carried, not used*: a
    keystone catalog may list a service that the federation config does not (an operator adding
    one, a test creating one), and clients complete their scope from that catalog. Refusing such
    entries broke every scoped request of the cloud, including the one that would repair it. No
    request of that type reaches the router's routing (it matches no catalog URL), so the entry
    cannot change where anything goes; it travels on unchanged so that a router whose config
    does list the type (during a rolling config change) still sees what the client meant.
    """
    for service_type, expr in scope.items():
        routed = service_type in catalog.service_types
        for name in (expr.name,) if isinstance(expr, CloudName) else clouds_of(expr):
            if name not in catalog.clouds:
                return f"unknown cloud {name!r} for {service_type!r} (known: {_clouds(catalog)})"
            if routed and catalog.endpoint(name, service_type, "public") is None:
                return f"cloud {name!r} has no {service_type!r} service"
    return None


def _clouds(catalog: Catalog) -> str:
    names = sorted(catalog.clouds)
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
