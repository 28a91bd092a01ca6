"""Part 2: the routing decision alone (``scoperouter.routing.decide``), no I/O.

A typical request of a scoped OpenStack client: ``GET /v2/images?limit=20`` on the image frontend
of the first cloud's router, with the complete scope the client plugin sends (five service types,
image on another cloud) on the token and in ``X-Scope``. Measured at 2 clouds and at 1000 clouds
x 10 services, also local (image on this cloud), unscoped, and with a scope the router has not
seen yet (``decide`` caches parsed scopes; a new session's first request misses that cache).
"""

from __future__ import annotations

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


def _describe(decision: Forward | Reject) -> str:
    if isinstance(decision, Reject):
        return f"reject {decision.status}"
    where = "remote router" if decision.remote else "local backend"
    return f"forward to {decision.cloud} {where}"


def _time(fn, iterations: int, repeats: int) -> tuple[float, float]:
    fn()  # warm caches (lru, dict indexes)
    # CPU time of this process, not wall time: on a machine others use, the time the process
    # waits for a core is not the decision's cost.
    timer = timeit.Timer(fn, timer=time.process_time)
    runs = [t / iterations * 1e6 for t in timer.repeat(repeat=repeats, number=iterations)]
    return min(runs), statistics.median(runs)


def build(n_clouds: int) -> tuple[Catalog, CatalogBuild]:
    data = synthetic(n_clouds)
    start = time.perf_counter()
    catalog = build_catalog(data)
    elapsed = (time.perf_counter() - start) * 1000
    n_endpoints = sum(len(c.endpoints) for c in catalog.clouds.values())
    return catalog, CatalogBuild(n_clouds, len(catalog.service_types), n_endpoints, elapsed)


def build_cpu(n_clouds: int, repeats: int = 3) -> dict[str, float]:
    """CPU seconds of this process to build the catalog of `n_clouds` clouds (what a reload
    costs a worker, in its reload thread): best and median of `repeats` builds."""
    data = synthetic(n_clouds)
    runs = []
    for _ in range(repeats):
        start = time.process_time()
        build_catalog(data)
        runs.append(time.process_time() - start)
    return {"clouds": n_clouds, "best_s": min(runs), "median_s": statistics.median(runs)}


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
        # A scope never seen before (the first request of a session): the memo is emptied
        # before each decision, so every one parses, validates and completes the scope.
        heavy = {
            "scoped, new scope (cache miss)": client_scope(local, remote),
            # Refused before any entry is parsed (issue 12 measured 3.2 ms for these).
            "scope of 372 unknown keys (refused)": json.dumps({f"s{i}": local for i in range(372)}),
            # The most a scope may name: 99 service types the federation does not route
            # (carried), and image.
            "scope of 100 entries, new (carried)": json.dumps(
                {**{f"s{i}": local for i in range(99)}, "image": remote}
            ),
        }
        for case, text in heavy.items():
            facts = _facts(local, text)

            def cold(
                facts: RequestFacts = facts, catalog: Catalog = catalog, local: str = local
            ) -> Forward | Reject:
                catalog.memo.clear()
                return decide(facts, catalog, local)

            n_cold = max(iterations // 10, 1000)
            best, median = _time(cold, n_cold, repeats)
            results.append(
                DecisionResult(
                    n, built.services, case, best, median, n_cold, repeats, _describe(cold())
                )
            )
    return results, builds


def as_dicts(items: list) -> list[dict]:
    return [asdict(x) for x in items]
