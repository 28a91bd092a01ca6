"""Tests of bench.wan's parts that need no namespace, no TUN and no root: the SYN counter, the
server and load client against each other on loopback (plain and TLS, new and open
connections), the routers' generated federation config (it must load), and the table."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from bench import wan, wan_clouds, wan_http, wan_link, wan_render, wan_run
from scoperouter.config import load_catalog
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
