"""``A & B`` on a read: one request per cloud, one answer (pure, no I/O).

A scope entry such as ``{"image": "CloudOne & CloudTwo"}`` makes a *read* go to every named
cloud at once; this module says what each cloud is asked (:func:`plan_read`) and turns the
clouds' answers into one answer: a list merged (:func:`merge_list`), or one resource found
where it is (:func:`find_one`). The router's engine does the I/O
(``scoperouter.router.fanout``).

**Which requests are reads of a list.** ``GET`` on a path that the service's API defines as a
collection: :data:`COLLECTIONS`, a small table keyed by service type, each entry the last path
segments of the collection (``servers/detail``), the key holding its items, and the way the
service writes its next-page link.

**Which are reads of one resource.** ``GET`` of ``<collection>/<id>`` for the collections of
:data:`RESOURCES` (``v2/images/<id>``, ``servers/<id>``, ``v2.0/networks/<id>``...), each
with the key its answer holds the resource in (none: the body is the resource, as glance's and
placement's). Every cloud is asked; the one that has it (2xx) answers, marked with its cloud
like a merged list's items; 404 when none has it, 409 naming the clouds when more than one has
it (the scope must then name one). So ``openstack image show``, ``server show`` and the SDK's
``find_*`` (a GET by id, then a list by name) work across clouds.

Anything else with ``&`` is refused by the router (400): a write would need replication.

**Order.** The clouds' items are concatenated in the expression's order (all of CloudOne's,
then all of CloudTwo's), each cloud's items in its own order. A page ends where the first
cloud that still has items stops, so the order is the same whatever the page sizes.

**Origin.** Every item gets one extra key, :data:`ORIGIN_KEY` (``"x-scope-cloud":
"CloudTwo"``), a string. openstacksdk ignores body keys its resources do not declare, except
for images, whose unknown keys it keeps as image properties (so ``openstack image show`` shows
the origin); glance's image schema allows extra properties only as strings, hence a string.

**Pagination.** The client's ``limit`` is sent to every cloud; its ``marker`` is a *merged
marker* (:mod:`scoperouter.merge_marker`) this module made: each cloud's state (from the
start, after its own marker = the id of the last item of it the client saw, or done). Each
cloud checks its own marker as it would if the client had sent it directly, so the merged
marker needs no signature; it is only checked for shape and size, and a garbled one is a
400. Its size is bounded by the clouds of the expression and :data:`MAX_CLOUD_MARKER`
(:func:`max_marker_length`).

**Failures.** A cloud that fails (no answer, an error status, a body that is not a list; for
one resource any status but 2xx and 404) fails the whole request naming it, unless the client
sent ``X-Scope-Partial: allow`` (:data:`PARTIAL_HEADER`): then the clouds that answered make
the answer and its ``X-Scope-Missing`` header (:data:`MISSING_HEADER`) lists the clouds left
out. A missing cloud keeps its place in the merged marker, so a later page asks it again from
the same point.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

from scoperouter.errors import Reject, error_body
from scoperouter.merge_marker import (
    DONE,
    MAX_CLOUD_MARKER,
    START,
    CloudState,
    decode_marker,
    encode_marker,
)
from scoperouter.merge_marker import (
    MARKER_PREFIX as MARKER_PREFIX,  # re-exported: the marker is part of merge's API
)
from scoperouter.merge_marker import (
    max_marker_length as max_marker_length,
)

ORIGIN_KEY = "x-scope-cloud"
ORIGIN_HEADER = "x-scope-cloud"  # on one resource found across clouds: the cloud it is in
PARTIAL_HEADER = "x-scope-partial"  # "allow": answer with the clouds that answered
MISSING_HEADER = "X-Scope-Missing"  # on a partial answer: the clouds left out, comma-separated
MAX_LIMIT_TEXT = 9  # digits of `limit`

LinkStyle = Literal["nova", "glance", "keystone", "none"]
"""How a service writes its next page: ``nova`` (and neutron, cinder): ``<key>_links`` a list
of ``{"rel": "next", "href": <absolute URL>}``; ``glance``: a top-level ``next`` path;
``keystone``: a ``links`` object whose ``next`` is a URL or null; ``none``: not paginated."""


@dataclass(frozen=True, slots=True)
class Collection:
    """One collection of one service's API."""

    suffix: tuple[str, ...]  # last path segments: ("servers", "detail")
    key: str  # the body key holding the items
    links: LinkStyle
    marker_field: str = "id"  # the item field the service's `marker` names


