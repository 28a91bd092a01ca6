"""Every router-to-router hop of the lab is TLS, verified with the lab's own CA: a call scoped to
the other cloud crosses the peer link (CloudOne's access line targets CloudTwo's https peer
address, CloudTwo's line has the same request id), no router of the lab sent a hop anywhere
else, and a router that trusts another CA refuses the link with a clear error."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from scoperouter_lab import pki

from scoperouter.client import scope_session

pytestmark = pytest.mark.e2e

STRANGER = "127.0.0.52"  # a second router of CloudOne, trusting another CA
ROUTER = [sys.executable, "-m", "scoperouter.cli", "serve"]


def access_lines(lab: Any, cloud: str) -> list[dict[str, Any]]:
    path = lab.paths.log(next(c for c in lab.clouds if c.name == cloud), "router")
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"scoperouter.access"' in line:
            lines.append(json.loads(line))
    return lines


def wait_for_line(lab: Any, cloud: str, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10  # access lines are written in batches (<= 0.5 s late)
    while True:
        found = [e for e in access_lines(lab, cloud) if e.get("request_id") == request_id]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            pytest.fail(f"no access line {request_id} in {cloud}'s router log")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def federation(lab: Any) -> dict[str, Any]:
    if lab.clouds_override is not None:
        pytest.skip("routers of another federation (playbooks/federation.yml): not the lab's")
    data: dict[str, Any] = yaml.safe_load(lab.paths.federation_yaml.read_text())
    return data


def test_the_lab_turns_tls_on_between_its_routers(lab: Any, fed: Any, federation: Any) -> None:
    ca = federation["settings"]["peers"]["ca"]
    assert Path(ca).is_file() and Path(ca).parent == lab.paths.pki
    assert not federation["settings"]["peers"].get("plain", False)
    for cloud in lab.clouds:
        peer = federation["clouds"][cloud.name]["peer"]
        assert peer["url"] == cloud.peer_url
        assert Path(peer["tls"]["key"]).stat().st_mode & 0o077 == 0, "a key readable by others"


def test_a_scoped_call_crosses_the_tls_peer_link(lab: Any, fed: Any, federation: Any) -> None:
    one, two, tiny = fed
    conn = lab.connect(one.slug)
    scope_session(conn.session, json.dumps({"image": two.name}), default_cloud=one.region)
    response = conn.session.get(
        "/v2/images", endpoint_filter={"service_type": "image", "interface": "public"}
    )
    assert response.status_code == 200
    assert tiny[two.name] in {image["id"] for image in response.json()["images"]}
    request_id = response.headers["X-Scope-Request-Id"]
    sent = wait_for_line(lab, one.name, request_id)
    assert sent["decision"] == "remote" and sent["cloud"] == two.name
    assert sent["target"].startswith(two.peer_url + "/"), sent
    received = wait_for_line(lab, two.name, request_id)
    assert received["status"] == 200 and received["decision"] == "local", received


def running_since(lab: Any, cloud: Any) -> str:
    """When the cloud's running router started, as the log's ``ts`` (UTC, same format): the
    log keeps the lines of routers the lab ran before (a lab without peer links, say)."""
    record = json.loads((lab.paths.run / f"{cloud.slug}-router.pid").read_text())
    return datetime.fromtimestamp(record["when"], UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_every_hop_between_the_lab_routers_was_tls(lab: Any, fed: Any, federation: Any) -> None:
    """Whatever the suite sent so far (the CLI's calls, nova's and glance's through the
    forward proxies, token validations): every hop to another router went to its peer link."""
    peers = {c.peer_url for c in lab.clouds}
    hops = [
        e
        for c in lab.clouds
        for e in access_lines(lab, c.name)
        if e["decision"] == "remote" and e["ts"] >= running_since(lab, c)
    ]
    assert hops, "no hop between routers in the logs"
    elsewhere = [e for e in hops if not any(e["target"].startswith(p + "/") for p in peers)]
    assert not elsewhere, elsewhere[:3]


@pytest.fixture
def stranger(lab: Any, fed: Any, federation: Any, tmp_path: Path) -> Iterator[str]:
    """A second router of CloudOne on another address whose config trusts a CA of its own:
    the lab's federation config, CloudOne's addresses moved to STRANGER."""
    one = fed[0]
    text = lab.paths.federation_yaml.read_text().replace(f"{one.front_ip}:", f"{STRANGER}:")
    config: dict[str, Any] = yaml.safe_load(text)
    config["settings"]["peers"]["ca"] = str(pki.make_ca(tmp_path, "stranger-ca")[0])
    config["clouds"][one.name].pop("proxy", None)
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config))
    image = next(f["url"] for f in config["clouds"][one.name]["frontends"] if ":9292" in f["url"])
    log = (tmp_path / "router.log").open("wb")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.Popen(
        [*ROUTER, "--config", str(path), "--cloud", one.name, "--workers", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((STRANGER, 9292), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail((tmp_path / "router.log").read_text()[-3000:])
                time.sleep(0.2)
        yield image
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def test_a_router_with_another_ca_refuses_the_link_clearly(stranger: str, fed: Any) -> None:
    two = fed[1]
    parts = urlsplit(stranger)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.request("GET", "/v2/images", headers={"X-Scope": json.dumps({"image": two.name})})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 502, body[:300]
    error = json.loads(body)["error"]
    assert error["code"] == 502
    assert two.name in error["message"]
    assert "TLS certificate verification failed" in error["message"], error
