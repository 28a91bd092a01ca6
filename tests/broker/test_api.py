"""The OSB API against a real database (SQLite and PostgreSQL) with the fake service: status
codes and error bodies of the spec, idempotent repeats, and "any 4xx leaves the database
unchanged" (table snapshots around every 4xx case)."""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

import pytest

from tests.broker import fakes
from tests.broker.conftest import HEADERS, PASSWORD, Harness

INSTANCE = "inst-1"


def _cf_identity(user_id: str = "683ea748-3092-4ff4-b656-39cacc4d5360") -> str:
    value = base64.b64encode(json.dumps({"user_id": user_id}).encode()).decode()
    return f"cloudfoundry {value}"


# ------------------------------------------------------------------ headers, auth, catalog


def test_catalog_lists_the_service_with_its_schemas(harness: Harness) -> None:
    response = harness.client.get("/v2/catalog")
    assert response.status_code == 200
    [service] = response.json()["services"]
    assert service["id"] == fakes.SERVICE_ID and service["bindable"] is True
    plan = service["plans"][0]
    assert plan["schemas"]["service_instance"]["create"]["parameters"] == fakes.CREATE_SCHEMA
    assert plan["maintenance_info"] == {"version": "1.0.0"}
    assert plan["binding_rotatable"] is True


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Broker-API-Version": "1.9"},
        {"X-Broker-API-Version": "2.12"},
        {"X-Broker-API-Version": "two"},
    ],
)
def test_missing_or_unsupported_version_is_412(harness: Harness, headers: dict[str, str]) -> None:
    client = harness.client
    client.headers.pop("X-Broker-API-Version")
    response = client.get("/v2/catalog", headers=headers)
    assert response.status_code == 412
    assert "X-Broker-API-Version" in response.json()["description"]


def test_wrong_or_missing_credentials_are_401(harness: Harness) -> None:
    for auth in [("broker", "wrong"), ("someone", PASSWORD), None]:
        harness.client.auth = auth  # type: ignore[assignment]
        response = harness.client.get("/v2/catalog")
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Basic")
        assert "description" in response.json()


def test_request_identity_is_echoed_and_on_every_log_line(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    from scoperouter.broker.logs import RequestIdentityFilter

    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdentityFilter())
    caplog.handler.addFilter(RequestIdentityFilter())
    response = harness.provision(
        INSTANCE, headers={"X-Broker-API-Request-Identity": "req-42", **HEADERS}
    )
    assert response.status_code == 202
    assert response.headers["X-Broker-API-Request-Identity"] == "req-42"
    harness.drain()  # the worker's lines of this operation carry the request's identity too
    broker_lines = [r for r in caplog.records if r.name.startswith("scoperouter.broker")]
    assert broker_lines
    assert {r.request_id for r in broker_lines} == {"req-42"}  # type: ignore[attr-defined]
    # and a 401 too
    harness.client.auth = None  # type: ignore[assignment]
    response = harness.client.get("/v2/catalog", headers={"X-Broker-API-Request-Identity": "r-9"})
    assert (
        response.status_code == 401 and response.headers["X-Broker-API-Request-Identity"] == "r-9"
    )


# --------------------------------------------------------------------------- provision


