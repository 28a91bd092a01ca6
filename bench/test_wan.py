"""Tests of bench.wan's parts that need no namespace, no TUN and no root: the SYN counter, the
server and load client against each other on loopback (plain and TLS, new and open
connections), the routers' generated federation config (it must load), and the table; its
certificates without the lab; and the pure parts of ``--clouds N``."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from bench import wan, wan_clouds, wan_http, wan_link, wan_render, wan_run
from bench.machine import ROOT
from bench.test_bench import _facts
from scoperouter.config import load_catalog
from scoperouter.errors import Reject
from scoperouter.merge import CloudAnswer, CloudFailure, merge_list, plan_list
from scoperouter.routing import FanOut, Forward, decide
from tests.integration.certs import federation_ca, issue


def tcp_packet(flags: int, ihl: int = 5) -> bytes:
    ip = bytes([0x40 | ihl]) + bytes(8) + bytes([6]) + bytes(ihl * 4 - 10)
    tcp = struct.pack("!HHIIBB", 1234, 80, 0, 0, 0x50, flags) + bytes(6)
    return ip + tcp


def test_only_a_connections_first_packet_counts_as_a_handshake() -> None:
    assert wan_link.is_syn(tcp_packet(0x02))  # SYN
    assert wan_link.is_syn(tcp_packet(0x02, ihl=6))  # with IP options
    assert not wan_link.is_syn(tcp_packet(0x12))  # SYN-ACK: the answer
    assert not wan_link.is_syn(tcp_packet(0x10))  # ACK
    assert not wan_link.is_syn(tcp_packet(0x18))  # data
    udp = bytearray(tcp_packet(0x02))
    udp[9] = 17
    assert not wan_link.is_syn(bytes(udp))
    assert not wan_link.is_syn(b"\x60" + bytes(60))  # IPv6
    assert not wan_link.is_syn(b"\x45")


@pytest.mark.parametrize("tls", [False, True])
@pytest.mark.parametrize("new", [False, True])
def test_load_client_against_the_server(tmp_path: Path, tls: bool, new: bool) -> None:
    cert, key, ca = issue(tmp_path, "127.0.0.1", name="wan")

    async def go() -> dict[str, object]:
        listener = "127.0.0.1:0:tls" if tls else "127.0.0.1:0"
        loop = asyncio.get_running_loop()
        ssl_context = None
        if tls:
            import ssl

            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(cert, key)
        server = await loop.create_server(
            lambda: wan_http._Server(listener), "127.0.0.1", 0, ssl=ssl_context
        )
        port = server.sockets[0].getsockname()[1]
        scheme = "https" if tls else "http"
        try:
            return await wan_http._load(
                f"{scheme}://127.0.0.1:{port}/v2/images", 3, 30, new, str(ca), {"X-A": "b"}
            )
        finally:
            server.close()

    result = asyncio.run(go())
    assert result["requests"] == 30 and result["errors"] == 0
    assert result["statuses"] == {200: 30}
    assert isinstance(result["p50_ms"], float) and isinstance(result["p99_ms"], float)
    assert result["p50_ms"] <= result["p99_ms"]


def test_load_client_warms_up_with_the_same_clients_then_measures() -> None:
    """The warm-up's requests and the measured ones in one run of the same clients, spread
    over the given time; the caller told once, as the first measured request starts."""
    seen: list[int] = []

    async def go() -> dict[str, object]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: wan_http._Server("127.0.0.1:0"), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v2/images"
        served = [0]
        original = wan_http._Server.data_received

        def counting(self: wan_http._Server, data: bytes) -> None:
            served[0] += data.count(b"GET ")
            original(self, data)

        wan_http._Server.data_received = counting  # type: ignore[method-assign]
        try:
            started = time.perf_counter()
            result = await wan_http._load(
                url,
                4,
                9,
                True,
                None,
                {},
                warmup=13,
                spread=0.2,
                on_warm=lambda: seen.append(served[0]),
            )
            result["took"] = time.perf_counter() - started
            return result
        finally:
            wan_http._Server.data_received = original  # type: ignore[method-assign]
            server.close()

    result = asyncio.run(go())
    assert result["requests"] == 9 and result["statuses"] == {200: 9}
    assert result["warmup"] == {"requests": 13, "errors": 0, "p50_ms": ANY, "p99_ms": ANY}
    assert len(seen) == 1 and 13 - 4 <= seen[0] <= 13  # the warm-up's requests (<= 4 in flight)
    assert result["took"] >= 0.15  # the last client started 3/4 of the spread late


def test_the_routers_federation_config_loads(tmp_path: Path) -> None:
    args = wan.parse_args([])
    bench = wan_run.Wan(args, tmp_path)
    bench.ca, bench.certs = federation_ca(
        tmp_path, {"CloudOne": wan_clouds.A_ADDR, "CloudTwo": wan_clouds.B_ADDR}
    )
    for tls in (False, True):
        catalog = load_catalog(bench.federation(tls))
        two = catalog.endpoint("CloudTwo", "image", "public")
        assert two is not None
        assert two.url.base == f"http://{wan_clouds.B_ADDR}:9292"
        peer = catalog.clouds["CloudTwo"].peer
        if tls:
            assert peer is not None and peer.url.base == f"https://{wan_clouds.B_ADDR}:9443"
            assert catalog.settings.peers.ca == str(bench.ca)
        else:
            assert peer is None


def test_table_has_ratios_to_the_floor_of_the_same_run() -> None:
    def point(path: str, connection: str, p50: float) -> dict[str, object]:
        return wan_render.Point(path, connection, 1, 10, 0, p50, p50 * 1.2, 0.0, {200: 10}).__dict__

    table = wan_render.render(
        {
            "points": [
                point("direct plain", "open", 50.0),
                point("direct plain", "new per request", 100.0),
                point("routers, plain between", "new per request", 125.0),
            ],
            "notes": ["a note"],
        }
    )
    assert "| routers, plain between | new per request | 1 | 125.0 | 150.0 | 0 | 2.50 | 1.25 |" in (
        table
    )
    assert table.endswith("a note")


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


# --- bench.wan --clouds N: the pure parts (no namespace, no root) ---------------------------


def test_wan_cloud_names_and_addresses() -> None:
    names = wan_clouds.cloud_names(10)
    assert names[:3] == ["CloudOne", "CloudTwo", "CloudThree"] and names[-1] == "CloudTen"
    assert wan_clouds.cloud_names(22)[-2:] == ["Cloud21", "Cloud22"]
    assert len(set(wan_clouds.cloud_names(wan_clouds.MAX_CLOUDS))) == wan_clouds.MAX_CLOUDS
    for bad in (1, wan_clouds.MAX_CLOUDS + 1):
        with pytest.raises(ValueError, match="--clouds"):
            wan_clouds.cloud_names(bad)
    # CloudOne in A; the others each on its own address on B's end of the link
    assert [wan_clouds.peer_host(i) for i in range(3)] == [
        "10.250.0.1",
        "10.250.0.2",
        "10.250.0.3",
    ]
    assert [wan_clouds.router_host(i) for i in (0, 9)] == ["127.0.0.2", "10.250.0.10"]
    assert [wan_clouds.backend_host(i) for i in (0, 1, 9)] == [
        "127.0.1.2",
        "127.0.1.3",
        "127.0.1.11",
    ]


def test_wan_merged_lists_are_merges() -> None:
    """Every merged list measured names two clouds or more (with two clouds, CloudTwo alone
    would be a single-cloud request, not a merge)."""
    assert wan_clouds.merged_sets(["CloudOne", "CloudTwo"]) == [["CloudOne", "CloudTwo"]]
    names = wan_clouds.cloud_names(10)
    assert wan_clouds.merged_sets(names) == [names[1:], names]
    assert wan_clouds.span(names[1:]) == "CloudTwo..CloudTen"
    assert wan_clouds.span(names[:2]) == "CloudOne & CloudTwo"


def test_wan_two_clouds_config_is_the_one_bench_wan_always_ran(tmp_path: Path) -> None:
    """Without --clouds the routers run the federation they always did (the documented
    figures were measured with it)."""
    ca, certs = federation_ca(tmp_path, {"CloudOne": "10.250.0.1", "CloudTwo": "10.250.0.2"})
    data = wan_clouds.federation_config(["CloudOne", "CloudTwo"], True, certs, ca)
    one, two = data["clouds"]["CloudOne"], data["clouds"]["CloudTwo"]
    assert one["frontends"][0] == {"url": "http://127.0.0.2:9292"}
    assert one["services"]["image"]["public"]["backend"] == "http://127.0.1.2:8001"
    assert two["frontends"] == [
        {"url": "http://10.250.0.2:9292"},
        {"url": "http://10.250.0.2:5000"},
    ]
    assert two["services"]["image"]["public"]["backend"] == "http://127.0.1.3:8001"
    assert two["peer"]["url"] == "https://10.250.0.2:9443"
    assert data["settings"]["peers"] == {"ca": str(ca)}
    plain = wan_clouds.federation_config(["CloudOne", "CloudTwo"], False, None, None)
    assert "peer" not in plain["clouds"]["CloudTwo"] and "peers" not in plain["settings"]


def test_wan_n_clouds_config_fans_a_merged_list_out_to_every_peer_link(tmp_path: Path) -> None:
    """At 10 clouds the merged scope makes CloudOne's router ask every other cloud's peer
    link (verified TLS, one origin per cloud: a warm pool each), and each of those routers
    deliver to its own backend."""
    names = wan_clouds.cloud_names(10)
    ca, certs = federation_ca(
        tmp_path, {name: wan_clouds.peer_host(i) for i, name in enumerate(names)}
    )
    path = tmp_path / "f.yaml"
    path.write_text(json.dumps(wan_clouds.federation_config(names, True, certs, ca)))
    catalog = load_catalog(path)
    assert catalog.settings.peers.ca == str(ca)
    scope = wan_clouds.merged_scope(names[1:])
    assert scope == '{"image":"' + " & ".join(names[1:]) + '"}'
    headers = {"x-auth-token": f"tok!SCOPE!{scope}", "x-scope": scope}
    facts = _facts("GET", "127.0.0.2", 9292, "/v2/images", headers)
    fanout = decide(facts, catalog, "CloudOne", combined=True)
    assert isinstance(fanout, FanOut)
    parts = dict(fanout.parts)
    assert list(parts) == names[1:]
    for index, name in enumerate(names[1:], start=1):
        part = parts[name]
        assert isinstance(part, Forward) and part.remote and part.cloud == name
        assert part.url == f"https://10.250.0.{index + 1}:9443/v2/images"
        # ... where that cloud's router delivers to its own backend (B's loopback)
        arriving = _facts(
            "GET", f"10.250.0.{index + 1}", 9292, "/v2/images", dict(part.set_headers)
        )
        local = decide(arriving, catalog, name)
        assert isinstance(local, Forward) and not local.remote
        assert local.url == f"http://127.0.1.{index + 2}:8001/v2/images"
    # With CloudOne itself: its own backend, in A, is one of the parts.
    headers = {"x-scope": wan_clouds.merged_scope(names)}
    both = decide(
        _facts("GET", "127.0.0.2", 9292, "/v2/images", headers), catalog, "CloudOne", True
    )
    assert isinstance(both, FanOut)
    own = dict(both.parts)["CloudOne"]
    assert isinstance(own, Forward) and own.url == "http://127.0.1.2:8001/v2/images"


def _merged(clouds: list[str], answers: dict[str, CloudAnswer | CloudFailure] | None = None) -> str:
    """What a router answers: the backends' glance lists merged by scoperouter.merge."""
    plan = plan_list("image", "GET", "/v2/images", clouds, {})
    assert not isinstance(plan, Reject)
    if answers is None:
        answers = {
            c: CloudAnswer(200, {}, json.dumps(wan_clouds.glance_list(c)).encode()) for c in clouds
        }
    return merge_list(plan, answers, "http://127.0.0.2:9292").body.decode()


