"""Client side: scoped keystoneauth plugins on a real Session (against a small fake keystone),
openstacksdk connections (plain API, vendor hook), env sources, the OSC plugin."""

from __future__ import annotations

import copy
import itertools
import json
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openstack
import pytest
import yaml
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
from keystoneauth1.identity import v3
from keystoneauth1.identity.base import BaseIdentityPlugin
from openstack.exceptions import ConfigException

from scoperouter.client import ScopedAuth, env_name, scope_auth, scope_from_sources, scope_session
from scoperouter.scope import ScopeError


class FakeKeystone(ThreadingHTTPServer):
    """Issues tokens tok-1, tok-2, ... with a catalog of `services`; echoes other requests'
    headers. Enough of keystone v3 for keystoneauth's password plugin and openstacksdk."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.services = ["identity", "image", "compute"]
        self.lifetime = timedelta(hours=1)
        self.counter = itertools.count(1)
        self.issued: list[str] = []

    def token_body(self) -> dict[str, Any]:
        now = datetime.now(UTC)
        domain = {"id": "default", "name": "Default"}
        return {
            "token": {
                "methods": ["password"],
                "issued_at": now.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
                "expires_at": (now + self.lifetime).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
                "user": {"id": "u1", "name": "demo", "domain": domain},
                "project": {"id": "p1", "name": "demo", "domain": domain},
                "roles": [{"id": "r1", "name": "member"}],
                "catalog": [
                    {
                        "type": st,
                        "name": st,
                        "id": st,
                        "endpoints": [
                            {
                                "id": f"{st}-public",
                                "interface": "public",
                                "region": "CloudOne",
                                "region_id": "CloudOne",
                                "url": f"{self.url}/{st}" + ("/v3" if st == "identity" else ""),
                            }
                        ],
                    }
                    for st in self.services
                ],
            }
        }


class _Handler(BaseHTTPRequestHandler):
    server: FakeKeystone

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json"}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/auth/tokens"):
            token = f"tok-{next(self.server.counter)}"
            self.server.issued.append(token)
            self._send(201, self.server.token_body(), {"X-Subject-Token": token})
        else:
            self._send(404, {}, {})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/identity/v3":  # version discovery
            link = {"rel": "self", "href": self.server.url + "/identity/v3/"}
            version = {"id": "v3.14", "status": "stable", "links": [link]}
            self._send(200, {"version": version}, {})
            return
        self._send(200, {k.lower(): v for k, v in self.headers.items()}, {})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def keystone() -> Iterator[FakeKeystone]:
    server = FakeKeystone()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def echo_url(keystone: FakeKeystone) -> str:
    return keystone.url


def password(keystone: FakeKeystone) -> v3.Password:
    return v3.Password(
        auth_url=keystone.url + "/identity/v3",
        username="demo",
        password="secret",
        project_name="demo",
        user_domain_id="default",
        project_domain_id="default",
    )


def test_scoped_auth_puts_scope_on_token_and_x_scope(echo_url: str) -> None:
    auth = scope_auth(token_endpoint.Token(echo_url, "tok"), '{"image": "CloudTwo"}')
    seen = ks_session.Session(auth=auth).get(echo_url + "/v2/images").json()
    assert seen["x-auth-token"] == 'tok!SCOPE!{"image":"CloudTwo"}'
    assert seen["x-scope"] == '{"image":"CloudTwo"}'


def test_scope_session_rescopes_and_unauthenticated_requests_stay_clean(echo_url: str) -> None:
    sess = ks_session.Session(auth=token_endpoint.Token(echo_url, "tok"))
    scope_session(sess, '{"image": "CloudTwo"}')
    scope_session(sess, '{"image": "CloudOne"}')  # replaces, does not stack
    seen = sess.get(echo_url).json()
    assert seen["x-auth-token"] == 'tok!SCOPE!{"image":"CloudOne"}'
    seen = sess.get(echo_url, authenticated=False).json()
    assert "x-auth-token" not in seen and "x-scope" not in seen
    same = sess.auth
    scope_session(sess, '{"image": "CloudOne"}')  # the same scope again: nothing changes
    assert sess.auth is same


def test_a_scoped_plugin_is_an_instance_of_the_plugin_class(keystone: FakeKeystone) -> None:
    """openstacksdk and osc-lib test plugins with isinstance (current_user_id,
    service_catalog, application credentials): a wrapper failed them."""
    plain = password(keystone)
    auth = scope_auth(plain, '{"image": "CloudTwo"}', default_cloud="CloudOne")
    assert isinstance(auth, v3.Password) and isinstance(auth, BaseIdentityPlugin)
    assert isinstance(auth, ScopedAuth) and not isinstance(plain, ScopedAuth)
    assert type(auth).__name__ == "ScopedPassword"
    assert type(scope_auth(password(keystone), "{}")) is type(auth)  # one class per plugin class
    sess = ks_session.Session(auth=auth)
    assert auth.get_user_id(sess) == "u1" and auth.get_project_id(sess) == "p1"
    seen = sess.get(keystone.url + "/image/v2/images").json()
    full = '{"compute":"CloudOne","identity":"CloudOne","image":"CloudTwo"}'
    assert seen["x-auth-token"] == f"tok-1!SCOPE!{full}"
    assert seen["x-scope"] == full
    assert plain.auth_ref is None  # the user's own plugin is not changed


def test_openstacksdk_connection_on_a_scoped_session_keeps_its_identity_api(
    keystone: FakeKeystone,
) -> None:
    sess = ks_session.Session(auth=password(keystone))
    conn = openstack.connection.Connection(session=sess, region_name="CloudOne")
    scope_session(conn.session, '{"image": "CloudTwo"}', default_cloud="CloudOne")
    assert conn.current_user_id == "u1"
    assert conn.current_project_id == "p1"
    assert {s["type"] for s in conn.service_catalog} == {"identity", "image", "compute"}
    assert conn.session.get_endpoint(service_type="image", interface="public").endswith("/image")


def test_reauthentication_recomputes_the_completed_scope(keystone: FakeKeystone) -> None:
    """A new token (invalidate, expiry) may come with another catalog: the scope follows it."""
    sess = ks_session.Session(auth=password(keystone))
    scope_session(sess, '{"image": "CloudTwo"}', default_cloud="CloudOne")
    first = sess.get(keystone.url + "/x").json()
    assert first["x-auth-token"].startswith("tok-1!SCOPE!")
    keystone.services.append("dns")
    assert sess.invalidate()
    second = sess.get(keystone.url + "/x").json()
    assert second["x-auth-token"].startswith("tok-2!SCOPE!")
    assert json.loads(second["x-scope"])["dns"] == "CloudOne"
    # Tokens about to expire are replaced by keystoneauth before each use; each new token is
    # scoped with its own catalog.
    keystone.lifetime = timedelta(seconds=30)
    keystone.services.remove("dns")
    sess.invalidate()
    tokens = [sess.get(keystone.url + "/x").json()["x-auth-token"] for _ in range(3)]
    assert [t.partition("!")[0] for t in tokens] == ["tok-3", "tok-4", "tok-5"]
    assert all('"dns"' not in t for t in tokens)


def test_scoped_plugins_copy_with_their_scope(keystone: FakeKeystone, echo_url: str) -> None:
    auth = scope_auth(password(keystone), '{"image": "CloudTwo"}', default_cloud="CloudOne")
    clone = copy.copy(auth)
    assert type(clone) is type(auth)
    assert clone.scoperouter_scope == auth.scoperouter_scope
    assert clone.scoperouter_default_cloud == "CloudOne"
    token = scope_auth(token_endpoint.Token(echo_url, "t"), '{"image": "CloudTwo"}')
    for clone in (copy.deepcopy(token), pickle.loads(pickle.dumps(token))):
        seen = ks_session.Session(auth=clone).get(echo_url).json()
        assert seen["x-auth-token"] == 't!SCOPE!{"image":"CloudTwo"}'
    plain = auth.scoperouter_unscoped()
    assert type(plain) is v3.Password and not hasattr(plain, "scoperouter_scope")


def test_scoped_auth_delegates_the_plugin_api(echo_url: str) -> None:
    inner = token_endpoint.Token(echo_url, "tok")
    auth = scope_auth(inner, '{"image": "A"}')
    sess = ks_session.Session(auth=auth)
    assert auth.get_token(sess) == "tok"
    assert auth.get_endpoint(sess) == echo_url
    assert type(auth.scoperouter_unscoped()) is token_endpoint.Token


def test_default_cloud_fills_catalog_services(echo_url: str) -> None:
    auth = scope_auth(
        token_endpoint.Token(echo_url, "t"), '{"image": "CloudTwo"}', default_cloud="CloudOne"
    )
    full = auth.scoperouter_scope_for(["compute", "image", "identity"])
    assert full.to_json() == '{"compute":"CloudOne","identity":"CloudOne","image":"CloudTwo"}'


def test_default_cloud_with_a_plugin_that_has_no_catalog(echo_url: str) -> None:
    """token_endpoint.Token has no get_access: the scope is sent as given (the first router
    completes it), rather than failing with AttributeError."""
    sess = ks_session.Session(auth=token_endpoint.Token(echo_url, "tok"))
    scope_session(sess, '{"image": "CloudTwo"}', default_cloud="CloudOne")
    seen = sess.get(echo_url).json()
    assert seen["x-auth-token"] == 'tok!SCOPE!{"image":"CloudTwo"}'


def _clouds_yaml(tmp_path: Path, keystone: FakeKeystone, **extra: Any) -> Path:
    entry = {
        "auth": {
            "auth_url": keystone.url + "/identity/v3",
            "username": "demo",
            "password": "secret",
            "project_name": "demo",
            "user_domain_id": "default",
            "project_domain_id": "default",
        },
        "region_name": "CloudOne",
        "vendor_hook": "scoperouter.client:connection_hook",
        **extra,
    }
    path = tmp_path / "clouds.yaml"
    path.write_text(yaml.safe_dump({"clouds": {"cloudone": entry}}))
    return path


@pytest.fixture
def no_scope_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_scope_env")
def test_clouds_yaml_vendor_hook_scopes_every_sdk_connection(
    keystone: FakeKeystone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _clouds_yaml(tmp_path, keystone, scope={"image": "CloudTwo"})
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(path))
    conn = openstack.connect(cloud="cloudone")
    assert isinstance(conn.session.auth, ScopedAuth)
    seen = conn.session.get(keystone.url + "/x").json()
    assert json.loads(seen["x-scope"]) == {
        "compute": "CloudOne",
        "identity": "CloudOne",
        "image": "CloudTwo",
    }
    assert conn.current_user_id == "u1"
    # Without a scope (and no $OS_SCOPE) the hook leaves the connection alone.
    _clouds_yaml(tmp_path, keystone)
    assert not isinstance(openstack.connect(cloud="cloudone").session.auth, ScopedAuth)
    monkeypatch.setenv("OS_SCOPE_IMAGE", "CloudTwo")
    assert isinstance(openstack.connect(cloud="cloudone").session.auth, ScopedAuth)


@pytest.mark.usefixtures("no_scope_env")
def test_clouds_yaml_bad_scope_stops_the_connection(
    keystone: FakeKeystone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _clouds_yaml(tmp_path, keystone, scope={"image": "CloudTwo |"})
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(path))
    with pytest.raises(ConfigException, match="invalid scope for cloud 'cloudone': scope for"):
        openstack.connect(cloud="cloudone")
    assert keystone.issued == []


def test_scope_sources_json_wins_env_fills() -> None:
    env = {"OS_SCOPE_IMAGE": "CloudThree", "OS_SCOPE_OBJECT_STORE": "A | B", "PATH": "/bin"}
    scope = scope_from_sources('{"image": "CloudTwo"}', env)
    assert scope.to_json() == '{"image":"CloudTwo","object-store":"A | B"}'
    assert env_name("object-store") == "OS_SCOPE_OBJECT_STORE"
    with pytest.raises(ScopeError, match=r"\$OS_SCOPE_IMAGE: expected a cloud name"):
        scope_from_sources(None, {"OS_SCOPE_IMAGE": "A |"})
    with pytest.raises(ScopeError, match="not valid JSON"):
        scope_from_sources("{bad", {})


def test_openstack_cli_refuses_bad_scope_before_any_request(tmp_path: object) -> None:
    """The real `openstack` CLI with the plugin: one line, non-zero, nothing sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "openstackclient.shell",
        "--os-auth-url",
        f"http://127.0.0.1:{port}/v3",
        "--os-username",
        "u",
        "--os-password",
        "p",
        "--os-project-name",
        "p",
        "--os-user-domain-id",
        "default",
        "--os-project-domain-id",
        "default",
        "--os-scope",
        '{"image": "CloudTwo |"}',
        "image",
        "list",
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    try:
        conn, _ = listener.accept()
        conn.close()
        connected = True
    except TimeoutError:
        connected = False
    finally:
        listener.close()
    assert result.returncode != 0
    err_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert err_lines == [
        "invalid --os-scope: scope for 'image': expected a cloud name but found "
        "end of expression in 'CloudTwo |'"
    ], result.stderr
    assert not connected, "the CLI contacted keystone despite the bad scope"


def test_openstack_cli_shows_the_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "openstackclient.shell", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--os-scope <scope>" in result.stdout
    # what a value may say: `&` and `|` (the help of --os-scope, up to the next option)
    option = result.stdout.split("--os-scope <scope>", 2)[2].split("\n  --", 1)[0]
    words = " ".join(option.split())
    assert '"A & B" uses every one' in words and '"A | B" the first that works' in words, words


def test_identity_elsewhere_than_the_credentials_is_refused(echo_url: str) -> None:
    plugin = token_endpoint.Token(echo_url, "t")
    with pytest.raises(ScopeError, match="credentials are for 'CloudOne'"):
        scope_auth(plugin, '{"identity": "CloudTwo"}', default_cloud="CloudOne")
    ok = scope_auth(plugin, '{"identity": "CloudOne"}', default_cloud="CloudOne")
    assert (
        ok.scoperouter_scope_for(["image"]).to_json()
        == '{"identity":"CloudOne","image":"CloudOne"}'
    )