def test_provision_lifecycle(harness: Harness) -> None:
    response = harness.provision(
        INSTANCE,
        {"steps": 3, "size": 2},
        headers={"X-Broker-API-Originating-Identity": _cf_identity(), **HEADERS},
    )
    assert response.status_code == 202, response.text
    operation = response.json()["operation"]
    poll = harness.last_operation(INSTANCE, operation=operation)
    assert poll.status_code == 200
    assert poll.json()["state"] == "in progress"
    assert int(poll.headers["Retry-After"]) >= 1
    # GET while provisioning: 404
    assert harness.client.get(f"/v2/service_instances/{INSTANCE}").status_code == 404
    assert harness.drain() == 3  # three passes, Pending twice
    poll = harness.last_operation(INSTANCE, operation=operation)
    assert poll.json() == {
        "state": "succeeded",
        "description": f"built fake {INSTANCE} in FakeCloud",
    }
    assert "Retry-After" not in poll.headers
    got = harness.client.get(f"/v2/service_instances/{INSTANCE}")
    assert got.status_code == 200
    body = got.json()
    assert body["service_id"] == fakes.SERVICE_ID and body["plan_id"] == fakes.PLAN_ID
    assert body["parameters"] == {"steps": 3, "size": 2}
    assert body["maintenance_info"] == {"version": "1.0.0"}
    assert body["metadata"]["attributes"] == {"cloud": "FakeCloud", "fake_id": f"fake-{INSTANCE}"}
    assert body["metadata"]["labels"] == {"cloud": "FakeCloud"}
    # the originating identity is recorded with the operation
    with harness.broker.store.read() as session:
        op = harness.broker.store.operation(session, operation)
        assert op is not None
        assert op.originating_identity == {
            "platform": "cloudfoundry",
            "value": {"user_id": "683ea748-3092-4ff4-b656-39cacc4d5360"},
        }
    assert (harness.state_dir / f"instance-{INSTANCE}").exists()
    # deprovision
    response = harness.deprovision(INSTANCE)
    assert response.status_code == 202
    gone_op = response.json()["operation"]
    assert harness.last_operation(INSTANCE, operation=gone_op).json()["state"] == "in progress"
    harness.drain()
    assert harness.last_operation(INSTANCE, operation=gone_op).status_code == 410
    assert not (harness.state_dir / f"instance-{INSTANCE}").exists()
    assert harness.deprovision(INSTANCE).status_code == 410
    assert harness.client.get(f"/v2/service_instances/{INSTANCE}").status_code == 404


def test_identical_repeats_get_the_same_answer(harness: Harness) -> None:
    first = harness.provision(INSTANCE, {"size": 2})
    again = harness.provision(INSTANCE, {"size": 2})
    assert first.status_code == again.status_code == 202
    assert first.json()["operation"] == again.json()["operation"]
    harness.drain()
    done = harness.provision(INSTANCE, {"size": 2})
    assert done.status_code == 200
    assert (harness.state_dir / "journal").read_text().count("create") == 1
    d1 = harness.deprovision(INSTANCE)
    d2 = harness.deprovision(INSTANCE)
    assert d1.status_code == d2.status_code == 202
    assert d1.json()["operation"] == d2.json()["operation"]


def test_provision_without_accepts_incomplete_is_422_async_required(harness: Harness) -> None:
    before = harness.broker.store.snapshot()
    response = harness.provision(INSTANCE, accepts_incomplete="false")
    assert response.status_code == 422
    assert response.json()["error"] == "AsyncRequired"
    assert harness.broker.store.snapshot() == before


def _unchanged(
    harness: Harness, call: Any, status: int, error: str | None = None
) -> dict[str, Any]:
    before = harness.broker.store.snapshot()
    journal = fakes.journal(harness.state_dir)
    response = call()
    assert response.status_code == status, response.text
    body = response.json()
    if error is not None:
        assert body.get("error") == error, body
    assert harness.broker.store.snapshot() == before
    assert fakes.journal(harness.state_dir) == journal
    return body  # type: ignore[no-any-return]


