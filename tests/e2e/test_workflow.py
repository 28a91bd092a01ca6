"""Issue 4 acceptance, in the lab: the scope set by the user (`openstack --os-scope`, the OSC
plugin of this package; `scope_session` on an openstacksdk Connection) follows the whole workflow
across clouds, bad tokens get nowhere, and no cloud's configuration holds another's admin secret.

The CLI is the `openstack` of the venv running the tests (it has the `--os-scope` plugin; the
lab venv's does not), with OS_CLIENT_CONFIG_FILE=<lab>/clouds.yaml. The users are the lab's demo
users (member role), not admin, except where a test needs to see every project.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.client import scope_session
from scoperouter.scope import Scope, ScopeError, join_token
from tests.ci import missing
from tests.e2e.osc import SERVER_TIMEOUT
from tests.e2e.osc import cli as _cli

pytestmark = pytest.mark.e2e


def _conn(lab, cloud: str):
    return lab.connect(cloud)


def _scoped_conn(lab, cloud: str, scope: str, region: str):
    conn = _conn(lab, cloud)
    scope_session(conn.session, scope, default_cloud=region)
    return conn


def _http(
    method: str, url: str, token: str, body: Any = None, headers: dict | None = None
) -> tuple[int, bytes]:
    """One request, no proxy, no retry: (status, body)."""
    hdrs = {"X-Auth-Token": token, "Accept": "application/json", **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _scope(**services: str) -> str:
    return json.dumps(services)


def _router_logs(lab) -> dict[str, str]:
    return {
        c.name: lab.paths.log(c, "router").read_text(errors="replace")
        if lab.paths.log(c, "router").exists()
        else ""
        for c in lab.clouds
    }


def _log_sizes(lab) -> dict[str, int]:
    return {c.name: _size(lab.paths.log(c, "router")) for c in lab.clouds}


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _new_log_lines(lab, cloud, since: int) -> list[str]:
    path = lab.paths.log(cloud, "router")
    with path.open("rb") as fh:
        fh.seek(since)
        return fh.read().decode(errors="replace").splitlines()


def _wait_gone(lab, cloud: str, scope: str | None, server_id: str) -> None:
    deadline = time.monotonic() + SERVER_TIMEOUT
    while time.monotonic() < deadline:
        ids = {s["ID"] for s in _cli(lab, cloud, "server", "list", scope=scope)}
        if server_id not in ids:
            return
        time.sleep(2)
    pytest.fail(f"server {server_id} still listed {SERVER_TIMEOUT}s after delete")


# ------------------------------------------------------ 1. image list, scope on the token


def test_cli_image_list_follows_the_scope(lab, fed):
    one, two, tiny = fed
    scoped = {i["ID"] for i in _cli(lab, one.slug, "image", "list", scope=_scope(image=two.name))}
    plain = {i["ID"] for i in _cli(lab, one.slug, "image", "list")}
    assert tiny[two.name] in scoped and tiny[one.name] not in scoped, scoped
    assert tiny[one.name] in plain and tiny[two.name] not in plain, plain
    assert not scoped & plain
    # the CloudTwo listing is CloudTwo's public images, as its own users see them
    public_two = {i["ID"] for i in _cli(lab, two.slug, "image", "list", "--public")}
    assert public_two <= scoped


def test_sdk_image_list_follows_the_scope(lab, fed):
    one, two, tiny = fed
    conn = _scoped_conn(lab, one.slug, _scope(image=two.name), one.region)
    scoped = {i.id for i in conn.image.images()}
    plain = {i.id for i in _conn(lab, one.slug).image.images()}
    assert tiny[two.name] in scoped and tiny[one.name] not in scoped, scoped
    assert tiny[one.name] in plain and tiny[two.name] not in plain, plain


# ------------------------------- 2. a server in CloudOne booted from an image of CloudTwo


def test_cli_server_in_cloudone_from_an_image_of_cloudtwo(lab, fed):
    one, two, tiny = fed
    scope = _scope(image=two.name)
    name = f"e2e-wf-{uuid.uuid4().hex[:8]}"
    since = _size(lab.paths.log(two, "router"))
    server = _cli(
        lab, one.slug, "server", "create", "--image", tiny[two.name], "--flavor", "m1.tiny",
        "--nic", "none", "--wait", name, scope=scope,
    )  # fmt: skip
    try:
        assert server["status"] == "ACTIVE", server
        assert tiny[two.name] in server["image"], server["image"]
        # the server lives in CloudOne: listed there without any scope
        listed = {s["ID"]: s for s in _cli(lab, one.slug, "server", "list")}
        assert listed[server["id"]]["Status"] == "ACTIVE"
        # nova-api of CloudOne fetched the image from CloudTwo's glance, through router2
        entries = [json.loads(line) for line in _new_log_lines(lab, two, since) if line[:1] == "{"]
        fetched = [
            entry
            for entry in entries
            if entry.get("path") == f"/v2/images/{tiny[two.name]}"
            and (entry.get("service"), entry.get("cloud")) == ("image", two.name)
        ]
        assert fetched and all(entry["status"] == 200 for entry in fetched), fetched
    finally:
        _cli(lab, one.slug, "server", "delete", "--wait", server["id"], scope=scope,
             json_out=False)  # fmt: skip
    # `--wait` returns on status DELETED, a moment before nova drops the server from its list
    _wait_gone(lab, one.slug, None, server["id"])


def test_sdk_server_in_cloudone_from_an_image_of_cloudtwo(lab, fed):
    one, two, tiny = fed
    conn = _scoped_conn(lab, one.slug, _scope(image=two.name), one.region)
    flavor = conn.compute.find_flavor("m1.tiny", ignore_missing=False)
    server = conn.compute.create_server(
        name=f"e2e-wf-{uuid.uuid4().hex[:8]}",
        image_id=tiny[two.name],
        flavor_id=flavor.id,
        networks="none",
    )
    try:
        server = conn.compute.wait_for_server(server, wait=SERVER_TIMEOUT)
        assert server.status == "ACTIVE"
        assert server.image.id == tiny[two.name]
        plain = _conn(lab, one.slug)
        assert server.id in {s.id for s in plain.compute.servers()}
    finally:
        conn.compute.delete_server(server, ignore_missing=True)
    conn.compute.wait_for_delete(server, wait=SERVER_TIMEOUT)


# ---------------------- 3. identity in CloudOne, compute in CloudTwo, as the demo user


def test_cli_compute_in_cloudtwo_with_a_cloudone_user(lab, fed):
    one, two, tiny = fed
    assert lab.cloud_entry(one.slug)["auth"]["username"] == "demo"  # member role, not admin
    scope = _scope(compute=two.name)
    name = f"e2e-wf-{uuid.uuid4().hex[:8]}"
    server = _cli(
        lab, one.slug, "server", "create", "--image", tiny[one.name], "--flavor", "m1.tiny",
        "--nic", "none", "--wait", name, scope=scope,
    )  # fmt: skip
    deleted = False
    try:
        assert server["status"] == "ACTIVE", server
        assert tiny[one.name] in server["image"], server["image"]
        scoped = {s["ID"]: s for s in _cli(lab, one.slug, "server", "list", scope=scope)}
        assert scoped[server["id"]]["Name"] == name
        assert scoped[server["id"]]["Status"] == "ACTIVE"
        plain = {s["ID"] for s in _cli(lab, one.slug, "server", "list")}
        assert server["id"] not in plain  # not a server of CloudOne
        _cli(lab, one.slug, "server", "delete", "--wait", server["id"], scope=scope,
             json_out=False)  # fmt: skip
        deleted = True
        _wait_gone(lab, one.slug, scope, server["id"])
    finally:
        if not deleted:
            _cli(lab, one.slug, "server", "delete", server["id"], scope=scope, json_out=False,
                 check=False)  # fmt: skip


def test_sdk_compute_in_cloudtwo_with_a_cloudone_user(lab, fed):
    one, two, tiny = fed
    conn = _scoped_conn(lab, one.slug, _scope(compute=two.name), one.region)
    flavor = conn.compute.find_flavor("m1.tiny", ignore_missing=False)
    server = conn.compute.create_server(
        name=f"e2e-wf-{uuid.uuid4().hex[:8]}",
        image_id=tiny[one.name],
        flavor_id=flavor.id,
        networks="none",
    )
    try:
        server = conn.compute.wait_for_server(server, wait=SERVER_TIMEOUT)
        assert server.status == "ACTIVE"
        assert server.image.id == tiny[one.name]
        assert server.id in {s.id for s in conn.compute.servers()}
        assert server.id not in {s.id for s in _conn(lab, one.slug).compute.servers()}
    finally:
        conn.compute.delete_server(server, ignore_missing=True)
    conn.compute.wait_for_delete(server, wait=SERVER_TIMEOUT)


# ---------------------------------------------------------------------- 4. bad tokens


def _forged_fernet() -> str:
    """A well-formed Fernet token made with a key no cloud of the federation has."""
    from cryptography.fernet import Fernet

    payload = secrets.token_bytes(64)  # whatever is inside, no keystone can decrypt it
    return Fernet(Fernet.generate_key()).encrypt(payload).decode().rstrip("=")


def _revoked_token(lab, cloud) -> str:
    """A token of the demo user, valid, then revoked (the stand-in for an expired one). It is
    never shown to a service before it is revoked (keystonemiddleware caches validations)."""
    token = _cli(lab, cloud.slug, "token", "issue")["id"]
    keystone = f"http://{cloud.front_ip}:5000/v3/auth/tokens"
    status, _ = _http("GET", keystone, token, headers={"X-Subject-Token": token})
    assert status == 200, f"a fresh token does not validate ({status})"
    _cli(lab, cloud.slug, "token", "revoke", token, json_out=False)
    status, _ = _http("GET", keystone, token, headers={"X-Subject-Token": token})
    # keystone refuses it either as the caller's token (401) or as the subject (404), depending
    # on which check its token cache answers first
    assert status in (401, 404), f"a revoked token still validates ({status})"
    return token


def _named(lab, name: str) -> dict[str, list[str]]:
    """The images and servers called `name` in each cloud, every project's ("image <id>",
    "server <id>"). By name, not as a before/after snapshot of every id: .ci/run's other e2e
    stream creates and deletes servers and images in the same clouds meanwhile."""
    found = {}
    for c in lab.clouds:
        conn = _conn(lab, f"{c.slug}-admin")
        found[c.name] = [f"image {i.id}" for i in conn.image.images() if i.name == name] + [
            f"server {s.id}" for s in conn.compute.servers(all_projects=True) if s.name == name
        ]
    return found


def test_bad_tokens_get_401_everywhere_and_change_nothing(lab, fed):
    one, two, tiny = fed
    bad = {
        "forged fernet": _forged_fernet(),
        "random string": secrets.token_urlsafe(32),
        "revoked": _revoked_token(lab, one),
    }
    image_url = f"http://{one.front_ip}:9292/v2/images"
    compute_url = f"http://{one.front_ip}:8774/v2.1/servers"
    scopes = {"unscoped": None, f"image+compute in {two.name}": {"image": two.name,
              "compute": two.name}}  # fmt: skip
    name = f"e2e-forged-{uuid.uuid4().hex[:6]}"
    new_image = {"name": name, "disk_format": "raw", "container_format": "bare"}
    new_server = {"server": {"name": name, "flavorRef": "1", "imageRef": tiny[one.name],
                             "networks": "none"}}  # fmt: skip
    micro = {"OpenStack-API-Version": "compute 2.37"}
    answers = {}
    for what, token in bad.items():
        for scope_name, scope in scopes.items():
            sent = join_token(token, Scope.parse(json.dumps(scope))) if scope else token
            for call, (method, url, body, headers) in {
                "image list": ("GET", image_url, None, None),
                "server list": ("GET", compute_url, None, micro),
                "image create": ("POST", image_url, new_image, None),
                "server create": ("POST", compute_url, new_server, micro),
            }.items():
                status, payload = _http(method, url, sent, body, headers)
                answers[(what, scope_name, call)] = (status, payload[:200])
    wrong = {key: value for key, value in answers.items() if value[0] != 401}
    assert not wrong, f"expected 401 for every bad token, got: {wrong}"
    # nothing was created anywhere (every create above names its image or server `name`)
    assert _named(lab, name) == {c.name: [] for c in lab.clouds}
    # and the routers never logged a token value
    for cloud, text in _router_logs(lab).items():
        leaked = [what for what, token in bad.items() if token in text]
        assert not leaked, f"{cloud}'s router log contains the {leaked} token"


def test_bad_tokens_through_keystoneauth_and_the_cli(lab, fed):
    """The same refusal through a scoped keystoneauth session (what openstacksdk uses) and the
    CLI (whose token authentication is refused by the user's keystone)."""
    from keystoneauth1 import session as ks_session
    from keystoneauth1 import token_endpoint

    one, two, _ = fed
    for token in (_forged_fernet(), secrets.token_urlsafe(32)):
        sess = ks_session.Session(auth=token_endpoint.Token(None, token))
        scope_session(sess, _scope(image=two.name, compute=two.name), default_cloud=one.region)
        for url in (f"http://{one.front_ip}:9292/v2/images",
                    f"http://{one.front_ip}:8774/v2.1/servers"):  # fmt: skip
            resp = sess.get(url, raise_exc=False)
            assert resp.status_code == 401, (url, resp.status_code, resp.text[:300])
        # --os-token=VALUE: a random token may start with "-" (token_urlsafe's alphabet), which
        # argparse would take for an option in "--os-token VALUE" (about one run in 64)
        proc = _cli(
            lab, None, "--os-auth-type", "v3token", f"--os-token={token}",
            "--os-auth-url", f"http://{one.front_ip}:5000/v3", "--os-project-name", "demo",
            "--os-project-domain-name", "Default", "--os-region-name", one.region,
            "image", "list", scope=_scope(image=two.name), check=False,
        )  # fmt: skip
        assert proc.returncode != 0
        # keystone refuses a token it cannot read (401, or 404 "Could not recognize Fernet
        # token" for a well-formed one); either way the command stops there
        assert "(HTTP 401)" in proc.stderr or "(HTTP 404)" in proc.stderr, proc.stderr[-500:]
        assert token not in proc.stderr


# ------------------------------------------------------------- 5. scopes that cannot work


def test_cli_identity_elsewhere_is_refused_before_any_request(lab, fed):
    one, two, _ = fed
    before = _log_sizes(lab)
    proc = _cli(lab, one.slug, "image", "list", scope=_scope(identity=two.name), check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "invalid --os-scope" in lines[0] and "identity" in lines[0], lines[0]
    assert one.name in lines[0] and two.name in lines[0], lines[0]
    time.sleep(0.5)
    # no request reached a router's frontend (the services' own periodic calls go through the
    # forward proxies, logged with absolute URLs)
    for cloud in lab.clouds:
        client_calls = [
            line
            for line in _new_log_lines(lab, cloud, before[cloud.name])
            if " INFO scoperouter: " in line and line.split(" ")[5].startswith("/")
        ]
        assert not client_calls, f"requests reached {cloud.name}'s router: {client_calls}"


def test_sdk_identity_elsewhere_is_refused(lab, fed):
    one, two, _ = fed
    conn = _conn(lab, one.slug)
    with pytest.raises(ScopeError, match="credentials are for"):
        scope_session(conn.session, _scope(identity=two.name), default_cloud=one.region)


def test_unknown_cloud_is_a_one_line_400_from_the_router(lab, fed):
    one, _, _ = fed
    for service, command in (("image", ("image", "list")), ("compute", ("server", "list"))):
        proc = _cli(lab, one.slug, *command, scope=json.dumps({service: "Nowhere"}), check=False)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "400" in lines[0] and "unknown cloud 'Nowhere'" in lines[0], lines[0]
    from openstack import exceptions

    conn = _scoped_conn(lab, one.slug, _scope(image="Nowhere"), one.region)
    with pytest.raises(exceptions.BadRequestException, match="unknown cloud 'Nowhere'"):
        list(conn.image.images())


# ---------------------------------------- 6. no cloud stores another cloud's admin password


def _config_files(lab) -> list[Path]:
    found = [lab.clouds_yaml, lab.paths.federation_yaml]
    found += [p for p in sorted(lab.paths.etc.rglob("*")) if p.is_file()]
    return found


def _entries_with(clouds_yaml: dict, secret: str) -> set[str]:
    return {name for name, entry in clouds_yaml.items() if secret in yaml.safe_dump(entry)}


def test_no_cloud_stores_another_clouds_admin_password(lab):
    assert len(lab.clouds) >= 2
    entries = yaml.safe_load(lab.clouds_yaml.read_text())["clouds"]
    passwords = {c.slug: entries[f"{c.slug}-admin"]["auth"]["password"] for c in lab.clouds}
    assert len(set(passwords.values())) == len(passwords), "clouds share an admin password"
    files = _config_files(lab)
    assert lab.paths.federation_yaml in files and any(lab.paths.etc in p.parents for p in files)
    for cloud in lab.clouds:
        secret = passwords[cloud.slug]
        own_etc = lab.paths.cloud_etc(cloud, "x").parent
        holders = [p for p in files if secret in p.read_text(errors="replace")]
        elsewhere = [p for p in holders if p != lab.clouds_yaml and own_etc not in p.parents]
        assert not elsewhere, f"{cloud.name}'s admin password is stored in {elsewhere}"
        # in the lab user's clouds.yaml: in that cloud's admin entry only
        assert _entries_with(entries, secret) == {f"{cloud.slug}-admin"}


def test_routers_read_only_their_own_credentials(lab):
    """Each running router's clouds.yaml/secure.yaml (its OS_CLIENT_CONFIG_FILE and
    OS_CLIENT_SECURE_FILE) hold the router users of the other clouds, no admin password."""
    if not lab.routed:
        missing("the lab runs without routers")  # under CI=true: a failure
    entries = yaml.safe_load(lab.clouds_yaml.read_text())["clouds"]
    admin = {entries[f"{c.slug}-admin"]["auth"]["password"] for c in lab.clouds}
    demo = {entries[c.slug]["auth"]["password"] for c in lab.clouds}
    table = lab.process_table()
    for cloud in lab.clouds:
        rec = table.get(f"{cloud.slug}-router")
        assert rec is not None and rec.alive(), f"{cloud.name}'s router is not running"
        raw = Path(f"/proc/{rec.pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)
        config = Path(env["OS_CLIENT_CONFIG_FILE"])
        secure = Path(env["OS_CLIENT_SECURE_FILE"])
        assert config != lab.clouds_yaml
        others = {f"{c.slug}-router" for c in lab.clouds if c != cloud}
        assert set(yaml.safe_load(config.read_text())["clouds"]) == others
        assert set(yaml.safe_load(secure.read_text())["clouds"]) == others
        text = config.read_text() + secure.read_text()
        assert "password" not in config.read_text()
        assert not [p for p in admin | demo if p in text], f"{cloud.name}'s router files"
