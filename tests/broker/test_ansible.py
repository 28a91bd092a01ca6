"""``ansible`` services: packs (service.yml + playbooks) run by real ansible-runner on real
playbooks against localhost, with the broker's real database (SQLite and PostgreSQL).

The test pack (tests/broker/packs/test-files) builds files in a folder, named after the
instance and binding as a real pack names what it builds in a cloud, and journals every create
and delete: the lifecycle through the OSB API, a SIGKILLed worker's re-run converging, a DELETE
that stops a running provision and removes what it built, and secrets kept out of logs and
descriptions. The pure parts (pack loading, catalog, the scrubber) are tested without Ansible."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.broker.config import BrokerConfigError
from scoperouter.broker.secrets import generate_key
from scoperouter.broker.services.ansible.pack import load_pack
from scoperouter.broker.services.ansible.playbook import (
    HIDDEN,
    Playbooks,
    RunSpec,
    Scrubber,
    marker,
    reap,
)
from scoperouter.broker.services.ansible.sandbox import run_env
from scoperouter.broker.worker import Worker
from tests.broker.ansible_harness import (
    NAME,
    TOKEN,
    WorkerProcess,
    config_data,
    make_pack,
    pack_broker,
)
from tests.broker.conftest import Harness

# A run's processes are found (and a new run's leftovers reaped) by the instance's marker, on
# the whole host: a test process of its own (pytest-xdist's workers run the [sqlite] and
# [postgresql] cases at once) must not share the id, or one reaps the other's playbook.
INSTANCE = f"ans-{uuid.uuid4().hex[:12]}"
PASSWORD = "pw-Very-Secret-42"


class PackHarness(Harness):
    """The conftest harness, speaking to the test pack's offering."""

    def __init__(
        self, db_url: str, tmp: Path, *, lease: float = 5.0, plan_vars: dict[str, Any] | None = None
    ) -> None:
        make_pack(tmp, plan_vars)
        self.key = generate_key()
        self.data = config_data(db_url, tmp, lease=lease)
        super().__init__(pack_broker(self.data, self.key), tmp / "cloud")
        entry = self.broker.offerings[next(iter(self.broker.offerings))]
        self.ids = {"service_id": entry.id, "plan_id": entry.plans[0].id}

    def provision(
        self, instance_id: str, parameters: dict[str, Any] | None = None, **kw: Any
    ) -> Any:
        return super().provision(
            instance_id, parameters, body={**self.ids, **kw.pop("body", {})}, **kw
        )

    def deprovision(self, instance_id: str, **params: Any) -> Any:
        return super().deprovision(instance_id, **{**self.ids, **params})

    def bind(
        self, instance_id: str, binding_id: str, parameters: dict[str, Any] | None = None, **kw: Any
    ) -> Any:
        return super().bind(
            instance_id, binding_id, parameters, body={**self.ids, **kw.pop("body", {})}, **kw
        )

    def unbind(self, instance_id: str, binding_id: str, **params: Any) -> Any:
        return super().unbind(instance_id, binding_id, **{**self.ids, **params})

    def patch(self, instance_id: str, parameters: dict[str, Any]) -> Any:
        return self.client.patch(
            f"/v2/service_instances/{instance_id}",
            params={"accepts_incomplete": "true"},
            json={"service_id": self.ids["service_id"], "parameters": parameters},
        )

    def journal(self) -> list[str]:
        path = self.state_dir / "journal"
        return path.read_text().split("\n")[:-1] if path.exists() else []

    def state(self, instance_id: str, binding_id: str | None = None) -> dict[str, Any]:
        return self.last_operation(instance_id, binding_id).json()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.client.close()
        self.broker.close()


@pytest.fixture
def pack(db_url: str, tmp_path: Path) -> Iterator[PackHarness]:
    h = PackHarness(db_url, tmp_path)
    yield h
    h.close()


def _until(
    predicate: Callable[[], Any], timeout: float, what: str, log: Path | None = None
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    tail = f"; its log:\n{log.read_text()[-3000:]}" if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}{tail}")