def test_every_4xx_leaves_the_database_unchanged(harness: Harness) -> None:
    h = harness
    # bad requests on an empty broker
    body = _unchanged(h, lambda: h.provision(INSTANCE, {"size": 0}), 400)
    assert body["description"].startswith("parameters.size:")
    body = _unchanged(h, lambda: h.provision(INSTANCE, {"colour": "red"}), 400)
    assert "colour" in body["description"]
    body = _unchanged(h, lambda: h.provision(INSTANCE, {"size": "big"}), 400)
    assert body["description"].startswith("parameters.size:")
    body = _unchanged(h, lambda: h.provision(INSTANCE, body={"service_id": "nope"}), 400)
    assert body["description"].startswith("service_id:")
    body = _unchanged(h, lambda: h.provision(INSTANCE, body={"plan_id": "nope"}), 400)
    assert body["description"].startswith("plan_id:")
    body = _unchanged(h, lambda: h.provision(INSTANCE, body={"parameters": [1]}), 400)
    assert body["description"].startswith("parameters:")
    body = _unchanged(
        h,
        lambda: h.client.put(
            f"/v2/service_instances/{INSTANCE}",
            params={"accepts_incomplete": "true"},
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        ),
        400,
    )
    assert "JSON" in body["description"]
    body = _unchanged(
        h,
        lambda: h.client.put(
            f"/v2/service_instances/{INSTANCE}",
            params={"accepts_incomplete": "true"},
            json={"plan_id": fakes.PLAN_ID},
        ),
        400,
    )
    assert body["description"].startswith("service_id:")
    _unchanged(h, lambda: h.provision("bad/id"), 404)  # a path with a slash is not a route
    body = _unchanged(h, lambda: h.provision("bad,id"), 400)
    assert body["description"].startswith("instance_id:")
    body = _unchanged(
        h,
        lambda: h.provision(
            INSTANCE, headers={"X-Broker-API-Originating-Identity": "cloudfoundry !!", **HEADERS}
        ),
        400,
    )
    assert "Originating-Identity" in body["description"]
    _unchanged(
        h,
        lambda: h.provision(INSTANCE, body={"maintenance_info": {"version": "0.9.0"}}),
        422,
        "MaintenanceInfoConflict",
    )
    _unchanged(h, lambda: h.deprovision(INSTANCE), 410)
    _unchanged(h, lambda: h.last_operation(INSTANCE), 404)
    _unchanged(h, lambda: h.bind(INSTANCE, "b1"), 404)
    _unchanged(h, lambda: h.unbind(INSTANCE, "b1"), 410)
    _unchanged(h, lambda: h.last_operation(INSTANCE, "b1"), 404)
    _unchanged(
        h, lambda: h.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b1"), 404
    )
    _unchanged(
        h,
        lambda: h.client.patch(
            f"/v2/service_instances/{INSTANCE}",
            params={"accepts_incomplete": "true"},
            json={"service_id": fakes.SERVICE_ID},
        ),
        404,
    )

    # with an instance being provisioned
    assert h.provision(INSTANCE, {"size": 1, "steps": 2}).status_code == 202
    _unchanged(h, lambda: h.provision(INSTANCE, {"size": 2}), 409)
    _unchanged(h, lambda: h.bind(INSTANCE, "b1"), 422, "ConcurrencyError")
    _unchanged(h, lambda: h.deprovision(INSTANCE, accepts_incomplete="false"), 422, "AsyncRequired")
    _unchanged(h, lambda: h.deprovision(INSTANCE, service_id=""), 400)
    _unchanged(h, lambda: h.deprovision(INSTANCE, plan_id="nope"), 400)
    h.drain()

    # with a provisioned instance
    _unchanged(h, lambda: h.provision(INSTANCE, {"size": 2}), 409)
    body = _unchanged(h, lambda: h.bind(INSTANCE, "b1", {"sleep": -1}), 400)
    assert body["description"].startswith("parameters.sleep")
    _unchanged(h, lambda: h.bind(INSTANCE, "b1", body={"plan_id": fakes.PLAN2_ID}), 400)
    _unchanged(h, lambda: h.bind(INSTANCE, "b1", body={"predecessor_binding_id": "nope"}), 400)
    _unchanged(
        h,
        lambda: h.client.patch(
            f"/v2/service_instances/{INSTANCE}",
            json={"service_id": fakes.SERVICE_ID, "parameters": {"size": 5}},
        ),
        422,
        "AsyncRequired",
    )
    _unchanged(
        h,
        lambda: h.client.patch(
            f"/v2/service_instances/{INSTANCE}",
            params={"accepts_incomplete": "true"},
            json={"service_id": fakes.SERVICE_ID, "parameters": {"steps": 5}},
        ),
        400,
    )
    _unchanged(
        h,
        lambda: h.client.patch(
            f"/v2/service_instances/{INSTANCE}",
            params={"accepts_incomplete": "true"},
            json={"service_id": fakes.SERVICE_ID, "maintenance_info": {"version": "2.0.0"}},
        ),
        422,
        "MaintenanceInfoConflict",
    )
    assert h.bind(INSTANCE, "b1").status_code == 202
    _unchanged(h, lambda: h.bind(INSTANCE, "b1", {"sleep": 1}), 409)
    _unchanged(h, lambda: h.bind(INSTANCE, "b2"), 422, "ConcurrencyError")
    _unchanged(h, lambda: h.deprovision(INSTANCE), 422, "ConcurrencyError")
    h.drain()
    _unchanged(h, lambda: h.unbind(INSTANCE, "b1", service_id=""), 400)
    _unchanged(h, lambda: h.unbind("other", "b1"), 410)


