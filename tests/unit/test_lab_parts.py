"""Parts of the lab that need no OpenStack: the generated files (checked with the router's own
loader), the network stand-in, the process table. Fast, no OpenStack: part of the default run."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from scoperouter_lab import files
from scoperouter_lab.api import port_open, wait_for
from scoperouter_lab.cli import main as lab_main
from scoperouter_lab.infra import rabbit_password_hash
from scoperouter_lab.layout import CloudSpec, resolve_services
from scoperouter_lab.procs import ProcessTable, group_members
from scoperouter_lab.templates import Secrets

from scoperouter.config import load_catalog

SECRETS = Secrets(admin="a", demo="d", service="s", db="p", rabbit="r", router="x", alt_demo="l")


def _rows(cloud: CloudSpec, routed: bool) -> list[dict[str, str]]:
    return [
        {"service_type": t, "interface": "public", "url": cloud.endpoint_url(t, routed),
         "region": cloud.name}
        for t in ("identity", "image", "compute", "placement", "network")
    ]  # fmt: skip


@pytest.mark.parametrize("routed", [True, False])
def test_federation_config_loads_with_the_router_loader(tmp_path: Path, routed: bool):
    clouds = [CloudSpec(1), CloudSpec(2), CloudSpec(3)]
    fed = files.federation_config({c: _rows(c, routed) for c in clouds})
    path = tmp_path / "federation.yaml"
    path.write_text(files.dump(fed, "# test\n"))
    catalog = load_catalog(path)
    assert set(catalog.clouds) == {"CloudOne", "CloudTwo", "CloudThree", files.DOWN_CLOUD}
    # CloudDown: every service, its router where nothing listens, no credentials of its own
    down = catalog.clouds[files.DOWN_CLOUD]
    assert {f.url.host for f in down.frontends} == {files.DOWN_HOST}
    assert str(catalog.endpoint("CloudDown", "image", "public").url) == "http://127.0.0.99:9292"
    assert "CloudDown" not in catalog.clouds["CloudOne"].credentials
    one = catalog.clouds["CloudOne"]
    assert one.proxy_listen == ("127.0.0.2", 3128)
    assert one.metrics_listen == ("127.0.0.2", 9180)  # /metrics, /status
    assert down.metrics_listen is None  # no router there: `scoperouter status` says unmonitored
    ep = catalog.endpoint("CloudTwo", "compute", "public")
    assert str(ep.url) == "http://127.0.0.3:8774/v2.1"
    assert str(ep.backend) == "http://127.0.1.3:8774/v2.1"
    assert dict(one.credentials) == {
        "CloudTwo": "cloudtwo-router",
        "CloudThree": "cloudthree-router",
    }
    match = catalog.match("127.0.0.2", 9292, "/v2/images")
    assert match is not None and match.endpoint.service_type == "image"


def test_federation_config_refuses_foreign_urls():
    cloud = CloudSpec(1)
    rows = [{"service_type": "image", "interface": "public", "url": "http://10.0.0.1:9292",
             "region": "CloudOne"}]  # fmt: skip
    with pytest.raises(ValueError, match="neither on the router"):
        files.federation_config({cloud: rows})


def test_clouds_yaml_entries():
    data = files.clouds_config([CloudSpec(1), CloudSpec(2)], SECRETS, routed=True)["clouds"]
    kinds = ("", "-alt", "-admin", "-router")
    assert set(data) == {c + k for c in ("cloudone", "cloudtwo") for k in kinds}
    assert data["cloudone-alt"]["auth"]["username"] == "alt_demo"
    assert data["cloudone-alt"]["auth"]["project_name"] == "alt_demo"
    assert data["cloudtwo"]["auth"]["auth_url"] == "http://127.0.0.3:5000/v3"
    assert data["cloudtwo"]["region_name"] == "CloudTwo"
    assert data["cloudone-router"]["auth"]["username"] == "scoperouter"
    yaml.safe_dump(data)


def test_clouds_yaml_entries_have_their_own_clouds_secrets():
    one, two = CloudSpec(1), CloudSpec(2)
    sec = {one: SECRETS, two: Secrets(admin="A2", demo="D2", service="S2", db="p", rabbit="r",
                                      router="X2", alt_demo="L2")}  # fmt: skip
    data = files.clouds_config([one, two], sec, routed=True)["clouds"]
    assert data["cloudone-admin"]["auth"]["password"] == "a"
    assert data["cloudtwo-admin"]["auth"]["password"] == "A2"
    assert data["cloudtwo"]["auth"]["password"] == "D2"
    assert data["cloudtwo-router"]["auth"]["password"] == "X2"


def test_router_clouds_yaml_names_only_the_other_clouds_router_users():
    one, two = CloudSpec(1), CloudSpec(2)
    sec = {one: SECRETS, two: Secrets(admin="A2", demo="D2", service="S2", db="p", rabbit="r",
                                      router="X2", alt_demo="L2")}  # fmt: skip
    clouds, secure = files.router_clouds_config([two], sec, routed=True)
    assert set(clouds["clouds"]) == {"cloudtwo-router"}
    auth = clouds["clouds"]["cloudtwo-router"]["auth"]
    assert auth["username"] == "scoperouter" and "password" not in auth
    assert auth["auth_url"] == "http://127.0.0.3:5000/v3"
    assert secure == {"clouds": {"cloudtwo-router": {"auth": {"password": "X2"}}}}
    text = yaml.safe_dump(clouds) + yaml.safe_dump(secure)
    assert "A2" not in text and "D2" not in text and "S2" not in text


def test_address_plan():
    c = CloudSpec(3)
    assert (c.name, c.slug, c.front_ip, c.back_ip) == ("CloudThree", "cloudthree", "127.0.0.4",
                                                       "127.0.1.4")  # fmt: skip
    assert c.endpoint_url("identity", True) == "http://127.0.0.4:5000/v3"
    assert c.endpoint_url("image", False) == "http://127.0.1.4:9292"


def test_resolve_services_adds_dependencies():
    assert resolve_services("nova") == ("keystone", "glance", "placement", "nova")
    assert resolve_services("glance") == ("keystone", "glance")
    assert resolve_services("heat,swift") == ("keystone", "swift", "heat")
    assert resolve_services(None) == ("keystone", "glance", "placement", "nova")  # a laptop's
    assert resolve_services("all") == (
        "keystone", "glance", "placement", "nova", "cinder", "swift", "heat"
    )  # fmt: skip
    with pytest.raises(ValueError, match="unknown"):
        resolve_services("neutron")


def test_processes_and_catalog_follow_the_selected_services(tmp_path: Path):
    """cinder replaces the block-storage stand-in (same port, same catalog entry); swift and
    heat add their processes and catalog entries; the router listens where the catalog says."""
    from scoperouter_lab.cloud import CloudRunner, Step
    from scoperouter_lab.lab import Lab
    from scoperouter_lab.layout import LabPaths, service_types
    from scoperouter_lab.procs import ProcessTable
    from scoperouter_lab.templates import CloudContext

    def runner(services: tuple[str, ...]) -> CloudRunner:
        ctx = CloudContext(CloudSpec(1), LabPaths(tmp_path), SECRETS, routed=True)
        return CloudRunner(ctx, services, ProcessTable(tmp_path / "run"),
                           Step(lambda *a: None), proxy_env=True)  # fmt: skip

    small = runner(resolve_services(None))
    assert "block-storage" in small.process_names() and "cinder-api" not in small.process_names()
    assert set(small.service_types()) == {"identity", "image", "placement", "compute",
                                          "network", "block-storage"}  # fmt: skip
    full = runner(resolve_services("all"))
    names = full.process_names()
    assert "block-storage" not in names and "network" in names
    new = ("cinder-api", "cinder-scheduler", "cinder-volume", "swift-proxy", "swift-account",
           "swift-container", "swift-object", "heat-api", "heat-engine")  # fmt: skip
    assert set(new) <= set(names)
    assert full.service_types().count("block-storage") == 1
    assert {"object-store", "orchestration"} <= set(full.service_types())
    assert full.listen_port("cinder-api") == 8776 == small.listen_port("block-storage")
    assert full.listen_port("swift-proxy") == 8080 and full.listen_port("heat-engine") is None
    assert full.health_url("swift-object") == "http://127.0.1.2:6200/healthcheck"
    lab = Lab(tmp_path, services=resolve_services("all"), out=io.StringIO())
    ports = {port for _, port in lab.router_listens(CloudSpec(1))}
    assert {8080, 8004, 8776, 5000, 3128, 9443, 9180} <= ports
    assert service_types(("keystone",)) == ["identity", "network", "block-storage"]
    # lab status sums each service's processes over the clouds
    assert [lab._service_of(p) for p in ("cloudtwo-cinder-volume", "cloudone-swift-object",
            "cloudone-nova-api", "cloudone-router", "cloudone-network", "epmd")] == [
        "cinder", "swift", "nova", "router", "network (stand-in)", "rabbitmq"]  # fmt: skip


def test_federation_config_routes_object_storage_and_orchestration(tmp_path: Path):
    """Keystone lists swift's and heat's endpoints with the project id substituted in each
    token's catalog: the generated federation config keeps the template, and the router routes
    every project's account to its cloud's proxy."""
    clouds = [CloudSpec(1), CloudSpec(2)]
    rows = {
        c: [{"service_type": t, "interface": "public", "url": c.endpoint_url(t, True),
             "region": c.name} for t in ("identity", "object-store", "orchestration")]
        for c in clouds
    }  # fmt: skip
    path = tmp_path / "federation.yaml"
    path.write_text(files.dump(files.federation_config(rows), "# test\n"))
    catalog = load_catalog(path)
    m = catalog.match("127.0.0.3", 8080, "/v1/AUTH_0a1b/photos/cat.jpg")
    assert m is not None and (m.endpoint.cloud, m.endpoint.service_type) == (
        "CloudTwo", "object-store"
    )  # fmt: skip
    assert m.target(m.endpoint.backend) == "http://127.0.1.3:8080/v1/AUTH_0a1b/photos/cat.jpg"
    m = catalog.match("127.0.0.2", 8004, "/v1/0a1b/stacks")
    assert m is not None and m.target(m.endpoint.backend) == "http://127.0.1.2:8004/v1/0a1b/stacks"


def test_service_configs_parse_and_keep_tokens_out_of_logs(tmp_path: Path):
    """The new services' files parse as INI (swift's with paste's interpolation, so no stray
    %), swift's proxy logs no token prefix and has large objects and keystone auth, cinder runs
    its fake driver, heat its stack domain."""
    import configparser

    from scoperouter_lab import templates as T
    from scoperouter_lab.layout import LabPaths

    sec = Secrets(admin="a", demo="d", service="s", db="p", rabbit="r", router="x",
                  alt_demo="l", swift_hash="h")  # fmt: skip
    ctx = T.CloudContext(CloudSpec(1), LabPaths(tmp_path), sec, routed=True)
    proxy = configparser.ConfigParser()
    proxy.read_string(T.swift_proxy_conf(ctx))
    pipeline = proxy["pipeline:main"]["pipeline"].split()
    for needed in ("authtoken", "keystoneauth", "slo", "dlo", "proxy_logging"):
        assert needed in pipeline
    assert pipeline.index("authtoken") < pipeline.index("keystoneauth") < pipeline.index("slo")
    assert pipeline[-1] == "proxy-server"
    for section in pipeline[:-1]:
        assert f"filter:{section}" in proxy, section
    assert proxy["filter:proxy_logging"]["reveal_sensitive_prefix"] == "0"
    assert proxy["filter:keystoneauth"]["reseller_prefix"] == "AUTH_"
    assert proxy["app:proxy-server"]["account_autocreate"] == "true"
    assert proxy["DEFAULT"]["bind_ip"] == "127.0.1.2" and proxy["DEFAULT"]["mount_check"] == "false"
    for kind in ("account", "container", "object"):
        conf = configparser.ConfigParser()
        conf.read_string(T.swift_storage_conf(ctx, kind))
        assert conf["pipeline:main"]["pipeline"] == f"healthcheck {kind}-server"
    swift = configparser.ConfigParser()
    swift.read_string(T.swift_conf(ctx))
    assert swift["swift-hash"]["swift_hash_path_suffix"] == "h"
    compile(T.SWIFT_LOG_HOOK, "hook", "exec")
    cinder = configparser.ConfigParser(interpolation=None)
    cinder.read_string(T.cinder_conf(ctx))
    assert cinder["fake"]["volume_driver"] == "cinder.tests.fake_driver.FakeLoggingVolumeDriver"
    assert cinder["DEFAULT"]["enabled_backends"] == "fake"
    heat = configparser.ConfigParser(interpolation=None)
    heat.read_string(T.heat_conf(ctx))
    assert heat["DEFAULT"]["stack_user_domain_name"] == "heat"
    assert heat["trustee"]["username"] == "heat"
    assert heat["clients_keystone"]["auth_uri"] == "http://127.0.0.2:5000"
    nova = configparser.ConfigParser(interpolation=None)
    nova.read_string(T.nova_conf(ctx))
    assert nova["cinder"]["catalog_info"] == "block-storage::publicURL"
    ini = T.uwsgi_ini(ctx, "cinder-api", "cinder.wsgi.api:application", 8776, {}, 1, 2,
                      ("--config-file", "/x/cinder.conf"))  # fmt: skip
    assert "pyargv = --config-file /x/cinder.conf\n" in ini


def test_rabbit_password_hash_format():
    import base64
    import hashlib

    raw = base64.b64decode(rabbit_password_hash("secret", b"salt"))
    assert raw[:4] == b"salt"
    assert raw[4:] == hashlib.sha256(b"salt" + b"secret").digest()


def test_help_texts(capsys):
    for argv in (["lab", "--help"], ["lab", "up", "--help"], ["lab", "down", "--help"],
                 ["lab", "status", "--help"]):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            lab_main(argv)
        assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--clouds" in out and "--purge" in out and "--services" in out


def _call(method: str, url: str, body: object = None, token: str | None = None) -> tuple[int, dict]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["X-Auth-Token"] = token
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with opener.open(req, timeout=5) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _get(url: str) -> tuple[int, dict]:
    return _call("GET", url)


def test_network_stand_in_and_process_table(tmp_path: Path):
    """Start the stand-in as the lab does, query it, stop it by its PID file."""
    table = ProcessTable(tmp_path / "run")
    host, port = "127.0.0.1", _free_port()
    rec = table.start(
        "netstub",
        [sys.executable, "-m", "scoperouter_lab.netstub", "--listen", f"{host}:{port}"],
        log=tmp_path / "logs" / "netstub.log",
        fp="x",
    )
    try:
        wait_for("stand-in", lambda: port_open(host, port), 20)
        assert table.running("netstub", "x") is not None
        assert table.running("netstub", "other") is None  # a changed definition
        status, body = _get(f"http://{host}:{port}/v2.0/ports?device_id=abc")
        assert (status, body) == (200, {"ports": []})
        status, body = _get(f"http://{host}:{port}/v2.0/security-groups.json")
        assert (status, body) == (200, {"security_groups": []})
        status, body = _get(f"http://{host}:{port}/v2.0/networks/xyz")
        assert status == 404 and "NeutronError" in body
        status, body = _get(f"http://{host}:{port}/")
        assert body["versions"][0]["id"] == "v2.0"
        status, body = _call("POST", f"http://{host}:{port}/v2.0/routers", {"router": {}})
        assert status == 403 and "NeutronError" in body
        assert group_members(rec.pgid) == [rec.pid]
    finally:
        assert table.stop("netstub", timeout=10) is True
    # Gone, with every process of its group (not "its port closed": a test running beside
    # this one may bind the same free port by then, a flake seen under a parallel run).
    assert group_members(rec.pgid) == []
    assert table.get("netstub") is None
    assert table.stop("netstub") is False  # nothing left to stop


def test_network_stand_in_serves_what_nova_asks_for_a_server():
    """nova's automatic networking, call by call: find the one network a project may use, make
    a port, bind it, build the addresses, delete it with the server."""
    from scoperouter_lab.netstub import make_server

    server = make_server("127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}/v2.0"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        project = "p1"
        _, own = _get(f"{base}/networks?tenant_id={project}&shared=False&admin_state_up=True")
        _, shared = _get(f"{base}/networks?shared=True")
        assert own == {"networks": []}
        assert [n["name"] for n in shared["networks"]] == ["private"]
        net = shared["networks"][0]
        _, by_name = _get(f"{base}/networks?name=private&fields=id&fields=name")
        assert by_name == {"networks": [{"id": net["id"], "name": "private"}]}
        status, made = _call("POST", f"{base}/ports", {"port": {
            "network_id": net["id"], "tenant_id": project, "admin_state_up": True,
            "device_id": "vm-1", "device_owner": "compute:nova", "mac_address": "x"}})  # fmt: skip
        assert status == 201
        port = made["port"]
        assert port["status"] == "DOWN" and port["binding:vif_type"] == "unbound"
        assert port["mac_address"].startswith("fa:16:3e:")
        ip = port["fixed_ips"][0]["ip_address"]
        assert ip == "10.0.0.2" and port["fixed_ips"][0]["subnet_id"] == net["subnets"][0]
        _, bound = _call("PUT", f"{base}/ports/{port['id']}",
                         {"port": {"binding:host_id": "cloudone-compute"}})  # fmt: skip
        assert bound["port"]["status"] == "ACTIVE" and bound["port"]["binding:vif_type"] == "ovs"
        _, mine = _get(f"{base}/ports?device_id=vm-1")
        _, other = _get(f"{base}/ports?device_id=vm-2")
        assert [p["id"] for p in mine["ports"]] == [port["id"]] and other == {"ports": []}
        _, by_ip = _get(f"{base}/ports?fixed_ips=ip_address%3D{ip}")
        assert [p["id"] for p in by_ip["ports"]] == [port["id"]]
        _, subnets = _get(f"{base}/subnets?id={net['subnets'][0]}")
        assert subnets["subnets"][0]["cidr"] == "10.0.0.0/24"
        _, groups = _get(f"{base}/security-groups?tenant_id={project}&fields=id&fields=name")
        assert [g["name"] for g in groups["security_groups"]] == ["default"]
        assert port["security_groups"] == [groups["security_groups"][0]["id"]]
        _, second = _call("POST", f"{base}/ports", {"port": {"network_id": net["id"]}})
        assert second["port"]["fixed_ips"][0]["ip_address"] == "10.0.0.3"
        assert _call("DELETE", f"{base}/ports/{port['id']}")[0] == 204
        assert _call("DELETE", f"{base}/ports/{port['id']}")[0] == 404
        assert _get(f"{base}/ports?device_id=vm-1")[1] == {"ports": []}
        assert _call("POST", f"{base}/ports", {"port": {"network_id": "nope"}})[0] == 404
        assert _call("POST", f"{base}/ports", {"port": "x"})[0] == 400
        assert _call("DELETE", f"{base}/networks/{net['id']}")[0] == 403  # the lab's own
    finally:
        server.shutdown()
        server.server_close()


def test_network_stand_in_keeps_networks_subnets_and_ports():
    """What openstacksdk's server tests do first: a network of their own with a subnet, a
    server port on it, then everything deleted in order (neutron's 409s when out of order)."""
    from scoperouter_lab.netstub import make_server

    server = make_server("127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}/v2.0"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, made = _call("POST", f"{base}/networks", {"network": {"name": "n1"}})
        assert status == 201
        net = made["network"]
        assert (net["shared"], net["status"], net["subnets"]) == (False, "ACTIVE", [])
        body = {"name": "s1", "network_id": net["id"], "ip_version": 4, "cidr": "192.0.2.0/28"}
        _, made = _call("POST", f"{base}/subnets", {"subnet": body})
        sub = made["subnet"]
        assert sub["gateway_ip"] == "192.0.2.1"
        assert sub["allocation_pools"] == [{"start": "192.0.2.2", "end": "192.0.2.14"}]
        assert _get(f"{base}/networks/{net['id']}")[1]["network"]["subnets"] == [sub["id"]]
        _, made = _call("POST", f"{base}/ports", {"port": {"network_id": net["id"]}})
        port = made["port"]
        assert port["fixed_ips"] == [{"subnet_id": sub["id"], "ip_address": "192.0.2.2"}]
        _, renamed = _call("PUT", f"{base}/networks/{net['id']}", {"network": {"name": "n2"}})
        assert renamed["network"]["name"] == "n2"
        bad = _call("PUT", f"{base}/subnets/{sub['id']}", {"subnet": {"cidr": "10.9.0.0/24"}})
        assert bad[0] == 400
        assert _call("DELETE", f"{base}/subnets/{sub['id']}")[0] == 409
        assert _call("DELETE", f"{base}/networks/{net['id']}")[0] == 409
        assert _call("DELETE", f"{base}/ports/{port['id']}")[0] == 204
        assert _call("DELETE", f"{base}/networks/{net['id']}")[0] == 204
        assert _get(f"{base}/subnets/{sub['id']}")[0] == 404  # went with its network
        bad = _call("POST", f"{base}/subnets", {"subnet": {"network_id": "x", "cidr": "1/2"}})
        assert bad[0] == 404
    finally:
        server.shutdown()
        server.server_close()


class _Keystone(BaseHTTPRequestHandler):
    """keystone's token validation for a token validating itself: ``tok-<project>`` is a token
    of that project; anything else is not a token (404, as keystone answers)."""

    asked: list[str] = []

    def do_GET(self) -> None:
        token, subject = self.headers.get("X-Auth-Token"), self.headers.get("X-Subject-Token")
        self.asked.append(self.path)
        if self.path == "/v3/auth/tokens" and token == subject and str(token).startswith("tok-"):
            body = json.dumps({"token": {"project": {"id": token[4:]}}}).encode()
            self.send_response(200)
        else:
            body = b'{"error": {"code": 404}}'
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_network_stand_in_keeps_security_groups_and_their_rules():
    """What openstack.cloud's security_group and security_group_rule modules and nova ask: a
    group made with a token (no project named: the token's, from keystone), found by name in
    its project as nova looks it up, rules added (a repeated one is 409), shown with the
    group, removed; a group a port uses cannot go; deleted with its rules."""
    from scoperouter_lab.netstub import make_server

    keystone = ThreadingHTTPServer(("127.0.0.1", 0), _Keystone)
    threading.Thread(target=keystone.serve_forever, daemon=True).start()
    server = make_server(
        "127.0.0.1", 0, keystone=f"http://127.0.0.1:{keystone.server_address[1]}/v3"
    )
    base = f"http://127.0.0.1:{server.server_address[1]}/v2.0"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        made = _call("POST", f"{base}/security-groups",
                     {"security_group": {"name": "web", "description": "d"}}, "tok-p1")  # fmt: skip
        assert made[0] == 201, made
        group = made[1]["security_group"]
        assert (group["project_id"], group["tenant_id"], group["name"]) == ("p1", "p1", "web")
        egress = group["security_group_rules"]
        assert sorted(r["ethertype"] for r in egress) == ["IPv4", "IPv6"]
        assert {r["direction"] for r in egress} == {"egress"}
        # the token was asked about once: a second create is answered from memory
        _call("POST", f"{base}/security-groups", {"security_group": {"name": "x"}}, "tok-p1")
        assert _Keystone.asked == ["/v3/auth/tokens"]
        # nova: the group by name among the instance's project's (fields id and name)
        _, found = _get(f"{base}/security-groups?name=web&tenant_id=p1&fields=id")
        assert found == {"security_groups": [{"id": group["id"]}]}
        assert _get(f"{base}/security-groups?name=web&tenant_id=p2")[1] == {"security_groups": []}
        assert _get(f"{base}/security-groups/web")[0] == 404  # openstacksdk's find: id first
        rule = {
            "security_group_id": group["id"],
            "direction": "ingress",
            "protocol": "tcp",
            "port_range_min": 22,
            "port_range_max": 22,
            "remote_ip_prefix": "0.0.0.0/0",
        }
        status, made = _call("POST", f"{base}/security-group-rules",
                             {"security_group_rule": rule}, "tok-p1")  # fmt: skip
        assert status == 201, made
        added = made["security_group_rule"]
        assert added["ethertype"] == "IPv4" and added["project_id"] == "p1"
        again = _call("POST", f"{base}/security-group-rules", {"security_group_rule": rule})
        assert again[0] == 409 and added["id"] in again[1]["NeutronError"]["message"]
        wrong = {**rule, "port_range_min": 30, "port_range_max": 20}
        assert (
            _call("POST", f"{base}/security-group-rules", {"security_group_rule": wrong})[0] == 400
        )
        nowhere = {**rule, "security_group_id": "nope"}
        assert (
            _call("POST", f"{base}/security-group-rules", {"security_group_rule": nowhere})[0]
            == 404
        )
        _, shown = _get(f"{base}/security-groups/{group['id']}")
        ingress = [r for r in shown["security_group"]["security_group_rules"]
                   if r["direction"] == "ingress"]  # fmt: skip
        assert [r["id"] for r in ingress] == [added["id"]] and ingress[0]["port_range_min"] == 22
        assert _get(f"{base}/security-group-rules/{added['id']}")[1]["security_group_rule"] == added
        listed = _get(
            f"{base}/security-group-rules?security_group_id={group['id']}&direction=ingress"
        )
        assert [r["id"] for r in listed[1]["security_group_rules"]] == [added["id"]]
        renamed = _call("PUT", f"{base}/security-groups/{group['id']}",
                        {"security_group": {"description": "new"}})  # fmt: skip
        assert renamed[1]["security_group"]["description"] == "new"
        assert _call("DELETE", f"{base}/security-group-rules/{added['id']}")[0] == 204
        _, shown = _get(f"{base}/security-groups/{group['id']}")
        assert len(shown["security_group"]["security_group_rules"]) == 2  # the egress rules
        # nova's port of a server booted in the group: the group stays while the port does
        net = _get(f"{base}/networks?name=private")[1]["networks"][0]
        port = _call("POST", f"{base}/ports", {"port": {"network_id": net["id"], "tenant_id": "p1",
                     "security_groups": [group["id"]]}})[1]["port"]  # fmt: skip
        assert port["security_groups"] == [group["id"]]
        assert _call("DELETE", f"{base}/security-groups/{group['id']}")[0] == 409
        assert _call("DELETE", f"{base}/ports/{port['id']}")[0] == 204
        assert _call("DELETE", f"{base}/security-groups/{group['id']}")[0] == 204
        assert _get(f"{base}/security-groups/{group['id']}")[0] == 404
        assert _get(f"{base}/security-group-rules?security_group_id={group['id']}")[1] == {
            "security_group_rules": []
        }  # its rules went with it
        # a token keystone does not know: 401; a body naming its project needs no token
        bad = _call("POST", f"{base}/security-groups", {"security_group": {"name": "y"}}, "bad")
        assert bad[0] == 401
        named = {"security_group": {"name": "z", "project_id": "p3"}}
        assert (
            _call("POST", f"{base}/security-groups", named)[1]["security_group"]["project_id"]
            == "p3"
        )
    finally:
        server.shutdown()
        server.server_close()
        keystone.shutdown()
        keystone.server_close()


def test_stop_ignores_a_reused_pid(tmp_path: Path):
    """A PID file whose process is gone (or whose PID now belongs to another process) is never
    signalled."""
    table = ProcessTable(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)  # fmt: skip
    try:
        rec = table.start("sleeper", [sys.executable, "-c", "pass"], log=tmp_path / "s.log")
        # forge: point the record at our unrelated sleeper, with the wrong start time
        data = json.loads(table.path("sleeper").read_text())
        data.update(pid=proc.pid, pgid=proc.pid, started=rec.started + 12345)
        table.path("sleeper").write_text(json.dumps(data))
        assert table.stop("sleeper", timeout=1) is False
        time.sleep(0.2)
        assert proc.poll() is None  # still alive: not ours, not signalled
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_block_storage_stand_in_answers_reads_like_an_empty_cinder():
    from scoperouter_lab.blockstub import answer

    base = "http://127.0.0.2:8776"
    status, body = answer("/", {}, base)
    assert status == 300 and body["versions"][0]["version"] == "3.71"
    assert answer("/v3/", {}, base)[1]["version"]["min_version"] == "3.0"
    assert answer("/v3/volumes/detail", {}, base) == (200, {"volumes": []})
    project = "0123456789abcdef0123456789abcdef"
    assert answer(f"/v3/{project}/snapshots", {}, base) == (200, {"snapshots": []})
    quota = answer(f"/v3/os-quota-sets/{project}", {"usage": ["True"]}, base)[1]["quota_set"]
    assert quota["volumes"] == {"limit": -1, "in_use": 0, "reserved": 0}
    assert answer(f"/v3/os-quota-sets/{project}", {}, base)[1]["quota_set"]["gigabytes"] == -1
    zones = answer("/v3/os-availability-zone", {}, base)[1]["availabilityZoneInfo"]
    assert zones == [{"zoneName": "nova", "zoneState": {"available": True}}]
    status, body = answer("/v3/volumes/abc", {}, base)
    assert status == 404 and body["itemNotFound"]["code"] == 404


def test_templates_hold_no_machine_specific_path(tmp_path: Path):
    """Every path in a rendered config comes from the lab directory; nothing names this
    machine (a home, a checkout) in the templates or anywhere in the lab's source."""
    import scoperouter_lab
    from scoperouter_lab import templates as T
    from scoperouter_lab.layout import LabPaths

    ctx = T.CloudContext(CloudSpec(1), LabPaths(tmp_path / "lab"), SECRETS, routed=True)
    uwsgi = T.uwsgi_ini(ctx, "keystone", "keystone.wsgi.api:application", 5000, {})
    rendered = [
        *(f(ctx) for f in (T.keystone_conf, T.glance_conf, T.placement_conf, T.nova_conf)),
        *(f(ctx) for f in (T.nova_db_conf, T.nova_cell0_map_conf, T.cinder_conf, T.heat_conf)),
        T.swift_proxy_conf(ctx),
        T.swift_storage_conf(ctx, "object"),
        uwsgi,
    ]
    machine = [str(Path.home()), "/work/", str(Path(__file__).resolve().parents[2])]
    for text in rendered:
        assert str(tmp_path / "lab") in text or "[database]" in text
        for marker in machine:
            assert marker not in text, marker
    source = Path(scoperouter_lab.__file__).parent
    for path in source.glob("*.py"):
        for marker in ("/work/", "/root/", "/home/"):
            assert marker not in path.read_text(), f"{path.name} names {marker}"


def test_the_router_does_not_need_the_lab():
    """The lab is its own package (lab/): nothing in scoperouter imports it but the CLI's
    optional `lab` subcommand."""
    import scoperouter

    pkg = Path(scoperouter.__file__).parent
    users = sorted(
        str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if "scoperouter_lab" in p.read_text()
    )
    assert users == ["cli/__init__.py"]
    assert not (pkg / "lab").exists()


def test_scoperouter_lab_without_the_lab_package_says_how_to_get_it(monkeypatch, capsys):
    import importlib.util

    from scoperouter import cli

    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "scoperouter_lab" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert cli.main(["lab", "up", "--clouds", "2"]) == 1
    err = capsys.readouterr().err
    assert "the lab is not installed" in err and "pip install -e ./lab" in err


def test_cell0_is_mapped_from_a_config_file_not_a_command_line(tmp_path: Path):
    """nova-manage maps cell0 to `[database] connection` + "_cell0": the short-lived config
    file names the database whose "_cell0" twin is the lab's cell0 database, so the database
    URL (and its password) never appears on a command line, which the setup log records."""
    import configparser

    from scoperouter_lab import templates as T
    from scoperouter_lab.layout import LabPaths

    ctx = T.CloudContext(CloudSpec(1), LabPaths(tmp_path), SECRETS, routed=True)
    conf = configparser.ConfigParser()
    conf.read_string(T.nova_cell0_map_conf(ctx))
    assert conf["database"]["connection"] + "_cell0" == ctx.db_url("nova_cell0")


def test_dropin_environment_reads_systemd_environment_lines(tmp_path: Path):
    from scoperouter_lab.cloud import dropin_environment

    assert dropin_environment(tmp_path / "missing.service.d") == {}
    d = tmp_path / "cloudone-glance.service.d"
    d.mkdir()
    (d / "10-other.conf").write_text("[Service]\nEnvironment=A=1 B=2\nUser=nobody\n")
    (d / "scoperouter.conf").write_text(
        "# comment\n[Service]\n"
        'Environment="HTTP_PROXY=http://127.0.0.2:3128" "http_proxy=http://127.0.0.2:3128"\n'
        'Environment="NO_PROXY=localhost,127.0.0.1" B=3\n'
    )
    (d / "ignored.txt").write_text("Environment=C=4\n")
    assert dropin_environment(d) == {
        "A": "1",
        "B": "3",  # later files and lines win, as in systemd
        "HTTP_PROXY": "http://127.0.0.2:3128",
        "http_proxy": "http://127.0.0.2:3128",
        "NO_PROXY": "localhost,127.0.0.1",
    }
    (d / "zz-reset.conf").write_text("[Service]\nEnvironment=\n")
    assert dropin_environment(d) == {}


def test_a_state_from_another_version_of_the_lab_is_read(tmp_path: Path):
    """A lab directory left by another version of the lab (a service this one does not run, a
    secret it does not know) is read, not refused: CI's `lab up` met one (a TypeError)."""
    from scoperouter_lab.lab import Lab

    state = {
        "clouds": 2,
        "services": ["keystone", "glance", "no-such-service"],
        "secrets": {"db": "p", "rabbit": "r"},
        "cloud_secrets": {"cloudone": {"admin": "a", "no_such_secret": "z"}},
    }
    (tmp_path / "lab.json").write_text(json.dumps(state))
    lab = Lab(tmp_path, out=io.StringIO())
    assert lab.services == ("keystone", "glance")
    sec = lab.secrets()
    assert (sec.admin, sec.db, sec.rabbit) == ("a", "p", "r")
    assert sec.demo and sec.router and sec.alt_demo  # made for what the state lacked
    assert lab.state["cloud_secrets"]["cloudone"]["no_such_secret"] == "z"  # kept for its owner


def _commands_of(text: str) -> list[list[str]]:
    """The shell commands of `lab up`'s closing lines (not comments, exports or labels)."""
    import shlex

    out = []
    for line in text.splitlines():
        line = line.strip()
        for label in ("Status:", "Stop:"):  # "Status: CMD     Stop: CMD"
            line = line.replace(label, "\n")
        for part in line.split("\n"):
            part = part.strip()
            if not part or part.startswith(
                ("#", "export ", "Next:", "Logs:", "Federation", "NOTE")
            ):
                continue
            if part.endswith("\\") or part.startswith("server create"):
                continue  # a continued line: its head is checked
            out.append(shlex.split(part.split("$(")[0]))
    return out


@pytest.mark.parametrize("on_path", [False, True])
def test_lab_up_prints_only_commands_that_run_as_printed(tmp_path: Path, monkeypatch, on_path):
    """`lab up`'s closing lines name programs a shell finds: scoperouter's venv is often not on
    PATH (then the absolute path is printed); every scoperouter command printed parses."""
    from scoperouter_lab.layout import LabPaths
    from scoperouter_lab.nextsteps import Commands, next_steps

    bin_dir = Path(sys.executable).parent  # this venv: scoperouter and openstack are here
    monkeypatch.setenv("PATH", str(bin_dir) if on_path else "/usr/bin:/bin")
    cmd = Commands.find(bin_dir, LabPaths(tmp_path))
    text = next_steps(
        [CloudSpec(1), CloudSpec(2)],
        ("keystone", "glance", "placement", "nova"),
        LabPaths(tmp_path),
        True,
        cmd,
    )
    commands = _commands_of(text)
    names = {"scoperouter"} | ({"openstack"} if cmd.openstack else set())
    assert {c[0] for c in commands if c[0] != cmd.lab_openstack} == (
        names if on_path else {str(bin_dir / n) for n in names}
    )
    for argv in commands:
        assert shutil.which(argv[0]), argv  # a shell with this PATH finds it
    lab_commands = [c for c in commands if c[0].endswith("scoperouter")]
    assert [c[1:] for c in lab_commands] == [["lab", "status"], ["lab", "down"]]
    for argv in lab_commands:
        done = subprocess.run(
            [*argv, "--help"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "PATH": str(bin_dir)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_lab_up_prints_no_step_for_a_service_it_does_not_run(tmp_path: Path):
    from scoperouter_lab.layout import LabPaths
    from scoperouter_lab.nextsteps import Commands, next_steps

    cmd = Commands(scoperouter="scoperouter", openstack="openstack", lab_openstack="x")
    clouds = [CloudSpec(1), CloudSpec(2)]
    no_nova = next_steps(clouds, ("keystone", "glance"), LabPaths(tmp_path), True, cmd)
    assert "image list" in no_nova and "server create" not in no_nova
    keystone = next_steps(clouds, ("keystone",), LabPaths(tmp_path), True, cmd)
    assert "image" not in keystone and "token issue" in keystone
    everything = next_steps(clouds, ("keystone", "glance", "nova"), LabPaths(tmp_path), True, cmd)
    assert everything.count("server create") == 2  # local, then the headline


def test_a_tls_lab_serves_and_trusts_https_everywhere(tmp_path: Path):
    """`lab up --tls`: every endpoint https (uWSGI's https-socket, the stand-ins', swift's
    proxy) with the cloud's backend certificate; the services call through their router with
    HTTPS_PROXY too and trust the bundle of the lab's CA and their interception CA (drop-in
    environment and configs' cafile); the routers' frontends https with their certificates,
    their forward proxies intercepting with the cloud's CA, upstreams verified with the lab's
    CA; clouds.yaml names it; the certificates verify for their addresses."""
    import configparser
    import ssl

    from cryptography import x509
    from scoperouter_lab import pki
    from scoperouter_lab import templates as T
    from scoperouter_lab.cloud import CloudRunner, Step
    from scoperouter_lab.layout import LabPaths
    from scoperouter_lab.procs import ProcessTable

    from scoperouter import pki as core_pki

    paths = LabPaths(tmp_path)
    one, two = CloudSpec(1, tls=True), CloudSpec(2, tls=True)
    pki.tls_files(paths, [one, two])
    made = {p.name: p.read_bytes() for p in paths.pki.iterdir()}
    pki.tls_files(paths, [one, two])  # kept while valid
    assert {p.name: p.read_bytes() for p in paths.pki.iterdir()} == made
    assert paths.tls_files(one, "proxy-ca")[1].stat().st_mode & 0o777 == 0o600
    for cloud in (one, two):
        for what, host in (("backend", cloud.back_ip), ("frontend", cloud.front_ip)):
            cert, key = paths.tls_files(cloud, what)
            assert key.stat().st_mode & 0o777 == 0o600
            loaded = x509.load_pem_x509_certificate(cert.read_bytes())
            assert core_pki.addresses_of(loaded) == {host}
            ssl.create_default_context(cafile=str(paths.ca_cert)).load_cert_chain(cert, key)
        proxy_ca = paths.tls_files(cloud, "proxy-ca")[0].read_bytes()
        assert paths.trust_bundle(cloud).read_bytes() == paths.ca_cert.read_bytes() + proxy_ca
    assert one.endpoint_url("image", True) == "https://127.0.0.2:9292"
    assert one.backend_endpoint("identity") == "https://127.0.1.2:5000/v3"

    ctx = T.CloudContext(one, paths, SECRETS, routed=True)
    cert, key = paths.tls_files(one, "backend")
    ini = T.uwsgi_ini(ctx, "glance", "glance.wsgi.api:application", 9292, {}, 1, 4)
    assert f"https-socket = 127.0.1.2:9292,{cert},{key}\n" in ini and "\nhttp-socket" not in ini
    nova = configparser.ConfigParser(interpolation=None)
    nova.read_string(T.nova_conf(ctx))
    # trust comes from the environment only (REQUESTS_CA_BUNDLE, below): a drop-in decides
    assert not [s for s in nova.sections() if "cafile" in nova[s]]
    assert nova["keystone_authtoken"]["auth_url"] == "https://127.0.0.2:5000/v3"
    swift = configparser.ConfigParser(interpolation=None)
    swift.read_string(T.swift_proxy_conf(ctx))
    assert swift["DEFAULT"]["cert_file"] == str(cert)
    assert "cert_file" not in T.swift_storage_conf(ctx, "object")  # only the proxy reaches them

    runner = CloudRunner(ctx, resolve_services(None), ProcessTable(tmp_path / "run"),
                         Step(lambda *a: None), proxy_env=True)  # fmt: skip
    env = runner.env("glance")
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://127.0.0.2:3128"
    assert env["REQUESTS_CA_BUNDLE"] == env["SSL_CERT_FILE"] == str(paths.trust_bundle(one))
    assert runner.health_url("glance") == "https://127.0.1.2:9292/"
    assert runner.health_url("swift-object").startswith("http://")
    argv, _ = runner._spec("network")
    assert argv[-4:] == ["--tls-cert", str(cert), "--tls-key", str(key)]
    plain = CloudRunner(T.CloudContext(CloudSpec(1), paths, SECRETS, routed=True),
                        resolve_services(None), ProcessTable(tmp_path / "run"),
                        Step(lambda *a: None), proxy_env=True)  # fmt: skip
    assert (
        "HTTPS_PROXY" not in plain.env("glance") and "--tls-cert" not in plain._spec("network")[0]
    )

    rows = {
        c: [{"service_type": t, "interface": "public", "url": c.endpoint_url(t, True),
             "region": c.name} for t in ("identity", "image")]
        for c in (one, two)
    }  # fmt: skip
    fed = files.federation_config(rows, paths=paths)
    assert fed["settings"]["ca_bundle"] == str(paths.ca_cert)
    config = fed["clouds"]["CloudOne"]
    fronts = config["frontends"]
    assert all(f["url"].startswith("https://127.0.0.2:") for f in fronts)
    front_cert = paths.tls_files(one, "frontend")[0]
    assert {f["tls"]["cert"] for f in fronts} == {str(front_cert)}
    ca, ca_key = paths.tls_files(one, "proxy-ca")
    assert config["proxy"] == {"listen": "127.0.0.2:3128", "ca": str(ca), "ca_key": str(ca_key)}
    assert config["services"]["image"]["public"] == {
        "url": "https://127.0.0.2:9292", "backend": "https://127.0.1.2:9292"
    }  # fmt: skip
    stype, port = files.MISMATCH_SERVICE
    assert config["services"][stype]["public"]["backend"] == f"https://127.0.1.2:{port}"
    assert stype not in fed["clouds"]["CloudTwo"]["services"]
    path = tmp_path / "federation.yaml"
    path.write_text(files.dump(fed, "# test\n"))
    load_catalog(path)  # the router's own loader accepts it (the files exist)
    entries = files.clouds_config([one, two], SECRETS, True, paths.ca_cert)["clouds"]
    assert {e["cacert"] for e in entries.values()} == {str(paths.ca_cert)}
    router, _ = files.router_clouds_config([two], SECRETS, True, paths.ca_cert)
    assert router["clouds"]["cloudtwo-router"]["cacert"] == str(paths.ca_cert)


def test_the_endpoints_of_services_no_longer_run_follow_the_labs_mode(tmp_path: Path):
    """A lab that ran more services keeps their endpoints in the catalog; `lab up --tls` /
    `--no-tls` / `--no-router` move them like the others (scheme, router or backend address),
    so the catalog import sees one consistent catalog; other regions' and hosts' are left."""
    from scoperouter_lab.cloud import CloudRunner, Step
    from scoperouter_lab.layout import LabPaths
    from scoperouter_lab.procs import ProcessTable
    from scoperouter_lab.templates import CloudContext

    class Catalog:
        def __init__(self, rows: list[dict[str, str]]) -> None:
            self.rows = {r["id"]: r for r in rows}

        def call(self, method: str, url: str, body: dict | None = None) -> dict:
            if method == "GET":
                return {"endpoints": list(self.rows.values())}
            assert method == "PATCH" and body is not None
            self.rows[url.rsplit("/", 1)[1]]["url"] = body["endpoint"]["url"]
            return {}

    rows = [
        {"id": "a", "region_id": "CloudOne", "url": "http://127.0.0.2:8080/v1/AUTH_%(project_id)s"},
        {"id": "b", "region_id": "CloudOne", "url": "https://127.0.0.2:9292"},
        {"id": "c", "region_id": "CloudOne", "url": "http://127.0.1.2:8004/v1/%(project_id)s"},
        {"id": "d", "region_id": "CloudTwo", "url": "http://127.0.0.3:8080/v1/AUTH_x"},
        {"id": "e", "region_id": "CloudOne", "url": "http://203.0.113.9:8080"},
    ]
    catalog = Catalog([dict(r) for r in rows])
    modes = ((True, True, "https://127.0.0.2:"), (False, False, "http://127.0.1.2:"),
             (True, False, "https://127.0.1.2:"), (False, True, "http://127.0.0.2:"))  # fmt: skip
    for tls, routed, want in modes:
        ctx = CloudContext(CloudSpec(1, tls=tls), LabPaths(tmp_path), SECRETS, routed=routed)
        runner = CloudRunner(ctx, resolve_services(None), ProcessTable(tmp_path / "run"),
                             Step(lambda *a: None), proxy_env=routed)  # fmt: skip
        runner._align_endpoints(catalog)  # type: ignore[arg-type]
        urls = {i: r["url"] for i, r in catalog.rows.items()}
        assert all(urls[i].startswith(want) for i in "abc"), urls
        assert urls["a"] == want + "8080/v1/AUTH_%(project_id)s"
        assert urls["b"] == want + "9292"
        assert (urls["d"], urls["e"]) == (rows[3]["url"], rows[4]["url"])
