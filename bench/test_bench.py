"""Fast checks of the bench's own machinery (no router needed): ``pytest bench``.

Config generation, the decision cases, wrk output parsing, the asyncio backend and the Python
load generator on loopback, large transfers against the backend, and teardown by PID. Each
bench's own parts have their file: test_peers.py, test_soak.py, test_wan.py, test_chaos.py;
the verdicts of every bench, test_verdicts.py.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest

from bench import backend, decision, federation, floor, load, profile, report, transfer
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
    processes on one port, and a single upstream connection per process for many requests; on
    the router workers' default loop (uvloop, a requirement of the bench's install)."""
    host = "127.0.1.2"
    port = free_port(host)
    server = backend.start_asyncio(procs, [(host, port, "CloudOne")], "backend")
    proxy_port = free_port("127.0.0.4")
    env = backend._env_with_bench()
    argv = [sys.executable, "-m", "bench.floor_servers", "lean", "--listen"]
    argv += [f"127.0.0.4:{proxy_port}", "--upstream", f"http://{host}:{port}"]
    started = [procs.start(f"lean-{n}", argv, env) for n in range(2)]
    for proc in started:  # each says so once it serves (the port alone: the first one's)
        wait_listening("127.0.0.4", proxy_port, proc)
        deadline = time.monotonic() + 30
        while "lean httptools proxy on uvloop" not in proc.log.read_text():
            assert proc.alive() and time.monotonic() < deadline, proc.log_tail()
            time.sleep(0.05)
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


def test_log_cost_is_judged_on_cpu_per_request() -> None:
    """The target is CPU per request (user + system: the kernel's cost of writing the line
    included), not user-space instructions (perf), which leave the write out, nor req/s at one
    point (moved by others' load); without CPU measured the row is INCONCLUSIVE."""
    from bench import render

    cost = {"connections": 50, "rps_info": 9_000.0, "rps_warning": 10_000.0}
    cost |= {"cpu_us_info": None, "cpu_us_warning": None}
    judged = []
    for extra in ({}, {"cpu_us_info": 100.0, "cpu_us_warning": 98.0}):
        targets: list[report.Target] = []
        text = render._log_cost({"log_cost": {**cost, **extra}}, targets)
        [target] = targets
        judged.append(target)
        assert "9,000 vs 10,000" in text
    assert "CPU per request not measured" in judged[0].measured and judged[0].ok is None
    assert "2.0% of CPU per request" in judged[1].measured and judged[1].ok
    # user-space instructions say 1 %, CPU per request (the kernel's write included) 5 %
    both = {**cost, "cpu_us_info": 100.0, "cpu_us_warning": 95.0}
    both |= {"instructions_info": 100_000.0, "instructions_warning": 99_000.0}
    targets = []
    render._log_cost({"log_cost": both}, targets)
    assert targets[0].measured.startswith("5.0% of CPU per request") and targets[0].ok is False
    assert "1.0% of user-space instructions" in targets[0].measured


def test_transfer_checked_end_to_end(procs: Processes) -> None:
    host = "127.0.1.2"
    port = free_port(host)
    backend.start_asyncio(procs, [(host, port, "CloudOne")], "backend")
    size = 3 * 2**20 + 5
    for direction in ("upload", "download"):
        intact, seconds, detail = transfer.checked(
            direction, host, port, {}, size, "CloudOne", hops=None
        )
        assert intact and seconds > 0, detail
    intact, _, detail = transfer.checked("upload", host, port, {}, size, "CloudTwo", hops=None)
    assert not intact and "backend CloudOne" in detail
    assert transfer.pattern_sha256(size) != transfer.pattern_sha256(size - 1)


def test_profile_sums_py_spy_stacks_by_function(tmp_path: Path) -> None:
    raw = tmp_path / "py-spy-50-1.txt"
    raw.write_text(
        "main (/x/worker.py:10);handle (/x/pipeline.py:20);write (/usr/lib/sel.py:5) 3\n"
        "main (/x/worker.py:10);handle (/x/pipeline.py:22) 1\n"
        "main (/x/worker.py:10);select (/usr/lib/selectors.py:9) 2\n"
    )
    own, inclusive, total = profile.summarize([raw])
    assert total == 6
    assert own["write (sel.py)"] == 3 and own["handle (pipeline.py)"] == 1
    assert inclusive["handle (pipeline.py)"] == 4 and inclusive["main (worker.py)"] == 6


def test_the_large_catalog_build_is_a_target() -> None:
    from bench import render

    results = {
        "decision": [
            {"clouds": 1000, "services": 10, "case": "scoped, image on another cloud",
             "us_per_decision": 1.5, "us_median": 1.6, "iterations": 10, "outcome": "forward"}
        ],
        "catalog_build_large": {"clouds": 10_000, "best_s": 1.4, "median_s": 1.5},
    }  # fmt: skip
    targets: list[report.Target] = []
    render._decision(results, targets)
    [build] = [t for t in targets if t.name.startswith("catalog build")]
    assert build.measured.startswith("1.40 s of CPU") and build.ok is False
    small = decision.build_cpu(30, repeats=2)
    assert small["clouds"] == 30 and 0 < small["best_s"] <= small["median_s"]


def test_bench_ab_reads_the_baselines_serve_options_in_either_cli_layout(tmp_path: Path) -> None:
    """bench.ab gives the baseline --workers only if its serve takes it: its CLI is a package
    of a module per command now, one module before."""
    from bench.ab import has_workers_option

    package = tmp_path / "new" / "scoperouter" / "cli"
    package.mkdir(parents=True)
    (package / "serve.py").write_text('parser.add_argument("--workers")\n')
    assert has_workers_option(tmp_path / "new")
    old = tmp_path / "old" / "scoperouter"
    old.mkdir(parents=True)
    (old / "cli.py").write_text('parser.add_argument("--config")\n')
    assert not has_workers_option(tmp_path / "old")
    (old / "cli.py").write_text('parser.add_argument("--workers")\n')
    assert has_workers_option(tmp_path / "old")
