"""The status page (/status, /status.json) of real routers, and `scoperouter status` across them:
two clouds with small backends, a third (named like markup) whose router is nowhere."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .backends import EchoBackend
from .routers import (
    Router,
    cloud_entry,
    free_port,
    metric,
    request,
    scoperouter_command,
    start_all,
    stop_all,
    write_config,
)

pytestmark = pytest.mark.integration

ONE, TWO, NOWHERE = "127.0.0.90", "127.0.0.91", "127.0.0.92"
HOSTILE = "<script>alert`1`</script>"  # a valid cloud name: data, never markup
WAIT = 30.0  # seconds: a sample every 5 s, the page refreshes from the newest


@dataclass
class Federation:
    config: Path
    routers: dict[str, Router]
    status: dict[str, str]  # cloud -> http://host:port of its metrics listener
    urls: dict[str, str]  # cloud -> its image frontend
    backends: dict[str, EchoBackend]


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Federation]:
    backends = {
        "CloudOne": EchoBackend("127.0.1.90", name="One-image").start(),
        "CloudTwo": EchoBackend("127.0.1.91", name="Two-image").start(),
    }
    clouds: dict[str, Any] = {}
    ports, status, urls = {}, {}, {}
    for name, host in (("CloudOne", ONE), ("CloudTwo", TWO)):
        port, metrics_port = free_port(host), free_port(host)
        entry = cloud_entry(host, {"image": (port, "", backends[name].url)})
        entry["metrics"] = {"listen": f"{host}:{metrics_port}"}
        clouds[name] = entry
        ports[name] = port
        status[name] = f"http://{host}:{metrics_port}"
        urls[name] = f"http://{host}:{port}"
    clouds[HOSTILE] = cloud_entry(
        NOWHERE, {"image": (free_port(NOWHERE), "", "http://127.0.1.92:9")}
    )
    config = write_config(
        tmp_path / "federation.yaml",
        clouds,
        peer_connect_timeout=1,
        breaker={"failures": 1, "down_for": 60},
    )
    routers = {
        name: Router(name, config, tmp_path / f"{name}.log", [(host, ports[name])])
        for name, host in (("CloudOne", ONE), ("CloudTwo", TWO))
    }
    start_all(routers.values())
    try:
        yield Federation(config, routers, status, urls, backends)
    finally:
        stop_all(routers.values())
        for backend in backends.values():
            backend.stop()


def until(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(0.5)


def document(fed: Federation, cloud: str) -> dict[str, Any]:
    reply = request("GET", fed.status[cloud] + "/status.json")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    doc: dict[str, Any] = reply.json()
    return doc


def scoped(fed: Federation, cloud: str, target: str) -> int:
    headers = {"X-Scope": json.dumps({"image": target})}
    return request("GET", fed.urls[cloud] + "/v2/images", headers=headers).status


def cli(fed: Federation, *args: str) -> tuple[int, dict[str, Any], str]:
    command = [*scoperouter_command(), "status", "--config", str(fed.config), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    doc = json.loads(done.stdout) if "--json" in args else {}
    return done.returncode, doc, done.stdout + done.stderr


def test_the_status_page_shows_the_router_its_traffic_and_upstreams(
    federation: Federation,
) -> None:
    fed = federation
    for _ in range(20):
        assert scoped(fed, "CloudOne", "CloudOne") == 200
        assert scoped(fed, "CloudOne", "CloudTwo") == 200
    assert scoped(fed, "CloudOne", "Nowhere") == 400  # an unknown cloud: a refusal
    doc = until(
        "the requests in CloudOne's status",
        lambda: (d := document(fed, "CloudOne"))["traffic"].get("requests", 0) >= 41 and d,
    )
    assert doc["cloud"] == "CloudOne" and doc["status"] == "ok"
    assert doc["workers"]["running"] == doc["workers"]["wanted"] == 1
    assert doc["config"]["generation"] == 1
    assert doc["config"]["digest"] == document(fed, "CloudTwo")["config"]["digest"]
    routes = {(r["service"], r["cloud"]): r for r in doc["routes"]}
    assert routes[("image", "CloudOne")]["requests"] == 20
    assert routes[("image", "CloudTwo")]["requests"] == 20
    assert doc["traffic"]["requests_per_second"] > 0 and doc["traffic"]["error_ratio"] == 0
    assert 0 < doc["traffic"]["p50_seconds"] <= doc["traffic"]["p99_seconds"]
    assert {"reason": "unknown_cloud", "count": 1.0, "total": 1.0} in doc["refusals"]
    upstreams = {u["upstream"]: u for u in doc["upstreams"]}
    assert upstreams[fed.backends["CloudOne"].url]["kind"] == "backend"
    peers = {u["cloud"]: u for u in doc["upstreams"] if u["kind"] == "peer"}
    assert set(peers) == {"CloudTwo", HOSTILE}
    assert peers["CloudTwo"]["up"] and not peers["CloudTwo"]["breaker_open"]
    assert doc["peer_links"] == {"up": 2, "total": 2} and doc["breakers_open"] == 0
    assert doc["certificates"] == []  # no TLS in this federation
    # the page: the same data, the hostile name as text, nothing loaded from elsewhere
    page = request("GET", fed.status["CloudOne"] + "/status")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    html = page.body.decode()
    assert HOSTILE not in html and "&lt;script&gt;alert`1`&lt;/script&gt;" in html
    assert 'data-cloud="CloudTwo" data-kind="peer"' in html
    assert "http://" + ONE not in html.replace(fed.status["CloudOne"], "")  # no self links
    # the connections CloudOne keeps to CloudTwo's router (idle after the requests)
    opened = f'scoperouter_upstream_connections{{state="open",upstream="{fed.urls["CloudTwo"]}"}}'
    idle = opened.replace('state="open"', 'state="idle"')
    until("CloudOne's idle connections to CloudTwo", lambda: metric(fed.status["CloudOne"], idle))
    assert metric(fed.status["CloudOne"], opened) >= metric(fed.status["CloudOne"], idle) >= 1
    # the contract's metrics, every series there
    metrics = request("GET", fed.status["CloudOne"] + "/metrics").body.decode()
    for name in (
        'scoperouter_workers{state="running"} 1.0',
        'scoperouter_workers{state="wanted"} 1.0',
        "scoperouter_worker_restarts_total 0.0",
        "scoperouter_config_generation 1.0",
        f'scoperouter_config_info{{digest="{doc["config"]["digest"]}"}} 1.0',
        'scoperouter_build_info{build="pure"',
        "scoperouter_config_loaded_timestamp_seconds ",
        f'scoperouter_breaker_open{{upstream="{fed.backends["CloudOne"].url}"}} 0.0',
        f'scoperouter_upstream_connections{{state="open",upstream="{fed.urls["CloudTwo"]}"}}',
        'scoperouter_refusals_total{reason="unknown_cloud"} 1.0',
        'scoperouter_refusals_total{reason="timeout"} 0.0',
        "scoperouter_interception_certificates_minted_total 0.0",
        "scoperouter_interception_cache_size 0.0",
    ):
        assert name in metrics, name


def test_status_across_clouds_follows_a_backend_and_a_router_going_down(
    federation: Federation,
) -> None:
    fed = federation
    code, doc, out = cli(fed)
    assert code == 0, out
    assert "| CloudOne" in out and "| CloudTwo" in out and "unmonitored" in out
    code, doc, out = cli(fed, "--json")
    assert code == 0 and doc["ok"] and doc["problems"] == [] and doc["skew"] == [], out
    rows = {row["cloud"]: row for row in doc["clouds"]}
    assert rows["CloudOne"]["router"] == rows["CloudTwo"]["router"] == "up"
    assert rows[HOSTILE]["router"] == "unmonitored"
    assert rows["CloudOne"]["workers_running"] == 1 and rows["CloudOne"]["generation"] == 1
    assert rows["CloudOne"]["peer_links_total"] == 2
    # CloudTwo's backend stops: its breaker opens with the first failed request
    backend = fed.backends["CloudTwo"]
    backend.stop()
    assert scoped(fed, "CloudTwo", "CloudTwo") == 502
    assert scoped(fed, "CloudTwo", "CloudTwo") == 503  # failing fast
    until(
        "CloudTwo's backend breaker open on its status page",
        lambda: any(
            u["upstream"] == backend.url and u["breaker_open"] and not u["up"]
            for u in document(fed, "CloudTwo")["upstreams"]
        ),
        timeout=15,  # a sample every 5 s
    )
    html = request("GET", fed.status["CloudTwo"] + "/status").body.decode()
    assert f'data-upstream="{backend.url}" data-breaker="open" data-up="down"' in html
    code, doc, out = cli(fed, "--json")
    assert code == 1, out
    assert f"CloudTwo: upstream {backend.url} down" in doc["problems"]
    # CloudTwo's router stops: shown down, exit 1
    fed.routers["CloudTwo"].stop()
    code, doc, out = cli(fed, "--json")
    assert code == 1, out
    rows = {row["cloud"]: row for row in doc["clouds"]}
    assert rows["CloudTwo"]["router"] == "down" and rows["CloudOne"]["router"] == "up"
    assert any(p.startswith("CloudTwo: router down at") for p in doc["problems"])
    code, _, out = cli(fed)
    assert code == 1 and "down (connection refused)" in out, out
    # bad usage: 2
    assert cli(fed, "--cloud", "Nowhere")[0] == 2
    assert subprocess.run([*scoperouter_command(), "status"], capture_output=True).returncode == 2


def test_a_reload_moves_the_generation_and_shows_the_skew(federation: Federation) -> None:
    fed = federation
    before = document(fed, "CloudOne")["config"]
    text = fed.config.read_text()
    fed.config.write_text(text.replace("peer_connect_timeout: 1", "peer_connect_timeout: 2"))
    fed.routers["CloudOne"].signal(signal.SIGHUP)
    fed.routers["CloudOne"].wait_for_log("reloaded")
    after = until(
        "generation 2 on CloudOne's status",
        lambda: (c := document(fed, "CloudOne")["config"])["generation"] == 2 and c,
    )
    assert after["digest"] != before["digest"] and after["loaded_at"] > before["loaded_at"]
    two = document(fed, "CloudTwo")["config"]  # not reloaded
    assert (two["generation"], two["digest"]) == (1, before["digest"])
    code, doc, out = cli(fed, "--json")
    assert code == 0, out  # skew is flagged, not a failure
    pairs = sorted([(after["digest"], "CloudOne"), (before["digest"], "CloudTwo")])
    assert doc["skew"] == ["config skew: " + "; ".join(f"{d}: {c}" for d, c in pairs)]
    metrics = request("GET", fed.status["CloudOne"] + "/metrics").body.decode()
    assert "scoperouter_config_generation 2.0" in metrics
    assert f'scoperouter_config_info{{digest="{after["digest"]}"}} 1.0' in metrics