def _leftovers(instance_id: str) -> int:
    """Processes of this instance's runs still alive (killed if any)."""
    return reap(marker(instance_id))


# ------------------------------------------------------------------ real playbooks


# Each database runs real playbooks here (PostgreSQL: this lifecycle and the DELETE during a
# provision; SQLite: the failed run and the SIGKILLed worker): eleven runs in all, about three
# seconds each, rather than every test on both databases.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_pack_s_lifecycle_through_the_osb_api(pack: PackHarness) -> None:
    """provision -> GET (set_stats as metadata) -> update -> bind (set_stats as credentials)
    -> unbind -> deprovision, each a real playbook run; 4xx changes nothing."""
    h = pack
    [service] = h.client.get("/v2/catalog").json()["services"]
    assert service["name"] == NAME and service["bindable"] is True
    schemas = service["plans"][0]["schemas"]
    assert schemas["service_instance"]["update"]["parameters"]["properties"].keys() == {
        "content",
        "labels",
        "fail",
    }
    assert "where" not in schemas["service_instance"]["create"]["parameters"]["properties"]

    response = h.provision(INSTANCE, {"content": "hello", "password": PASSWORD})
    assert response.status_code == 202, response.text
    h.drain()
    done = h.state(INSTANCE)
    assert done["state"] == "succeeded", done
    assert done["description"].startswith("provision.yml succeeded in FakeCloud:")
    instance_file = h.state_dir / f"osb-{INSTANCE}"
    assert instance_file.read_text() == "hello"
    got = h.client.get(f"/v2/service_instances/{INSTANCE}").json()
    assert got["metadata"]["attributes"] == {
        "cloud": "FakeCloud",
        "project_id": "fake-project",
        "scope": None,
        "path": str(instance_file),
        "content_length": 5,
        "plan_label": "small",
    }
    # osb_secrets: kept encrypted for later runs, never in metadata
    with h.broker.store.read() as session:
        row = h.broker.store.instance(session, INSTANCE)
        assert row is not None and row.secrets is not None and PASSWORD not in row.secrets
        assert h.broker.secrets.decrypt(row.secrets) == {"password": PASSWORD}

    before = h.broker.store.snapshot()
    refused = h.patch(INSTANCE, {"bogus": 1})
    assert refused.status_code == 400, refused.text
    assert refused.json()["description"] == "parameters.bogus: not a parameter of this plan"
    assert h.broker.store.snapshot() == before

    assert h.patch(INSTANCE, {"content": "hello, world"}).status_code == 202
    h.drain()
    assert h.state(INSTANCE)["state"] == "succeeded"
    assert instance_file.read_text() == "hello, world"
    got = h.client.get(f"/v2/service_instances/{INSTANCE}").json()
    assert got["metadata"]["attributes"]["content_length"] == 12

    assert h.bind(INSTANCE, "b-1", {"role": "writer"}).status_code == 202
    h.drain()
    assert h.state(INSTANCE, "b-1")["state"] == "succeeded", h.state(INSTANCE, "b-1")
    binding = h.client.get(f"/v2/service_instances/{INSTANCE}/service_bindings/b-1").json()
    binding_file = h.state_dir / f"osb-{INSTANCE}.osb-b-1"
    assert binding["credentials"] == {
        "username": "b-1",
        "token": binding_file.read_text(),
        "role": "writer",
        "path": str(instance_file),
    }

    assert h.unbind(INSTANCE, "b-1", accepts_incomplete="true").status_code == 202
    h.drain()
    assert h.last_operation(INSTANCE, "b-1").status_code == 410
    assert not binding_file.exists()

    assert h.deprovision(INSTANCE).status_code == 202
    h.drain()
    assert h.last_operation(INSTANCE).status_code == 410
    assert not list(h.state_dir.glob(f"osb-{INSTANCE}*"))
    assert h.journal() == [f"create {INSTANCE}", f"delete {INSTANCE}"]
    with h.broker.store.read() as session:
        row = h.broker.store.instance(session, INSTANCE)
        assert row is not None and row.secrets is None  # forgotten with the instance
    assert not any((h.state_dir.parent / "work").iterdir())  # no run directory left


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_failed_run_says_which_task_and_why_and_never_a_secret(
    pack: PackHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that fails with the password and the run's token in its message: the
    description names the task and the message, with both hidden; nothing the broker logs
    holds them, whatever the playbook printed (the password also went through a no_log task
    and a debug task)."""
    caplog.set_level(logging.DEBUG)
    response = pack.provision(INSTANCE, {"password": PASSWORD, "fail": True})
    assert response.status_code == 202
    pack.drain()
    failed = pack.state(INSTANCE)
    assert failed["state"] == "failed"
    assert failed["description"] == (
        "provision.yml failed in FakeCloud: task 'Fail with the password and the token in "
        f"the message' failed: refused {HIDDEN} with token {HIDDEN}"
    )
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Say the password loudly" in logged  # the run was logged, task by task
    for secret in (PASSWORD, TOKEN):
        assert secret not in logged
        assert secret not in json.dumps(failed)
    # the platform's orphan mitigation: DELETE removes what the failed provision built
    assert pack.deprovision(INSTANCE).status_code == 202
    pack.drain()
    assert pack.last_operation(INSTANCE).status_code == 410
    assert pack.journal() == [f"create {INSTANCE}", f"delete {INSTANCE}"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_delete_during_provisioning_stops_the_playbook_and_removes_what_it_built(
    pack: PackHarness,
) -> None:
    worker = Worker(pack.broker)
    worker.start(2)
    try:
        response = pack.provision(INSTANCE, {"sleep": 120})
        assert response.status_code == 202
        provision_op = response.json()["operation"]
        # the description follows the playbook, task by task
        sleeping = "provision: running provision.yml in FakeCloud: Sleep"
        _until(lambda: pack.state(INSTANCE).get("description") == sleeping, 90, "the sleep")
        assert (pack.state_dir / f"osb-{INSTANCE}.slept").exists()
        assert pack.deprovision(INSTANCE).status_code == 202
        _until(lambda: pack.last_operation(INSTANCE).status_code == 410, 60, "the deprovision")
    finally:
        worker.stop()
    stopped = pack.last_operation(INSTANCE, operation=provision_op).json()
    assert stopped["state"] == "failed"
    assert stopped["description"].startswith("stopped: a delete request arrived")
    assert not list(pack.state_dir.glob(f"osb-{INSTANCE}*"))
    assert pack.journal() == [f"create {INSTANCE}", f"delete {INSTANCE}"]
    assert _leftovers(INSTANCE) == 0  # the sleeping module went with its playbook


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_worker_killed_mid_playbook_is_re_run_and_converges(db_url: str, tmp_path: Path) -> None:
    """SIGKILL of the process running the provision's playbook: the playbook dies with it
    (PR_SET_PDEATHSIG), what its module left is killed before the re-run, and the next worker
    runs the playbook again once the lease expired: it finds the file the dead run made (one
    create in the journal) and the operation succeeds."""
    h = PackHarness(db_url, tmp_path, lease=3.0)
    try:
        response = h.provision(INSTANCE, {"sleep": 120, "content": "once"})
        assert response.status_code == 202
        worker = WorkerProcess(h.data, h.key, tmp_path / "worker.log")
        try:
            sleeping = "provision: running provision.yml in FakeCloud: Sleep"
            _until(
                lambda: h.state(INSTANCE).get("description") == sleeping,
                120,
                "the provision playbook to sleep",
                tmp_path / "worker.log",
            )
            [playbook] = [pid for pid, parent in _processes(INSTANCE) if parent == worker.proc.pid]
        finally:
            worker.kill()
        _until(
            lambda: playbook not in {pid for pid, _ in _processes(INSTANCE)},
            30,
            "ansible-playbook to die with its broker",
        )
        # the dead worker's lease expires; then this process claims the operation and runs
        # its pass again: the re-run of the playbook
        _until(lambda: h.worker.run_one("re-run"), 30, "the lease to expire")
        done = h.state(INSTANCE)
        assert done["state"] == "succeeded", (done, (tmp_path / "worker.log").read_text()[-2000:])
        assert h.journal() == [f"create {INSTANCE}"]  # built once
        assert (h.state_dir / f"osb-{INSTANCE}").read_text() == "once"
        assert _processes(INSTANCE) == set()  # the dead run's module was killed
    finally:
        h.close()


def _processes(instance_id: str) -> set[tuple[int, int]]:
    """(pid, parent pid) of the live processes of an instance's runs (by their marker)."""
    needle = f"SCOPEROUTER_BROKER_RUN={marker(instance_id)}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                found.add((int(entry.name), int(stat.rsplit(")", 1)[1].split()[1])))
        except (OSError, ValueError, IndexError):
            continue
    return found


