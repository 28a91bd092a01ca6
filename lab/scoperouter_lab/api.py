"""A tiny OpenStack REST client on urllib, for seeding the lab and checking health.

The lab's own process has no OpenStack libraries (they live in the lab venv); a few dozen REST
calls do not need them. Requests never use an environment proxy. https URLs (a TLS lab) are
verified with the system's CAs and the file :func:`trust` names (the lab's CA).
"""

from __future__ import annotations

import json
import socket
import socketserver
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_CAFILES: list[Path] = []


def trust(cafile: Path) -> None:
    """Verify https servers with `cafile` too (besides the system's CAs): a TLS lab's CA. The
    file may be made later: it is read on every https request."""
    if cafile not in _CAFILES:
        _CAFILES.append(cafile)


def _opener(url: str) -> urllib.request.OpenerDirector:
    if not url.startswith("https:") or not _CAFILES:
        return _OPENER
    context = ssl.create_default_context()
    for cafile in _CAFILES:
        context.load_verify_locations(cafile=str(cafile))
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )


def serve_tls(server: socketserver.TCPServer, cert: str, key: str) -> None:
    """Make a stand-in's server (not yet serving) speak https with `cert` and `key`. Each
    connection's handshake happens on its first read, in the thread that handles it (not in
    the accepting loop, which a client slow to say hello would hold up)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )


def scheme(handler: socketserver.BaseRequestHandler) -> str:
    """The scheme a stand-in's request came in with (its links say the same)."""
    return "https" if isinstance(handler.request, ssl.SSLSocket) else "http"


class ApiError(RuntimeError):
    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        super().__init__(f"{method} {url} -> {status}: {body[:500]}")
        self.status = status
        self.body = body


