"""Cross-cloud identity logic with injected keystone calls (the lab's e2e tests use real ones)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scoperouter.catalog import Catalog
from scoperouter.errors import Reject
from scoperouter.identity import Identity, TokenCheck, add_region, token_key


class FakeKeystone:
    """Records calls; answers from a table. Stands in for the HTTP calls only."""

    def __init__(self, tokens: dict[str, TokenCheck]) -> None:
        self.tokens = tokens
        self.validations: list[tuple[str, str]] = []
        self.fetches: list[str] = []

    def validate(self, url: str, token: str, verify: bool | str) -> TokenCheck:
        self.validations.append((url, token))
        return self.tokens.get(token, TokenCheck(False))

    def fetch(self, entry: str) -> tuple[str, float]:
        self.fetches.append(entry)
        return f"router-token-from-{entry}", 10_000.0


def make(
    catalog: Catalog, keystone: FakeKeystone, now: list[float], creds: bool = True
) -> Identity:
    """CloudTwo's identity, with credentials for CloudOne or (creds=False) none at all."""
    from dataclasses import replace

    clouds = dict(catalog.clouds)
    credentials = {"CloudOne": "two-at-one"} if creds else {}
    clouds["CloudTwo"] = replace(clouds["CloudTwo"], credentials=credentials)
    cat = Catalog(clouds, catalog.settings)
    return Identity(cat, "CloudTwo", keystone.validate, keystone.fetch, clock=lambda: now[0])


SERVICE = TokenCheck(True, frozenset({"service"}), 5_000.0)
MEMBER = TokenCheck(True, frozenset({"member", "reader"}), 5_000.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_swap_checks_locally_then_uses_own_token(catalog: Catalog) -> None:
    ks = FakeKeystone({"glance-tok": SERVICE})
    ident = make(catalog, ks, [1000.0])
    edits = run(ident.swap({"x-auth-token": "glance-tok"}, frozenset({"x-auth-token"}), "CloudOne"))
    assert edits == {"x-auth-token": "router-token-from-two-at-one"}
    assert ks.validations == [("http://127.0.1.3:5000", "glance-tok")]  # CloudTwo's own keystone
    assert ks.fetches == ["two-at-one"]


def test_checks_and_tokens_are_cached(catalog: Catalog) -> None:
    ks = FakeKeystone({"glance-tok": SERVICE})
    now = [1000.0]
    ident = make(catalog, ks, now)
    for _ in range(3):
        run(
            ident.swap(
                {"x-service-token": "glance-tok"}, frozenset({"x-service-token"}), "CloudOne"
            )
        )
    assert len(ks.validations) == 1 and len(ks.fetches) == 1
    now[0] = 9_900.0  # router token within its refresh margin; the check expired too
    ks.tokens["glance-tok"] = TokenCheck(True, frozenset({"service"}), 20_000.0)
    run(ident.swap({"x-service-token": "glance-tok"}, frozenset({"x-service-token"}), "CloudOne"))
    assert len(ks.validations) == 2 and len(ks.fetches) == 2


@pytest.mark.parametrize(
    ("table", "status", "fragment"),
    [
        ({}, 401, "X-Auth-Token is not a valid token of CloudTwo"),
        ({"s3cr3t-user": MEMBER}, 403, "not a service token of CloudTwo"),
    ],
)
def test_user_tokens_cannot_be_carried(
    catalog: Catalog, table: dict, status: int, fragment: str
) -> None:
    ks = FakeKeystone(table)
    ident = make(catalog, ks, [1000.0])
    result = run(
        ident.swap({"x-auth-token": "s3cr3t-user"}, frozenset({"x-auth-token"}), "CloudOne")
    )
    assert isinstance(result, Reject) and result.status == status and fragment in result.message
    assert ks.fetches == []  # never obtained a remote token for an unchecked caller
    assert "s3cr3t" not in result.message


def test_missing_credentials_is_a_clear_error(catalog: Catalog) -> None:
    ks = FakeKeystone({"tok": SERVICE})
    ident = make(catalog, ks, [1000.0], creds=False)
    result = run(ident.swap({"x-auth-token": "tok"}, frozenset({"x-auth-token"}), "CloudOne"))
    assert isinstance(result, Reject) and result.status == 502
    assert "clouds.CloudTwo.credentials.CloudOne" in result.message


def test_keystone_failure_is_502_not_a_crash(catalog: Catalog) -> None:
    def broken(url: str, token: str, verify: bool | str) -> TokenCheck:
        raise ConnectionError("refused")

    ident = Identity(catalog, "CloudTwo", broken, lambda e: ("x", 0.0), clock=lambda: 0.0)
    result = run(ident.swap({"x-auth-token": "tok"}, frozenset({"x-auth-token"}), "CloudOne"))
    assert isinstance(result, Reject) and result.status == 502
    assert "could not check X-Auth-Token" in result.message


def test_token_key_hides_the_token() -> None:
    assert "secret" not in token_key("secret") and len(token_key("secret")) == 64


def test_add_region_twins_endpoints() -> None:
    body = {
        "token": {
            "catalog": [
                {
                    "type": "image",
                    "endpoints": [
                        {
                            "id": "e1",
                            "interface": "public",
                            "region_id": "CloudOne",
                            "region": "CloudOne",
                            "url": "http://127.0.0.2:9292",
                        },
                    ],
                },
                {
                    "type": "compute",
                    "endpoints": [
                        {
                            "id": "e2",
                            "interface": "public",
                            "region_id": "CloudTwo",
                            "region": "CloudTwo",
                            "url": "http://x",
                        },
                    ],
                },
            ]
        }
    }
    assert add_region(body, "CloudTwo") is True
    image = body["token"]["catalog"][0]["endpoints"]
    assert [e["region_id"] for e in image] == ["CloudOne", "CloudTwo"]
    assert image[1]["url"] == "http://127.0.0.2:9292" and image[1]["id"] == "e1-CloudTwo"
    assert len(body["token"]["catalog"][1]["endpoints"]) == 1  # already has the region
    assert add_region(body, "CloudTwo") is False  # idempotent
    assert add_region({"error": {}}, "CloudTwo") is False