def _c(suffix: str, key: str, links: LinkStyle, marker_field: str = "id") -> Collection:
    return Collection(tuple(suffix.split("/")), key, links, marker_field)


COLLECTIONS: Mapping[str, tuple[Collection, ...]] = {
    "compute": (
        _c("servers", "servers", "nova"),
        _c("servers/detail", "servers", "nova"),
        _c("flavors", "flavors", "nova", "id"),
        _c("flavors/detail", "flavors", "nova", "id"),
        _c("os-server-groups", "server_groups", "nova"),
    ),
    "image": (_c("v2/images", "images", "glance"),),
    "network": (
        _c("v2.0/networks", "networks", "nova"),
        _c("v2.0/subnets", "subnets", "nova"),
        _c("v2.0/ports", "ports", "nova"),
        _c("v2.0/routers", "routers", "nova"),
        _c("v2.0/security-groups", "security_groups", "nova"),
        _c("v2.0/floatingips", "floatingips", "nova"),
    ),
    "volume": (
        _c("volumes", "volumes", "nova"),
        _c("volumes/detail", "volumes", "nova"),
        _c("snapshots", "snapshots", "nova"),
        _c("snapshots/detail", "snapshots", "nova"),
    ),
    "identity": (
        _c("v3/auth/projects", "projects", "keystone"),
        _c("v3/projects", "projects", "keystone"),
        _c("v3/users", "users", "keystone"),
        _c("v3/regions", "regions", "keystone"),
    ),
    "placement": (_c("resource_providers", "resource_providers", "none"),),
}
"""Service type -> its collections that ``&`` merges. Block storage is listed under
``volume``; add a row to merge another collection (the tests load every row)."""
COLLECTIONS = {**COLLECTIONS, "block-storage": COLLECTIONS["volume"]}


def collection_of(service_type: str, method: str, path: str) -> Collection | None:
    """The collection a request reads, or None when it is not a read of a list."""
    if method != "GET":
        return None
    segments = path.partition("?")[0].rstrip("/").split("/")
    for collection in COLLECTIONS.get(service_type, ()):
        n = len(collection.suffix)
        if tuple(segments[-n:]) == collection.suffix:
            return collection
    return None


@dataclass(frozen=True, slots=True)
class Resource:
    """One kind of resource of a service's API, read by id."""

    suffix: tuple[str, ...]  # the last path segments of its collection: ("v2", "images")
    key: str | None  # the body key holding it (nova's "server"); None: the body is it


def _r(suffix: str, key: str | None) -> Resource:
    return Resource(tuple(suffix.split("/")), key)


RESOURCES: Mapping[str, tuple[Resource, ...]] = {
    "compute": (
        _r("servers", "server"),
        _r("flavors", "flavor"),
        _r("os-server-groups", "server_group"),
    ),
    "image": (_r("v2/images", None),),
    "network": (
        _r("v2.0/networks", "network"),
        _r("v2.0/subnets", "subnet"),
        _r("v2.0/ports", "port"),
        _r("v2.0/routers", "router"),
        _r("v2.0/security-groups", "security_group"),
        _r("v2.0/floatingips", "floatingip"),
    ),
    "volume": (_r("volumes", "volume"), _r("snapshots", "snapshot")),
    "identity": (
        _r("v3/projects", "project"),
        _r("v3/users", "user"),
        _r("v3/regions", "region"),
    ),
    "placement": (_r("resource_providers", None),),
}
"""Service type -> the resources ``&`` finds by id (``GET <collection>/<id>``): the
collections of :data:`COLLECTIONS`, one resource of each. Block storage is listed under
``volume``."""
RESOURCES = {**RESOURCES, "block-storage": RESOURCES["volume"]}


def resource_of(service_type: str, method: str, path: str) -> Resource | None:
    """The kind of resource a request reads by id, or None when it is not such a read (a
    list is not: :func:`collection_of` is asked first)."""
    if method != "GET":
        return None
    segments = path.partition("?")[0].rstrip("/").split("/")
    for resource in RESOURCES.get(service_type, ()):
        n = len(resource.suffix)
        if len(segments) > n and segments[-1] and tuple(segments[-n - 1 : -1]) == resource.suffix:
            return resource
    return None