# --------------------------------------------------------------------- pure parts


def test_the_scrubber_hides_known_values_keyed_secrets_and_private_keys() -> None:
    scrub = Scrubber(["s3cr3t-value", {"nested": ["tok-123456"]}, "abc", None, 12345678])
    assert scrub("x s3cr3t-value y tok-123456 abc 12345678") == (
        f"x {HIDDEN} y {HIDDEN} abc {HIDDEN}"  # short values are left alone
    )
    assert scrub('{"password": "hunter22", "user": "bob"}') == (
        f'{{"password": "{HIDDEN}", "user": "bob"}}'
    )
    assert scrub("application_credential_secret=abcdefgh rest") == (
        f"application_credential_secret={HIDDEN} rest"
    )
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----"
    assert scrub(f"key: {pem} done") == f"key: {HIDDEN} done"


def _pack_dir(tmp_path: Path, spec: dict[str, Any], playbooks: tuple[str, ...]) -> Path:
    directory = tmp_path / "p"
    directory.mkdir(parents=True)
    (directory / "service.yml").write_text(yaml.safe_dump(spec))
    for name in playbooks:
        (directory / name).write_text("- hosts: localhost\n  tasks: []\n")
    return directory


BASE = {"name": "p", "description": "d", "plans": [{"name": "s", "description": "s"}]}
ALL = ("provision.yml", "deprovision.yml", "bind.yml", "unbind.yml")