def test_update_changes_plan_and_parameters(harness: Harness) -> None:
    harness.provisioned(INSTANCE, {"size": 1})
    response = harness.client.patch(
        f"/v2/service_instances/{INSTANCE}",
        params={"accepts_incomplete": "true"},
        json={"service_id": fakes.SERVICE_ID, "plan_id": fakes.PLAN2_ID, "parameters": {"size": 3}},
    )
    assert response.status_code == 202, response.text
    op = response.json()["operation"]
    got = harness.client.get(f"/v2/service_instances/{INSTANCE}")
    assert got.status_code == 422 and got.json()["error"] == "ConcurrencyError"
    harness.drain()
    assert harness.last_operation(INSTANCE, operation=op).json()["state"] == "succeeded"
    body = harness.client.get(f"/v2/service_instances/{INSTANCE}").json()
    assert body["plan_id"] == fakes.PLAN2_ID and body["parameters"] == {"size": 3}
    stored = json.loads((harness.state_dir / f"instance-{INSTANCE}").read_text())
    assert stored == {"size": 3, "plan": fakes.PLAN2_ID}
    # nothing to change: 200 {} synchronously
    same = harness.client.patch(
        f"/v2/service_instances/{INSTANCE}",
        json={"service_id": fakes.SERVICE_ID, "parameters": {"size": 3}},
    )
    assert same.status_code == 200 and same.json() == {}


def test_failed_provision_then_delete_cleans_up(harness: Harness) -> None:
    response = harness.provision(INSTANCE, {"fail": True})
    op = response.json()["operation"]
    harness.drain()
    poll = harness.last_operation(INSTANCE, operation=op).json()
    assert poll == {"state": "failed", "description": "asked to fail"}
    assert harness.client.get(f"/v2/service_instances/{INSTANCE}").status_code == 404
    # the platform's orphan mitigation
    response = harness.deprovision(INSTANCE)
    assert response.status_code == 202
    harness.drain()
    assert harness.last_operation(INSTANCE).status_code == 410


# ----------------------------------------------------------------------------- binding


def test_async_bind_get_unbind(harness: Harness) -> None:
    harness.provisioned(INSTANCE)
    response = harness.bind(INSTANCE, "b1")
    assert response.status_code == 202
    assert "credentials" not in response.json()
    op = response.json()["operation"]
    assert (
        harness.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b1").status_code
        == 404
    )
    harness.drain()
    assert harness.last_operation(INSTANCE, "b1", operation=op).json()["state"] == "succeeded"
    got = harness.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b1")
    assert got.status_code == 200
    secret = (harness.state_dir / "binding-b1").read_text()
    assert got.json()["credentials"] == {"username": "b1", "password": secret}
    # identical repeat: 200 with the same credentials
    again = harness.bind(INSTANCE, "b1")
    assert again.status_code == 200 and again.json()["credentials"]["password"] == secret
    # the secret is stored encrypted only
    with harness.broker.store.read() as session:
        binding = harness.broker.store.binding(session, "b1")
        assert binding is not None and binding.credentials is not None
        assert secret not in binding.credentials
    dump = json.dumps(harness.broker.store.snapshot(), default=str)
    assert secret not in dump
    # GET of the instance never carries it
    assert secret not in harness.client.get(f"/v2/service_instances/{INSTANCE}").text
    response = harness.unbind(INSTANCE, "b1", accepts_incomplete="true")
    assert response.status_code == 202
    harness.drain()
    assert (
        harness.last_operation(INSTANCE, "b1", operation=response.json()["operation"]).status_code
        == 410
    )
    assert not (harness.state_dir / "binding-b1").exists()
    assert harness.unbind(INSTANCE, "b1").status_code == 410


