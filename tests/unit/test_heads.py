"""What a client may send in a request head: paths a backend could resolve elsewhere, and the
identity fields only keystonemiddleware sets (scoperouter/http/heads.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter.http import heads


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        (b"/network/../placement/x", heads.DOT_SEGMENT_MESSAGE),
        (b"/network/%2E%2e/placement/x", heads.DOT_SEGMENT_MESSAGE),
        (b"/a/./b", heads.DOT_SEGMENT_MESSAGE),
        (b"/a/b/..", heads.DOT_SEGMENT_MESSAGE),
        (b"/a/%2e?x", heads.DOT_SEGMENT_MESSAGE),
        (b"/..", heads.DOT_SEGMENT_MESSAGE),
        (b"/a%2Fb", heads.ENCODED_SLASH_MESSAGE),
        (b"/a%2f..", heads.ENCODED_SLASH_MESSAGE),
        (b"/a\\b", heads.BACKSLASH_MESSAGE),
        (b"/v2.1/servers/detail", None),
        (b"/v1/AUTH_x/c/.hidden/a..b/...", None),
        (b"/v1/AUTH_x/c/a%5Cb%20c", None),
        (b"/v1/AUTH_x/c/a%252Fb", None),
        (b"/v2/images?name=/../x%2F\\", None),
        (b"/a/..?x=1", heads.DOT_SEGMENT_MESSAGE),
        (b"/a?/..", None),
        (b"/", None),
    ],
)
def test_check_path(target: bytes, refused: str | None) -> None:
    assert heads.check_path(target) == refused


def _resolved(path: str) -> str:
    """What a backend that decodes %2E and removes dot-segments (RFC 3986 5.2.4) makes of it."""
    out: list[str] = []
    for segment in re.sub("%2e", ".", path, flags=re.IGNORECASE).split("/")[1:]:
        if segment == "..":
            out = out[:-1]
        elif segment != ".":
            out.append(segment)
    return "/" + "/".join(out)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["/", ".", "%2e", "%2E", "a", "%2F", "%5C", "\\", "?"])))
def test_an_accepted_path_is_the_path_every_backend_sees(pieces: list[str]) -> None:
    """A path the router forwards resolves to itself: no backend can route it elsewhere."""
    target = ("/" + "".join(pieces)).encode()
    if heads.check_path(target) is None:
        path = target.decode().partition("?")[0]
        assert _resolved(path) == re.sub("%2e", ".", path, flags=re.IGNORECASE)
        assert "%2f" not in path.lower() and "\\" not in path


def test_identity_fields_are_keystonemiddlewares_and_every_spelling() -> None:
    names = heads.IDENTITY_NAMES
    for name in ("x-roles", "x-service-roles", "x-is-admin-project", "x-service-catalog"):
        assert names[name] == name
    assert names["x_service_project_domain_name"] == "x-service-project-domain-name"
    assert names["x-service_roles"] == "x-service-roles"
    assert names["openstack-system-scope"] == "openstack-system-scope"
    # what clients and services do send stays
    for kept in ("x-auth-token", "x-service-token", "x-subject-token", "x-openstack-request-id"):
        assert kept not in names


def test_strip_identity_drops_every_repeat_and_spelling_and_says_which() -> None:
    fields = [
        (b"Host", b"h"),
        (b"X-Roles", b"admin"),
        (b"X-Auth-Token", b"t"),
        (b"x_roles", b"admin"),
        (b"X-IS-ADMIN-PROJECT", b"True"),
        (b"X-Service-Token", b"s"),
    ]
    headers = {"host": "h", "x-roles": "admin", "x-auth-token": "t", "x_roles": "admin"}
    headers |= {"x-is-admin-project": "True", "x-service-token": "s"}
    kept, dropped = heads.strip_identity(fields, headers)
    assert kept == [(b"Host", b"h"), (b"X-Auth-Token", b"t"), (b"X-Service-Token", b"s")]
    assert headers == {"host": "h", "x-auth-token": "t", "x-service-token": "s"}
    assert dropped == ("x-is-admin-project", "x-roles")