# --- planning and merging ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListPlan:
    """What to ask each cloud for one page of a merged list."""

    service_type: str
    collection: Collection
    path: str  # without the query
    query: tuple[tuple[str, str], ...]  # the client's, without limit and marker
    clouds: tuple[str, ...]  # every cloud of the expression, in its order
    limit: int | None
    states: Mapping[str, CloudState]  # per cloud, from the client's marker
    partial: bool  # the client accepts an answer without the clouds that failed

    @property
    def asked(self) -> tuple[str, ...]:
        """The clouds that still have items: each gets one request."""
        return tuple(c for c in self.clouds if self.states[c] is not DONE)

    def query_for(self, cloud: str) -> str:
        """The query to send to `cloud` (its own limit and marker): ``"?..."`` or ``""``."""
        query = list(self.query)
        if self.limit is not None:
            query.append(("limit", str(self.limit)))
        state = self.states[cloud]
        if state:
            query.append(("marker", state))
        return f"?{urlencode(query)}" if query else ""

    def target(self, cloud: str) -> str:
        """The path and query to send to `cloud`."""
        return self.path + self.query_for(cloud)


def plan_read(
    service_type: str,
    method: str,
    path: str,
    clouds: Sequence[str],
    headers: Mapping[str, str],
) -> ListPlan | ResourcePlan | Reject:
    """What each cloud of ``A & B`` is asked: a page of a merged list, one resource, or the
    400 for a request ``&`` cannot serve (`path` with its query, as the client sent it;
    `headers` with lower-case names)."""
    if collection_of(service_type, method, path) is not None:
        return plan_list(service_type, method, path, clouds, headers)
    resource = resource_of(service_type, method, path)
    if resource is None:
        reads = (
            "only reads, a list (GET of a collection, merged) or one resource (GET by id, "
            "found in the cloud that has it)"
        )
        return _not_a_read(service_type, method, path, clouds, reads)
    partial = headers.get(PARTIAL_HEADER, "").strip().lower() == "allow"
    return ResourcePlan(service_type, resource, path, tuple(clouds), partial)


def plan_list(
    service_type: str,
    method: str,
    path: str,
    clouds: Sequence[str],
    headers: Mapping[str, str],
) -> ListPlan | Reject:
    """Plan one page of a merged list (`path` with its query, as the client sent it), or the
    400 for a request that is not a read of a list. `headers` have lower-case names."""
    collection = collection_of(service_type, method, path)
    if collection is None:
        reads = "only merges reads of a list (GET of a collection)"
        return _not_a_read(service_type, method, path, clouds, reads)
    base, _, query_text = path.partition("?")
    query: list[tuple[str, str]] = []
    limit: int | None = None
    marker: str | None = None
    for name, value in parse_qsl(query_text, keep_blank_values=True):
        if name == "limit":
            if not (value.isascii() and value.isdigit()) or len(value) > MAX_LIMIT_TEXT:
                return Reject(400, f"invalid limit {value[:20]!r}: expected a count")
            limit = int(value)
        elif name == "marker":
            marker = value
        else:
            query.append((name, value))
    if marker is None:
        states: Mapping[str, CloudState] = dict.fromkeys(clouds, START)
    else:
        decoded = decode_marker(marker, clouds)
        if isinstance(decoded, Reject):
            return decoded
        states = decoded
    partial = headers.get(PARTIAL_HEADER, "").strip().lower() == "allow"
    return ListPlan(
        service_type, collection, base, tuple(query), tuple(clouds), limit, states, partial
    )


def _not_a_read(
    service_type: str, method: str, path: str, clouds: Sequence[str], reads: str
) -> Reject:
    what = f"{method} {path.partition('?')[0]}"
    return Reject(
        400,
        f"{' & '.join(clouds)} for {service_type!r}: '&' {reads}, not {what}; name one cloud "
        "for it (or use '|')",
    )


@dataclass(frozen=True, slots=True)
class CloudAnswer:
    """A cloud's answer to its request of the plan."""

    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True, slots=True)
class CloudFailure:
    """A cloud that gave no answer: why, in words, and the status it means for the client
    (502: refused or broken, 504: no answer in time)."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class Merged:
    """The answer to the client."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


# Headers of the first answering cloud that describe the body and stay true after the merge.
_KEPT_HEADERS = ("content-type", "openstack-api-version", "x-openstack-nova-api-version", "vary")


