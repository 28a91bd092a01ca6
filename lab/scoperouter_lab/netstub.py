"""A small stand-in for the network service (neutron) of a lab cloud.

Real neutron is heavy (agents, OVS); nova needs only a few of its calls to give a server a
network: list the networks a project may use, create a port on one, bind it to the compute host
(``binding:host_id``), list the server's ports, subnets and floating IPs to build its addresses,
and delete the port with the server. This stand-in answers those, from memory:

* one network, ``private`` (shared, so every project's automatic networking — nova's
  ``networks: auto`` or no ``--nic`` — finds exactly one), with one IPv4 subnet
  ``private-subnet`` (10.0.0.0/24); stable ids across restarts; it cannot be deleted;
* networks, subnets and ports: create, show, list with neutron's equality filters and
  ``fields``, update, delete (a port gets a MAC and the next free address of its network's
  first subnet; binding it to a host makes it ACTIVE with vif type ``ovs``; a network with
  ports or a subnet with addresses in use answers 409);
* security groups and their rules: create, show, list, delete (a group's name and
  description can be updated); a new group has neutron's two egress rules, a ``default`` group
  per project appears on first use as neutron makes it, a rule repeated answers 409, a group a
  port uses answers 409 to its delete; rules are kept, not enforced (nova's fake driver has no
  traffic to filter). So nova boots a server in a group named at create, and openstack.cloud's
  ``security_group``/``security_group_rule`` modules manage them;
* quotas unlimited; no extensions; no routers or floating IPs: those writes answer 403
  (NeutronError JSON), a limit of the lab.

State lives in memory (a restart forgets what clients created; nova tolerates a port that is
gone when it deletes a server). Tokens are not checked for access: everything listens on the
lab's loopback backend address, behind the cloud's router. A resource belongs to the project
its request body names (admins and nova name it); a create that names none belongs to the
project of the request's token, which the stand-in asks the cloud's keystone where the
services find it (``--keystone``, the router's identity URL in a routed lab: it understands a
token carrying a routing scope; a token may validate itself), as neutron does.

Run: ``python -m scoperouter_lab.netstub --listen 127.0.1.2:9696 --keystone
http://127.0.0.2:5000/v3`` (stdlib only).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import ipaddress
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scoperouter_lab.api import scheme, serve_tls

_COLLECTION = re.compile(r"^/v2\.0/([a-z0-9_-]+?)(?:\.json)?/?$")
_ITEM = re.compile(r"^/v2\.0/([a-z0-9_-]+)/([^/]+?)(?:\.json)?/?$")
_QUOTA_KEYS = ("network", "subnet", "port", "router", "floatingip", "security_group",
               "security_group_rule")  # fmt: skip
NETWORK_NAME = "private"
SUBNET_CIDR = "10.0.0.0/24"
MAX_BODY = 1 << 20  # a port body is a few hundred bytes

Resource = dict[str, Any]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _singular(collection: str) -> str:
    """``security_groups`` -> ``security_group``; ``policies`` -> ``policy``."""
    if collection.endswith("ies"):
        return collection[:-3] + "y"
    return collection[:-1] if collection.endswith("s") else collection


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


def _matches(item: Mapping[str, Any], key: str, wanted: list[str]) -> bool:
    """neutron's list filters: ``?k=v&k=w`` keeps items whose k is v or w (strings compared the
    way neutron's API renders them: booleans as True/False, case-insensitively)."""
    if key == "fixed_ips":  # fixed_ips=ip_address=10.0.0.3 / subnet_id=...
        for cond in wanted:
            name, _, value = cond.partition("=")
            if not any(str(ip.get(name)) == value for ip in item.get("fixed_ips", [])):
                return False
        return True
    if key not in item:
        return False
    value = item[key]
    if isinstance(value, bool):
        return any(w.lower() == str(value).lower() for w in wanted)
    if isinstance(value, list):
        return any(w in (str(v) for v in value) for w in wanted)
    return str(value) in wanted


class Conflict(Exception):
    pass


class Forbidden(Exception):
    pass