def test_wan_merged_answer_check() -> None:
    clouds = wan_clouds.cloud_names(10)[1:]
    body = _merged(clouds)
    assert wan_clouds.check_merged(200, body, clouds) is None
    assert len(json.loads(body)["images"]) == 9 * wan_clouds.IMAGES_PER_CLOUD
    # every backend answers a different, valid glance list (the merge does real work)
    ids = [i for c in clouds for i in wan_clouds.image_ids(c)]
    assert len(set(ids)) == len(ids)
    # a cloud's items missing, or another's that were not asked for
    short = _merged(clouds[:-1])
    assert wan_clouds.check_merged(200, short, clouds) == (
        "40 images, expected 45; missing items of CloudTen"
    )
    assert "unexpected items of CloudTen" in (wan_clouds.check_merged(200, body, clouds[:-1]) or "")
    # the same items, not in the expression's order
    swapped = _merged([clouds[1], clouds[0], *clouds[2:]])
    assert "not in the expression's order" in (wan_clouds.check_merged(200, swapped, clouds) or "")
    # an error, a body that is no list, a next link
    failed = {c: CloudFailure(502, "it refused the connection") for c in clouds}
    error = _merged(clouds, failed)
    assert (wan_clouds.check_merged(502, error, clouds) or "").startswith("status 502")
    assert "no 'images' list" in (wan_clouds.check_merged(200, "{}", clouds) or "")
    assert "not JSON" in (wan_clouds.check_merged(200, "<html>", clouds) or "")
    paged = json.dumps({**json.loads(body), "next": "/v2/images?marker=x"})
    assert "a next link" in (wan_clouds.check_merged(200, paged, clouds) or "")