@pytest.mark.parametrize(
    ("spec", "playbooks", "message"),
    [
        (BASE, ("provision.yml", "deprovision.yml"), "playbooks.bind: no file bind.yml"),
        ({**BASE, "bindable": False}, ("provision.yml",), "playbooks.deprovision: no file"),
        ({**BASE, "playbooks": {"update": "u.yml"}}, ALL, "playbooks.update: this pack has no"),
        ({**BASE, "playbooks": {"provision": "../x.yml"}}, ALL, "outside the pack"),
        ({**BASE, "name": "Bad Name"}, ALL, "name: String should match pattern"),
        ({**BASE, "plans": []}, ALL, "plans: Tuple should have at least 1 item"),
        ({**BASE, "colour": "red"}, ALL, "colour: Extra inputs are not permitted"),
    ],
)
def test_a_bad_pack_is_a_config_error_naming_the_file_and_key(
    tmp_path: Path, spec: dict[str, Any], playbooks: tuple[str, ...], message: str
) -> None:
    directory = _pack_dir(tmp_path, spec, playbooks)
    with pytest.raises(BrokerConfigError, match=str(directory / "service.yml")) as caught:
        load_pack(directory)
    assert message in str(caught.value)


def test_a_pack_s_catalog_places_with_where_and_says_what_is_updatable(tmp_path: Path) -> None:
    spec = {
        **BASE,
        "bindable": False,
        "placement": {"default": {"strategy": "most-free"}, "demand": {"VCPU": 1}},
        "parameters": {
            "provision": {"properties": {"key": {"type": "string", "writeOnly": True}}},
        },
        "secret_parameters": ["other"],
    }
    pack = load_pack(_pack_dir(tmp_path, spec, ("provision.yml", "deprovision.yml")))
    entry = pack.catalog(("CloudOne", "CloudTwo"))
    assert entry.plan_updateable is False and entry.bindable is False
    schemas = entry.plans[0].schemas
    assert schemas.instance_update is None and schemas.binding_create is None
    create = schemas.instance_create
    assert create is not None and create["additionalProperties"] is False
    assert create["properties"]["where"]["properties"]["cloud"]["enum"] == ["CloudOne", "CloudTwo"]
    assert pack.secret_names() == {"key", "other"}
    elsewhere = {**spec, "placement": {"default": {"cloud": "X"}}}
    other = load_pack(_pack_dir(tmp_path / "b", elsewhere, ("provision.yml", "deprovision.yml")))
    with pytest.raises(BrokerConfigError, match=r"placement\.default: where\.cloud: 'X'"):
        other.check_clouds(("CloudOne",))


