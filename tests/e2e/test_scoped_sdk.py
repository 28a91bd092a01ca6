"""Issue 13, in the lab: a scoped openstacksdk connection behaves like a plain one for what an
SDK user (and the broker) touches: the identity API (user and project ids, catalog),
application credentials and access rules, re-authentication, revoked tokens, connections made
from the clouds.yaml hook, placement; while its image calls go to the cloud of the scope.

These failed before scoped plugins became instances of the plugin class: openstacksdk refused
``current_user_id`` and ``service_catalog`` ("cannot fetch catalog for non-keystone auth
plugin"), so everything keyed by the user id (application credentials, access rules, the
user's projects) did too.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from keystoneauth1 import exceptions as ks_exceptions
from openstack import config as os_config
from openstack import connection

from scoperouter.client import ScopedAuth, scope_session
from scoperouter.scope import split_token

pytestmark = pytest.mark.e2e


def _scoped(lab: Any, cloud: Any, other: Any) -> Any:
    conn = lab.connect(cloud.slug)
    scope_session(conn.session, json.dumps({"image": other.name}), default_cloud=cloud.region)
    return conn


def _image_ids(conn: Any) -> set[str]:
    return {image.id for image in conn.image.images()}


def test_scoped_connection_keeps_the_identity_api(lab, fed):
    one, two, tiny = fed
    plain = lab.connect(one.slug)
    conn = _scoped(lab, one, two)
    assert isinstance(conn.session.auth, ScopedAuth)
    assert conn.current_user_id == plain.current_user_id
    assert conn.current_project_id == plain.current_project_id
    assert conn.current_project.name == "demo"
    types = {s["type"] for s in conn.service_catalog}
    assert {"identity", "image", "compute", "placement"} <= types
    assert types == {s["type"] for s in plain.service_catalog}
    projects = {p.name for p in conn.identity.user_projects(conn.current_user_id)}
    assert "demo" in projects
    # ... while image calls go to CloudTwo
    ids = _image_ids(conn)
    assert tiny[two.name] in ids and tiny[one.name] not in ids


def test_application_credentials_through_a_scoped_connection(lab, fed):
    """What a broker bind does: create an application credential with a scoped connection,
    use it (scoped too), delete it, and the credential stops working at once."""
    one, two, tiny = fed
    conn = _scoped(lab, one, two)
    user = conn.current_user_id
    name = f"e2e-sdk-{uuid.uuid4().hex[:8]}"
    rule = {"service": "image", "method": "GET", "path": "/v2/images"}
    cred = conn.identity.create_application_credential(
        user, name, roles=[{"name": "member"}], access_rules=[rule]
    )
    try:
        assert cred.secret and cred.id
        assert name in {c.name for c in conn.identity.application_credentials(user)}
        assert any(r.path == "/v2/images" for r in conn.identity.access_rules(user))
        app = connection.Connection(
            auth_type="v3applicationcredential",
            auth={
                "auth_url": f"http://{one.front_ip}:5000/v3",
                "application_credential_id": cred.id,
                "application_credential_secret": cred.secret,
            },
            region_name=one.region,
        )
        scope_session(app.session, json.dumps({"image": two.name}), default_cloud=one.region)
        assert app.current_user_id == user
        ids = _image_ids(app)
        assert tiny[two.name] in ids and tiny[one.name] not in ids
    finally:
        conn.identity.delete_application_credential(user, cred.id)
    assert name not in {c.name for c in conn.identity.application_credentials(user)}
    gone = connection.Connection(
        auth_type="v3applicationcredential",
        auth={
            "auth_url": f"http://{one.front_ip}:5000/v3",
            "application_credential_id": cred.id,
            "application_credential_secret": cred.secret,
        },
        region_name=one.region,
    )
    with pytest.raises(ks_exceptions.HttpError) as refused:
        gone.current_user_id  # noqa: B018 (authenticates)
    assert refused.value.http_status in (401, 404), refused.value


def _bare_token(conn: Any) -> str:
    """The session's token without the scope (keystoneauth derives get_token from the
    request headers, so a scoped session's token carries its scope, as requests do)."""
    token, scope = split_token(conn.session.get_token())
    assert scope is not None
    return token


def test_reauthentication_and_revoked_tokens_keep_the_scope(lab, fed):
    one, two, tiny = fed
    conn = _scoped(lab, one, two)
    first = _bare_token(conn)
    assert tiny[two.name] in _image_ids(conn)
    conn.session.invalidate()
    token = _bare_token(conn)
    assert token != first
    # The new token, revoked before any use: keystone answers 401, keystoneauth
    # re-authenticates and retries, and the next token is scoped like the first. (A token
    # already validated stays accepted from keystone's and keystonemiddleware's caches for a
    # while: OpenStack's behaviour, with or without routers.)
    admin = lab.connect(f"{one.slug}-admin")
    admin.identity.delete("/auth/tokens", headers={"X-Subject-Token": token}, raise_exc=True)
    assert conn.identity.get_user(conn.current_user_id).name == "demo"
    assert _bare_token(conn) != token
    assert tiny[two.name] in _image_ids(conn)


def test_clouds_yaml_hook_scopes_connections_and_connect_as(lab, fed, tmp_path: Path):
    """`vendor_hook: scoperouter.client:connection_hook` + `scope:` in clouds.yaml: every
    openstacksdk connection to that cloud is scoped, including those made by connect_as."""
    one, two, tiny = fed
    entry = {
        **lab.cloud_entry(f"{one.slug}-admin"),
        "scope": {"image": two.name},
        "vendor_hook": "scoperouter.client:connection_hook",
    }
    path = tmp_path / "clouds.yaml"
    path.write_text(yaml.safe_dump({"clouds": {"scoped": entry}}))
    cfg = os_config.OpenStackConfig(config_files=[str(path)], load_envvars=False)
    conn = connection.Connection(config=cfg.get_one(cloud="scoped"))
    assert isinstance(conn.session.auth, ScopedAuth)
    ids = _image_ids(conn)
    assert tiny[two.name] in ids and tiny[one.name] not in ids
    again = conn.connect_as_project(conn.current_project.name)
    assert again.session is not conn.session
    assert isinstance(again.session.auth, ScopedAuth)
    assert tiny[two.name] in _image_ids(again)


def test_placement_through_a_scoped_admin_connection(lab, fed):
    one, two, _ = fed
    admin = lab.connect(f"{one.slug}-admin")
    conn = lab.connect(f"{one.slug}-admin")
    scope_session(conn.session, json.dumps({"image": two.name}), default_cloud=one.region)
    plain = {rp.id for rp in admin.placement.resource_providers()}
    scoped = {rp.id for rp in conn.placement.resource_providers()}
    assert plain and scoped == plain  # placement not named in the scope: CloudOne's
    rp = next(iter(scoped))
    inventories = {inv.resource_class for inv in conn.placement.resource_provider_inventories(rp)}
    assert "VCPU" in inventories
