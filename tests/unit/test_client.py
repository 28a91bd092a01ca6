"""Client side: ScopedAuth on a real keystoneauth Session, env sources, the OSC plugin."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint

from scoperouter.client import ScopedAuth, env_name, scope_from_sources, scope_session
from scoperouter.scope import Scope, ScopeError


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scoped_auth_puts_scope_on_token_and_x_scope(echo_url: str) -> None:
    auth = ScopedAuth(token_endpoint.Token(echo_url, "tok"), Scope.parse('{"image": "CloudTwo"}'))
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


def test_scoped_auth_delegates_the_plugin_api(echo_url: str) -> None:
    inner = token_endpoint.Token(echo_url, "tok")
    auth = ScopedAuth(inner, Scope.parse('{"image": "A"}'))
    sess = ks_session.Session(auth=auth)
    assert auth.get_token(sess) == "tok"
    assert auth.get_endpoint(sess) == echo_url
    assert auth.wrapped is inner


def test_default_cloud_fills_catalog_services() -> None:
    auth = ScopedAuth(object(), Scope.parse('{"image": "CloudTwo"}'), default_cloud="CloudOne")
    full = auth.scope_for(["compute", "image", "identity"])
    assert full.to_json() == '{"compute":"CloudOne","identity":"CloudOne","image":"CloudTwo"}'


def test_default_cloud_with_a_plugin_that_has_no_catalog(echo_url: str) -> None:
    """token_endpoint.Token has no get_access: the scope is sent as given (the first router
    completes it), rather than failing with AttributeError."""
    sess = ks_session.Session(auth=token_endpoint.Token(echo_url, "tok"))
    scope_session(sess, '{"image": "CloudTwo"}', default_cloud="CloudOne")
    seen = sess.get(echo_url).json()
    assert seen["x-auth-token"] == 'tok!SCOPE!{"image":"CloudTwo"}'


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


def test_identity_elsewhere_than_the_credentials_is_refused() -> None:
    with pytest.raises(ScopeError, match="credentials are for 'CloudOne'"):
        ScopedAuth(object(), Scope.parse('{"identity": "CloudTwo"}'), default_cloud="CloudOne")
    ok = ScopedAuth(object(), Scope.parse('{"identity": "CloudOne"}'), default_cloud="CloudOne")
    assert ok.scope_for(["image"]).to_json() == '{"identity":"CloudOne","image":"CloudOne"}'