def test_deprovision_with_bindings_left_removes_their_credentials(harness: Harness) -> None:
    """OSB lets a platform deprovision an instance whose bindings it did not unbind, and the
    broker accepts it (docs/broker.md): the service removes their credentials with the
    instance, as every real service does (`credentials.revoke_instance`). `bench.kills` found
    the fake service leaving them: an orphaned credential after the deprovision. Also: a
    binding unbound first is not removed twice, and an update keeps the bindings' names."""
    harness.provisioned(INSTANCE)
    for binding in ("b1", "b2"):
        assert harness.bind(INSTANCE, binding).status_code == 202
        harness.drain()
    assert harness.unbind(INSTANCE, "b2", accepts_incomplete="true").status_code == 202
    harness.drain()
    update = harness.client.patch(
        f"/v2/service_instances/{INSTANCE}",
        params={"accepts_incomplete": "true"},
        json={"service_id": fakes.SERVICE_ID, "parameters": {"size": 2}},
    )
    assert update.status_code == 202, update.text
    harness.drain()
    assert (harness.state_dir / "binding-b1").exists()
    gone = harness.deprovision(INSTANCE)
    assert gone.status_code == 202
    harness.drain()
    assert harness.last_operation(INSTANCE, operation=gone.json()["operation"]).status_code == 410
    left = sorted(p.name for p in harness.state_dir.iterdir() if p.name != "journal")
    assert left == []  # no instance, no credential of b1 (nor of b2)
    journal = fakes.journal(harness.state_dir)
    assert journal.count("delete-binding b1") == 1 and journal.count("delete-binding b2") == 1
    with harness.broker.store.read() as session:
        binding = harness.broker.store.binding(session, "b1")
        assert binding is not None and binding.state == "gone" and binding.credentials is None


def test_sync_bind_returns_201_with_credentials_and_sync_unbind_200(harness: Harness) -> None:
    harness.provisioned(INSTANCE)
    response = harness.bind(INSTANCE, "b1", accepts_incomplete=False)
    assert response.status_code == 201, response.text
    secret = (harness.state_dir / "binding-b1").read_text()
    assert response.json()["credentials"] == {"username": "b1", "password": secret}
    # a binding made synchronously does not hand its credentials out again on GET
    got = harness.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b1")
    assert got.status_code == 200 and "credentials" not in got.json()
    response = harness.unbind(INSTANCE, "b1")
    assert response.status_code == 200 and response.json() == {}
    assert not (harness.state_dir / "binding-b1").exists()


def test_sync_bind_refused_when_the_service_says_so(db_url: str, tmp_path: Any) -> None:
    from tests.broker.conftest import make_broker

    broker = make_broker(db_url, tmp_path / "cloud", fake={"synchronous_seconds": 0})
    h = Harness(broker, tmp_path / "cloud")
    h.provisioned(INSTANCE)
    _unchanged(h, lambda: h.bind(INSTANCE, "b1", accepts_incomplete=False), 422, "AsyncRequired")
    broker.close()


def test_binding_rotation(harness: Harness) -> None:
    harness.provisioned(INSTANCE)
    assert harness.bind(INSTANCE, "b1", {"sleep": 0}).status_code == 202
    harness.drain()
    response = harness.bind(
        INSTANCE, "b2", body={"predecessor_binding_id": "b1", "parameters": None}
    )
    assert response.status_code == 202, response.text
    harness.drain()
    got = harness.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b2").json()
    assert got["parameters"] == {"sleep": 0}  # taken from the predecessor
    # both are valid in parallel
    assert (harness.state_dir / "binding-b1").exists() and (
        harness.state_dir / "binding-b2"
    ).exists()
    assert (
        got["credentials"]["password"]
        != harness.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b1").json()[
            "credentials"
        ]["password"]
    )


def test_delete_during_provisioning_stops_it_and_cleans_up(harness: Harness) -> None:
    response = harness.provision(INSTANCE, {"steps": 50})
    provision_op = response.json()["operation"]
    owner = "test-worker"
    # two passes run: the instance exists in the "cloud" and the provision is half way
    for _ in range(2):
        assert harness.worker.run_one(owner)
        time.sleep(0.02)  # the pass asked to be called again after 0.01 s
    assert (harness.state_dir / f"instance-{INSTANCE}").exists()
    response = harness.deprovision(INSTANCE)
    assert response.status_code == 202
    harness.drain()
    assert harness.last_operation(INSTANCE, operation=provision_op).json()["state"] == "failed"
    assert harness.last_operation(INSTANCE).status_code == 410
    assert not (harness.state_dir / f"instance-{INSTANCE}").exists()


