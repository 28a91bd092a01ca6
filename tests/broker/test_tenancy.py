"""Tenancy (issue 30, finding 7): every instance belongs to the platform space its request
names, and a request that names none is refused. On d265555 a provision with
``"context": {}`` or ``{"platform": "other"}`` and no GUIDs got 202 and landed in one shared
``osb-unknown-default`` project with every other such instance; so did a Cloud Foundry
request that sent its GUIDs only at the top level (the services read the kept context alone).

The API against a real database (SQLite and PostgreSQL); the space an instance's services use
is :func:`identity.space_of` of the context the instance keeps, checked against the tags the
broker of d265555 gave the same Cloud Foundry and Kubernetes spaces (no project moves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scoperouter.broker.config import BrokerConfigError
from scoperouter.broker.identity import Space, space_of
from tests.broker import fakes
from tests.broker.conftest import Harness, broker_config, make_broker

CF = {"platform": "cloudfoundry", "organization_guid": "o1", "space_guid": "s1"}
NO_GUIDS = {"organization_guid": None, "space_guid": None}
# the tags d265555's identity.space_of gave these spaces: what works today keeps its project
CF_TAG = "osb-space-4b668ecba0bb7e6a7f33"  # cloudfoundry o1/s1
K8S_TAG = "osb-space-f4c59fe582064c5cfb81"  # kubernetes c1/ns
K8S_NS_TAG = "osb-space-71490d17fc8c399be354"  # kubernetes ns (no cluster id)


def _kept_space(harness: Harness, instance_id: str, **platforms: Any) -> Space:
    with harness.broker.store.read() as session:
        instance = harness.broker.store.instance(session, instance_id)
        assert instance is not None
        context = dict(instance.context or {})
    return space_of(context, platforms=platforms)  # what the services compute


def _snapshot_unchanged(harness: Harness, body: dict[str, Any]) -> dict[str, Any]:
    before = harness.broker.store.snapshot()
    response = harness.provision("inst-t", body=body)
    assert response.status_code == 400, response.text
    assert harness.broker.store.snapshot() == before
    answer: dict[str, Any] = response.json()
    assert answer["error"] == "BadRequest"
    return answer


@pytest.mark.parametrize(
    ("context", "field"),
    [
        ({}, "context.platform"),
        ({"platform": "other"}, "context.platform"),
        ({"platform": "other", "tenant": "t1"}, "context.platform"),
        ({"platform": 5}, "context.platform"),
        ({"platform": "cloudfoundry"}, "context.organization_guid"),
        ({"platform": "cloudfoundry", "organization_guid": "o1"}, "context.space_guid"),
        ({**CF, "space_guid": ""}, "context.space_guid"),
        ({**CF, "space_guid": {"a": 1}}, "context.space_guid"),
        ({"platform": "kubernetes"}, "context.namespace"),
        ({"platform": "kubernetes", "clusterid": "c1"}, "context.namespace"),
        ({"platform": "kubernetes", "namespace": "n" * 256}, "context.namespace"),
    ],
)
def test_a_provision_naming_no_tenant_is_400_and_writes_nothing(
    harness: Harness, context: dict[str, Any], field: str
) -> None:
    answer = _snapshot_unchanged(harness, {"context": context, **NO_GUIDS})
    assert answer["description"].startswith(f"{field}: "), answer


def test_cloud_foundry_and_kubernetes_keep_their_spaces(harness: Harness) -> None:
    """Every form that worked before is accepted and lands in the same space as before; the
    CF GUIDs sent only at the top level now reach the services (kept in the context)."""
    cases: list[tuple[dict[str, Any], str]] = [
        ({"context": CF, "organization_guid": "o1", "space_guid": "s1"}, CF_TAG),
        ({"context": CF, **NO_GUIDS}, CF_TAG),
        ({"context": None, "organization_guid": "o1", "space_guid": "s1"}, CF_TAG),
        ({"context": {}, "organization_guid": "o1", "space_guid": "s1"}, CF_TAG),
        ({"context": {"platform": "cloudfoundry"}, "organization_guid": "o1", "space_guid": "s1"},
         CF_TAG),
        ({"context": {"platform": "kubernetes", "clusterid": "c1", "namespace": "ns"}, **NO_GUIDS},
         K8S_TAG),
        ({"context": {"platform": "kubernetes", "clusterId": "c1", "namespace": "ns"}, **NO_GUIDS},
         K8S_TAG),  # Crossplane provider-osb spells it clusterId
        ({"context": {"platform": "kubernetes", "namespace": "ns"}, **NO_GUIDS}, K8S_NS_TAG),
    ]  # fmt: skip
    for index, (body, tag) in enumerate(cases):
        instance_id = f"inst-{index}"
        response = harness.provision(instance_id, body=body)
        assert response.status_code == 202, (body, response.text)
        assert _kept_space(harness, instance_id).tag == tag, body
    # what the platform sent stays as sent, completed only where the tenant came from outside
    with harness.broker.store.read() as session:
        crossplane = harness.broker.store.instance(session, "inst-6")
        top_level = harness.broker.store.instance(session, "inst-2")
        assert crossplane is not None and top_level is not None
        assert crossplane.context == {
            "platform": "kubernetes",
            "clusterId": "c1",
            "namespace": "ns",
        }
        assert top_level.context == CF


def test_an_operator_maps_another_platform(db_url: str, tmp_path: Path) -> None:
    """identity.platforms names the context keys of a platform's tenant; an unmapped platform
    stays refused, and the built-in ones cannot be redefined."""
    broker = make_broker(
        db_url, tmp_path / "cloud", identity={"platforms": {"sapcp": ["subaccount_id"]}}
    )
    harness = Harness(broker, tmp_path / "cloud")
    try:
        body = {"context": {"platform": "sapcp", "subaccount_id": "sa-1"}, **NO_GUIDS}
        assert harness.provision("inst-sap", body=body).status_code == 202
        space = _kept_space(harness, "inst-sap", sapcp=("subaccount_id",))
        assert space == Space("sapcp", (("subaccount_id", "sa-1"),))
        answer = _snapshot_unchanged(harness, {"context": {"platform": "sapcp"}, **NO_GUIDS})
        assert answer["description"].startswith("context.subaccount_id: required")
        answer = _snapshot_unchanged(harness, {"context": {"platform": "other"}, **NO_GUIDS})
        assert "identity.platforms" in answer["description"]
    finally:
        harness.client.close()
        broker.close()
    with pytest.raises(BrokerConfigError, match="built in"):
        broker_config(db_url, tmp_path, identity={"platforms": {"kubernetes": ["namespace"]}})


def test_a_context_update_keeps_the_instance_s_tenant(harness: Harness) -> None:
    """A PATCH whose context names no tenant, or another one, is 400 and changes nothing;
    the same tenant with other details (a renamed space) is taken."""
    instance_id = "inst-u"
    harness.provisioned(instance_id)

    def patch(context: dict[str, Any]) -> Any:
        return harness.client.patch(
            f"/v2/service_instances/{instance_id}",
            params={"accepts_incomplete": "true"},
            json={"service_id": fakes.SERVICE_ID, "context": context},
        )

    for context in ({}, {"platform": "other"}, {**harness_context(), "space_guid": "another"}):
        before = harness.broker.store.snapshot()
        response = patch(context)
        assert response.status_code == 400, (context, response.text)
        assert response.json()["description"].startswith("context"), response.json()
        assert harness.broker.store.snapshot() == before
    renamed = {**harness_context(), "space_name": "renamed"}
    assert patch(renamed).status_code == 200
    with harness.broker.store.read() as session:
        instance = harness.broker.store.instance(session, instance_id)
        assert instance is not None and instance.context == renamed


def harness_context() -> dict[str, str]:
    """The context Harness.provision sends."""
    return {"platform": "cloudfoundry", "organization_guid": "org", "space_guid": "space"}
