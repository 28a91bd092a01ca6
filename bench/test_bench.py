"""Fast checks of the bench's own machinery (no router needed): ``pytest bench``.

Config generation, the decision cases, wrk output parsing, the asyncio backend and the Python
load generator on loopback, large transfers against the backend, and teardown by PID.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import backend, decision, federation, floor, haproxy, load, peers, transfer
from bench.machine import ROOT
from bench.procs import Processes, free_port, rss_mb, wait_listening
from scoperouter.config import build_catalog, load_catalog
from scoperouter.routing import Forward, RequestFacts, decide

WRK_OUTPUT = """\
Running 2s test @ http://127.0.0.2:40001/v2/images
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    52.43ms   17.81ms 133.35ms   87.08%
    Req/Sec     0.93k    95.21     1.05k    70.00%
  Latency Distribution
     50%   52.43ms
     75%   58.10ms
     90%   66.00ms
     99%  133.35ms
  1862 requests in 2.02s, 433.24KB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:    921.78
Transfer/sec:    214.48KB
BENCHJSON {"requests":1862,"duration_us":2020000,"bytes":443637,"connect":0,"read":3,\
"write":0,"status":7,"timeout":2,"p50":52431,"p90":66002,"p99":133351,"max":133351,\
"mean":52430.1}
"""


def test_parse_wrk_text() -> None:
    figures = load.parse_wrk_text(WRK_OUTPUT)
    assert figures["requests"] == 1862
    assert figures["seconds"] == pytest.approx(2.02)
    assert figures["rps"] == pytest.approx(921.78)
    assert figures["p50_ms"] == pytest.approx(52.43)
    assert figures["p99_ms"] == pytest.approx(133.35)
    assert figures["mean_ms"] == pytest.approx(52.43)
    assert figures["max_ms"] == pytest.approx(133.35)
    assert figures["err_read"] == 3 and figures["err_timeout"] == 2
    assert figures["err_status"] == 7


def test_wrk_units() -> None:
    assert load._ms("812.00us") == pytest.approx(0.812)
    assert load._ms("1.50s") == pytest.approx(1500)
    assert load._ms("2.00m") == pytest.approx(120_000)
    with pytest.raises(ValueError):
        load._ms("fast")


def test_benchjson_result() -> None:
    data = load.parse_benchjson(WRK_OUTPUT)
    assert data is not None
    result = load._result("wrk", 50, data)
    assert result.rps == pytest.approx(1862 / 2.02)
    assert result.p50_ms == pytest.approx(52.431)
    assert result.errors == {"read": 3, "status": 7, "timeout": 2}
    assert result.error_count == 12


def _addresses() -> list[federation.CloudAddresses]:
    return [
        federation.CloudAddresses(
            name,
            federation.ROUTER_HOSTS[name],
            41001 + i * 10,
            41002 + i * 10,
            41003 + i * 10,
            federation.BACKEND_HOSTS[name],
            42001 + i * 10,
            42002 + i * 10,
        )
        for i, name in enumerate(federation.CLOUDS)
    ]


def _facts(
    method: str, host: str, port: int, path: str, headers: Mapping[str, str]
) -> RequestFacts:
    return RequestFacts(
        method=method, scheme="http", host=host, port=port, path=path, headers=dict(headers)
    )


def test_two_clouds_config_routes_as_the_bench_expects(tmp_path: Path) -> None:
    addresses = _addresses()
    path = federation.write_config(federation.two_clouds(addresses), tmp_path / "f.yaml")
    catalog = load_catalog(path)
    one, two = addresses
    scope = json.dumps({"image": "CloudTwo"})
    headers = {"x-auth-token": f"tok!SCOPE!{scope}", "x-scope": scope}
    facts = _facts("GET", one.router_host, one.image_port, "/v2/images", headers)
    first = decide(facts, catalog, "CloudOne")
    assert isinstance(first, Forward) and first.remote
    assert first.url == f"http://{two.router_host}:{two.image_port}/v2/images"
    # ... and CloudTwo's router, receiving what CloudOne's sends, delivers to its backend.
    facts2 = _facts("GET", two.router_host, two.image_port, "/v2/images", first.set_headers)
    second = decide(facts2, catalog, "CloudTwo")
    assert isinstance(second, Forward) and not second.remote
    assert second.url == f"http://{two.backend_host}:{two.small_port}/v2/images"
    # The large bodies go to the object-store backend (bench.httpserver).
    scope = json.dumps({"object-store": "CloudTwo"})
    facts3 = _facts("PUT", one.router_host, one.object_port, "/v1/AUTH_x/c/o", {"x-scope": scope})
    third = decide(facts3, catalog, "CloudOne")
    assert isinstance(third, Forward) and third.url.endswith(f":{two.object_port}/v1/AUTH_x/c/o")


def test_synthetic_catalog_size() -> None:
    catalog = build_catalog(federation.synthetic(50))
    assert len(catalog.clouds) == 50
    assert len(catalog.service_types) == 10


def test_decision_cases_decide_what_they_say() -> None:
    results, builds = decision.run((2, 30), iterations=200, repeats=1)
    assert [b.clouds for b in builds] == [2, 30]
    outcomes = {(r.clouds, r.case): r.outcome for r in results}
    assert outcomes[(30, "scoped, image on another cloud")] == "forward to Cloud0029 remote router"
    assert outcomes[(30, "scoped, image on this cloud")] == "forward to Cloud0000 local backend"
    assert outcomes[(30, "unscoped (plain token)")] == "forward to Cloud0000 local backend"
    assert outcomes[(2, "scoped, new scope (cache miss)")] == "forward to Cloud0001 remote router"
    assert outcomes[(30, "scope of 372 unknown keys (refused)")] == "reject 400"
    assert outcomes[(30, "scope of 100 entries, new (carried)")] == (
        "forward to Cloud0029 remote router"
    )
    assert all(r.us_per_decision > 0 for r in results)


@pytest.fixture
def procs(tmp_path: Path):
    group = Processes(tmp_path)
    yield group
    group.stop_all()


def test_asyncio_backend_python_load_and_transfers(procs: Processes, tmp_path: Path) -> None:
    host = "127.0.1.2"
    port = free_port(host)
    server = backend.start_asyncio(procs, [(host, port, "CloudOne")], "backend")
    env = backend._env_with_bench()
    result = load.run_load(
        load.python_tool(),
        f"http://{host}:{port}/v2/images",
        4,
        0.5,
        {"X-Scope": "{}"},
        tmp_path,
        env,
    )
    assert result.requests > 50 and result.error_count == 0
    assert 0 < result.p50_ms <= result.p99_ms
    size = 5 * 2**20
    up = transfer.measure(
        "upload", "direct", host, port, {}, size, {"b": server.proc.pid}, "CloudOne"
    )
    assert up.ok, up.detail
    down = transfer.measure(
        "download", "direct", host, port, {}, size, {"b": server.proc.pid}, "CloudOne"
    )
    assert down.ok, down.detail
    assert down.rss_peak_mb["b"] >= down.rss_before_mb["b"] > 0


def test_teardown_stops_processes_and_children(procs: Processes) -> None:
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    proc = procs.start("parent", [sys.executable, "-c", code])
    deadline = psutil.time.time() + 10
    while not psutil.Process(proc.pid).children() and psutil.time.time() < deadline:
        psutil.time.sleep(0.05)
    child = psutil.Process(proc.pid).children()[0].pid
    procs.stop_all()
    assert not proc.alive()
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert rss_mb(proc.pid) != rss_mb(proc.pid)  # nan: gone


def test_lean_floor_proxy_forwards_over_a_pooled_connection(procs: Processes) -> None:
    """bench.floor's httptools prototype: the backend's answer, keep-alive on both sides, two
    processes on one port, and a single upstream connection per process for many requests."""
    host = "127.0.1.2"
    port = free_port(host)
    server = backend.start_asyncio(procs, [(host, port, "CloudOne")], "backend")
    proxy_port = free_port("127.0.0.4")
    env = backend._env_with_bench()
    argv = [sys.executable, "-m", "bench.floor_servers", "lean", "--listen"]
    argv += [f"127.0.0.4:{proxy_port}", "--upstream", f"http://{host}:{port}"]
    for n in range(2):
        proc = procs.start(f"lean-{n}", argv, env)
        wait_listening("127.0.0.4", proxy_port, proc)
    conn = http.client.HTTPConnection("127.0.0.4", proxy_port, timeout=10)
    for _ in range(20):
        conn.request("PUT", "/v2/images", body=b"x" * 1000, headers={"X-Scope": "{}"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["cloud"] == "CloudOne"
        assert answer["body_bytes"] == 1000 and answer["method"] == "PUT"
    conn.close()
    upstream = [
        c
        for c in psutil.Process(server.proc.pid).net_connections("tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
    ]
    assert len(upstream) == 1  # one client connection -> one process -> one pooled connection


def test_floor_report_has_ratios_and_spread() -> None:
    rows = [
        {"path": p, "processes": n, "connections": 1, "rps": rps, "p50_ms": p50,
         "cpu_us_per_req": cpu, "machine_busy_cores": 1.0}
        for p, n, rps, p50, cpu in [
            ("direct", 0, 10_000, 0.1, None), ("direct", 0, 12_000, 0.1, None),
            ("router", 2, 1_000, 1.1, 1500), ("router", 2, 1_200, 1.3, 1300),
        ]
    ]  # fmt: skip
    text = floor.report(rows, rounds=2)
    router = next(line for line in text.splitlines() if line.startswith("router"))
    assert "1,100" in router and "0.100" in router and "+1.100" in router and "1,400" in router
    assert "1,000-1,200" in router and "1,300-1,500" in router


def test_log_cost_is_judged_on_the_routers_work_when_measured() -> None:
    """A router at capacity loses the share of its work the line adds: req/s at one point
    (moved by others' load) decides only when neither instructions nor CPU were measured."""
    from bench import render, report

    cost = {"connections": 50, "rps_info": 9_000.0, "rps_warning": 10_000.0}
    cost |= {"cpu_us_info": None, "cpu_us_warning": None}
    judged = []
    for extra in ({}, {"cpu_us_info": 100.0, "cpu_us_warning": 97.0}):
        targets: list[report.Target] = []
        text = render._log_cost({"log_cost": {**cost, **extra}}, targets)
        [target] = targets
        judged.append(target)
        assert "9,000 vs 10,000" in text
    assert "10.0% of req/s" in judged[0].measured and not judged[0].ok
    assert "3.0% of CPU per request" in judged[1].measured and judged[1].ok
    both = {**cost, "cpu_us_info": 100.0, "cpu_us_warning": 97.0}
    both |= {"instructions_info": 100_000.0, "instructions_warning": 90_000.0}
    targets = []
    render._log_cost({"log_cost": both}, targets)
    assert targets[0].measured.startswith("10.0% of instructions") and not targets[0].ok


# ---------------------------------------------------------------- bench.peers (HAProxy + Lua)


def test_haproxy_config_has_the_scope_script_and_a_backend_per_cloud(tmp_path: Path) -> None:
    backends = {"CloudOne": ("127.0.1.2", 8001), "CloudTwo": ("127.0.0.3", 9292)}
    text = haproxy.config(
        ("127.0.0.5", 7000), tmp_path / "scope.lua", "CloudOne", "image", backends, 2, 4096
    )
    lines = [line.strip() for line in text.splitlines()]
    for expected in (
        "nbthread 2",
        "maxconn 4096",
        f"lua-load-per-thread {tmp_path / 'scope.lua'}",
        "http-reuse always",
        "bind 127.0.0.5:7000",
        "http-request lua.interpret_scope CloudOne image",
        "use_backend %[var(txn.scope_backend)]",
        "backend CloudOne_image",
        "server CloudOne 127.0.1.2:8001",
        "backend CloudTwo_image",
        "server CloudTwo 127.0.0.3:9292",
        f"default_backend {haproxy.NO_SUCH_CLOUD}",
    ):
        assert expected in lines, expected
    assert haproxy.maxconn_for(1000) == 4096 and haproxy.maxconn_for(5000) == 10_000
    assert "token:find(SEPARATOR, 1, true)" in haproxy.LUA_SCRIPT  # plain find: "!" is no magic


def _recording_backend(name: str, seen: list[tuple[str, dict[str, str]]]) -> ThreadingHTTPServer:
    """An HTTP/1.1 backend on loopback answering its name, recording each request's headers."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append((name, {k.lower(): v for k, v in self.headers.items()}))
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.1.5", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def haproxy_binary() -> haproxy.HAProxy:
    found = haproxy.ensure_haproxy(allow_apt=False, say=print)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: haproxy is not installed (.ci/run installs Debian's haproxy)")
        pytest.skip("haproxy is not installed (apt-get install haproxy): the Lua scope script")
    return found


def test_haproxy_lua_script_routes_by_scope_and_strips_it(
    procs: Processes, haproxy_binary: haproxy.HAProxy
) -> None:
    """The bench's HAProxy + Lua for real: the scope's cloud for the frontend's service picks
    the backend, the token goes on without its scope, X-Scope carries the scope."""
    seen: list[tuple[str, dict[str, str]]] = []
    one, two = _recording_backend("one", seen), _recording_backend("two", seen)
    try:
        listen = (haproxy.HOST, free_port(haproxy.HOST))
        backends = {
            "CloudOne": ("127.0.1.5", one.server_port),
            "CloudTwo": ("127.0.1.5", two.server_port),
        }
        haproxy.start(procs, haproxy_binary, listen, "CloudOne", "image", backends)
        conn = http.client.HTTPConnection(*listen, timeout=10)
        cases = [  # token sent -> (status, backend, token forwarded, X-Scope forwarded)
            ('tok!SCOPE!{"image": "CloudOne"}', 200, "one", "tok", '{"image": "CloudOne"}'),
            (
                'tok!SCOPE!{"compute": "CloudOne", "image": "CloudTwo"}',  # commas: whole value
                200, "two", "tok", '{"compute": "CloudOne", "image": "CloudTwo"}',
            ),
            ('tok!SCOPE!{"compute":"CloudTwo"}', 200, "one", "tok", '{"compute":"CloudTwo"}'),
            ("tok", 200, "one", "tok", None),  # unscoped: where it was addressed, unchanged
            ('tok!SCOPE!{"image": "Nowhere"}', 503, None, None, None),  # no such cloud
        ]  # fmt: skip
        for token, status, where, forwarded, scope in cases:
            before = len(seen)
            conn.request("GET", "/v2/images", headers={"X-Auth-Token": token})  # keep-alive
            response = conn.getresponse()
            body = response.read()
            assert response.status == status, (token, body)
            if where is None:
                assert len(seen) == before
                continue
            name, headers = seen[-1]
            assert (name, body) == (where, where.encode())
            assert headers["x-auth-token"] == forwarded
            assert headers.get("x-scope") == scope
        conn.close()
    finally:
        one.shutdown()
        two.shutdown()


def _peer_rows() -> list[dict[str, Any]]:
    """Two rounds at 1, 50 and 1,000 connections: the router at 0.8x then 0.6x HAProxy's req/s
    at 1,000 (median 0.7x: MISS; the ratio of the medians would be 24k / 35k), p99 1.4x
    HAProxy's there (PASS), its CPU per request 100 us at 50 and 110 at 1,000 (PASS)."""
    rows = []
    figures = {  # (path, conns) -> per round (req/s, p99 ms, CPU us/req)
        ("direct", 1): [(20_000, 0.1, None), (22_000, 0.1, None)],
        ("HAProxy + Lua", 1): [(10_000, 0.2, 40.0), (10_000, 0.2, 40.0)],
        ("scoperouter", 1): [(9_000, 0.3, 150.0), (8_000, 0.3, 150.0)],
        ("HAProxy + Lua", 50): [(40_000, 2.0, 22.0), (44_000, 2.0, 22.0)],
        ("scoperouter", 50): [(32_000, 4.0, 100.0), (35_200, 4.0, 100.0)],
        ("HAProxy + Lua", 1000): [(30_000, 50.0, 25.0), (40_000, 60.0, 25.0)],
        ("scoperouter", 1000): [(24_000, 70.0, 110.0), (24_000, 84.0, 110.0)],
    }
    for (path, conns), rounds in figures.items():
        for round_, (rps, p99, cpu) in enumerate(rounds, 1):
            rss = {"total": 230.0, "main": 70.0, "children": [80.0, 80.0]} if cpu else None
            rows.append(
                {"path": path, "connections": conns, "round": round_, "rps": float(rps),
                 "p50_ms": p99 / 2, "p99_ms": p99, "cpu_us_per_req": cpu,
                 "instructions_per_req": None, "errors": 0, "other_cpu_cores": 0.1,
                 "other_busy_processes": [], "rss_mb": rss}
            )  # fmt: skip
    return rows


def test_peers_ratios_are_taken_within_each_round_and_judged() -> None:
    summary = peers.summarize(_peer_rows())
    router_1000 = peers.find(summary, peers.ROUTER, 1000)
    assert router_1000 is not None
    assert router_1000["rps_x_haproxy"] == pytest.approx((0.8 + 0.6) / 2)  # not 24k / 35k
    assert router_1000["p99_x_haproxy"] == pytest.approx(1.4)  # 70 / 50 and 84 / 60
    assert router_1000["rps_min"] == router_1000["rps_max"] == 24_000
    judged = {t.name: t for t in peers.targets(summary)}
    assert judged["router req/s vs HAProxy + Lua, 1 conns"].ok is True  # 0.9 / 0.8
    assert judged["router req/s vs HAProxy + Lua, 50 conns"].ok is True  # 0.8 both rounds
    assert judged["router req/s vs HAProxy + Lua, 1,000 conns"].ok is False
    assert (
        "0.70x (24,000 vs 35,000 req/s)"
        in judged["router req/s vs HAProxy + Lua, 1,000 conns"].measured
    )
    assert judged["router p99 vs HAProxy's, 1,000 conns"].ok is True
    flat = judged["router CPU/request at 1,000 conns vs at 50"]
    assert flat.ok is True and flat.measured.startswith("1.10x")


def test_peers_targets_not_measured_are_na() -> None:
    rows = [r for r in _peer_rows() if r["connections"] != 50 and r["path"] != "HAProxy + Lua"]
    judged = peers.targets(peers.summarize(rows))
    assert judged and all(t.ok is None and t.measured == "-" for t in judged)


def test_peers_report_is_markdown_with_targets() -> None:
    rows = _peer_rows()
    results = {
        "rows": rows,
        "summary": peers.summarize(rows),
        "rss_before": {peers.ROUTER: {"total": 200.0, "main": 70.0, "children": [65.0, 65.0]}},
        "rss_after": {peers.ROUTER: {"total": 230.0, "main": 70.0, "children": [80.0, 80.0]}},
    }
    args = peers.parse_args(["--quick", "--connections", "1,50,1000"])
    assert (args.duration, args.rounds, args.conns) == (2.0, 1, [1, 50, 1000])
    text = peers.render(results, args)
    lines = text.splitlines()
    router = next(line for line in lines if line.startswith("| scoperouter | 1,000 |"))
    assert "| 24,000 | 0.70 |" in router and "230 (workers 80 / 80)" in router
    assert any(line.startswith("| --- | ---: |") for line in lines)
    assert "| router CPU/request at 1,000 conns vs at 50 | <= 1.2x | 1.10x" in text
    assert "MISS |" in text and "PASS |" in text
    assert (
        "- scoperouter RSS: 200 (workers 65 / 65) MB before the run" in text
        and "(+30.0 MB)" in text
    )


def test_bench_wan_makes_its_certificates_without_the_lab(tmp_path: Path) -> None:
    """bench.wan needs the bench extra, not the lab package (it failed with
    ModuleNotFoundError: scoperouter_lab): its certificates come from scoperouter.pki."""
    code = textwrap.dedent(
        f"""
        import importlib.abc, sys
        from pathlib import Path

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "scoperouter_lab":
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
                return None

        sys.meta_path.insert(0, Block())
        import bench.wan
        from tests.integration.certs import federation_ca
        ca, certs = federation_ca(Path({str(tmp_path)!r}), {{"CloudOne": "127.0.0.2"}})
        print(ca.exists() and certs["CloudOne"].exists())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "True", done.stderr[-3000:]