@pytest.mark.parametrize(
    "query",
    [
        b"operation=provision-1",
        b"service_id=s&plan_id=p&operation=op%2Fx+y",
        b"operation=&operation=second",
        b"operation=%C3%A9t%C3%A9",
        b"operationx=1&xoperation=2",
        b"",
    ],
)
def test_the_polling_query_parser_agrees_with_parse_qs(query: bytes) -> None:
    from urllib.parse import parse_qs

    from scoperouter.broker.api import _query_value

    expected = parse_qs(query.decode("latin-1")).get("operation", [None])[0]
    assert _query_value(query, b"operation") == expected


def test_last_operation_bodies_are_osb_last_operation_objects(harness: Harness) -> None:
    """The polling route writes its JSON by hand (no pydantic per request): each body it
    answers is still a valid models.LastOperation, with exact content headers."""
    from scoperouter.broker.models import LastOperation

    response = harness.provision(INSTANCE, {"fail": True})
    assert response.status_code == 202, response.text
    operation = response.json()["operation"]
    in_progress = harness.last_operation(INSTANCE, operation=operation)
    assert LastOperation.model_validate(in_progress.json()).state == "in progress"
    assert in_progress.headers["content-type"] == "application/json"
    assert int(in_progress.headers["content-length"]) == len(in_progress.content)
    harness.drain()
    failed = harness.last_operation(INSTANCE, operation=operation)
    body = LastOperation.model_validate(failed.json())
    assert (body.state, body.description) == ("failed", "asked to fail")
    assert "retry-after" not in failed.headers


# ------------------------------------------------------- found tried as CF and Kubernetes


def _patch(h: Harness, **body: Any) -> Any:
    return h.client.patch(
        f"/v2/service_instances/{INSTANCE}",
        params={"accepts_incomplete": "true"},
        json={"service_id": fakes.SERVICE_ID, **body},
    )


def test_an_update_the_service_cannot_do_is_refused_at_once_changing_nothing(
    db_url: str, tmp_path: Any
) -> None:
    """A service without an update schema (openstack-server, openstack-image): a PATCH that
    changes a parameter is 422 with update_repeatable false, not a 202 followed by an update
    that fails and can never succeed; the catalog says nothing is updatable."""
    from tests.broker.conftest import make_broker

    broker = make_broker(db_url, tmp_path / "cloud", fake={"updatable": False})
    h = Harness(broker, tmp_path / "cloud")
    try:
        [service] = h.client.get("/v2/catalog").json()["services"]
        assert service["plan_updateable"] is False
        assert "update" not in service["plans"][0]["schemas"]["service_instance"]
        h.provisioned(INSTANCE, {"size": 1})
        for parameters in ({"bogus": 1}, {"size": 2}):
            body = _unchanged(h, lambda p=parameters: _patch(h, parameters=p), 422)  # type: ignore[misc]
            name = next(iter(parameters))
            assert body["description"].startswith(f"parameters.{name}: plan small of fake")
            assert body["update_repeatable"] is False and body["instance_usable"] is True
        _unchanged(h, lambda: _patch(h, plan_id=fakes.PLAN2_ID), 422)
        # the current values sent again (Kubernetes sends them all) change nothing: 200
        assert _unchanged(h, lambda: _patch(h, parameters={"size": 1}), 200) == {}
    finally:
        h.client.close()
        broker.close()


def test_an_update_resending_current_values_changes_only_what_differs(harness: Harness) -> None:
    """The update schema checks what changes: parameters sent again with their current value
    (create-only ones included) are no change; a create-only one with a new value is 400
    naming it."""
    harness.provisioned(INSTANCE, {"size": 1, "steps": 2})
    body = _unchanged(harness, lambda: _patch(harness, parameters={"steps": 3, "size": 1}), 400)
    assert body["description"] == "parameters.steps: not a parameter of this plan"
    response = _patch(harness, parameters={"size": 3, "steps": 2})
    assert response.status_code == 202, response.text
    harness.drain()
    got = harness.client.get(f"/v2/service_instances/{INSTANCE}").json()
    assert got["parameters"] == {"size": 3, "steps": 2}


