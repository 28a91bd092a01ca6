"""Real OpenStack clouds behind scoperouters: unscoped calls work as without the router, a scope
appended by hand to the token routes a request to another cloud, and everything listens on
loopback only."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from scoperouter_lab.layout import SERVICE_PORTS, service_types

pytestmark = pytest.mark.e2e

IMAGE_MB = 8


def _clouds(lab):
    return [c.slug for c in lab.clouds]


def test_lab_is_routed(lab):
    assert lab.routed, (
        "the lab runs without routers (`scoperouter serve` was not usable when it came up); "
        f"see the output of `scoperouter lab up --dir {lab.root} --require-router`"
    )


def test_clouds_yaml_points_at_the_routers(lab):
    for cloud in lab.clouds:
        entry = lab.cloud_entry(cloud.slug)
        assert entry["auth"]["auth_url"] == f"http://{cloud.front_ip}:5000/v3"
        assert entry["region_name"] == cloud.name


@pytest.mark.parametrize("index", [0, 1])
def test_token_issue(lab, index):
    cloud = lab.clouds[index].slug
    token = lab.osc(cloud, "token", "issue")
    assert token["id"] and token["project_id"] and token["user_id"]


def test_catalog_endpoints_are_router_frontends(lab):
    """Every service the lab registers (those it runs, and its stand-ins) is advertised at its
    router. (Other rows may come and go: a test or an operator adding a service, which the
    federation does not route.)"""
    for cloud in lab.clouds:
        rows = lab.osc(f"{cloud.slug}-admin", "endpoint", "list")
        types = {r["Service Type"] for r in rows}
        assert set(service_types(tuple(lab.state["services"]))) <= types
        for row in rows:
            if row["Service Type"] not in SERVICE_PORTS:
                continue  # not the lab's: e.g. a service OpenStack's own suites create
            assert row["Region"] == cloud.name
            port, path = SERVICE_PORTS[row["Service Type"]]
            assert row["URL"] == f"http://{cloud.front_ip}:{port}{path}", row


def test_flavor_list(lab):
    for cloud in _clouds(lab):
        names = [f["Name"] for f in lab.osc(cloud, "flavor", "list")]
        assert "m1.tiny" in names


def test_seeded_image_listed(lab):
    for cloud in _clouds(lab):
        images = lab.osc(cloud, "image", "list")
        assert any(i["Name"] == "tiny" and i["Status"] == "active" for i in images), images


def test_image_upload_download_checksum(lab, tmp_path: Path):
    """A multi-MB image goes up and comes back byte for byte, through the router."""
    data = os.urandom(IMAGE_MB * 2**20)
    src = tmp_path / "upload.raw"
    src.write_bytes(data)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cloud = lab.clouds[0].slug
    created = lab.osc(
        cloud, "image", "create", "--file", str(src), "--disk-format", "raw",
        "--container-format", "bare", "--private", name,
    )  # fmt: skip
    try:
        image = lab.osc(cloud, "image", "show", created["id"])
        assert image["status"] == "active"
        assert image["size"] == len(data)
        assert image["checksum"] == hashlib.md5(data).hexdigest()
        if image.get("os_hash_value"):
            assert image["os_hash_value"] == hashlib.sha512(data).hexdigest()
        out = tmp_path / "download.raw"
        lab.osc(cloud, "image", "save", "--file", str(out), created["id"], json_out=False)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        lab.osc(cloud, "image", "delete", created["id"], json_out=False)
    assert name not in [i["Name"] for i in lab.osc(cloud, "image", "list")]


def _listed_until_gone(lab, cloud: str, name: str) -> None:
    """`--wait` returns once the server's status is DELETED, which nova shows a moment before
    the server leaves its list: the list is asked until then."""
    deadline = time.monotonic() + 60
    while name in [s["Name"] for s in lab.osc(cloud, "server", "list")]:
        assert time.monotonic() < deadline, f"{name} still listed 60s after its deletion"
        time.sleep(1)


def _listed_active(lab, cloud: str, name: str) -> None:
    listed = {s["Name"]: s for s in lab.osc(cloud, "server", "list")}
    assert listed[name]["Status"] == "ACTIVE"
    assert listed[name]["Image"] == "tiny"


def test_server_create_list_delete(lab):
    """In CloudTwo, by its own user (CloudOne's: test_automatic_networking_gives_...)."""
    cloud = lab.clouds[1].slug
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    server = lab.osc(
        cloud, "server", "create", "--image", "tiny", "--flavor", "m1.tiny", "--nic", "none",
        "--wait", name, timeout=300,
    )  # fmt: skip
    try:
        assert server["status"] == "ACTIVE", server
        _listed_active(lab, cloud, name)
    finally:
        lab.osc(cloud, "server", "delete", "--wait", server["id"], json_out=False, timeout=300)
    _listed_until_gone(lab, cloud, name)


def _get(url: str, token: str, timeout: float = 60) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"X-Auth-Token": token, "Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_scope_by_hand_lists_the_other_clouds_images(lab):
    """`X-Auth-Token: <tok>!SCOPE!{"image":"CloudTwo"}` sent to CloudOne's image frontend
    answers with CloudTwo's images."""
    one, two = lab.clouds[0], lab.clouds[1]
    tiny_one, tiny_two = _tiny_id(lab, one.slug), _tiny_id(lab, two.slug)
    images_two = {i["ID"] for i in lab.osc(two.slug, "image", "list", "--public")}
    token = lab.osc(one.slug, "token", "issue")["id"]
    scoped = f'{token}!SCOPE!{{"image":"{two.name}"}}'
    status, body = _get(f"http://{one.front_ip}:9292/v2/images?visibility=public", scoped)
    assert status == 200, f"{status}: {body[:800]!r}"
    ids = {i["id"] for i in json.loads(body)["images"]}
    # CloudOne's user sees CloudTwo's public images (the seeded tiny), none of CloudOne's
    assert ids == images_two
    assert tiny_two in ids and tiny_one not in ids
    # and without the scope, the same call stays in CloudOne
    status, body = _get(f"http://{one.front_ip}:9292/v2/images?visibility=public", token)
    assert status == 200
    assert tiny_one in {i["id"] for i in json.loads(body)["images"]}


def _tiny_id(lab, cloud: str) -> str:
    found = [i["ID"] for i in lab.osc(cloud, "image", "list", "--name", "tiny")]
    assert len(found) == 1, found
    return found[0]


def test_scope_with_keystoneauth_session(lab):
    """The same with a keystoneauth session (the token in an explicit header) and openstacksdk
    for the reference listing."""
    pytest.importorskip("keystoneauth1")
    pytest.importorskip("openstack")
    from keystoneauth1 import session as ks_session
    from keystoneauth1.identity import v3

    one, two = lab.clouds[0], lab.clouds[1]
    from openstack import config as os_config
    from openstack import connection

    cfg = os_config.OpenStackConfig(config_files=[str(lab.clouds_yaml)], load_envvars=False)
    conn_two = connection.Connection(config=cfg.get_one(cloud=two.slug))
    expected = {img.id for img in conn_two.image.images(visibility="public")}
    auth = lab.cloud_entry(one.slug)["auth"]
    sess = ks_session.Session(
        auth=v3.Password(
            auth_url=auth["auth_url"], username=auth["username"], password=auth["password"],
            project_name=auth["project_name"], user_domain_name="Default",
            project_domain_name="Default",
        )
    )  # fmt: skip
    token = sess.get_token()
    resp = sess.get(
        f"http://{one.front_ip}:9292/v2/images?visibility=public",
        headers={"X-Auth-Token": f'{token}!SCOPE!{{"image": "{two.name}"}}'},
        authenticated=False,
        raise_exc=False,
    )
    assert resp.status_code == 200, resp.text[:800]
    assert {i["id"] for i in resp.json()["images"]} == expected


def test_unknown_cloud_in_scope_is_a_clear_400(lab):
    one = lab.clouds[0]
    token = lab.osc(one.slug, "token", "issue")["id"]
    status, body = _get(
        f"http://{one.front_ip}:9292/v2/images", f'{token}!SCOPE!{{"image":"Nowhere"}}'
    )
    assert status == 400, body[:500]
    assert b"Nowhere" in body


def _lab_pids(lab) -> dict[int, str]:
    from scoperouter_lab.procs import group_members

    pids: dict[int, str] = {}
    for rec in lab.process_table().all():
        if rec.alive():
            for pid in group_members(rec.pgid) or [rec.pid]:
                pids[pid] = rec.name
    return pids


def test_every_lab_process_listens_on_loopback_only(lab):
    psutil = pytest.importorskip("psutil")
    pids = _lab_pids(lab)
    assert len({n for n in pids.values()}) >= 9 * len(lab.clouds) + 1
    listening: dict[str, set[tuple[str, int]]] = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.status != psutil.CONN_LISTEN or conn.pid not in pids:
            continue
        listening.setdefault(pids[conn.pid], set()).add((conn.laddr.ip, conn.laddr.port))
    offenders = {
        name: sorted(addrs)
        for name, addrs in listening.items()
        for ip, _ in addrs
        if not (ip.startswith("127.") or ip == "::1")
    }
    assert not offenders, f"lab processes listening beyond loopback: {offenders}"
    # and the ones that must listen do, where the address plan says
    for cloud in lab.clouds:
        assert (cloud.back_ip, 5000) in listening.get(f"{cloud.slug}-keystone", set())
        assert (cloud.front_ip, 3128) in listening.get(f"{cloud.slug}-router", set())
    assert ("127.0.0.1", 5432) in listening.get("postgres", set())


def test_status_reports_healthy(lab):
    import sys

    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "scoperouter_lab", "status", "--dir", str(lab.root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "healthy" in proc.stdout
    assert time.monotonic() - t < 60


def _call(method: str, url: str, token: str, body: dict | None = None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"X-Auth-Token": token, "Accept": "application/json", **(headers or {})}
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as resp:
            payload = resp.read()
            return resp.status, json.loads(payload) if payload else None
    except urllib.error.HTTPError as err:
        return err.code, err.read()[:1000]


def test_server_in_cloudone_from_an_image_of_cloudtwo(lab):
    """The headline workflow: compute in CloudOne, image in CloudTwo, the scope on the token by
    hand. nova-api of CloudOne fetches the image from CloudTwo through the routers."""
    one, two = lab.clouds[0], lab.clouds[1]
    image = _tiny_id(lab, two.slug)
    token = lab.osc(one.slug, "token", "issue")["id"]
    scoped = f'{token}!SCOPE!{{"image":"{two.name}"}}'
    compute = f"http://{one.front_ip}:8774/v2.1"
    micro = {"OpenStack-API-Version": "compute 2.37", "X-OpenStack-Nova-API-Version": "2.37"}
    name = f"e2e-x-{uuid.uuid4().hex[:8]}"
    body = {"server": {"name": name, "imageRef": image, "flavorRef": "1", "networks": "none"}}
    status, created = _call("POST", f"{compute}/servers", scoped, body, micro)
    assert status == 202, f"{status}: {created!r}"
    server_id = created["server"]["id"]
    try:
        deadline = time.monotonic() + 120
        while True:
            status, shown = _call("GET", f"{compute}/servers/{server_id}", scoped, None, micro)
            assert status == 200, f"{status}: {shown!r}"
            state = shown["server"]["status"]
            if state in ("ACTIVE", "ERROR") or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert state == "ACTIVE", shown["server"].get("fault")
        assert shown["server"]["image"]["id"] == image
    finally:
        _call("DELETE", f"{compute}/servers/{server_id}", scoped, None, micro)


def test_no_lab_log_holds_a_secret(lab):
    """Every password and key the lab generated (its state file) is absent from every log it
    writes: setup commands, services, routers, PostgreSQL, RabbitMQ."""
    secrets: dict[str, str] = {f"shared {k}": v for k, v in lab.state["secrets"].items()}
    for cloud, own in lab.state["cloud_secrets"].items():
        secrets.update({f"{cloud} {k}": v for k, v in own.items()})
    assert len(secrets) >= 2 + 4 * len(lab.clouds)
    logs = [p for p in lab.paths.logs.rglob("*") if p.is_file()]
    assert any(p.name == "setup.log" for p in logs)
    leaks = [
        f"{path.relative_to(lab.paths.logs)}: the {what} secret"
        for path in logs
        for what, value in secrets.items()
        if value and value.encode() in path.read_bytes()
    ]
    assert not leaks, "secrets in the lab's logs:\n" + "\n".join(leaks)


def test_automatic_networking_gives_a_server_an_address(lab):
    """No --nic at all: nova finds the one shared network of the network stand-in, makes and
    binds a port, and the server shows its address (all through the router). It is also
    CloudOne's server create, list and delete by its own user (CloudTwo's:
    test_server_create_list_delete)."""
    cloud = lab.clouds[0].slug
    admin = lab.connect(f"{cloud}-admin")
    name = f"e2e-auto-{uuid.uuid4().hex[:8]}"
    server = lab.osc(
        cloud, "server", "create", "--image", "tiny", "--flavor", "m1.tiny", name, "--wait"
    )
    try:
        assert server["status"] == "ACTIVE"
        _listed_active(lab, cloud, name)
        addresses = lab.osc(cloud, "server", "show", name)["addresses"]
        assert list(addresses) == ["private"] and addresses["private"][0].startswith("10.0.0.")
        ports = list(admin.network.ports(device_id=server["id"]))
        assert [(p.status, p.binding_host_id) for p in ports] == [("ACTIVE", f"{cloud}-compute")]
    finally:
        lab.osc(cloud, "server", "delete", "--wait", name, json_out=False)
    _listed_until_gone(lab, cloud, name)
    assert list(admin.network.ports(device_id=server["id"])) == []  # went with the server


def test_placement_usages_with_consumer_types(lab):
    """GET /usages at microversion 1.38 (consumer types) answers 200: placement's query is not
    valid SQL on PostgreSQL, so the lab's placement runs on SQLite."""
    admin = lab.osc(f"{lab.clouds[0].slug}-admin", "token", "issue")
    status, body = _call(
        "GET",
        f"http://{lab.clouds[0].front_ip}:8778/usages?project_id={admin['project_id']}",
        admin["id"],
        headers={"OpenStack-API-Version": "placement 1.38"},
    )
    assert status == 200, body
    assert isinstance(body["usages"], dict)