def merge_list(
    plan: ListPlan, answers: Mapping[str, CloudAnswer | CloudFailure], base_url: str
) -> Merged:
    """One page from the clouds' answers (one per cloud in ``plan.asked``).

    `base_url` is ``scheme://host:port`` as the client addressed the router: the next link
    points there. Cost: linear in the items and links of the answers."""
    items_of: dict[str, list[dict[str, Any]]] = {}
    more: dict[str, bool] = {}
    failed: dict[str, tuple[int, str]] = {}
    first: CloudAnswer | None = None
    for cloud in plan.asked:
        answer = answers.get(cloud)
        if answer is None:
            failed[cloud] = (502, "it was not asked")
            continue
        if isinstance(answer, CloudFailure):
            failed[cloud] = (answer.status, answer.reason)
            continue
        read = _read(answer, plan.collection)
        if isinstance(read, CloudFailure):
            failed[cloud] = (read.status, read.reason)
            continue
        items_of[cloud], more[cloud] = read
        first = first or answer
    if failed and (not plan.partial or not items_of):
        return _failure(plan, failed)

    page: list[dict[str, Any]] = []
    states = dict(plan.states)
    room = plan.limit if plan.limit is not None else -1
    for cloud in plan.asked:
        if cloud in failed:
            continue  # partial: it keeps its state, a later page asks it again
        items = items_of[cloud]
        take = items if room < 0 else items[:room]
        for item in take:
            item[ORIGIN_KEY] = cloud
        page.extend(take)
        if room >= 0:
            room -= len(take)
        if take:
            last = take[-1].get(plan.collection.marker_field)
            if not isinstance(last, str) or len(last) > MAX_CLOUD_MARKER:
                return _failure(plan, {cloud: (502, "its items carry no usable marker")})
            states[cloud] = last
        exhausted = len(take) == len(items) and not more[cloud]
        if exhausted:
            states[cloud] = DONE
        else:
            break  # the order is the expression's: stop where this cloud has more
    body: dict[str, Any] = {plan.collection.key: page}
    next_query = _next_url(plan, states) if _has_more(states) else None
    _write_links(body, plan, next_query, base_url)
    # No answer at all: a marker saying every cloud is done (never one of ours), an empty page.
    kept = first.headers if first is not None else {}
    headers = {k: kept[k] for k in _KEPT_HEADERS if k in kept}
    headers.setdefault("content-type", "application/json")
    if failed:
        headers[MISSING_HEADER] = ", ".join(failed)
    return Merged(200, headers, json.dumps(body).encode())


def _has_more(states: Mapping[str, CloudState]) -> bool:
    return any(state is not DONE for state in states.values())


