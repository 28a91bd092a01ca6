"""FederationClouds without a lab: capacity arithmetic, its cache, connection caching and the
scope applied to connections (a fake openstacksdk connection stands in for the cloud; the real
path is tests/e2e/test_broker_clouds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.broker.clouds import CloudAccess, CloudUnavailable, FederationClouds
from scoperouter.client import ScopedAuth


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code = status
        self._body = body
        self.text = str(body)

    def json(self) -> Any:
        return self._body


class _Placement:
    def __init__(self, answers: dict[str, Any], calls: list[str]) -> None:
        self.answers = answers
        self.calls = calls

    def get(self, path: str, microversion: str) -> _Response:
        self.calls.append(path)
        body = self.answers.get(path)
        return _Response(200, body) if body is not None else _Response(500, "boom")


class _Conn:
    def __init__(self, region: Any, answers: dict[str, Any], calls: list[str]) -> None:
        from keystoneauth1 import session, token_endpoint

        self.region = region
        self.session = session.Session(auth=token_endpoint.Token("http://127.0.0.1:9", "t"))
        self.placement = _Placement(answers, calls)


INVENTORY = {
    "VCPU": {"total": 10, "reserved": 2, "allocation_ratio": 4.0},
    "MEMORY_MB": {"total": 1000, "reserved": 0, "allocation_ratio": 1.0},
}


def _clouds(tmp_path: Path, answers: dict[str, Any], calls: list[str], **kw: Any) -> Any:
    path = tmp_path / "clouds.yaml"
    entry = {"auth": {"auth_url": "http://127.0.0.2:5000/v3", "token": "x"}, "auth_type": "token"}
    path.write_text(
        yaml.safe_dump({"clouds": {"one": {**entry, "region_name": "CloudOne"}, "two": entry}})
    )
    return FederationClouds(
        [CloudAccess(name="CloudOne", entry="one"), CloudAccess(name="CloudTwo", entry="two")],
        config_files=[path],
        connection_factory=lambda region: _Conn(region, answers, calls),
        **kw,
    )


def test_capacity_sums_providers_with_ratio_reserved_and_usage(tmp_path: Path) -> None:
    answers = {
        "/resource_providers": {"resource_providers": [{"uuid": "a"}, {"uuid": "b"}]},
        "/resource_providers/a/inventories": {"inventories": INVENTORY},
        "/resource_providers/a/usages": {"usages": {"VCPU": 8, "MEMORY_MB": 1200}},
        "/resource_providers/b/inventories": {"inventories": {"VCPU": INVENTORY["VCPU"]}},
        "/resource_providers/b/usages": {"usages": {}},
    }
    calls: list[str] = []
    clouds = _clouds(tmp_path, answers, calls)
    cap = clouds.capacity("CloudOne")
    assert cap.total == {"VCPU": 64.0, "MEMORY_MB": 1000.0}
    # provider a: 32 - 8 VCPU; memory over-used counts as 0 free, never negative
    assert cap.free == {"VCPU": 24.0 + 32.0, "MEMORY_MB": 0.0}
    count = len(calls)
    assert clouds.capacity("CloudOne") is cap and len(calls) == count  # cached


def test_capacity_keeps_the_largest_single_allocation_per_class(tmp_path: Path) -> None:
    """max_unit bounds one allocation on a provider; so does that provider's free amount."""
    answers = {
        "/resource_providers": {"resource_providers": [{"uuid": "a"}, {"uuid": "b"}]},
        "/resource_providers/a/inventories": {
            "inventories": {
                "VCPU": {"total": 16, "reserved": 0, "allocation_ratio": 1.0, "max_unit": 4},
                "MEMORY_MB": {"total": 4096, "allocation_ratio": 1.0, "max_unit": 4096},
            }
        },
        "/resource_providers/a/usages": {"usages": {"MEMORY_MB": 3072}},
        "/resource_providers/b/inventories": {
            "inventories": {"VCPU": {"total": 8, "allocation_ratio": 1.0, "max_unit": 8}}
        },
        "/resource_providers/b/usages": {"usages": {"VCPU": 2}},
    }
    cap = _clouds(tmp_path, answers, []).capacity("CloudOne")
    assert cap.free == {"VCPU": 16.0 + 6.0, "MEMORY_MB": 1024.0}
    # VCPU: a allows 4 (max_unit), b 6 (free below its max_unit 8); memory: a's free 1024
    assert cap.largest == {"VCPU": 6.0, "MEMORY_MB": 1024.0}