# what a client may set on each kind of resource; ids, MACs, IPs and states are the stand-in's
_RULE_FIELDS = ("direction", "ethertype", "protocol", "port_range_min", "port_range_max",
                "remote_ip_prefix", "remote_group_id")  # fmt: skip
_WRITABLE = {
    "networks": frozenset(("name", "description", "admin_state_up", "shared", "mtu", "tags",
                           "port_security_enabled", "tenant_id", "project_id")),
    "subnets": frozenset(("name", "description", "network_id", "cidr", "ip_version",
                          "gateway_ip", "enable_dhcp", "dns_nameservers", "host_routes", "tags",
                          "tenant_id", "project_id")),
    "ports": frozenset(("name", "description", "network_id", "admin_state_up", "device_id",
                        "device_owner", "binding:host_id", "binding:profile",
                        "binding:vnic_type", "dns_name", "tags", "security_groups",
                        "tenant_id", "project_id")),
    "security_groups": frozenset(("name", "description", "stateful", "tags", "tenant_id",
                                  "project_id")),
    "security_group_rules": frozenset(("security_group_id", "description", *_RULE_FIELDS,
                                       "tenant_id", "project_id")),
}  # fmt: skip
# fields fixed once created
_IMMUTABLE = frozenset(
    (
        "network_id",
        "cidr",
        "ip_version",
        "tenant_id",
        "project_id",
        "security_group_id",
        *_RULE_FIELDS,
    )
)