def _read(
    answer: CloudAnswer, collection: Collection
) -> tuple[list[dict[str, Any]], bool] | CloudFailure:
    """(the items, whether the cloud says it has more), or why the answer is unusable."""
    if not 200 <= answer.status < 300:
        return _error_of(answer)
    try:
        body = json.loads(answer.body)
    except ValueError:
        return CloudFailure(502, "its answer is not JSON")
    items = body.get(collection.key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return CloudFailure(502, f"its answer has no {collection.key!r} list")
    return items, _says_more(body, collection)


def _says_more(body: dict[str, Any], collection: Collection) -> bool:
    if collection.links == "glance":
        return bool(body.get("next"))
    if collection.links == "keystone":
        links = body.get("links")
        return isinstance(links, dict) and bool(links.get("next"))
    if collection.links == "nova":
        links = body.get(f"{collection.key}_links")
        return isinstance(links, list) and any(
            isinstance(link, dict) and link.get("rel") == "next" for link in links
        )
    return False


def _error_of(answer: CloudAnswer) -> CloudFailure:
    """A cloud's error answer: 4xx keeps its status (the client's fault, e.g. 403), anything
    else is the cloud's and becomes 502. The cloud's own message is quoted when it has one."""
    status = answer.status if 400 <= answer.status < 500 else 502
    message = ""
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    if isinstance(body, dict):
        # keystone/glance: {"error": {"message"}}, nova: {"<name>": {"message"}},
        # placement: {"errors": [{"detail"}]}, neutron: {"NeutronError": {"message"}}
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            message = str(errors[0].get("detail") or errors[0].get("title") or "")
        else:
            for value in body.values():
                if isinstance(value, dict) and "message" in value:
                    message = str(value["message"])
                    break
    text = f"it answered {answer.status}"
    return CloudFailure(status, f"{text}: {message[:300]}" if message else text)


def _failure(plan: ListPlan | ResourcePlan, failed: Mapping[str, tuple[int, str]]) -> Merged:
    status = next(iter(failed.values()))[0]
    reasons = "; ".join(f"{cloud}: {why}" for cloud, (_, why) in failed.items())
    others = "list the others" if isinstance(plan, ListPlan) else "look in the others only"
    hint = "" if plan.partial else f" (send {_title(PARTIAL_HEADER)}: allow to {others})"
    message = (
        f"{' & '.join(plan.clouds)} for {plan.service_type!r}: "
        f"{', '.join(failed)} failed ({reasons}){hint}"
    )
    return Merged(status, {"content-type": "application/json"}, error_body(status, message))


def _title(name: str) -> str:
    return "-".join(part.capitalize() for part in name.split("-"))


def _next_url(plan: ListPlan, states: Mapping[str, CloudState]) -> str:
    query = list(plan.query)
    if plan.limit is not None:
        query.append(("limit", str(plan.limit)))
    query.append(("marker", encode_marker(states)))
    return f"?{urlencode(query)}"


def _write_links(
    body: dict[str, Any], plan: ListPlan, next_query: str | None, base_url: str
) -> None:
    """The next link in the service's own format (clients follow it as they would the
    cloud's): glance's is a path from its version segment, as glance writes it; the others'
    are absolute URLs at the router's address the client used."""
    collection = plan.collection
    if collection.links == "glance":
        own = "/" + "/".join(collection.suffix)
        first = list(plan.query)
        if plan.limit is not None:
            first.append(("limit", str(plan.limit)))
        body["first"] = f"{own}?{urlencode(first)}" if first else own
        if next_query is not None:
            body["next"] = own + next_query
    elif collection.links == "keystone":
        body["links"] = {
            "self": base_url + plan.path,
            "previous": None,
            "next": None if next_query is None else base_url + plan.path + next_query,
        }
    elif collection.links == "nova" and next_query is not None:
        href = base_url + plan.path + next_query
        body[f"{collection.key}_links"] = [{"rel": "next", "href": href}]


# --- one resource --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    """What to ask each cloud for one resource: the request as the client sent it."""

    service_type: str
    resource: Resource
    path: str  # with the query
    clouds: tuple[str, ...]  # every cloud of the expression, in its order
    partial: bool  # the client accepts an answer without the clouds that failed

    @property
    def asked(self) -> tuple[str, ...]:
        return self.clouds

    def query_for(self, cloud: str) -> None:
        """None: each cloud gets the request's own path and query."""
        return None


def find_one(plan: ResourcePlan, answers: Mapping[str, CloudAnswer | CloudFailure]) -> Merged:
    """The answer of the one cloud that has the resource (2xx), marked with its cloud (the
    :data:`ORIGIN_KEY` of the resource in the body, the :data:`ORIGIN_HEADER`); 404 when
    every cloud answered 404, 409 when more than one has it; a cloud that failed (any other
    status, no answer) fails the request naming it unless ``plan.partial``."""
    found: list[tuple[str, CloudAnswer]] = []
    failed: dict[str, tuple[int, str]] = {}
    for cloud in plan.asked:
        answer = answers.get(cloud)
        if answer is None:
            failed[cloud] = (502, "it was not asked")
        elif isinstance(answer, CloudFailure):
            failed[cloud] = (answer.status, answer.reason)
        elif 200 <= answer.status < 300:
            found.append((cloud, answer))
        elif answer.status != 404:
            error = _error_of(answer)
            failed[cloud] = (error.status, error.reason)
    expression = " & ".join(plan.clouds)
    what = f"{expression} for {plan.service_type!r}: GET {plan.path.partition('?')[0]}"
    if failed and (not plan.partial or len(failed) == len(plan.asked)):
        return _failure(plan, failed)
    missing = {MISSING_HEADER: ", ".join(failed)} if failed else {}
    if len(found) > 1:
        clouds = ", ".join(cloud for cloud, _ in found)
        message = f"{what} is in more than one cloud ({clouds}): name the one to use"
        return _error(409, message, missing)
    if not found:
        asked = " or ".join(c for c in plan.asked if c not in failed)
        return _error(404, f"{what}: not found in {asked}", missing)
    cloud, answer = found[0]
    headers = {k: v for k, v in answer.headers.items() if k != "content-length"}
    headers[ORIGIN_HEADER] = cloud
    headers.update(missing)
    return Merged(answer.status, headers, _marked(answer.body, plan.resource, cloud))


def _error(status: int, message: str, headers: Mapping[str, str]) -> Merged:
    return Merged(
        status, {"content-type": "application/json", **headers}, error_body(status, message)
    )


def _marked(body: bytes, resource: Resource, cloud: str) -> bytes:
    """`body` with the resource marked with its cloud; unchanged when it is not the JSON the
    service's API says (the answer's header still names the cloud)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    item = data.get(resource.key) if resource.key and isinstance(data, dict) else data
    if not isinstance(item, dict):
        return body
    item[ORIGIN_KEY] = cloud
    return json.dumps(data).encode()