def _wan_point(path: str, clients: int, p50: float | None) -> dict[str, Any]:
    return wan_render.Point(
        path, "new per request", clients, 200, 0, p50, None, 0.0, {200: 200}
    ).__dict__


def test_wan_target_pass_and_miss() -> None:
    assert wan_clouds.verdict(60.0, 10, 25.0) == "PASS"
    assert wan_clouds.verdict(60.1, 10, 25.0) == "MISS"
    assert wan_clouds.verdict(None, 10, 25.0) == "MISS"  # no answer at all
    assert wan_clouds.verdict(30.0, 9, 25.0) == "n/a"  # not the target's setting
    assert wan_clouds.verdict(30.0, 10, 10.0) == "n/a"
    others, every = (
        "merged CloudTwo..CloudTen, TLS between",
        "merged CloudOne..CloudTen, TLS between",
    )
    points = [
        _wan_point("direct TLS", 1, 51.0),
        _wan_point("routers, TLS between", 1, 70.0),  # one cloud: not the target's point
        _wan_point(others, 1, 55.0),
        _wan_point(every, 1, 59.9),
        _wan_point("merged CloudTwo..CloudTen, plain between", 1, 99.0),  # no peer links
    ]
    lines, overall = wan_clouds.target_lines(points, 10, 25.0)
    assert overall == "PASS"
    assert lines[0].startswith("Target (issue 21): a merged list over 10 clouds, 25 ms each way")
    assert lines[0].endswith("p50 <= 60 ms: **PASS**")
    assert lines[1:] == [
        f"- {others}, 1 client: p50 55.0 ms: PASS",
        f"- {every}, 1 client: p50 59.9 ms: PASS",
    ]
    lines, overall = wan_clouds.target_lines([*points, _wan_point(others, 20, 92.1)], 10, 25.0)
    assert overall == "MISS" and lines[-1] == f"- {others}, 20 clients: p50 92.1 ms: MISS"
    lines, overall = wan_clouds.target_lines(points, 3, 25.0)
    assert overall == "n/a" and "not judged: measured at 3 clouds" in lines[0]
    assert wan_clouds.target_lines(points[:2], 10, 25.0) == ([], "n/a")


