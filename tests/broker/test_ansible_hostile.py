"""Pack parameters are data, never templates (issue 30 finding 1): OSB requests to a real broker
(the API and its worker, real ansible-runner runs) whose every string, in parameters, context,
binding parameters, nested dicts and lists and dict keys, is a Jinja2 payload (tests/broker/
hostile.py): each reaches the playbook as its literal text, whatever the action and whether it
came from the request or back from the database (previous parameters, kept metadata and
secrets); the canary file a payload would touch never appears; no description holds an
evaluation's result or a template error.

The test pack writes back what its runs got; the example packs (broker-packs/) run against a
stub OpenStack (tests/broker/stub_openstack.py) whose image and network carry the payloads as
names: the server boots only if the literal text reached openstacksdk's lookup."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.broker.secrets import generate_key
from tests.broker import hostile
from tests.broker.ansible_harness import PackClouds, config_data, pack_broker
from tests.broker.conftest import Harness
from tests.broker.stub_openstack import StubServer
from tests.broker.test_ansible import PackHarness

ROOT = Path(__file__).resolve().parents[2]
DESCRIPTION_LIMIT = 300  # what a failed run's description may hold at most


def _context(values: list[str]) -> dict[str, Any]:
    return {
        "platform": "cloudfoundry",
        "organization_guid": "org",
        "space_guid": "space",
        "organization_name": values[0],
        "space_name": values[2],
        "instance_name": values[3],
        "instance_annotations": hostile.nested(values),
    }


def _clean(h: Harness, canary: Path, *texts: str) -> None:
    assert not canary.exists(), "a payload ran a command"
    for text in texts:
        assert hostile.evaluated(text) == [], text[:2000]


def _desc(h: Harness, iid: str, binding: str | None = None) -> str:
    return str(h.last_operation(iid, binding).json().get("description", ""))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_value_reaches_the_test_pack_as_literal_text(db_url: str, tmp_path: Path) -> None:
    h = PackHarness(db_url, tmp_path)
    try:
        canary = h.state_dir / "canary"  # where a run may write: a command would succeed
        values = hostile.templates(canary)
        iid = "hostile-1"
        params = {"content": values[0], "labels": hostile.nested(values), "password": values[3]}
        context = _context(values)
        response = h.provision(iid, params, body={"context": context})
        assert response.status_code == 202, response.text
        h.drain()
        done = h.last_operation(iid).json()
        assert done["state"] == "succeeded", done
        assert (h.state_dir / f"osb-{iid}").read_text() == values[0]
        got = json.loads((h.state_dir / f"osb-{iid}.vars").read_text())
        assert got["parameters"] == params
        assert got["context"] == {**context, **got["context"]}  # the broker may add to it
        for key, value in context.items():
            assert got["context"][key] == value, key
        # set_stats of the literal values: metadata, given back to the next run
        attributes = h.client.get(f"/v2/service_instances/{iid}").json()["metadata"]["attributes"]
        assert attributes["labels"] == params["labels"] and attributes["content"] == values[0]

        update = {"content": values[2], "labels": hostile.nested(values[::-1])}
        assert h.patch(iid, update).status_code == 202
        h.drain()
        assert h.last_operation(iid).json()["state"] == "succeeded"
        got = json.loads((h.state_dir / f"osb-{iid}.update-vars").read_text())
        assert got["parameters"] == {**params, **update}  # the broker merges them
        assert got["previous"] == params  # from the database
        assert got["instance"]["labels"] == params["labels"]  # kept metadata
        assert got["secrets"] == {"password": values[3]}  # kept encrypted, given back
        assert (h.state_dir / f"osb-{iid}").read_text() == values[2]

        binding = {"role": "writer", "labels": hostile.nested(values)}
        assert h.bind(iid, "b-1", binding).status_code == 202
        h.drain()
        assert h.last_operation(iid, "b-1").json()["state"] == "succeeded"
        got = json.loads((h.state_dir / f"osb-{iid}.osb-b-1.vars").read_text())
        assert got["binding_parameters"] == binding
        assert got["instance"]["labels"] == params["labels"]

        # a failing run whose message carries a payload, and one carrying a template that
        # does not parse: a short description, the text as text, never an evaluation or a
        # template error
        for value in (values[0], values[7], values[4]):
            assert h.patch(iid, {"content": value, "fail": True}).status_code == 202
            h.drain()
            failed = h.last_operation(iid).json()
            assert failed["state"] == "failed", failed
            text = failed["description"]
            assert text.startswith("update.yml failed in FakeCloud: task 'Refuse when asked'")
            assert len(text) <= DESCRIPTION_LIMIT, text
            assert value.split("\n")[0][:40] in text, text
            for word in ("TemplateSyntaxError", "template error", "Syntax", "unexpected"):
                assert word not in text, text
            _clean(h, canary, text)

        files = "\n".join(p.read_text() for p in h.state_dir.iterdir() if p.is_file())
        _clean(h, canary, files, _desc(h, iid), _desc(h, iid, "b-1"))
        assert h.deprovision(iid).status_code == 202
        h.drain()
        assert h.last_operation(iid).status_code == 410
        _clean(h, canary)
    finally:
        h.close()


# ------------------------------------------------------------- the example packs


class StubClouds(PackClouds):
    """FakeCloud, every service at the stub OpenStack."""

    def __init__(self, stub: StubServer, suffix: str = "") -> None:
        self.stub = stub
        self.suffix = suffix  # what a hostile catalog adds to the object-store endpoint

    def endpoints(self, cloud: str, **_: Any) -> dict[str, str]:
        return {"object-store": f"{self.stub.url}/swift/v1/AUTH_p{self.suffix}"}

    def session_entry(self, cloud: str, **_: Any) -> dict[str, Any]:
        return self.stub.cloud_entry()


def _example_pack(tmp: Path, name: str) -> Path:
    """An example pack as shipped, its playbooks untouched; its service.yml runs in the
    broker's own project of FakeCloud, with no application credential (no keystone here)."""
    pack = tmp / name
    shutil.copytree(ROOT / "broker-packs" / name, pack)
    spec = yaml.safe_load((pack / "service.yml").read_text())
    spec["project"] = "broker"
    spec["placement"] = {"parameter": False, "default": {"cloud": "FakeCloud"}}
    spec["binding"] = {"credential": False}
    (pack / "service.yml").write_text(yaml.safe_dump(spec))
    return pack


