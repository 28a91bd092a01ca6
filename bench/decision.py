"""Part 2: the routing decision alone (``scoperouter.routing.decide``), no I/O.

A typical request of a scoped OpenStack client: ``GET /v2/images?limit=20`` on the image frontend
of the first cloud's router, with the complete scope the client plugin sends (five service types,
image on another cloud) on the token and in ``X-Scope``. Measured at 2 clouds and at 1000 clouds
x 10 services, also local (image on this cloud), unscoped, and with a scope the router has not
seen yet (``decide`` caches parsed scopes; a new session's first request misses that cache).
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
import timeit
from dataclasses import asdict, dataclass

from bench.federation import SERVICE_PORTS, cloud_name, synthetic
from scoperouter.catalog import Catalog
from scoperouter.config import build_catalog
from scoperouter.errors import Reject
from scoperouter.routing import Forward, RequestFacts, decide

# A Fernet token is ~180 characters of urlsafe base64.
TOKEN = "gAAAAABm" + "x" * 175
CLIENT_SERVICES = ("compute", "identity", "image", "network", "placement")


@dataclass
class DecisionResult:
    clouds: int
    services: int
    case: str
    us_per_decision: float  # best of the repeats
    us_median: float
    iterations: int  # per repeat
    repeats: int
    outcome: str  # what decide returned, for the reader to check the case is the one meant


@dataclass
class CatalogBuild:
    clouds: int
    services: int
    endpoints: int
    build_ms: float


def _facts(cloud: str, scope_text: str | None, service: str = "image") -> RequestFacts:
    port, path = SERVICE_PORTS[service]
    headers = {
        "host": f"router.{cloud.lower()}.example:{port}",
        "user-agent": "openstacksdk/4.0.0 keystoneauth1/5.8.0 python-requests/2.32.3 CPython/3.11",
        "accept": "application/json",
        "accept-encoding": "gzip, deflate",
        "connection": "keep-alive",
    }
    if scope_text is None:
        headers["x-auth-token"] = TOKEN
    else:
        headers["x-auth-token"] = f"{TOKEN}!SCOPE!{scope_text}"
        headers["x-scope"] = scope_text
    return RequestFacts(
        method="GET",
        scheme="http",
        host=f"router.{cloud.lower()}.example",
        port=port,
        path=f"{path}/v2/images?limit=20",
        headers=headers,
        mode="reverse",
    )


def client_scope(local: str, image: str) -> str:
    """The complete scope a client plugin sends: its own cloud for all but image."""
    scope = {st: local for st in CLIENT_SERVICES}
    scope["image"] = image
    return json.dumps(scope)


def distinct_scopes(local: str, image: str, n: int) -> list[str]:
    """`n` different texts of the same scope (key order and spacing vary): every one is a
    cache miss for ``decide`` once `n` exceeds its cache (4096 entries)."""
    scope = {st: local for st in CLIENT_SERVICES}
    scope["image"] = image
    out: list[str] = []
    for order in itertools.permutations(CLIENT_SERVICES):
        for spacing in itertools.product((":", ": "), repeat=len(order)):
            for commas in itertools.product((",", ", "), repeat=len(order) - 1):
                parts = [f'"{k}"{sep}"{scope[k]}"' for k, sep in zip(order, spacing, strict=True)]
                text = parts[0] + "".join(c + p for c, p in zip(commas, parts[1:], strict=True))
                out.append("{" + text + "}")
                if len(out) == n:
                    return out
    return out


def _describe(decision: Forward | Reject) -> str:
    if isinstance(decision, Reject):
        return f"reject {decision.status}"
    where = "remote router" if decision.remote else "local backend"
    return f"forward to {decision.cloud} {where}"


def _time(fn, iterations: int, repeats: int) -> tuple[float, float]:
    fn()  # warm caches (lru, dict indexes)
    timer = timeit.Timer(fn)
    runs = [t / iterations * 1e6 for t in timer.repeat(repeat=repeats, number=iterations)]
    return min(runs), statistics.median(runs)


def build(n_clouds: int) -> tuple[Catalog, CatalogBuild]:
    data = synthetic(n_clouds)
    start = time.perf_counter()
    catalog = build_catalog(data)
    elapsed = (time.perf_counter() - start) * 1000
    n_endpoints = sum(len(c.endpoints) for c in catalog.clouds.values())
    return catalog, CatalogBuild(n_clouds, len(catalog.service_types), n_endpoints, elapsed)


def run(
    sizes: tuple[int, ...] = (2, 1000), iterations: int = 100_000, repeats: int = 5
) -> tuple[list[DecisionResult], list[CatalogBuild]]:
    results: list[DecisionResult] = []
    builds: list[CatalogBuild] = []
    for n in sizes:
        catalog, built = build(n)
        builds.append(built)
        local, remote = cloud_name(0), cloud_name(n - 1)
        cases = {
            "scoped, image on another cloud": _facts(local, client_scope(local, remote)),
            "scoped, image on this cloud": _facts(local, client_scope(local, local)),
            "unscoped (plain token)": _facts(local, None),
        }
        for case, facts in cases.items():

            def one(
                facts: RequestFacts = facts, catalog: Catalog = catalog, local: str = local
            ) -> Forward | Reject:
                return decide(facts, catalog, local)

            best, median = _time(one, iterations, repeats)
            results.append(
                DecisionResult(
                    n, built.services, case, best, median, iterations, repeats, _describe(one())
                )
            )
        # A scope never seen before: cycle through more distinct texts than the cache holds.
        misses = [_facts(local, text) for text in distinct_scopes(local, remote, 5000)]
        cycle = itertools.cycle(misses)

        def miss(
            cycle: itertools.cycle = cycle, catalog: Catalog = catalog, local: str = local
        ) -> Forward | Reject:
            return decide(next(cycle), catalog, local)

        n_miss = max(iterations // 10, len(misses))
        best, median = _time(miss, n_miss, repeats)
        results.append(
            DecisionResult(
                n,
                built.services,
                "scoped, new scope (cache miss)",
                best,
                median,
                n_miss,
                repeats,
                _describe(miss()),
            )
        )
    return results, builds


def as_dicts(items: list) -> list[dict]:
    return [asdict(x) for x in items]