def request(
    method: str,
    url: str,
    *,
    body: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    ok: tuple[int, ...] = (),
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; returns (status, headers, body). Raises ApiError on >= 400 unless the
    status is listed in `ok`; raises OSError when nothing answers."""
    hdrs = {"Accept": "application/json", "Connection": "close"}
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with _opener(url).open(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        payload = err.read()
        if err.code in ok:
            return err.code, dict(err.headers.items()), payload
        raise ApiError(method, url, err.code, payload.decode(errors="replace")) from None


def http_status(url: str, timeout: float = 3.0) -> int | None:
    """Status of a GET (any status counts as an answer); None when nothing answers."""
    try:
        status, _, _ = request("GET", url, timeout=timeout, ok=tuple(range(300, 600)))
        return status
    except (OSError, ApiError):
        return None


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float,
    interval: float = 0.3,
    on_fail: Callable[[], str | None] | None = None,
) -> Any:
    """Poll `check()` until it returns a truthy value; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on timeout
            last_exc = exc
        if on_fail is not None:
            reason = on_fail()
            if reason:
                raise RuntimeError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            extra = f" (last error: {last_exc})" if last_exc else ""
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s{extra}")
        time.sleep(interval)


class Keystone:
    """Password-authenticated admin session against one keystone (v3)."""

    def __init__(self, url: str, username: str, password: str, project: str = "admin") -> None:
        self.url = url.rstrip("/")
        self.username = username
        self.password = password
        self.project = project
        self.token = ""
        self.catalog: list[dict[str, Any]] = []
        self.user_id = ""
        self.project_id = ""

    def login(self) -> Keystone:
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {
                            "name": self.username,
                            "domain": {"id": "default"},
                            "password": self.password,
                        }
                    },
                },
                "scope": {"project": {"name": self.project, "domain": {"id": "default"}}},
            }
        }
        _, headers, payload = request("POST", self.url + "/auth/tokens", body=body)
        self.token = headers.get("X-Subject-Token") or headers.get("x-subject-token") or ""
        tok = json.loads(payload)["token"]
        self.catalog = tok.get("catalog", [])
        self.user_id = tok["user"]["id"]
        self.project_id = tok["project"]["id"]
        return self

    def call(
        self, method: str, url: str, body: Any = None, ok: tuple[int, ...] = (), **kw: Any
    ) -> Any:
        if not url.startswith("http"):
            url = self.url + url
        headers = {"X-Auth-Token": self.token, **kw.pop("headers", {})}
        _status, _, payload = request(method, url, body=body, headers=headers, ok=ok, **kw)
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError:
            return payload

    # -- idempotent helpers ------------------------------------------------------------

    def find(self, collection: str, name: str, key: str | None = None, **filters: str) -> Any:
        key = key or collection
        query = "&".join(f"{k}={v}" for k, v in {"name": name, **filters}.items())
        found = self.call("GET", f"/{collection}?{query}")[key]
        return found[0] if found else None

    def ensure_project(self, name: str, description: str = "") -> str:
        found = self.find("projects", name, domain_id="default")
        if found:
            return str(found["id"])
        body = {"project": {"name": name, "domain_id": "default", "description": description}}
        return str(self.call("POST", "/projects", body)["project"]["id"])

    def ensure_domain(self, name: str, description: str = "") -> str:
        found = self.find("domains", name)
        if found:
            return str(found["id"])
        body = {"domain": {"name": name, "description": description, "enabled": True}}
        return str(self.call("POST", "/domains", body)["domain"]["id"])

    def ensure_user(
        self, name: str, password: str, project_id: str | None = None, domain_id: str = "default"
    ) -> str:
        found = self.find("users", name, domain_id=domain_id)
        if found:
            if not self.password_works(name, password, domain_id):  # the lab's secret changed
                self.call("PATCH", f"/users/{found['id']}", {"user": {"password": password}})
            return str(found["id"])
        user: dict[str, Any] = {"name": name, "domain_id": domain_id, "password": password}
        if project_id:
            user["default_project_id"] = project_id
        return str(self.call("POST", "/users", {"user": user})["user"]["id"])

    def password_works(self, name: str, password: str, domain_id: str = "default") -> bool:
        """Can user `name` (of `domain_id`) authenticate with `password`? (unscoped token)"""
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {"name": name, "domain": {"id": domain_id}, "password": password}
                    },
                }
            }
        }
        status, _, _ = request("POST", self.url + "/auth/tokens", body=body, ok=(401,))
        return status != 401

    def role_id(self, name: str) -> str:
        found = self.find("roles", name)
        if found:
            return str(found["id"])
        return str(self.call("POST", "/roles", {"role": {"name": name}})["role"]["id"])

    def grant(self, project_id: str, user_id: str, role: str) -> None:
        rid = self.role_id(role)
        self.call("PUT", f"/projects/{project_id}/users/{user_id}/roles/{rid}")

    def grant_domain(self, domain_id: str, user_id: str, role: str) -> None:
        rid = self.role_id(role)
        self.call("PUT", f"/domains/{domain_id}/users/{user_id}/roles/{rid}")

    def ensure_service(self, service_type: str, name: str) -> str:
        found = self.call("GET", f"/services?type={service_type}")["services"]
        for svc in found:
            if svc["name"] == name:
                return str(svc["id"])
        body = {"service": {"type": service_type, "name": name, "enabled": True}}
        return str(self.call("POST", "/services", body)["service"]["id"])

    def ensure_endpoint(self, service_id: str, interface: str, url: str, region: str) -> None:
        found = self.call("GET", f"/endpoints?service_id={service_id}&interface={interface}")[
            "endpoints"
        ]
        mine = [e for e in found if e.get("region_id") == region]
        if mine:
            ep = mine[0]
            if ep["url"] != url:
                self.call("PATCH", f"/endpoints/{ep['id']}", {"endpoint": {"url": url}})
            for extra in mine[1:]:
                self.call("DELETE", f"/endpoints/{extra['id']}")
            return
        body = {
            "endpoint": {
                "service_id": service_id,
                "interface": interface,
                "url": url,
                "region_id": region,
                "enabled": True,
            }
        }
        self.call("POST", "/endpoints", body)

    def endpoint_rows(self) -> list[dict[str, str]]:
        """``openstack endpoint list`` as dicts: service_type, interface, url, region."""
        services = {s["id"]: s for s in self.call("GET", "/services")["services"]}
        rows = []
        for ep in self.call("GET", "/endpoints")["endpoints"]:
            svc = services.get(ep["service_id"])
            if svc is None or not ep.get("enabled", True):
                continue
            rows.append(
                {
                    "service_type": svc["type"],
                    "interface": ep["interface"],
                    "url": ep["url"],
                    "region": ep.get("region_id") or ep.get("region") or "",
                }
            )
        return rows