def test_capacity_cache_expires(tmp_path: Path) -> None:
    answers = {"/resource_providers": {"resource_providers": []}}
    calls: list[str] = []
    clouds = _clouds(tmp_path, answers, calls, capacity_ttl=0.0)
    first = clouds.capacity("CloudOne")
    assert clouds.capacity("CloudOne") is not first
    assert calls == ["/resource_providers", "/resource_providers"]


def test_unreadable_capacity_is_cloud_unavailable(tmp_path: Path) -> None:
    clouds = _clouds(tmp_path, {}, [])
    with pytest.raises(CloudUnavailable, match=r"CloudOne.*placement answered 500"):
        clouds.capacity("CloudOne")


def test_connections_are_cached_per_cloud_project_and_scope(tmp_path: Path) -> None:
    clouds = _clouds(tmp_path, {}, [])
    plain = clouds.connect("CloudOne")
    assert clouds.connect("CloudOne") is plain
    scoped = clouds.connect("CloudOne", scope='{"image": "CloudTwo"}')
    assert scoped is not plain
    assert isinstance(scoped.session.auth, ScopedAuth)
    assert scoped.session.auth.scoperouter_default_cloud == "CloudOne"  # the entry's region
    other = clouds.connect("CloudOne", project_id="p2")
    assert other.region.config["auth"]["project_id"] == "p2"
    assert clouds.region("CloudTwo") == "CloudTwo"  # no region_name: the cloud's name
    assert clouds.identity_url("CloudTwo") == "http://127.0.0.2:5000/v3"


def test_a_cloud_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        FederationClouds([CloudAccess(name="A", entry="a"), CloudAccess(name="A", entry="b")])


def test_the_clouds_yaml_named_by_the_environment_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `clouds_yaml` in the config: $OS_CLIENT_CONFIG_FILE names the file (the README's
    quick start and the Kubernetes deployment rely on it), while other OS_* variables stay out
    of the broker's clouds."""
    path = tmp_path / "elsewhere.yaml"
    entry = {"auth": {"auth_url": "http://127.0.0.9:5000/v3"}, "region_name": "R1"}
    path.write_text(yaml.safe_dump({"clouds": {"far": entry}}))
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(path))
    monkeypatch.setenv("OS_REGION_NAME", "not-this-one")
    clouds = FederationClouds([CloudAccess(name="Far", entry="far")])
    assert clouds.region("Far") == "R1"
    assert clouds.identity_url("Far") == "http://127.0.0.9:5000/v3"
    monkeypatch.delenv("OS_CLIENT_CONFIG_FILE")
    with pytest.raises(CloudUnavailable, match="far"):
        FederationClouds([CloudAccess(name="Far", entry="far")]).region("Far")


def test_a_run_s_entry_holds_the_plain_token_and_the_scope_beside_it(tmp_path: Path) -> None:
    """The clouds.yaml entry of a playbook run: the token as keystone issued it and the scope
    for the client hook to add. A token with the scope already joined (what a scoped
    session's headers carry) is not a token keystone knows: every module of a scoped ansible
    instance failed with "Could not recognize Fernet token" (found against the lab)."""
    clouds = _clouds(tmp_path, {}, [])
    entry = clouds.session_entry("CloudOne", project_id="p2", scope='{"image": "CloudTwo"}')
    assert entry["auth"]["token"] == "t"
    assert entry["auth"]["project_id"] == "p2" and entry["auth_type"] == "v3token"
    assert entry["scope"] == {"image": "CloudTwo"}
    assert entry["vendor_hook"] == "scoperouter.client:connection_hook"
    assert "scope" not in clouds.session_entry("CloudOne", project_id="p2")