class Store:
    """The stand-in's resources, keyed by collection name (``networks``, ``ports`` ...).

    Networks, subnets and ports can be created, updated and deleted (a network with ports, or
    a subnet with addresses in use, answers 409 as neutron does); the seeded ``private``
    network and its subnet cannot be deleted. Projects come from the request body (the
    stand-in does not read tokens)."""

    def __init__(self, seed: str) -> None:
        self.lock = threading.Lock()
        self.seed = seed
        ns = uuid.uuid5(uuid.NAMESPACE_URL, f"scoperouter-lab-network:{seed}")
        self.network_id = str(uuid.uuid5(ns, "network"))
        self.subnet_id = str(uuid.uuid5(ns, "subnet"))
        self.data: dict[str, dict[str, Resource]] = {
            "networks": {},
            "subnets": {},
            "ports": {},
            "security_groups": {},
            "security_group_rules": {},
        }
        self._add_network({"name": NETWORK_NAME, "shared": True}, self.network_id)
        self._add_subnet(
            {"name": f"{NETWORK_NAME}-subnet", "network_id": self.network_id,
             "cidr": SUBNET_CIDR, "ip_version": 4},
            self.subnet_id,
        )  # fmt: skip

    # -- reads ----------------------------------------------------------------------------

    def list(self, collection: str, query: Mapping[str, list[str]]) -> list[Resource]:
        with self.lock:
            if collection == "security_groups":
                for project in query.get("tenant_id", []) + query.get("project_id", []):
                    self._default_group(project)
            items = copy.deepcopy(list(self.data.get(collection, {}).values()))
        fields = [f for value in query.get("fields", []) for f in value.split(",") if f]
        for key, wanted in query.items():
            if key in ("fields", "limit", "marker", "sort_key", "sort_dir", "page_reverse"):
                continue
            items = [i for i in items if _matches(i, key, wanted)]
        return [_project(i, fields) for i in items]

    def show(self, collection: str, ident: str, fields: Iterable[str] = ()) -> Resource:
        with self.lock:
            item = copy.deepcopy(self.data.get(collection, {}).get(ident))
        if item is None:
            raise NotFound(f"{_singular(collection)} {ident} could not be found")
        return _project(item, list(fields))

    # -- writes ---------------------------------------------------------------------------

    def create(self, collection: str, body: Resource) -> Resource:
        add = {"networks": self._add_network, "subnets": self._add_subnet,
               "ports": self._add_port, "security_groups": self._add_group,
               "security_group_rules": self._add_rule}[collection]  # fmt: skip
        with self.lock:
            return copy.deepcopy(add(body, str(uuid.uuid4())))

    def update(self, collection: str, ident: str, body: Resource) -> Resource:
        with self.lock:
            item = self.data[collection].get(ident)
            if item is None:
                raise NotFound(f"{_singular(collection)} {ident} could not be found")
            fixed = sorted(k for k in body if k in _IMMUTABLE and body[k] != item.get(k))
            if fixed:
                raise BadRequest(f"cannot update read-only attribute(s) {', '.join(fixed)}")
            item.update(_writable(collection, body))
            item["updated_at"] = _now()
            item["revision_number"] += 1
            if collection == "ports":
                _bind(item)
            return copy.deepcopy(item)

    def delete(self, collection: str, ident: str) -> None:
        with self.lock:
            item = self.data[collection].get(ident)
            if item is None:
                raise NotFound(f"{_singular(collection)} {ident} could not be found")
            if ident in (self.network_id, self.subnet_id):
                raise Forbidden(f"the lab's {item['name']} {_singular(collection)} stays")
            if collection == "networks":
                if any(p["network_id"] == ident for p in self.data["ports"].values()):
                    raise Conflict(
                        f"Unable to complete operation on network {ident}. There are one or "
                        "more ports still in use on the network."
                    )
                for sid in item["subnets"]:
                    self.data["subnets"].pop(sid, None)
            if collection == "subnets":
                if any(ip["subnet_id"] == ident for p in self.data["ports"].values()
                       for ip in p["fixed_ips"]):  # fmt: skip
                    raise Conflict(
                        f"Unable to complete operation on subnet {ident}: one or more ports "
                        "have an IP allocation from this subnet."
                    )
                net = self.data["networks"].get(item["network_id"])
                if net is not None:
                    net["subnets"] = [s for s in net["subnets"] if s != ident]
            if collection == "security_groups":
                if any(ident in p["security_groups"] for p in self.data["ports"].values()):
                    raise Conflict(f"Security Group {ident} in use.")
                for rule in item["security_group_rules"]:
                    self.data["security_group_rules"].pop(rule["id"], None)
            if collection == "security_group_rules":
                group = self.data["security_groups"].get(item["security_group_id"])
                if group is not None:
                    rules = group["security_group_rules"]
                    group["security_group_rules"] = [r for r in rules if r["id"] != ident]
            del self.data[collection][ident]

    # -- the resources --------------------------------------------------------------------

    def _base(self, ident: str, body: Resource) -> Resource:
        project = str(body.get("project_id") or body.get("tenant_id") or "")
        stamp = _now()
        return {"id": ident, "name": "", "description": "", "tenant_id": project,
                "project_id": project, "tags": [], "created_at": stamp, "updated_at": stamp,
                "revision_number": 1}  # fmt: skip

    def _add_network(self, body: Resource, ident: str) -> Resource:
        net = {
            **self._base(ident, body),
            "status": "ACTIVE", "admin_state_up": True, "shared": False,
            "router:external": False, "is_default": False, "mtu": 1450,
            "port_security_enabled": True, "subnets": [], "availability_zones": ["nova"],
            "availability_zone_hints": [], "ipv4_address_scope": None,
            "ipv6_address_scope": None, "provider:network_type": "local",
            "provider:physical_network": None, "provider:segmentation_id": None,
        }  # fmt: skip
        net.update(_writable("networks", body))
        self.data["networks"][ident] = net
        return net

    def _add_subnet(self, body: Resource, ident: str) -> Resource:
        net = self._network_of(body)
        try:
            cidr = ipaddress.ip_network(str(body.get("cidr")), strict=False)
        except ValueError:
            raise BadRequest(f"invalid cidr {body.get('cidr')!r}") from None
        hosts = cidr.hosts()
        gateway = str(next(hosts, cidr.network_address))
        first = str(next(hosts, gateway))
        last = str(cidr.broadcast_address - 1) if cidr.num_addresses > 2 else first
        subnet = {
            **self._base(ident, body),
            "network_id": net["id"], "ip_version": cidr.version, "cidr": str(cidr),
            "gateway_ip": gateway, "allocation_pools": [{"start": first, "end": last}],
            "enable_dhcp": False, "dns_nameservers": [], "host_routes": [],
            "ipv6_address_mode": None, "ipv6_ra_mode": None, "subnetpool_id": None,
            "segment_id": None, "service_types": [], "shared": net["shared"],
        }  # fmt: skip
        subnet.update(_writable("subnets", body))
        subnet["cidr"] = str(cidr)
        self.data["subnets"][ident] = subnet
        net["subnets"].append(ident)
        return subnet

    def _add_port(self, body: Resource, ident: str) -> Resource:
        net = self._network_of(body)
        project = str(body.get("project_id") or body.get("tenant_id") or "")
        mac = "fa:16:3e:" + ":".join(f"{b:02x}" for b in uuid.UUID(ident).bytes[:3])
        fixed = [self._next_ip(net["subnets"][0])] if net["subnets"] else []
        port = {
            **self._base(ident, body),
            "network_id": net["id"], "mac_address": mac, "admin_state_up": True,
            "status": "DOWN", "device_id": "", "device_owner": "", "fixed_ips": fixed,
            "security_groups": [self._default_group(project)] if project else [],
            "allowed_address_pairs": [], "extra_dhcp_opts": [], "port_security_enabled": True,
            "qos_policy_id": None, "dns_name": "", "binding:host_id": "",
            "binding:vif_type": "unbound", "binding:vnic_type": "normal",
            "binding:vif_details": {}, "binding:profile": {},
        }  # fmt: skip
        port.update(_writable("ports", body))
        _bind(port)
        self.data["ports"][ident] = port
        return port

    def _network_of(self, body: Resource) -> Resource:
        network_id = body.get("network_id")
        if not isinstance(network_id, str) or not network_id:
            raise BadRequest("network_id is required")
        net = self.data["networks"].get(network_id)
        if net is None:
            raise NotFound(f"network {network_id} could not be found")
        return net

    def _next_ip(self, subnet_id: str) -> Resource:
        subnet = self.data["subnets"][subnet_id]
        pool = subnet["allocation_pools"][0]
        start = int(ipaddress.ip_address(pool["start"]))
        end = int(ipaddress.ip_address(pool["end"]))
        used = {ip["ip_address"] for p in self.data["ports"].values() for ip in p["fixed_ips"]}
        for number in range(start, min(end, start + 65535) + 1):
            address = str(ipaddress.ip_address(number))
            if address not in used:
                return {"subnet_id": subnet_id, "ip_address": address}
        raise Conflict(f"No more IP addresses available on network {subnet['network_id']}.")

    def _default_group(self, project: str) -> str:
        """neutron creates a project's ``default`` security group on first use."""
        gid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.seed}:sg:{project}"))
        if gid not in self.data["security_groups"]:
            body = {"project_id": project, "name": "default",
                    "description": "Default security group"}  # fmt: skip
            self._add_group(body, gid)
        return gid

    def _add_group(self, body: Resource, ident: str) -> Resource:
        """A security group, with the egress rules neutron gives every new group."""
        group = {**self._base(ident, body), "security_group_rules": [], "stateful": True,
                 "shared": False}  # fmt: skip
        group.update(_writable("security_groups", body))
        self.data["security_groups"][ident] = group
        for ethertype in ("IPv4", "IPv6"):
            rule = {"security_group_id": ident, "direction": "egress", "ethertype": ethertype,
                    "project_id": group["project_id"]}  # fmt: skip
            self._add_rule(rule, str(uuid.uuid4()))
        return group

    def _add_rule(self, body: Resource, ident: str) -> Resource:
        group = self.data["security_groups"].get(str(body.get("security_group_id")))
        if group is None:
            raise NotFound(f"Security group {body.get('security_group_id')} does not exist")
        body = {"project_id": group["project_id"], **body}
        rule: Resource = {**self._base(ident, body), "security_group_id": group["id"],
                          "remote_address_group_id": None,
                          **dict.fromkeys(_RULE_FIELDS)}  # fmt: skip
        del rule["name"]
        rule.update(_writable("security_group_rules", body))
        rule["ethertype"] = rule["ethertype"] or "IPv4"
        if rule["direction"] not in ("ingress", "egress"):
            raise BadRequest(f"Invalid direction {rule['direction']!r}: ingress or egress")
        if rule["ethertype"] not in ("IPv4", "IPv6"):
            raise BadRequest(f"Invalid ethertype {rule['ethertype']!r}: IPv4 or IPv6")
        low, high = rule["port_range_min"], rule["port_range_max"]
        if low is not None and high is not None and int(low) > int(high):
            raise BadRequest("port_range_min must be <= port_range_max")
        for other in group["security_group_rules"]:
            if all(other[k] == rule[k] for k in _RULE_FIELDS):
                raise Conflict(f"Security group rule already exists. Rule id is {other['id']}.")
        self.data["security_group_rules"][ident] = rule
        group["security_group_rules"].append(rule)
        return rule