def test_a_provision_without_organization_and_space_and_no_context_is_400(
    harness: Harness,
) -> None:
    """OSB 2.17 requires organization_guid and space_guid; only a context may stand in for
    them (it names the platform's space). Else the instance would land in a shared space."""
    no_context = {"context": None}
    body = _unchanged(
        harness,
        lambda: harness.provision(
            INSTANCE, body={**no_context, "organization_guid": None, "space_guid": None}
        ),
        400,
        "BadRequest",
    )
    assert body["description"].startswith("organization_guid: required")
    body = _unchanged(
        harness, lambda: harness.provision(INSTANCE, body={**no_context, "space_guid": None}), 400
    )
    assert body["description"].startswith("space_guid: required")
    # a context alone (Kubernetes' namespace, CF's space) names the space: accepted
    response = harness.provision(
        INSTANCE,
        body={
            "organization_guid": None,
            "space_guid": None,
            "context": {"platform": "kubernetes", "namespace": "ns", "clusterid": "c1"},
        },
    )
    assert response.status_code == 202, response.text
    # the guids without a context: accepted as before
    response = harness.provision("inst-2", body=no_context)
    assert response.status_code == 202, response.text


def test_an_invalid_parameter_is_named_with_its_limit_never_its_value(harness: Harness) -> None:
    """cloud-init text and other parameters may hold passwords: a 400 names the field and the
    rule, never quotes what was sent (jsonschema's own messages quote it whole)."""
    secret = "hunter2-s3cr3t"
    cases = [
        ({"name": secret * 5}, "parameters.name: longer than 20 characters"),
        ({"size": secret}, "parameters.size: expected integer"),
        ({"steps": 1000}, "parameters.steps: above the maximum of 100"),
    ]
    for parameters, expected in cases:
        body = _unchanged(harness, lambda p=parameters: harness.provision(INSTANCE, p), 400)  # type: ignore[misc]
        assert body["description"] == expected
        assert secret not in json.dumps(body) and "1000" not in body["description"]


def test_a_parameter_naming_another_instance_is_checked_before_anything_is_written(
    harness: Harness,
) -> None:
    """Service.check_references: a bind naming an instance that is not a live one beside
    this one is 400 naming the field (the volume-to-server rule), nothing written."""
    harness.provisioned(INSTANCE)
    body = _unchanged(harness, lambda: harness.bind(INSTANCE, "b1", {"peer": "nobody"}), 400)
    assert body["description"] == "parameters.peer: no instance nobody beside this one"
    harness.provisioned("inst-2")
    assert harness.bind(INSTANCE, "b1", {"peer": "inst-2"}).status_code == 202


# ------------------------------------------------------------------ the database going away


def test_a_database_that_goes_away_is_a_json_503_with_retry_after(
    pg_cluster: Any, tmp_path: Any, caplog: Any
) -> None:
    """Found by bench.chaos (PostgreSQL restarted under two replicas): a `last_operation` poll
    then got uvicorn's text/plain 500 (the polling path had no error handler) and every other
    route a 500 with a traceback in the log. Now both answer the OSB JSON error, 503 with
    Retry-After (a platform polls again), logged as one line each."""
    from tests.broker.conftest import make_broker

    if pg_cluster is None:
        pytest.skip("PostgreSQL is not installed")
    name = pg_cluster.new_database(template="broker_template")
    broker = make_broker(pg_cluster.url(name), tmp_path)
    harness = Harness(broker, tmp_path)
    try:
        assert harness.provision(INSTANCE).status_code == 202
        assert harness.last_operation(INSTANCE).status_code == 200
        caplog.set_level("INFO", logger="scoperouter.broker")
        pg_cluster.sql(f"DROP DATABASE {name} WITH (FORCE)")  # its connections terminated too
        answers = {
            "poll": harness.last_operation(INSTANCE),
            "binding poll": harness.last_operation(INSTANCE, "b1"),
            "provision": harness.provision("inst-2"),
            "get": harness.client.get(f"/v2/service_instances/{INSTANCE}"),
        }
    finally:
        for engine in {broker.store.engine, broker.store._read_engine, broker.store._poll_engine}:
            engine.dispose()
    for what, response in answers.items():
        assert response.status_code == 503, (what, response.status_code, response.text)
        assert response.headers["content-type"] == "application/json", what
        assert "database is unavailable" in response.json()["description"], what
        assert response.headers["retry-after"] == "5", what
    logged = [r for r in caplog.records if r.name.startswith("scoperouter.broker")]
    assert not [r for r in logged if r.exc_info or r.levelno >= logging.ERROR], [
        r.getMessage() for r in logged
    ]
    assert len([r for r in logged if "database is unavailable" in r.getMessage()]) == len(answers)
