"""The routing decision, rule by rule, on the sample federation (no sockets)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import yaml

from scoperouter.catalog import Catalog
from scoperouter.config import build_catalog
from scoperouter.errors import Reject
from scoperouter.routing import FanOut, Forward, RequestFacts, decide

from .conftest import SAMPLE

FULL = '{"compute":"CloudOne","identity":"CloudOne","image":"CloudTwo","placement":"CloudOne"}'


def facts(
    path: str = "/v2/images",
    port: int = 9292,
    host: str = "127.0.0.2",
    mode: str = "reverse",
    **headers: str,
) -> RequestFacts:
    return RequestFacts(
        method="GET",
        scheme="http",
        host=host,
        port=port,
        path=path,
        headers={k.replace("_", "-"): v for k, v in headers.items()},
        mode=mode,  # type: ignore[arg-type]
    )


def forward(catalog: Catalog, f: RequestFacts, cloud: str = "CloudOne") -> Forward:
    decision = decide(f, catalog, cloud)
    assert isinstance(decision, Forward), decision
    return decision


def reject(catalog: Catalog, f: RequestFacts, cloud: str = "CloudOne") -> Reject:
    decision = decide(f, catalog, cloud)
    assert isinstance(decision, Reject), decision
    body = json.loads(decision.body())["error"]
    assert body["code"] == decision.status and body["message"] == decision.message
    return decision


def test_unscoped_goes_to_local_backend_unchanged(catalog: Catalog) -> None:
    d = forward(catalog, facts(x_auth_token="tok"))
    assert (d.cloud, d.remote, d.url) == ("CloudOne", False, "http://127.0.1.2:9292/v2/images")
    assert d.set_headers == {"x-scope-hops": "1"} and d.scope is None


def test_scope_on_token_routes_to_remote_router_and_completes(catalog: Catalog) -> None:
    d = forward(catalog, facts(x_auth_token='tok!SCOPE!{"image": "CloudTwo"}'))
    assert (d.cloud, d.remote, d.url) == ("CloudTwo", True, "http://127.0.0.3:9292/v2/images")
    assert d.set_headers == {
        "x-auth-token": f"tok!SCOPE!{FULL}",
        "x-scope": FULL,
        "x-scope-hops": "1",
    }


def test_remote_router_sends_complete_scope_to_its_backend(catalog: Catalog) -> None:
    f = facts(host="127.0.0.3", x_auth_token=f"tok!SCOPE!{FULL}", x_scope_hops="1")
    d = forward(catalog, f, cloud="CloudTwo")
    assert (d.cloud, d.remote, d.url) == ("CloudTwo", False, "http://127.0.1.3:9292/v2/images")
    assert d.set_headers["x-auth-token"] == f"tok!SCOPE!{FULL}"  # "local" kept its meaning
    assert d.set_headers["x-scope-hops"] == "2"  # carried to the backend too


def test_x_scope_header_alone(catalog: Catalog) -> None:
    d = forward(catalog, facts(x_auth_token="tok", x_scope='{"image": "CloudTwo"}'))
    assert d.cloud == "CloudTwo" and d.set_headers["x-auth-token"] == f"tok!SCOPE!{FULL}"


def test_token_wins_over_x_scope(catalog: Catalog) -> None:
    d = forward(
        catalog,
        facts(x_auth_token='tok!SCOPE!{"image": "CloudOne"}', x_scope='{"image": "CloudTwo"}'),
    )
    assert d.cloud == "CloudOne" and '"image":"CloudOne"' in d.set_headers["x-scope"]


def test_identity_target_gets_bare_token(catalog: Catalog) -> None:
    d = forward(
        catalog,
        facts(
            "/v3/auth/tokens",
            5000,
            x_auth_token='tok!SCOPE!{"image": "CloudTwo"}',
            x_subject_token='user!SCOPE!{"image": "CloudTwo"}',
        ),
    )
    assert d.url == "http://127.0.1.2:5000/v3/auth/tokens"
    assert d.set_headers["x-auth-token"] == "tok"
    assert d.set_headers["x-subject-token"] == "user"


def test_subject_token_scope_routes_token_validation(catalog: Catalog) -> None:
    d = forward(
        catalog,
        facts(
            "/v3/auth/tokens",
            5000,
            x_auth_token="service-token",
            x_subject_token='user!SCOPE!{"identity": "CloudTwo"}',
        ),
    )
    assert (d.cloud, d.remote, d.url) == ("CloudTwo", True, "http://127.0.0.3:5000/v3/auth/tokens")
    assert d.set_headers["x-subject-token"] == "user"
    assert d.set_headers["x-auth-token"] == "service-token"


def test_subject_token_scope_is_stripped_for_non_identity_too(catalog: Catalog) -> None:
    d = forward(catalog, facts(x_auth_token="tok", x_subject_token='u!SCOPE!{"image": "CloudOne"}'))
    assert d.scope is None  # unscoped request (the subject token's scope routes identity only)
    assert d.set_headers == {"x-subject-token": "u", "x-scope-hops": "1"}
    d = forward(catalog, facts(x_auth_token="tok", x_subject_token="plain"))
    assert "x-subject-token" not in d.set_headers


def test_version_discovery_root_follows_scope(catalog: Catalog) -> None:
    d = forward(catalog, facts("/", 8774, x_auth_token='t!SCOPE!{"compute": "CloudTwo"}'))
    assert d.url == "http://127.0.0.3:8774/"


def test_query_string_is_kept(catalog: Catalog) -> None:
    d = forward(catalog, facts("/v2/images?limit=2&marker=x", x_scope='{"image": "CloudTwo"}'))
    assert d.url == "http://127.0.0.3:9292/v2/images?limit=2&marker=x"


def test_forward_mode_catalog_destinations(catalog: Catalog) -> None:
    d = forward(catalog, facts(mode="forward", host="127.0.0.3", x_auth_token="tok"))
    assert (d.cloud, d.remote, d.url) == ("CloudTwo", True, "http://127.0.0.3:9292/v2/images")
    d = forward(catalog, facts(mode="forward", host="127.0.0.3", x_auth_token=f"tok!SCOPE!{FULL}"))
    assert (d.cloud, d.remote) == ("CloudTwo", True)
    d = forward(
        catalog,
        facts(mode="forward", host="127.0.0.3", x_auth_token='tok!SCOPE!{"image": "CloudOne"}'),
    )
    assert (d.cloud, d.remote, d.url) == ("CloudOne", False, "http://127.0.1.2:9292/v2/images")


@pytest.mark.parametrize(
    ("f", "status", "fragment"),
    [
        (facts(mode="forward", host="10.1.2.3", port=80), 403, "not an endpoint of the federation"),
        (facts("/v2/images", 9999), 404, "no service of CloudOne is published at /v2/images"),
        (
            facts(x_auth_token="t!SCOPE!{bad"),
            400,
            "invalid scope in X-Auth-Token: scope is not valid JSON",
        ),
        (facts(x_scope='{"image": "Nowhere"}'), 400, "unknown cloud 'Nowhere' for 'image'"),
        (facts(x_scope='{"volume": "CloudNine"}'), 400, "unknown cloud 'CloudNine' for 'volume'"),
        (facts(x_scope='{"image": "CloudTwo &"}'), 400, "expected a cloud name"),
        (facts(x_scope='{"image": "CloudTwo & CloudOne"}'), 501, "not supported here"),
        (facts(x_scope='{"image": "CloudTwo", "x": "A"}'), 400, "unknown cloud 'A' for 'x'"),
        (facts(x_scope='{"volume": "CloudTwo &"}'), 400, "scope for 'volume': expected a cloud"),
        (facts(x_scope='{"image": "CloudTwo"}', x_scope_hops="8"), 508, "routing loop"),
        (facts(x_scope_hops="8"), 508, "no backend is a router"),
        (facts(x_scope_hops="²"), 400, "invalid x-scope-hops"),
        (facts(x_scope_hops="-1"), 400, "invalid x-scope-hops"),
        # The separator with nothing after it is a scope, an empty (invalid) one: not a token
        # to pass on, nor a reason to look for the scope elsewhere.
        (facts(x_auth_token="t!SCOPE!", x_scope=FULL), 400, "invalid scope in X-Auth-Token"),
    ],
)
def test_rejections(catalog: Catalog, f: RequestFacts, status: int, fragment: str) -> None:
    r = reject(catalog, f)
    assert r.status == status
    assert fragment in r.message


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_service_types_the_federation_does_not_route_are_carried(
    catalog: Catalog, mode: str
) -> None:
    """A type only a keystone catalog lists (an operator's new service) never breaks the
    others: routed by the known types, carried unchanged to the next hop."""
    scope = '{"image": "CloudTwo", "dns": "CloudOne", "volume": "CloudTwo | CloudOne"}'
    d = forward(catalog, facts(mode=mode, x_auth_token=f"tok!SCOPE!{scope}"))
    assert (d.cloud, d.remote) == ("CloudTwo", True)
    sent = d.set_headers["x-scope"]
    assert '"dns":"CloudOne"' in sent and '"volume":"CloudTwo | CloudOne"' in sent
    assert d.set_headers["x-auth-token"] == f"tok!SCOPE!{sent}"
    d = forward(catalog, facts(x_scope='{"dns": "CloudTwo"}'))
    assert (d.cloud, d.remote) == ("CloudOne", False)  # image: not named, local


def test_operators_elsewhere_in_the_scope_are_fine(catalog: Catalog) -> None:
    d = forward(catalog, facts(x_scope='{"image": "CloudTwo", "compute": "CloudOne | CloudTwo"}'))
    assert d.cloud == "CloudTwo"
    assert '"compute":"CloudOne | CloudTwo"' in d.set_headers["x-scope"]


def test_cloud_without_the_service_is_refused() -> None:
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    del data["clouds"]["CloudTwo"]["services"]["placement"]
    cat = build_catalog(data)
    r = reject(cat, facts("/", 8778, x_scope='{"placement": "CloudTwo"}'))
    assert r.status == 400 and "cloud 'CloudTwo' has no 'placement' service" in r.message


def test_hop_count_is_checked_on_every_hop(catalog: Catalog) -> None:
    d = forward(catalog, facts(x_scope='{"image": "CloudTwo"}', x_scope_hops="6"))
    assert d.set_headers["x-scope-hops"] == "7"
    d = forward(catalog, facts(x_scope='{"image": "CloudOne"}', x_scope_hops="7"))
    assert d.remote is False and d.set_headers["x-scope-hops"] == "8"
    # Arriving having crossed hop_limit routers: refused wherever it would go, a local backend
    # (which may be a router, misconfigured), an unscoped request, a path of no service.
    for f in (
        facts(x_scope='{"image": "CloudOne"}', x_scope_hops="8"),
        facts(x_scope_hops="8"),
        facts("/nothing/here", 9999, x_scope_hops="9"),
    ):
        r = reject(catalog, f)
        assert r.status == 508 and "already crossed" in r.message


def test_decision_is_independent_of_cloud_count() -> None:
    """Many clouds: same answer, found by index (the speed is measured in bench/)."""
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    template = data["clouds"]["CloudTwo"]
    for i in range(200):
        cloud = yaml.safe_load(
            yaml.safe_dump(template)
            .replace("127.0.0.3", f"127.2.{i // 250}.{i % 250 + 1}")
            .replace("127.0.1.3", f"127.3.{i // 250}.{i % 250 + 1}")
        )
        cloud["region"] = f"C{i}"
        data["clouds"][f"C{i}"] = cloud
    cat = build_catalog(data)
    d = forward(cat, facts(x_scope='{"image": "C150"}'))
    assert d.url == "http://127.2.0.151:9292/v2/images"


# ----------------------------------------------------------------- cross-cloud identity


def test_token_validation_leaving_the_cloud_swaps_the_service_token(catalog: Catalog) -> None:
    """keystonemiddleware of CloudTwo's glance validates a CloudOne user's token."""
    f = facts(
        "/v3/auth/tokens",
        5000,
        host="127.0.0.3",
        mode="forward",
        x_auth_token="glance-service-token",
        x_subject_token=f"user-token!SCOPE!{FULL}",
    )
    d = forward(catalog, f, cloud="CloudTwo")
    assert (d.cloud, d.remote, d.url) == ("CloudOne", True, "http://127.0.0.2:5000/v3/auth/tokens")
    assert d.swap_tokens == {"x-auth-token"}
    assert d.catalog_region == "CloudTwo"
    assert d.set_headers["x-subject-token"] == "user-token"


def test_self_validation_needs_no_swap(catalog: Catalog) -> None:
    f = facts(
        "/v3/auth/tokens",
        5000,
        x_auth_token="t",
        x_subject_token='t!SCOPE!{"identity": "CloudTwo"}',
    )
    d = forward(catalog, f)
    assert d.remote and d.swap_tokens == frozenset() and d.catalog_region == "CloudOne"


def test_service_token_is_swapped_only_when_leaving(catalog: Catalog) -> None:
    scoped = 'u!SCOPE!{"image": "CloudTwo"}'
    d = forward(catalog, facts(mode="forward", x_auth_token=scoped, x_service_token="nova-token"))
    assert d.remote and d.swap_tokens == {"x-service-token"} and d.catalog_region is None
    local = 'u!SCOPE!{"image": "CloudOne"}'
    d = forward(catalog, facts(mode="forward", x_auth_token=local, x_service_token="nova-token"))
    assert not d.remote and d.swap_tokens == frozenset()
    d = forward(
        catalog, facts(mode="forward", host="127.0.0.3", x_auth_token="u", x_service_token="s")
    )
    assert d.remote and d.swap_tokens == {"x-service-token"}  # unscoped, still leaving


def _small_cloud_catalog() -> Catalog:
    """CloudOne without placement: its router must not name itself for placement."""
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    del data["clouds"]["CloudOne"]["services"]["placement"]
    data["clouds"]["CloudOne"]["frontends"].pop()
    return build_catalog(data)


def test_completion_names_only_services_the_local_cloud_offers() -> None:
    cat = _small_cloud_catalog()
    d = forward(cat, facts(x_scope='{"image": "CloudTwo"}'))
    assert "placement" not in d.set_headers["x-scope"]
    # ... so CloudTwo's router accepts the completed scope
    nxt = facts(host="127.0.0.3", x_scope=d.set_headers["x-scope"], x_scope_hops="1")
    assert forward(cat, nxt, cloud="CloudTwo").remote is False


def test_unnamed_service_the_local_cloud_lacks_goes_where_addressed() -> None:
    cat = _small_cloud_catalog()
    f = facts(
        "/resource_providers",
        8778,
        host="127.0.0.3",
        mode="forward",
        x_auth_token='t!SCOPE!{"image": "CloudOne"}',
    )
    d = forward(cat, f)
    assert (d.cloud, d.remote, d.url) == (
        "CloudTwo",
        True,
        "http://127.0.0.3:8778/resource_providers",
    )


def test_another_clouds_backend_is_reached_through_its_router(catalog: Catalog) -> None:
    f = facts(mode="forward", host="127.0.1.3", x_auth_token="tok")  # CloudTwo's image backend
    d = forward(catalog, f)
    assert (d.cloud, d.remote, d.url) == ("CloudTwo", True, "http://127.0.0.3:9292/v2/images")
    d = forward(catalog, facts(mode="forward", host="127.0.1.2", x_auth_token="tok"))
    assert (d.cloud, d.remote, d.url) == ("CloudOne", False, "http://127.0.1.2:9292/v2/images")


# ----------------------------------------------------------------- scopes a workflow cannot honour


def test_placement_follows_compute_when_completed(catalog: Catalog) -> None:
    d = forward(catalog, facts("/servers", 8774, x_scope='{"compute": "CloudTwo"}'))
    assert d.cloud == "CloudTwo"
    assert '"placement":"CloudTwo"' in d.set_headers["x-scope"]  # not this router's cloud


def test_placement_named_away_from_compute_is_refused_for_compute(catalog: Catalog) -> None:
    scope = '{"placement": "CloudTwo"}'  # compute: completed with CloudOne
    r = reject(catalog, facts("/servers", 8774, x_scope=scope))
    assert r.status == 400
    assert "'CloudTwo' for placement but 'CloudOne' for compute" in r.message
    assert "own credentials" in r.message
    # ... but honoured where it means something: placement's own API, and other services.
    d = forward(catalog, facts("/resource_providers", 8778, x_scope=scope))
    assert (d.cloud, d.service_type) == ("CloudTwo", "placement")
    assert forward(catalog, facts(x_scope=scope)).cloud == "CloudOne"
    both = '{"placement": "CloudTwo", "compute": "CloudTwo"}'
    assert forward(catalog, facts("/servers", 8774, x_scope=both)).cloud == "CloudTwo"


def _with_block_storage(catalog_type: str = "block-storage") -> Catalog:
    """The sample federation with block storage (cinder, on :8776) in both clouds, listed
    under `catalog_type` (block-storage, or one of its aliases such as volumev3)."""
    data = yaml.safe_load(SAMPLE.read_text())
    for name, ip in (("CloudOne", "2"), ("CloudTwo", "3")):
        cloud = data["clouds"][name]
        cloud["frontends"].append({"url": f"http://127.0.0.{ip}:8776"})
        cloud["services"][catalog_type] = {
            "public": {"url": f"http://127.0.0.{ip}:8776/v3", "backend": f"http://127.0.1.{ip}:8776/v3"}
        }  # fmt: skip
    return build_catalog(data)


def test_block_storage_follows_compute_when_completed() -> None:
    """`{"compute": "CloudTwo"}` means CloudTwo's volumes too: nova in CloudTwo calls cinder with
    the user's scoped token, which must name the cloud the server runs in."""
    cat = _with_block_storage()
    d = forward(cat, facts("/servers", 8774, x_scope='{"compute": "CloudTwo"}'))
    assert d.cloud == "CloudTwo"
    assert '"block-storage":"CloudTwo"' in d.set_headers["x-scope"]
    # the volume API of a scope that names only compute goes where compute goes
    d = forward(cat, facts("/v3/volumes", 8776, x_scope='{"compute": "CloudTwo"}'))
    assert (d.cloud, d.service_type) == ("CloudTwo", "block-storage")
    # without a scope for compute, block storage stays local
    d = forward(cat, facts("/v3/volumes", 8776, x_scope='{"image": "CloudTwo"}'))
    assert (d.cloud, d.remote) == ("CloudOne", False)


@pytest.mark.parametrize(
    "path",
    ["/servers", "/servers/abc/os-volume_attachments", "/servers/abc/os-volume_attachments/v"],
)
def test_block_storage_named_away_from_compute_is_refused_for_compute(path: str) -> None:
    """A server in CloudOne cannot use a volume of CloudTwo: every compute request of such a
    scope is a 400 saying why (its attachments, its creation with a volume, its reads alike:
    the router decides on the head, not on what the body asks for)."""
    cat = _with_block_storage()
    scope = '{"block-storage": "CloudTwo"}'  # compute: completed with CloudOne
    r = reject(cat, facts(path, 8774, x_scope=scope))
    assert r.status == 400
    assert "'CloudTwo' for block-storage but 'CloudOne' for compute" in r.message
    assert "block devices do not cross clouds" in r.message
    assert "leave block-storage out" in r.message
    # honoured where it means something: the volume API, and every other service
    d = forward(cat, facts("/v3/volumes", 8776, x_scope=scope))
    assert (d.cloud, d.service_type, d.remote) == ("CloudTwo", "block-storage", True)
    assert forward(cat, facts(x_scope=scope)).cloud == "CloudOne"
    both = '{"block-storage": "CloudTwo", "compute": "CloudTwo"}'
    assert forward(cat, facts(path, 8774, x_scope=both)).cloud == "CloudTwo"


@pytest.mark.parametrize("alias", ["volumev3", "volume"])
def test_block_storage_aliases_follow_compute_too(alias: str) -> None:
    cat = _with_block_storage(alias)
    r = reject(cat, facts("/servers", 8774, x_scope=json.dumps({alias: "CloudTwo"})))
    assert r.status == 400 and f"for {alias} but 'CloudOne' for compute" in r.message
    d = forward(cat, facts("/servers", 8774, x_scope='{"compute": "CloudTwo"}'))
    assert f'"{alias}":"CloudTwo"' in d.set_headers["x-scope"]


def test_the_refusal_names_the_follower_that_is_apart() -> None:
    cat = _with_block_storage()
    scope = '{"compute": "CloudTwo", "placement": "CloudTwo", "block-storage": "CloudOne"}'
    r = reject(cat, facts("/servers", 8774, x_scope=scope))
    assert "'CloudOne' for block-storage but 'CloudTwo' for compute" in r.message
    scope = '{"compute": "CloudTwo", "placement": "CloudOne", "block-storage": "CloudTwo"}'
    r = reject(cat, facts("/servers", 8774, x_scope=scope))
    assert "'CloudOne' for placement but 'CloudTwo' for compute" in r.message
    assert "own credentials" in r.message


def test_fan_out_of_compute_narrows_block_storage_with_it() -> None:
    """`server list` over both clouds: each cloud's request names that cloud for compute and
    for the volumes that follow it (the next router delivers, it does not refuse)."""
    cat = _with_block_storage()
    d = decide(facts("/servers", 8774, x_scope='{"compute": "CloudOne & CloudTwo"}'), cat,
               "CloudOne", combined=True)  # fmt: skip
    assert isinstance(d, FanOut), d
    for label, part in d.parts:
        assert isinstance(part, Forward)
        scope = json.loads(part.set_headers["x-scope"])
        assert scope["compute"] == scope["block-storage"] == scope["placement"] == label


# ----------------------------------------------------------------- bounded cost and memory


def test_scope_entries_are_bounded_before_any_is_parsed(catalog: Catalog) -> None:
    many = json.dumps({f"s{i}": "CloudOne" for i in range(372)})  # under the 8 KiB cap
    r = reject(catalog, facts(x_scope=many))
    assert r.status == 400 and "more than 100 service types" in r.message
    # Entries with fewer quotes (values that are not strings) are counted once decoded.
    sneaky = json.dumps({f"s{i}": i for i in range(150)})
    r = reject(catalog, facts(x_scope=sneaky))
    assert r.status == 400 and "150 service types; at most 100" in r.message
    # Up to the bound, unknown service types are carried (issue 13), not refused.
    carried = json.dumps({f"svc-{i}": "CloudTwo" for i in range(99)})
    assert forward(catalog, facts(x_scope=carried)).cloud == "CloudOne"


def test_refused_scopes_are_never_memoised(catalog: Catalog) -> None:
    before = len(catalog.memo)
    for i in range(50):
        reject(catalog, facts(x_scope=f'{{"image": "Nowhere{i}"}}'))
    assert len(catalog.memo) == before
    forward(catalog, facts(x_scope='{"image": "CloudTwo"}'))
    assert len(catalog.memo) == before + 1


def test_the_memo_has_a_budget(catalog: Catalog) -> None:
    from scoperouter.catalog import MEMO_BUDGET

    names = ["identity", "image", "compute", "placement"]
    used = 0
    for i in range(3000):
        extra = {f"x{i}-{n}-{'a' * 60}": "CloudOne" for n in names}  # distinct, ~400 chars
        text = json.dumps({"image": "CloudTwo", **extra})
        forward(catalog, facts(x_scope=text))
        used += len(text)
    assert used > MEMO_BUDGET  # more than the budget went through ...
    assert len(catalog.memo) < 3000  # ... and the memo was cleared on the way


@pytest.mark.parametrize(
    "f",
    [
        facts(x_auth_token="tok"),
        facts(x_auth_token=f"tok!SCOPE!{FULL}"),
        facts(x_scope='{"image": "CloudOne"}'),
        facts("/v3/auth/tokens", 5000, x_auth_token="a", x_subject_token=f"b!SCOPE!{FULL}"),
    ],
)
def test_every_field_of_a_forward_is_set(catalog: Catalog, f: RequestFacts) -> None:
    """decide()'s Forward (routing._to_backend, _to_router) is the object a keyword call with
    its fields makes: every field set."""
    d = forward(catalog, f)
    assert Forward(**{field.name: getattr(d, field.name) for field in dataclasses.fields(d)}) == d