def test_wan_table_with_merged_points_has_the_target_under_it() -> None:
    points = [
        _wan_point("direct TLS", 1, 50.0) | {"connection": "open"},
        _wan_point("merged CloudTwo..CloudTen, TLS between", 1, 57.5)
        | {"router_cpu_us": [2650, 600, 500, 550, 600, 500, 550, 600, 650, 600]},
    ]
    lines, _ = wan_clouds.target_lines(points, 10, 25.0)
    table = wan_render.render(
        {"points": points, "notes": [], "merged": {"target": {"lines": lines}}}
    )
    assert "| merged CloudTwo..CloudTen, TLS between | new per request | 1 | 57.5 |" in table
    assert "| 0 | 1.15 | - | 2650 + 5150 (9 routers) |" in table  # CloudOne + the others
    assert table.endswith("- merged CloudTwo..CloudTen, TLS between, 1 client: p50 57.5 ms: PASS")
    # Two routers: each one's figure, as before
    two = wan_render.render(
        {"points": [_wan_point("routers, TLS between", 1, 52.0) | {"router_cpu_us": [900, 600]}]}
    )
    assert "| 900 + 600 |" in two and "Target" not in two


def test_wan_options_clouds() -> None:
    assert wan.parse_args([]).between == [False, True]  # as it always ran
    assert wan.parse_args([]).clouds is None
    args = wan.parse_args(["--clouds", "10"])
    assert args.clouds == 10 and args.between == [True]  # the merged lists over peer links
    assert wan.parse_args(["--clouds", "3", "--between", "plain,tls"]).between == [False, True]
    with pytest.raises(SystemExit):
        wan.parse_args(["--clouds", "1"])


