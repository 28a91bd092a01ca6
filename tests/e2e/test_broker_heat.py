"""A ``heat`` service against the lab's heat, through the broker's OSB API (a real `broker
serve` process, driven by the project's OSB client as Cloud Foundry would), with the example
template ``broker-templates/server.yaml`` as a plan:

- the full lifecycle of a stack in CloudOne whose server boots **CloudTwo's** image (the scope
  ``{"compute": "CloudOne", "image": "CloudTwo"}``): the plan's schema from the template, the
  stack created through CloudOne's router, its outputs as the binding's credentials with an
  application credential carrying the scope, used with the `openstack` CLI (the server, and
  CloudTwo's image through the scope), unbind (the credential refused), deprovision (the stack
  and its server gone);
- a broker SIGKILLed once its stack create reached heat: the restarted broker finds the stack by
  its name, one stack (one server), and the operation finishes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scoperouter.broker.openstack_helpers import instance_tag
from scoperouter.broker.services.heat import stack_name
from tests.e2e.broker_services import (
    DEADLINES,
    OSBBroker,
    database,
    drift_of,
    instance_id,
    run_projects,
    swept_clouds,
)
from tests.e2e.labservices import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STACK = "openstack-stack"


def heat_services(one: str) -> dict[str, Any]:
    return {
        STACK: {
            "type": "heat",
            "deadlines": DEADLINES,
            "binding_credential": True,
            "placement": {"default": {"cloud": one}},
            "poll_seconds": 2,
            "plans": [
                {
                    "name": "server",
                    "description": "A server with a generated password",
                    "template": str(ROOT / "broker-templates" / "server.yaml"),
                },
            ],
        }
    }


@pytest.fixture(scope="module")
def clouds(lab, fed) -> Iterator[Any]:
    yield from swept_clouds(lab, fed, "heat")


def _stacks(clouds: Any, cloud: str, iid: str) -> list[Any]:
    """The stacks named after the instance in this run's projects of `cloud`."""
    found = []
    for project_id in run_projects(clouds, cloud):
        conn = clouds.connect(cloud, project_id=project_id)
        found += [s for s in conn.orchestration.stacks() if s.name == stack_name(iid)]
    return found


def _servers(clouds: Any, cloud: str, iid: str) -> list[str]:
    admin = clouds.connect(cloud)
    return [
        s.id
        for s in admin.compute.servers(all_projects=True)
        if (s.name or "").startswith(stack_name(iid))
    ]


def test_a_stack_in_cloudone_from_cloudtwos_image_full_lifecycle(
    lab, clouds, fed, tmp_path, request, record_property
):
    one, two, tiny = fed
    env = OSBBroker(
        lab, tmp_path, space="osb-heat", services=heat_services(one.name),
        db_url=database(request),
    )  # fmt: skip
    try:
        started = time.monotonic()
        [service] = [s for s in env.catalog["services"] if s["name"] == STACK]
        [plan] = service["plans"]
        schema = plan["schemas"]["service_instance"]["create"]["parameters"]
        assert schema["required"] == ["image"]  # the template's only parameter without default
        assert schema["properties"]["flavor"]["enum"] == ["m1.tiny", "m1.small"]

        # a value the template refuses is refused by the broker first, nothing written
        service_id, plan_id = env.plan(STACK)
        bad = env.osb.provision(
            instance_id("bad"), service_id, plan_id, {"image": "x", "name_suffix": "Not_Ok"}
        )
        assert bad.status == 400 and "parameters.name_suffix" in bad.body["description"], bad.body

        scope = {"compute": one.name, "image": two.name}
        params = {"image": tiny[two.name], "name_suffix": "web", "where": {"scope": scope}}
        iid, last = env.provision(STACK, "stack", params)
        assert last.body["state"] == "succeeded", last.body
        attributes = env.osb.get_instance(iid).body["metadata"]["attributes"]
        assert attributes["cloud"] == one.name
        assert json.loads(attributes["scope"]) == scope
        assert attributes["stack_name"] == stack_name(iid)
        assert last.body["description"] == (
            f"stack {stack_name(iid)} ({attributes['stack_id']}) is CREATE_COMPLETE in "
            f"{one.name} (scope {attributes['scope']})"
        ), last.body
        [stack] = _stacks(clouds, one.name, iid)
        assert stack.id == attributes["stack_id"] and _stacks(clouds, two.name, iid) == []
        admin = clouds.connect(one.name)
        [server_id] = _servers(clouds, one.name, iid)
        server = admin.compute.get_server(server_id)
        assert server.status == "ACTIVE" and server.image.id == tiny[two.name]
        assert server.project_id == attributes["project_id"]
        assert server.name == f"{stack_name(iid)}-web"

        # an update is a stack update: heat renames the server in place; the stack keeps
        # the broker's tags (heat keeps only those an update sends), so `broker repair`
        # still finds it (reading each project's stacks: heat refuses everyone's at once)
        last = env.update(STACK, iid, {"name_suffix": "api"})
        assert "is UPDATE_COMPLETE in" in last.body["description"], last.body
        assert admin.compute.get_server(server_id).name == f"{stack_name(iid)}-api"
        [stack] = _stacks(clouds, one.name, iid)
        assert sorted(stack.tags) == ["osb", instance_tag(iid)]
        assert drift_of(env.repair(), iid) == []

        binding, creds = env.bind(STACK, iid)
        assert creds["server_id"] == server_id and creds["stack_id"] == stack.id
        assert creds["server_name"] == f"{stack_name(iid)}-api"
        assert len(creds["password"]) == 24  # the template's OS::Heat::RandomString
        # the binding's credential with the openstack CLI: the stack's server, and through
        # the scope the image it was booted from, which lives in CloudTwo
        env.server_binding_works(creds, server_id, tiny[two.name], scope)

        env.unbind(STACK, iid, binding)
        assert env.revoked(creds, server_id)

        env.deprovision(STACK, iid)
        assert _stacks(clouds, one.name, iid) == [] and _servers(clouds, one.name, iid) == []
        record_property("wall_seconds", round(time.monotonic() - started, 1))
    finally:
        env.stop()


def test_sigkill_during_a_stack_create(lab, clouds, fed, tmp_path, request, record_property):
    """A broker SIGKILLed once its create reached heat is replaced by a restarted one that finds
    the stack by its name and polls it to the end: one stack, one server."""
    one, _two, tiny = fed
    env = OSBBroker(
        lab, tmp_path, space="osb-heat-crash", lease=4.0, services=heat_services(one.name),
        db_url=database(request),
    )  # fmt: skip
    try:
        started = time.monotonic()
        service_id, plan_id = env.plan(STACK)
        iid = instance_id("stackcrash")
        params = {"image": tiny[one.name], "where": {"cloud": one.name}}
        answer = env.osb.provision(iid, service_id, plan_id, params)
        assert answer.status == 202, answer.body
        wait_until("the stack create to reach heat", lambda: _stacks(clouds, one.name, iid), 120)
        env.restart()
        last = env.wait(iid, answer.operation, "provision")
        assert last.body["state"] == "succeeded", last.body
        assert len(_stacks(clouds, one.name, iid)) == 1
        assert len(_servers(clouds, one.name, iid)) == 1
        env.deprovision(STACK, iid)
        assert _stacks(clouds, one.name, iid) == [] and _servers(clouds, one.name, iid) == []
        record_property("wall_seconds", round(time.monotonic() - started, 1))
    finally:
        env.stop()