def _writable(collection: str, body: Resource) -> Resource:
    return {k: v for k, v in body.items() if k in _WRITABLE[collection]}


def _bind(port: Resource) -> None:
    """A port bound to a host is ACTIVE with an OVS vif, as neutron's agents would report."""
    if port.get("binding:host_id"):
        details = {"port_filter": True, "ovs_hybrid_plug": False}
        port.update({"status": "ACTIVE", "binding:vif_type": "ovs", "binding:vif_details": details})
    else:
        port.update({"status": "DOWN", "binding:vif_type": "unbound", "binding:vif_details": {}})


def _project(item: Resource, fields: list[str]) -> Resource:
    return {k: v for k, v in item.items() if k in fields} if fields else dict(item)


class Unauthorized(Exception):
    pass


class TokenProjects:
    """The project of a token, asked of keystone once per token (``GET /v3/auth/tokens`` with
    the token as its own subject: keystone lets a token validate itself)."""

    MAX = 1024  # tokens remembered

    def __init__(self, keystone: str) -> None:
        self.keystone = keystone.rstrip("/")
        self.known: dict[str, str] = {}
        self.lock = threading.Lock()
        # straight to the URL given, whatever proxy the environment names
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __call__(self, token: str) -> str:
        key = hashlib.sha256(token.encode()).hexdigest()
        with self.lock:
            if key in self.known:
                return self.known[key]
        headers = {"X-Auth-Token": token, "X-Subject-Token": token}
        request = urllib.request.Request(f"{self.keystone}/auth/tokens", headers=headers)
        try:
            with self.opener.open(request, timeout=30) as response:
                data = json.load(response)
        except urllib.error.HTTPError as exc:
            raise Unauthorized(f"keystone refused the token ({exc.code})") from None
        project = str(((data.get("token") or {}).get("project") or {}).get("id") or "")
        if not project:
            raise BadRequest("the token is not scoped to a project: name one (project_id)")
        with self.lock:
            if len(self.known) >= self.MAX:
                self.known.clear()
            self.known[key] = project
        return project


