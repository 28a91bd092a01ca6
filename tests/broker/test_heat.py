"""``heat`` services: the plan's JSON schema derived from a HOT template's parameters (pure),
and the passes (stack create, update, delete, outputs as credentials) against a fake
orchestration API standing in for heat, also through the broker's OSB API on its real
database. The lab's heat comes with another branch: the end-to-end tests wait for it."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import yaml
from openstack import exceptions

from scoperouter.broker.config import BrokerConfigError, config_from_dict
from scoperouter.broker.contract import Capacity, Done, Failed, Pending
from scoperouter.broker.openstack_helpers import instance_tag
from scoperouter.broker.runtime import Broker, compile_schema
from scoperouter.broker.secrets import Secrets, generate_key
from scoperouter.broker.services.heat import HeatService, service_class
from scoperouter.broker.services.heat_templates import (
    load_template,
    owner_of,
    stack_name,
    stack_parameters,
    template_schemas,
)
from tests.broker.conftest import Harness
from tests.broker.passes import MemoryOperation, Saved, after, drive, instance
from tests.broker.test_server import FakeIdentity

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "broker-templates"
_ids = itertools.count(1)


# ----------------------------------------------------------------- schema derivation


TEMPLATE = {
    "heat_template_version": "2018-08-31",
    "parameters": {
        "image": {"type": "string", "label": "Image", "description": "what to boot"},
        "flavor": {
            "type": "string",
            "default": "m1.tiny",
            "constraints": [{"allowed_values": ["m1.tiny", "m1.small"]}],
        },
        "name": {
            "type": "string",
            "default": "a",
            "immutable": True,
            "constraints": [
                {"length": {"min": 1, "max": 8}},
                {"allowed_pattern": "[a-z]+", "description": "lower case"},
            ],
        },
        "size": {
            "type": "number",
            "default": 2,
            "constraints": [{"range": {"min": 1, "max": 10}}, {"modulo": {"step": 2}}],
        },
        "odd": {
            "type": "number",
            "default": 1,
            "constraints": [{"modulo": {"step": 2, "offset": 1}}],
        },
        "ports": {
            "type": "comma_delimited_list",
            "default": "22,80",
            "constraints": [{"length": {"max": 3}}, {"allowed_values": ["22", "80", "443"]}],
        },
        "extra": {"type": "json", "default": {}},
        "debug": {"type": "boolean", "default": False},
        "secret": {"type": "string", "hidden": True, "default": "x"},
        "key": {"type": "string", "constraints": [{"custom_constraint": "nova.keypair"}]},
    },
    "resources": {"r": {"type": "OS::Heat::None"}},
}  # fmt: skip


def test_a_template_s_parameters_become_the_plan_s_schemas() -> None:
    create, update = template_schemas(TEMPLATE)
    props = create["properties"]
    assert create["required"] == ["image", "key"]  # no default
    assert create["additionalProperties"] is False and create["$schema"].endswith(
        "draft-04/schema#"
    )
    assert props["image"] == {"type": "string", "title": "Image", "description": "what to boot"}
    assert props["flavor"] == {
        "type": "string",
        "default": "m1.tiny",
        "enum": ["m1.tiny", "m1.small"],
    }
    assert props["name"]["minLength"] == 1 and props["name"]["maxLength"] == 8
    assert props["name"]["pattern"] == "^(?:[a-z]+)$"  # heat matches the whole value
    assert props["name"]["description"] == "cannot be changed by an update; lower case"
    assert props["size"] == {
        "type": "number",
        "default": 2,
        "minimum": 1,
        "maximum": 10,
        "multipleOf": 2,
    }
    assert "multipleOf" not in props["odd"] and "checked by heat" in props["odd"]["description"]
    assert props["ports"] == {
        "type": ["array", "string"],
        "items": {"type": "string", "enum": ["22", "80", "443"]},
        "default": ["22", "80"],
        "maxItems": 3,
    }
    assert props["extra"]["type"] == ["object", "array"] and props["debug"]["type"] == "boolean"
    assert props["secret"]["writeOnly"] is True
    assert props["key"]["description"] == "a valid nova.keypair (checked by heat)"
    # the update schema: what may change (not `name`), nothing required
    assert "name" not in update["properties"] and "required" not in update
    assert set(update["properties"]) == set(props) - {"name"}
    validator = compile_schema(create, "t")
    assert validator.is_valid({"image": "cirros", "key": "k"})
    for change in ({"flavor": "m1.huge"}, {"name": "Abc"}, {"size": 3}, {"size": 12},
                   {"ports": ["21"]}, {"key": None}):  # fmt: skip
        bad = {k: v for k, v in {"image": "c", "key": "k", **change}.items() if v is not None}
        assert not validator.is_valid(bad), bad


def test_parameters_a_plan_sets_are_not_offered() -> None:
    create, _ = template_schemas(TEMPLATE, fixed={"image", "key"})
    assert "image" not in create["properties"] and "required" not in create


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "int"}, "parameters.p.type: expected one of"),
        ({"type": "number", "constraints": [{"length": {"max": 1}}]}, "length applies to"),
        ({"type": "string", "constraints": [{"range": {"max": 1}}]}, "range applies to number"),
        ({"type": "string", "constraints": [{"allowed_pattern": "("}]}, "allowed_pattern:"),
        ({"type": "string", "constraints": [{"shiny": 1}]}, "unknown constraint ['shiny']"),
    ],
)
def test_a_parameter_the_broker_cannot_read_is_named(spec: dict[str, Any], message: str) -> None:
    template = {"heat_template_version": "2018-08-31", "parameters": {"p": spec}}
    with pytest.raises(ValueError) as caught:
        template_schemas(template)
    assert message in str(caught.value)


def test_the_example_templates_load_and_make_valid_schemas() -> None:
    for path in sorted(TEMPLATES.glob("*.yaml")):
        template = load_template(path)
        assert template["heat_template_version"] == "2018-08-31"  # text, not a date
        create, update = template_schemas(template)
        compile_schema(create, path.name)
        compile_schema(update, path.name)
    server, _ = template_schemas(load_template(TEMPLATES / "server.yaml"))
    assert server["required"] == ["image"]
    volume, volume_update = template_schemas(load_template(TEMPLATES / "volume.yaml"))
    assert volume["properties"]["size"]["maximum"] == 100
    assert set(volume_update["properties"]) == {"size"}  # name is immutable


def test_stack_parameters_names_and_owners() -> None:
    values = {"ports": ["22", "443"], "image": "c", "where": {"cloud": "x"}, "unknown": 1}
    assert stack_parameters(TEMPLATE, values) == {"ports": "22,443", "image": "c"}
    assert stack_name("6f1c0a4e-4b39") == "osb-6f1c0a4e-4b39"
    odd = stack_name("a~b")
    assert odd.startswith("osb-") and len(odd) == 52 and "~" not in odd
    long_id = "x" * 100  # its tag is a digest, its stack name is not
    assert owner_of(stack_name(long_id), ["osb", instance_tag(long_id)]) == long_id
    assert owner_of("osb-i-1", ["osb", instance_tag("i-1")]) == "i-1"
    assert owner_of(odd, ["osb", instance_tag("a~b")]) is None  # not recoverable: unknown
    assert owner_of("other", ["osb"]) is None


# ------------------------------------------------------------- passes, fake heat


@dataclass
class FakeStack:
    id: str
    name: str
    status: str
    template: dict[str, Any]
    parameters: dict[str, Any]
    tags: list[str]
    status_reason: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 0
    project: str = ""


def _response(status: int, body: dict[str, Any]) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response.reason = {
        200: "OK", 201: "Created", 202: "Accepted", 400: "Bad Request", 403: "Forbidden",
        404: "Not Found", 409: "Conflict",
    }[status]  # fmt: skip
    response.headers["Content-Type"] = "application/json"
    response._content = json.dumps(body).encode()
    return response


@dataclass
class FakeHeat:
    """heat's orchestration API as the service uses it: a create or update completes (or
    fails with `fail`) after `polls` reads; a delete after one."""

    polls: int = 1
    fail: str | None = None
    stacks: dict[str, FakeStack] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def _advance(self, stack: FakeStack) -> FakeStack:
        stack.polls += 1
        if stack.status.endswith("_IN_PROGRESS") and stack.polls > self.polls:
            action = stack.status.split("_")[0]
            if action != "DELETE" and self.fail:
                stack.status, stack.status_reason = f"{action}_FAILED", self.fail
            else:
                stack.status = f"{action}_COMPLETE"
                stack.outputs = [
                    {"output_key": "server_id", "output_value": f"srv-{stack.id}"},
                    {"output_key": "password", "output_value": "generated-pw"},
                    {"output_key": "broken", "output_error": "no attribute"},
                ]
        return stack

    def post(self, path: str, json: dict[str, Any]) -> requests.Response:
        """heat's ``POST /stacks`` as heat answers it: `tags` is one comma-separated string
        (a list is heat's 400 without a message, its API calling ``split`` on it)."""
        assert path == "/stacks", path
        attrs = json
        self.calls.append(("create", attrs))
        if not isinstance(attrs.get("tags", ""), str):
            error = {"type": "AttributeError", "traceback": None}
            return _response(400, {"code": 400, "title": "Bad Request", "error": error})
        if any(
            s.name == attrs["stack_name"] and s.status != "DELETE_COMPLETE"
            for s in self.stacks.values()
        ):
            error = {"message": "The Stack already exists.", "type": "StackExists"}
            return _response(409, {"code": 409, "title": "Conflict", "error": error})
        stack = FakeStack(
            id=f"stack-{next(_ids)}",
            name=attrs["stack_name"],
            status="CREATE_IN_PROGRESS",
            template=attrs["template"],
            parameters=attrs["parameters"],
            tags=attrs["tags"].split(",") if attrs.get("tags") else [],
        )
        self.stacks[stack.id] = stack
        return _response(201, {"stack": {"id": stack.id, "links": []}})

    def create_stack(self, **attrs: Any) -> FakeStack:
        """openstacksdk's ``create_stack``: its Stack resource sends ``tags`` as a JSON list
        (``type=list``), which heat refuses."""
        body = {"stack_name": attrs.pop("name"), **attrs, "tags": list(attrs.get("tags") or [])}
        response = self.post("/stacks", json=body)
        exceptions.raise_from_response(response)
        return self.stacks[response.json()["stack"]["id"]]

    def get_stack(self, stack_id: str) -> FakeStack:
        if stack_id not in self.stacks:
            raise exceptions.NotFoundException(message=f"404: no stack {stack_id}")
        return self._advance(self.stacks[stack_id])

    def find_stack(self, name: str, ignore_missing: bool = True) -> FakeStack | None:
        live = [s for s in self.stacks.values() if s.name == name and s.status != "DELETE_COMPLETE"]
        return self._advance(live[0]) if live else None

    def put(self, path: str, json: dict[str, Any]) -> requests.Response:
        """heat's ``PUT /stacks/<name>/<id>``: a whole new definition of the stack, whose
        tags are those the request gives (none given: the stack has none left)."""
        name, stack_id = path.removeprefix("/stacks/").split("/")
        stack = self.stacks.get(stack_id)
        if stack is None or stack.name != name:
            error = {"message": f"The Stack ({name}) could not be found.", "type": "NotFound"}
            return _response(404, {"code": 404, "title": "Not Found", "error": error})
        self.calls.append(("update", json))
        if not isinstance(json.get("tags", ""), str):
            error = {"type": "AttributeError", "traceback": None}
            return _response(400, {"code": 400, "title": "Bad Request", "error": error})
        stack.status, stack.polls = "UPDATE_IN_PROGRESS", 0
        stack.template, stack.parameters = json["template"], json["parameters"]
        stack.tags = json["tags"].split(",") if json.get("tags") else []
        return _response(202, {})

    def update_stack(self, stack: FakeStack, **attrs: Any) -> FakeStack:
        """openstacksdk's ``update_stack``: the attributes given, without the stack's tags."""
        exceptions.raise_from_response(self.put(f"/stacks/{stack.name}/{stack.id}", attrs))
        return stack

    def delete_stack(self, stack: FakeStack) -> None:
        self.calls.append(("delete", {"id": stack.id}))
        stack.status, stack.polls = "DELETE_IN_PROGRESS", 0

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


class ProjectHeat:
    """A FakeHeat as a connection scoped to `project` sees it: what it creates is the
    project's, and ``GET /stacks`` lists the project's stacks; heat's default policy refuses
    ``global_tenant`` (every project's stacks) to everyone (``stacks:global_index``)."""

    def __init__(self, heat: FakeHeat, project: str) -> None:
        self.heat = heat
        self.project = project

    def __getattr__(self, name: str) -> Any:
        return getattr(self.heat, name)

    def post(self, path: str, json: dict[str, Any]) -> requests.Response:
        response = self.heat.post(path, json)
        if response.status_code == 201:
            self.heat.stacks[response.json()["stack"]["id"]].project = self.project
        return response

    def create_stack(self, **attrs: Any) -> FakeStack:
        return FakeHeat.create_stack(self, **attrs)  # type: ignore[arg-type]

    def get(self, path: str, params: dict[str, str]) -> requests.Response:
        assert path == "/stacks", path
        if params.get("global_tenant"):
            error = {"message": "Access was denied to this resource.", "type": "Forbidden"}
            return _response(403, {"code": 403, "title": "Forbidden", "error": error})
        wanted = set(params["tags"].split(",")) if params.get("tags") else set()
        stacks = [
            {"id": st.id, "stack_name": st.name, "tags": st.tags}
            for st in self.heat.stacks.values()
            if st.project == self.project
            and wanted <= set(st.tags)
            and st.status != "DELETE_COMPLETE"
        ]
        return _response(200, {"stacks": stacks})


class HeatClouds:
    """Two clouds, each with its own fake heat; connections say where and with which scope."""

    def __init__(self) -> None:
        self.heat = {"CloudOne": FakeHeat(), "CloudTwo": FakeHeat()}
        self.free = {"CloudOne": 0.3, "CloudTwo": 0.8}
        self.connects: list[tuple[str, str | None, str | None]] = []

    def names(self) -> tuple[str, ...]:
        return tuple(self.heat)

    def connect(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> Any:
        self.connects.append((cloud, project_id, scope))
        managed = [SimpleNamespace(id=f"project-{cloud}")]  # FakeIdentity's space project
        return SimpleNamespace(
            orchestration=ProjectHeat(self.heat[cloud], project_id or "broker-project"),
            identity=SimpleNamespace(projects=lambda tags: managed),
            cloud_name=cloud,
            current_project_id="p",
        )

    def capacity(self, cloud: str) -> Capacity:
        total = {"VCPU": 10.0}
        return Capacity(cloud, total, {"VCPU": 10.0 * self.free[cloud]}, datetime.now(UTC))

    def identity_url(self, cloud: str) -> str:
        return f"http://{cloud}/v3"

    def region(self, cloud: str) -> str:
        return cloud


def _service(clouds: HeatClouds, **settings: Any) -> HeatService:
    plans = [
        {"name": "server", "description": "a server", "template": str(TEMPLATES / "server.yaml")},
        {
            "name": "big",
            "description": "a bigger server",
            "template": str(TEMPLATES / "server.yaml"),
            "parameters": {"flavor": "m1.small"},
        },
    ]
    cls = service_class("openstack-stack")
    return cls({"plans": plans, "plan_updateable": True, **settings}, clouds)  # type: ignore[arg-type]


def _op(service: HeatService, kind: Any, view: Any, saved: Saved, plan: int = 0) -> MemoryOperation:
    return MemoryOperation(
        kind, view, service.catalog().plans[plan], service.clouds, saved, identity=FakeIdentity()
    )


def test_provision_creates_one_stack_where_placement_says_and_a_rerun_finds_it() -> None:
    clouds = HeatClouds()
    service = _service(clouds)
    view = instance("i-1", {"image": "cirros", "name_suffix": "web"})
    saved = Saved()
    first = service.provision(_op(service, "provision", view, saved))
    assert isinstance(first, Pending) and "CREATE_IN_PROGRESS" in first.description
    heat = clouds.heat["CloudTwo"]  # the freer cloud
    [(_, create)] = heat.calls
    assert create["stack_name"] == "osb-i-1" and create["tags"] == "osb,osb-instance-i-1"
    assert heat.stacks[saved.progress["stack_id"]].tags == ["osb", "osb-instance-i-1"]
    assert create["parameters"] == {"image": "cirros", "name_suffix": "web"}
    assert create["template"]["heat_template_version"] == "2018-08-31"
    assert create["disable_rollback"] is True and create["timeout_mins"] >= 1
    # a crash after the create, before its id was saved: the next pass finds it by name
    saved.progress.pop("stack_id")
    outcome = drive(service, _op(service, "provision", view, saved), max_sleep=0)
    assert isinstance(outcome, Done), outcome
    assert (
        outcome.description.startswith("stack osb-i-1 (stack-")
        and "CREATE_COMPLETE in CloudTwo" in outcome.description
    )
    assert heat.kinds() == ["create"]  # one stack
    assert saved.resources["stack_name"] == "osb-i-1" and saved.resources["cloud"] == "CloudTwo"
    assert saved.resources["project_id"] == "project-CloudTwo"


def test_a_scope_puts_the_stack_in_its_compute_cloud() -> None:
    clouds = HeatClouds()
    service = _service(clouds)
    where = {"scope": {"compute": "CloudOne", "image": "CloudTwo"}}
    view = instance("i-2", {"image": "CloudTwo-image", "where": where})
    outcome = drive(service, _op(service, "provision", view, Saved()), max_sleep=0)
    assert isinstance(outcome, Done) and "in CloudOne (scope " in outcome.description
    assert clouds.heat["CloudOne"].kinds() == ["create"] and not clouds.heat["CloudTwo"].calls
    scopes = {scope for cloud, _, scope in clouds.connects if cloud == "CloudOne" and scope}
    assert len(scopes) == 1 and '"image":"CloudTwo"' in scopes.pop().replace(" ", "")
    assert "where" not in clouds.heat["CloudOne"].calls[0][1]["parameters"]


def test_a_failed_stack_s_reason_is_the_operation_s_description() -> None:
    clouds = HeatClouds()
    clouds.heat["CloudTwo"].fail = "Resource CREATE failed: No valid host was found."
    service = _service(clouds)
    saved = Saved()
    outcome = drive(
        service, _op(service, "provision", instance("i-3", {"image": "c"}), saved), max_sleep=0
    )
    assert isinstance(outcome, Failed)
    assert outcome.description.endswith(
        "is CREATE_FAILED in CloudTwo: Resource CREATE failed: No valid host was found."
    )
    # the platform's DELETE removes the failed stack
    gone = drive(
        service, _op(service, "deprovision", after(instance("i-3", {}), saved), saved), max_sleep=0
    )
    assert isinstance(gone, Done) and clouds.heat["CloudTwo"].kinds() == ["create", "delete"]


def test_update_sends_the_target_plan_s_template_and_the_merged_parameters() -> None:
    clouds = HeatClouds()
    service = _service(clouds)
    view = instance("i-4", {"image": "c", "flavor": "m1.tiny"})
    saved = Saved()
    assert isinstance(drive(service, _op(service, "provision", view, saved), max_sleep=0), Done)
    saved.progress.clear()
    changed = after(instance("i-4", {"image": "c", "name_suffix": "new"}), saved)
    outcome = drive(service, _op(service, "update", changed, saved, plan=1), max_sleep=0)
    assert isinstance(outcome, Done) and "UPDATE_COMPLETE" in outcome.description
    heat = clouds.heat["CloudTwo"]
    [(_, update)] = [c for c in heat.calls if c[0] == "update"]
    # the `big` plan sets the flavor itself
    assert update["parameters"] == {"image": "c", "name_suffix": "new", "flavor": "m1.small"}
    # a stack update replaces the stack's tags with the request's: the broker's are sent again
    # (without them, `broker repair` no longer found the stack; found against the lab's heat)
    [stack] = heat.stacks.values()
    assert stack.tags == ["osb", "osb-instance-i-4"]


def test_bind_gives_the_outputs_and_deprovision_deletes_the_stack() -> None:
    clouds = HeatClouds()
    service = _service(clouds)
    saved = Saved()
    view = instance("i-5", {"image": "c"})
    assert isinstance(drive(service, _op(service, "provision", view, saved), max_sleep=0), Done)
    bound = service.bind(_op(service, "bind", after(view, saved), Saved()))
    assert isinstance(bound, Done)
    credentials = dict((bound.result or {})["credentials"])
    stack_id = credentials.pop("stack_id")
    assert stack_id.startswith("stack-")
    assert credentials == {
        "cloud": "CloudTwo",
        "stack_name": "osb-i-5",
        "server_id": f"srv-{stack_id}",
        "password": "generated-pw",
    }  # an output heat could not resolve is left out
    deleting = service.deprovision(_op(service, "deprovision", after(view, saved), saved))
    assert isinstance(deleting, Pending) and "deleting stack osb-i-5" in deleting.description
    done = drive(service, _op(service, "deprovision", after(view, saved), saved), max_sleep=0)
    assert isinstance(done, Done) and "no stack of this instance is left" in done.description
    assert clouds.heat["CloudTwo"].kinds() == ["create", "delete"]


def test_repair_s_inventory_lists_the_broker_s_stacks_project_by_project() -> None:
    """`broker repair` finds the stacks of the projects the broker manages, asking each
    project's heat: heat's default policy denies every project's stacks at once
    (``global_tenant``) even to admins, which made the inventory a 403 on the lab's heat."""
    clouds = HeatClouds()
    service = _service(clouds)
    saved = Saved()
    view = instance("i-7", {"image": "c"})
    assert isinstance(drive(service, _op(service, "provision", view, saved), max_sleep=0), Done)
    # a stack of another project, and an untagged one of the managed project: not the broker's
    other = ProjectHeat(clouds.heat["CloudTwo"], "someone-else")
    other.post("/stacks", {"stack_name": "osb-x", "template": {}, "parameters": {}, "tags": "osb"})
    mine = ProjectHeat(clouds.heat["CloudTwo"], "project-CloudTwo")
    mine.post("/stacks", {"stack_name": "theirs", "template": {}, "parameters": {}})
    found = list(service.inventory("CloudTwo"))
    assert [(f.kind, f.id, f.instance_id, f.name) for f in found] == [
        ("stack", saved.progress["stack_id"], "i-7", "osb-i-7")
    ]
    assert list(service.inventory("CloudOne")) == []


def test_a_deprovision_before_anything_was_placed_has_nothing_to_do() -> None:
    service = _service(HeatClouds())
    outcome = service.deprovision(_op(service, "deprovision", instance("i-6", {}), Saved()))
    assert outcome == Done("nothing was built")


def test_a_bad_heat_config_is_a_config_error(tmp_path: Path) -> None:
    clouds = HeatClouds()
    with pytest.raises(
        BrokerConfigError, match=r"services\.openstack-stack\.plans: Field required"
    ):
        service_class("openstack-stack")({}, clouds)  # type: ignore[arg-type]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "heat_template_version: 2018-08-31\n"
        "parameters: {where: {type: string}}\n"
        "resources: {r: {type: OS::Heat::None}}\n"
    )
    with pytest.raises(BrokerConfigError, match="'where' is the broker's"):
        service_class("openstack-stack")(  # type: ignore[arg-type]
            {"plans": [{"name": "p", "description": "p", "template": str(bad)}]}, clouds
        )
    bad.write_text("description: no version\nresources: {}\n")
    with pytest.raises(BrokerConfigError, match="not a HOT template"):
        load_template(bad)


# --------------------------------------------------------- through the OSB API


def test_a_heat_plan_through_the_osb_api(db_url: str, tmp_path: Path) -> None:
    """The catalog shows the derived schemas; a value a constraint refuses is 400 naming the
    field (nothing written); a provision creates the stack and polls it to COMPLETE."""
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database": {"url": db_url},
                "worker": {"threads": 0, "lease_seconds": 5, "heartbeat_seconds": 1},
                "services": {
                    "openstack-stack": {
                        "type": "heat",
                        "project": "broker",  # no keystone here: the account's project
                        "poll_seconds": 0.05,
                        "plans": [
                            {
                                "name": "volume",
                                "description": "a volume",
                                "template": str(TEMPLATES / "volume.yaml"),
                            }
                        ],
                    }
                },
            }
        )
    )
    from scoperouter.broker.config import load_config

    clouds = HeatClouds()
    broker = Broker(load_config(config), secrets=Secrets([generate_key()]), clouds=clouds)  # type: ignore[arg-type]
    h = Harness(broker, tmp_path)
    try:
        [service] = h.client.get("/v2/catalog").json()["services"]
        plan = service["plans"][0]
        create = plan["schemas"]["service_instance"]["create"]["parameters"]
        assert create["properties"]["size"]["maximum"] == 100
        ids = {"service_id": service["id"], "plan_id": plan["id"]}
        before = broker.store.snapshot()
        refused = h.provision("v-1", {"size": 500}, body=ids)
        assert refused.status_code == 400
        assert refused.json()["description"] == "parameters.size: above the maximum of 100"
        assert broker.store.snapshot() == before
        assert (
            h.provision("v-1", {"size": 5, "where": {"cloud": "CloudOne"}}, body=ids).status_code
            == 202
        )
        h.drain(wait=10)
        state = h.last_operation("v-1").json()
        assert state["state"] == "succeeded", state
        assert clouds.heat["CloudOne"].calls[0][1]["parameters"] == {"size": 5}
        got = h.client.get("/v2/service_instances/v-1").json()["metadata"]["attributes"]
        assert got["stack_name"] == "osb-v-1" and got["cloud"] == "CloudOne"
    finally:
        h.client.close()
        broker.close()


def test_a_plan_s_template_path_is_relative_to_the_config(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(TEMPLATES, tmp_path / "templates")
    data = {
        "database": {"url": f"sqlite:///{tmp_path / 'broker.db'}"},
        "services": {
            "openstack-stack": {
                "type": "heat",
                "plans": [{"name": "s", "description": "s", "template": "templates/server.yaml"}],
            }
        },
    }
    config = config_from_dict(data, source=tmp_path / "broker.yaml")
    broker = Broker(config, secrets=Secrets([generate_key()]), clouds=HeatClouds())  # type: ignore[arg-type]
    try:
        assert [e.name for e in broker.offerings.values()] == ["openstack-stack"]
    finally:
        broker.close()
