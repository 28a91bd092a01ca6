"""A stub OpenStack on loopback for the example packs' runs without a cloud: compute (key
pairs, servers), network (security groups and rules), image and object-store APIs with
nothing in them but what a run creates. It records every request (method, path with its
query, decoded), so a test sees what reached the "cloud"; images and networks are never
found, so a server's boot fails on its image as it would in a cloud without it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nc3R1Yg==\n-----END OPENSSH PRIVATE KEY-----\n"


class _Handler(BaseHTTPRequestHandler):
    server: StubServer

    def _answer(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _record(self) -> tuple[str, dict[str, Any]]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        with self.server.lock:
            self.server.requests.append((self.command, unquote(self.path), body))
        return self.path.split("?")[0].rstrip("/"), body

    def do_GET(self) -> None:
        path, _ = self._record()
        tail = path.rsplit("/", 1)[-1]
        lists = {
            "os-keypairs": "keypairs",
            "detail": "servers",
            "servers": "servers",
            "security-groups": "security_groups",
            "security-group-rules": "security_group_rules",
            "images": "images",
            "networks": "networks",
            "flavors": "flavors",
            "ports": "ports",
        }
        if path.startswith("/swift/v1/AUTH_p"):
            rest = path[len("/swift/v1/AUTH_p") :]
            if not rest:
                return self._answer(200, [{"name": n, "count": 0, "bytes": 0}
                                          for n in self.server.containers])  # fmt: skip
            return self._answer(200 if rest.strip("/") in self.server.containers else 404, [])
        if "/security-groups" in path:
            groups = list(self.server.groups.values())
            if tail == "security-groups":
                name = parse_qs(urlsplit(self.path).query).get("name", [None])[0]
                chosen = [g for g in groups if name in (None, g["name"])]
                return self._answer(200, {"security_groups": chosen})
            found = [g for g in groups if tail in (g["id"], g["name"])]
            if found:
                return self._answer(200, {"security_group": found[0]})
        if path.startswith("/compute/v2.1/servers/") and tail not in ("detail",):
            server = self.server.servers.get(tail)
            if server is not None:
                return self._answer(200, {"server": server})
        known = {"images": self.server.images, "networks": self.server.networks,
                 "flavors": self.server.flavors, "servers": list(self.server.servers.values()),
                 "detail": list(self.server.servers.values())}  # fmt: skip
        if tail in lists:
            query = parse_qs(urlsplit(self.path).query)
            items = [i for i in known.get(tail, [])
                     if query.get("name", [i.get("name")])[0] == i.get("name")]  # fmt: skip
            return self._answer(200, {lists[tail]: items})
        for kind, items in known.items():
            if f"/{kind}/" in path:
                found = [i for i in items if tail in (i.get("id"), i.get("name"))]
                if found:
                    return self._answer(200, {kind.rstrip("s"): found[0]})
        versions = {"/network": ("v2.0", "network/v2.0"), "/image": ("v2.16", "image/v2")}
        if path in versions:
            ident, where = versions[path]
            link = {"rel": "self", "href": f"{self.server.url}/{where}/"}
            return self._answer(200, {"versions": [{"id": ident, "status": "CURRENT",
                                                    "links": [link]}]})  # fmt: skip
        if path in ("/compute", "/compute/v2.1"):
            version = {"id": "v2.1", "status": "CURRENT", "version": "2.90",
                       "min_version": "2.1", "updated": "2013-07-23T11:33:21Z",
                       "links": [{"rel": "self",
                                  "href": f"{self.server.url}/compute/v2.1/"}]}  # fmt: skip
            return self._answer(200, {"version": version} if path.endswith("1") else
                                {"versions": [version]})  # fmt: skip
        self._answer(404, {"itemNotFound": {"code": 404, "message": "not found"}})

    def do_HEAD(self) -> None:
        path, _ = self._record()
        if path.startswith("/swift/v1/AUTH_p/"):
            found = path.rsplit("/", 1)[-1] in self.server.containers
            return self._answer(204 if found else 404)
        self._answer(404)

    def do_PUT(self) -> None:
        path, _ = self._record()
        if path.startswith("/swift/v1/AUTH_p/"):
            self.server.containers.add(path.rsplit("/", 1)[-1])
            return self._answer(201)
        self._answer(404)

    def do_POST(self) -> None:
        path, body = self._record()
        if path.endswith("/os-keypairs"):
            name = (body.get("keypair") or {}).get("name", "k")
            return self._answer(200, {"keypair": {"name": name, "private_key": PRIVATE_KEY,
                                                  "public_key": "ssh-ed25519 AAAA stub",
                                                  "fingerprint": "f", "type": "ssh",
                                                  "user_id": "u"}})  # fmt: skip
        if path.endswith("/security-groups"):
            group = dict(body.get("security_group") or {})
            group.update(
                id=f"sg-{len(self.server.groups) + 1}",
                security_group_rules=[],
                project_id="p",
                tenant_id="p",
            )
            self.server.groups[group["id"]] = group
            return self._answer(201, {"security_group": group})
        if path.endswith("/security-group-rules"):
            rule = dict(body.get("security_group_rule") or {})
            rule.update(id=f"rule-{len(self.server.requests)}", project_id="p")
            return self._answer(201, {"security_group_rule": rule})
        if path.endswith("/compute/v2.1/servers"):
            server = dict(body.get("server") or {})
            server.update(id=f"srv-{len(self.server.servers) + 1}", status="ACTIVE",
                          addresses={"net": [{"addr": "10.0.0.5", "version": 4}]},
                          flavor={"original_name": "m1.tiny"},
                          image={"id": server.get("imageRef")}, tenant_id="p")  # fmt: skip
            self.server.servers[server["id"]] = server
            return self._answer(202, {"server": server})
        if path.startswith("/swift/v1/AUTH_p/"):
            return self._answer(204)
        self._answer(404, {"itemNotFound": {"code": 404, "message": "not found"}})

    def do_DELETE(self) -> None:
        path, _ = self._record()
        tail = path.rsplit("/", 1)[-1]
        for kind in (self.server.servers, self.server.groups):
            if tail in kind:
                del kind[tail]
                return self._answer(204)
        if "/os-keypairs/" in path:
            return self._answer(202)
        if path.startswith("/swift/v1/AUTH_p/"):
            self.server.containers.discard(path.rsplit("/", 1)[-1])
            return self._answer(204)
        self._answer(404, {"itemNotFound": {"code": 404, "message": "not found"}})

    def log_message(self, *args: Any) -> None:
        pass


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.containers: set[str] = set()
        self.groups: dict[str, dict[str, Any]] = {}
        self.servers: dict[str, dict[str, Any]] = {}
        # what a test makes visible (named after its hostile values)
        self.images: list[dict[str, Any]] = []
        self.networks: list[dict[str, Any]] = []
        self.flavors = [{"id": "1", "name": "m1.tiny", "vcpus": 1, "ram": 512, "disk": 1}]
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def cloud_entry(self) -> dict[str, Any]:
        """The clouds.yaml entry a run gets: every service at this stub, no auth."""
        return {
            "auth_type": "none",
            "compute_endpoint_override": f"{self.url}/compute/v2.1",
            "network_endpoint_override": f"{self.url}/network",
            "image_endpoint_override": f"{self.url}/image",
            "object_store_endpoint_override": f"{self.url}/swift/v1/AUTH_p",
        }

    def seen(self) -> str:
        """Every recorded request as text (method, decoded path, JSON body)."""
        with self.lock:
            return "\n".join(f"{m} {p} {json.dumps(b)}" for m, p, b in self.requests)