class ExampleHarness(Harness):
    def __init__(
        self, db_url: str, tmp: Path, name: str, stub: StubServer, suffix: str = ""
    ) -> None:
        data = config_data(db_url, tmp)
        data["services"] = {
            name: {
                "type": "ansible",
                "pack": str(_example_pack(tmp, name)),
                "work_dir": str(tmp / "work"),
                "synchronous_seconds": 0,
                "deadlines": {"provision": 300, "update": 300, "bind": 300},
            }
        }
        broker = pack_broker(data, generate_key())
        broker.clouds = StubClouds(stub, suffix)
        for service in broker.services.values():
            service.clouds = broker.clouds  # type: ignore[attr-defined]
        (tmp / "cloud").mkdir(exist_ok=True)
        super().__init__(broker, tmp / "cloud")
        entry = next(iter(broker.offerings.values()))
        self.ids = {"service_id": entry.id, "plan_id": entry.plans[0].id}

    def run(self, method: str, iid: str, params: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """One operation to its end: its last_operation body."""
        if method == "provision":
            answer = self.provision(iid, params, body={**self.ids, **kw})
        elif method == "update":
            answer = self.client.patch(
                f"/v2/service_instances/{iid}",
                params={"accepts_incomplete": "true"},
                json={"service_id": self.ids["service_id"], "parameters": params},
            )
        elif method == "bind":
            answer = self.bind(iid, kw["binding"], params, body=self.ids)
        elif method == "unbind":
            answer = self.unbind(iid, kw["binding"], accepts_incomplete="true", **self.ids)
        else:
            answer = self.deprovision(iid, **self.ids)
        assert answer.status_code == 202, answer.text
        self.drain()
        last = self.last_operation(iid, kw.get("binding"))
        return {"state": "gone"} if last.status_code == 410 else last.json()  # type: ignore[no-any-return]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_server_pack_takes_hostile_image_and_network_names_as_names(
    db_url: str, tmp_path: Path, stub: StubServer
) -> None:
    """openstack-server-keypair: image and network (its string parameters) are payloads; the
    stub has an image and a network named after each: the server boots, so openstacksdk
    looked the literal text up. An image the stub does not have: the description names it as
    text (the issue's `Could not find image uid=0(root)...`)."""
    h = ExampleHarness(db_url, tmp_path, "openstack-server-keypair", stub)
    canary = tmp_path / "canary"
    values = hostile.templates(canary)
    picks = [values[i] for i in (0, 2, 3, 4, 7)]
    for i, value in enumerate(picks):
        stub.images.append({"id": f"img-{i}", "name": value, "status": "active"})
        stub.networks.append({"id": f"net-{i}", "name": picks[-1 - i]})
    context = _context(values)
    # three servers: images picks[0:3], networks picks[4], picks[3], picks[2]: every pick once
    for i, value in enumerate(picks[:3]):
        iid = f"srv-{i}"
        last = h.run("provision", iid, {"image": value, "network": picks[-1 - i]}, context=context)
        assert last["state"] == "succeeded", last
        [boot] = [b for m, p, b in stub.requests if m == "POST" and p.endswith("/servers")][-1:]
        assert boot["server"]["imageRef"] == f"img-{i}", boot
        assert boot["server"]["networks"] == [{"uuid": f"net-{i}"}], boot
        _clean(h, canary, last["description"])
    last = h.run("update", "srv-0", {"ports": [22, 443]})
    assert last["state"] == "succeeded", last
    last = h.run("bind", "srv-0", {}, binding="b-0")
    assert last["state"] == "succeeded", last
    credentials = h.client.get("/v2/service_instances/srv-0/service_bindings/b-0").json()
    assert credentials["credentials"]["server_id"] == "srv-1"
    assert h.run("unbind", "srv-0", {}, binding="b-0")["state"] == "gone"
    assert h.run("deprovision", "srv-0", {})["state"] == "gone"
    # not in the cloud: the failure names the image as text, short, nothing evaluated
    # the two: a command's output, a template error (neither may come back evaluated)
    for i, value in enumerate(values[i] for i in (0, 7)):
        last = h.run("provision", f"missing-{i}", {"image": f"x{value}"})
        assert last["state"] == "failed", last
        text = last["description"]
        assert "Could not find image x" in text and len(text) <= DESCRIPTION_LIMIT, text
        assert f"x{value}"[:30].split("\n")[0] in text, text
        _clean(h, canary, text)
    seen = stub.seen()
    _clean(h, canary, seen)
    assert "uid=" not in seen and "osb-srv-0" in seen


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_object_storage_pack_takes_hostile_context_as_data(
    db_url: str, tmp_path: Path, stub: StubServer
) -> None:
    """openstack-object-storage has no string parameter (public_read is a boolean): its runs
    get the payloads in the request's context, and in the endpoint a cloud's catalog gives
    (osb_endpoints), which provision publishes as the storage URL (kept metadata) and bind
    reads back from the database; the container is made, its ACL set, bound and removed;
    nothing is evaluated."""
    canary = tmp_path / "canary"
    values = hostile.templates(canary)
    suffix = f"/{values[3]}/{values[0]}"
    h = ExampleHarness(db_url, tmp_path, "openstack-object-storage", stub, suffix)
    last = h.run("provision", "box-1", {"public_read": True}, context=_context(values))
    assert last["state"] == "succeeded", last
    assert stub.containers == {"osb-box-1"}
    assert h.run("update", "box-1", {"public_read": False})["state"] == "succeeded"
    assert h.run("bind", "box-1", {}, binding="b-1")["state"] == "succeeded"
    credentials = h.client.get("/v2/service_instances/box-1/service_bindings/b-1").json()
    assert credentials["credentials"]["container"] == "osb-box-1"
    url = f"{stub.url}/swift/v1/AUTH_p{suffix}/osb-box-1"
    assert credentials["credentials"]["storage_url"] == url
    assert h.run("unbind", "box-1", {}, binding="b-1")["state"] == "gone"
    assert h.run("deprovision", "box-1", {})["state"] == "gone"
    assert stub.containers == set()
    _clean(h, canary, stub.seen())