# ------------------------------------------- placement and what a run gets (no Ansible)


class _Recorder:
    """Stands in for Playbooks: records each run, answers successful with `stats`."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats
        self.runs: list[Any] = []

    def run(self, spec: Any) -> Any:
        from scoperouter.broker.services.ansible.playbook import RunResult

        self.runs.append(spec)
        return RunResult(status="successful", rc=0, stats=dict(self.stats), tasks=3, changed=2)


def _server_pack_service(tmp_path: Path, clouds: Any) -> Any:
    from scoperouter.broker.services.ansible.service import service_class

    pack = Path(__file__).resolve().parents[2] / "broker-packs" / "openstack-server-keypair"
    cls = service_class("openstack-server-keypair")
    return cls({"pack": str(pack), "work_dir": str(tmp_path / "work")}, clouds)


class _PackFederation:
    """test_server's two fake clouds, plus what a pack's run asks of them."""

    def __init__(self, **overrides: dict[str, Any]) -> None:
        from tests.broker.test_server import federation

        self.inner = federation(**overrides)
        self.entries: list[tuple[str, str | None, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def session_entry(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> dict[str, Any]:
        self.entries.append((cloud, project_id, scope))
        return {"auth_type": "v3token", "auth": {"token": f"token-of-{cloud}"}}

    def endpoints(self, cloud: str, **_: Any) -> dict[str, str]:
        return {"compute": f"http://{cloud}:8774/v2.1"}


def test_a_pack_is_placed_once_and_each_run_gets_its_cloud_project_and_scope(
    tmp_path: Path,
) -> None:
    from tests.broker.passes import MemoryOperation, Saved, after, instance
    from tests.broker.test_server import FakeIdentity

    clouds = _PackFederation(CloudOne={"free": 0.2}, CloudTwo={"free": 0.9})
    service = _server_pack_service(tmp_path, clouds)
    recorder = _Recorder(
        {"server_id": "srv-1", "cloud": "ignored", "osb_secrets": {"private_key": "K" * 40}}
    )
    service.playbooks = recorder
    plan = service.catalog().plans[0]
    saved = Saved()
    view = instance("i-1", {"image": "cirros"})
    op = MemoryOperation("provision", view, plan, clouds, saved, identity=FakeIdentity())  # type: ignore[arg-type]
    outcome = service.provision(op)
    assert outcome.description == "provision.yml succeeded in CloudTwo: 3 task(s), 2 changed"
    [spec] = recorder.runs
    assert clouds.entries == [("CloudTwo", "project-CloudTwo", None)]  # the freer cloud
    variables = spec.extravars
    assert variables["osb_cloud"] == "CloudTwo" and variables["flavor"] == "m1.tiny"
    assert variables["osb_name"] == "osb-i-1"
    assert variables["osb_tags"] == ["osb", "osb-instance-i-1"]
    assert variables["osb_parameters"] == {"image": "cirros"}
    assert variables["osb_endpoints"] == {"compute": "http://CloudTwo:8774/v2.1"}
    assert spec.clouds_yaml == {
        "clouds": {"osb": {"auth_type": "v3token", "auth": {"token": "token-of-CloudTwo"}}}
    }
    assert spec.scrub("token-of-CloudTwo") == HIDDEN
    # set_stats: metadata, except the broker's keys; osb_secrets kept apart
    assert saved.resources == {
        "cloud": "CloudTwo",
        "project_id": "project-CloudTwo",
        "scope": None,
        "server_id": "srv-1",
    }
    assert saved.secrets == {"private_key": "K" * 40}
    # a re-run (the pass repeated after a crash) keeps the cloud chosen first
    clouds.inner.clouds["CloudOne"].free = 1.0
    service.provision(
        MemoryOperation("provision", view, plan, clouds, saved, identity=FakeIdentity())
    )  # type: ignore[arg-type]
    assert [e[0] for e in clouds.entries] == ["CloudTwo", "CloudTwo"]
    # later operations run where the instance is, with its kept secrets scrubbed
    update = MemoryOperation(
        "update", after(view, saved), plan, clouds, saved, identity=FakeIdentity()
    )  # type: ignore[arg-type]
    service.update(update)
    assert recorder.runs[-1].playbook == "update.yml"
    assert recorder.runs[-1].scrub("K" * 40) == HIDDEN


def test_a_scope_enters_at_its_compute_cloud_and_every_run_carries_it(tmp_path: Path) -> None:
    from tests.broker.passes import MemoryOperation, Saved, instance
    from tests.broker.test_server import FakeIdentity

    clouds = _PackFederation()
    service = _server_pack_service(tmp_path, clouds)
    service.playbooks = recorder = _Recorder({})
    where = {"scope": {"compute": "CloudOne", "image": "CloudTwo"}}
    view = instance("i-2", {"image": "CloudTwo-img", "where": where})
    saved = Saved()
    op = MemoryOperation(
        "provision", view, service.catalog().plans[0], clouds, saved, identity=FakeIdentity()
    )  # type: ignore[arg-type]
    outcome = service.provision(op)
    assert "in CloudOne (scope " in outcome.description
    [(cloud, project, scope)] = clouds.entries
    assert (cloud, project) == ("CloudOne", "project-CloudOne")
    assert json.loads(scope or "") == {"compute": "CloudOne", "image": "CloudTwo"}
    assert recorder.runs[0].extravars["osb_scope"] == {"compute": "CloudOne", "image": "CloudTwo"}
    assert saved.resources["scope"] == scope


class _StubSwift(BaseHTTPRequestHandler):
    """An object-store API with one account and one container: what
    ``openstack.cloud.object_containers_info`` reads."""

    def do_GET(self) -> None:
        if self.path.split("?")[0].rstrip("/") == "/v1/AUTH_test":
            body = json.dumps([{"name": "osb-stub", "count": 0, "bytes": 0}]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json; charset=utf-8")
        else:
            body = b"not here"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_openstack_cloud_modules_run_with_the_broker_s_openstacksdk(tmp_path: Path) -> None:
    """A real run of an ``openstack.cloud`` module (ansible 12.3.0's collection, 2.5.0) with
    the broker's openstacksdk, against a stub swift: the collection reads
    ``openstack.version.__version__``, which openstacksdk 4.15 removed, and every module of it
    failed with "module 'openstack' has no attribute 'version'" until the broker's runs gave it
    back (found by the first run of an example pack against the lab)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubSwift)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    project = tmp_path / "project"
    project.mkdir()
    (project / "list.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "List the containers",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Read them",
                            "openstack.cloud.object_containers_info": {},
                            "register": "found",
                        },
                        {
                            "name": "Publish them",
                            "ansible.builtin.set_stats": {
                                "data": {"names": "{{ found.containers | map(attribute='name') }}"}
                            },
                        },
                    ],
                }
            ]
        )
    )
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/AUTH_test"
    entry = {"auth_type": "none", "object_store_endpoint_override": url}
    try:
        result = Playbooks(tmp_path / "work").run(
            RunSpec(
                run_id="sdk-1",
                marker=marker("sdk-1"),
                project_dir=project,
                playbook="list.yml",
                extravars={},
                clouds_yaml={"clouds": {"osb": entry}},
                timeout=120,
                scrub=Scrubber(),
            )
        )
    finally:
        server.shutdown()
    assert result.ok, result.failure
    assert result.stats == {"names": ["osb-stub"]}