def test_wan_backend_answers_its_clouds_glance_list() -> None:
    """`serve HOST:PORT:glance=CloudThree`: the backend answers that cloud's image list."""
    import asyncio

    async def go() -> bytes:
        server = await asyncio.get_running_loop().create_server(
            lambda: wan_http._Server("x", json.dumps(wan_clouds.glance_list("CloudThree"))),
            "127.0.0.1",
            0,
        )
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v2/images HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await reader.read()
            writer.close()
            return data
        finally:
            server.close()

    head, _, body = asyncio.run(go()).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    images = json.loads(body)["images"]
    assert [i["id"] for i in images] == wan_clouds.image_ids("CloudThree")


def _access_line(router: str, rid: str, ts: str, ms: float, decision: str) -> str:
    entry = {
        "ts": f"2026-11-27T23:05:{ts}Z",
        "level": "INFO",
        "logger": "scoperouter.access",
        "router": router,
        "msg": "GET /v2/images 200",
        "request_id": rid,
        "ms": ms,
        "decision": decision,
    }
    return json.dumps(entry)


def test_wan_timeline_from_the_routers_access_lines() -> None:
    """A merged request's time, from the routers' own lines: CloudOne's router read it at
    17.000 and answered at 17.056; its two parts reached their routers 26 and 28 ms later and
    left them at 17.027 and 17.030; the way back took 26 ms."""
    one = [
        "not json",
        '{"ts":"2026-11-27T23:05:16.000Z","logger":"scoperouter","msg":"started"}',
        _access_line("CloudOne", "req-1", "17.056", 56.0, "fanout"),
        _access_line("CloudOne", "req-2", "18.000", 1.0, "local"),  # not a merged request
        _access_line("CloudOne", "req-3", "19.000", 50.0, "fanout"),  # its parts not logged
    ]
    others = [
        _access_line("CloudTwo", "req-1", "17.027", 1.0, "local"),
        _access_line("CloudThree", "req-1", "17.030", 2.0, "local"),
    ]
    found = wan_clouds.timeline(one, others)
    assert found == wan_clouds.Timeline(
        requests=1,
        router_ms=56.0,
        first_part_at_ms=26.0,
        last_part_at_ms=28.0,
        spread_ms=2.0,
        slowest_part_ms=2.0,
        back_ms=26.0,
    )
    assert "the parts reach their routers 26.0-28.0 ms after it read the request" in found.text()
    assert wan_clouds.timeline(one, []) is None
    # only the requests that started at since_ms or later (not a point's warm-up): req-1
    # started at 17.000 (2026-11-27T23:05:17Z)
    started = datetime(2026, 11, 27, 23, 5, 17, tzinfo=UTC).timestamp() * 1000
    assert wan_clouds.timeline(one, others, since_ms=started) == found
    assert wan_clouds.timeline(one, others, since_ms=started + 1) is None


def test_a_load_client_that_never_says_warm_fails_the_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a warm-up, the router counters are read where the measured requests start: a load
    client that never said where is an error, not a point whose figures hold its warm-up."""
    bench = wan_run.Wan(wan.parse_args([]), tmp_path)
    real = subprocess.Popen
    said: list[str] = []

    def load_client(lines: list[str]) -> None:
        argv = [sys.executable, "-c", "".join(f"print({line!r})\n" for line in lines)]
        monkeypatch.setattr(wan_run.subprocess, "Popen", lambda _, **kw: real(argv, **kw))

    load_client(["warm", '{"requests": 5}'])
    assert bench.load("http://x/", 1, 5, True, {}, warmup=3, on_warm=lambda: said.append("warm"))
    assert said == ["warm"]
    load_client(['{"requests": 5}'])
    with pytest.raises(wan_run.BenchError, match="never said where its measured requests start"):
        bench.load("http://x/", 1, 5, True, {}, warmup=3, on_warm=lambda: said.append("warm"))
    assert said == ["warm"]
    assert bench.load("http://x/", 1, 5, True, {}) == {"requests": 5}  # no warm-up: no line