class Handler(BaseHTTPRequestHandler):
    server_version = "scoperouter-lab-network/2"
    protocol_version = "HTTP/1.1"
    store: Store  # set on the class made by make_server()
    projects: TokenProjects | None = None  # without one, projects come from bodies only

    def _send(self, status: int, body: object | None) -> None:
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.close_connection = True

    def _error(self, status: int, kind: str, message: str) -> None:
        self._send(status, {"NeutronError": {"type": kind, "message": message, "detail": ""}})

    def _host(self) -> str:
        host, port = self.server.server_address[:2]  # type: ignore[index,str-unpack]
        return self.headers.get("Host") or f"{host}:{port}"

    def _target(self) -> tuple[str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        return parts.path, parse_qs(parts.query)

    def _body(self, collection: str) -> Resource:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise BadRequest(f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        key = _singular(collection)
        if not isinstance(data, dict) or not isinstance(data.get(key), dict):
            raise BadRequest(f"the request body must be an object with a {key!r} object")
        resource: Resource = data[key]
        return resource

    def _handle(self, fn: Any) -> None:
        try:
            fn()
        except NotFound as exc:
            self._error(404, "NotFound", str(exc))
        except BadRequest as exc:
            self._error(400, "BadRequest", str(exc))
        except Conflict as exc:
            self._error(409, "Conflict", str(exc))
        except Forbidden as exc:
            self._error(403, "Forbidden", str(exc))
        except Unauthorized as exc:
            self._error(401, "Unauthorized", str(exc))
        except urllib.error.URLError as exc:
            self._error(503, "ServiceUnavailable", f"keystone did not answer: {exc.reason}")

    def do_GET(self) -> None:
        self._handle(self._get)

    def _get(self) -> None:
        path, query = self._target()
        if path in ("", "/"):
            link = {"href": f"{scheme(self)}://{self._host()}/v2.0/", "rel": "self"}
            self._send(200, {"versions": [{"id": "v2.0", "status": "CURRENT", "links": [link]}]})
            return
        if path.rstrip("/") == "/v2.0":
            self._send(200, {"resources": []})
            return
        m = _COLLECTION.match(path)
        if m:
            collection = m.group(1).replace("-", "_")
            self._send(200, {collection: self.store.list(collection, query)})
            return
        m = _ITEM.match(path)
        if m and m.group(1) == "quotas":
            self._send(200, {"quota": {k: -1 for k in _QUOTA_KEYS}})
            return
        if m:
            collection = m.group(1).replace("-", "_")
            fields = [f for v in query.get("fields", []) for f in v.split(",") if f]
            item = self.store.show(collection, m.group(2), fields)
            self._send(200, {_singular(collection): item})
            return
        self._error(404, "NotFound", f"no resource at {path}")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self._handle(self._post)

    def _post(self) -> None:
        path, _ = self._target()
        m = _COLLECTION.match(path)
        collection = m.group(1).replace("-", "_") if m else ""
        if collection in _WRITABLE:
            body = self._body(collection)
            token = self.headers.get("X-Auth-Token")
            if not (body.get("project_id") or body.get("tenant_id")) and token and self.projects:
                body["project_id"] = self.projects(token)  # neutron: the token's project
            item = self.store.create(collection, body)
            self._send(201, {_singular(collection): item})
            return
        self._read_only()

    def do_PUT(self) -> None:
        self._handle(self._put)

    def _put(self) -> None:
        path, _ = self._target()
        m = _ITEM.match(path)
        collection = m.group(1).replace("-", "_") if m else ""
        if m and collection in _WRITABLE:
            item = self.store.update(collection, m.group(2), self._body(collection))
            self._send(200, {_singular(collection): item})
            return
        self._read_only()

    def do_DELETE(self) -> None:
        self._handle(self._delete)

    def _delete(self) -> None:
        path, _ = self._target()
        m = _ITEM.match(path)
        collection = m.group(1).replace("-", "_") if m else ""
        if m and collection in _WRITABLE:
            self.store.delete(collection, m.group(2))
            self._send(204, None)
            return
        self._read_only()

    def _read_only(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= MAX_BODY:
            self.rfile.read(length)
        self._error(
            403,
            "Forbidden",
            "the lab's network stand-in keeps networks, subnets, ports and security groups; "
            f"{self.command} {self._target()[0]} is not supported",
        )

    do_PATCH = _read_only

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write(f"{self.log_date_time_string()} {fmt % args}\n")
        sys.stderr.flush()


def make_server(host: str, port: int, keystone: str | None = None) -> ThreadingHTTPServer:
    """A stand-in on host:port (not yet serving); its ids derive from the address. With
    `keystone` (its /v3 URL), a create naming no project gets its token's."""
    projects = TokenProjects(keystone) if keystone else None
    attrs = {"store": Store(f"{host}:{port}"), "projects": projects}
    handler = type("BoundHandler", (Handler,), attrs)
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--tls-cert", help="serve https with this certificate (a TLS lab)")
    parser.add_argument("--tls-key", help="and this key")
    parser.add_argument("--keystone", help="keystone's /v3 URL: the project of a token")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    server = make_server(host, int(port), args.keystone)
    if args.tls_cert:
        serve_tls(server, args.tls_cert, args.tls_key or args.tls_cert)
    sys.stderr.write(f"network stand-in listening on {args.listen}\n")
    sys.stderr.flush()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