RUN_ENV_SEEN = ("PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "OS_PASSWORD", "LC_ALL", "HTTPS_PROXY")


def test_a_run_sees_only_the_allowlisted_environment_of_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run reads its environment (lookup('env') on the controller): the broker's
    secrets of any name (a PostgreSQL password, a cloud provider key, an OS_PASSWORD) stay
    out; the locale and the proxy, on the allowlist, get in; so does the service's `env`."""
    monkeypatch.setenv("PGPASSWORD", "pg-s3cret-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-s3cret-value")
    monkeypatch.setenv("OS_PASSWORD", "os-s3cret-value")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    project = tmp_path / "project"
    project.mkdir()
    names = (*RUN_ENV_SEEN, "PACK_SETTING")
    seen = {name: "{{ lookup('env', '" + name + "') }}" for name in names}
    (project / "env.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "What the run sees",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [{"name": "Publish", "ansible.builtin.set_stats": {"data": seen}}],
                }
            ]
        )
    )
    result = Playbooks(tmp_path / "work", env={"PACK_SETTING": "configured"}).run(
        RunSpec(
            run_id="env-1",
            marker=marker("env-1"),
            project_dir=project,
            playbook="env.yml",
            extravars={},
            clouds_yaml={"clouds": {"osb": {"auth_type": "none"}}},
            timeout=120,
            scrub=Scrubber(),
        )
    )
    assert result.ok, result.failure
    assert result.stats == {
        "PGPASSWORD": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "OS_PASSWORD": "",
        "LC_ALL": "C.UTF-8",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "PACK_SETTING": "configured",
    }


def test_a_service_s_env_is_checked_when_the_broker_starts() -> None:
    """services.<name>.env: names as the shell has them, values strings or numbers, and none of
    the broker's own (OS_*, SCOPEROUTER_BROKER_*); an error names where."""
    assert run_env(None, "services.p.env") == {}
    assert run_env({"PACK_MODE": "fast", "RETRIES": 3}, "services.p.env") == {
        "PACK_MODE": "fast",
        "RETRIES": "3",
    }
    for bad, says in (
        (["A=1"], "a mapping"),
        ({"1BAD": "x"}, "'1BAD' is not a variable name"),
        ({"A;rm -rf /": "x"}, "is not a variable name"),
        ({"OS_PASSWORD": "x"}, "services.p.env.OS_PASSWORD"),
        ({"SCOPEROUTER_BROKER_PASSWORD": "x"}, "are the broker's"),
        ({"A": ["x"]}, "services.p.env.A: a string or a number"),
        ({"A": True}, "a string or a number"),
    ):
        with pytest.raises(BrokerConfigError, match=re.escape(says)):
            run_env(bad, "services.p.env")


def test_ansible_runner_is_imported_by_one_thread_at_a_time() -> None:
    """The broker's worker threads start their first runs together: ansible-runner is imported
    under a lock (two threads importing its modules at once saw one partially initialised, and
    every later run of the process failed). In a fresh interpreter: a thread asking for the
    classes while the lock is held waits, imports nothing, then gets them."""
    import subprocess
    import sys

    script = """
import sys, threading, time
from scoperouter.broker.services.ansible import playbook
assert "ansible_runner.runner" not in sys.modules
got = []
with playbook._RUNNER_IMPORT:
    thread = threading.Thread(target=lambda: got.append(playbook.import_runner()))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and "ansible_runner.runner" not in sys.modules, "not serialised"
thread.join(30)
assert got == [None] and "ansible_runner.config.runner" in sys.modules, got
from ansible_runner.runner import Runner
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
