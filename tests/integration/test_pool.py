"""The upstream pool under many connections: a load that keeps N requests in flight reuses the
backend connections it opened, whatever N (issue 21: the router's cost per request grew with
the number of client connections; each request above the pool's idle cap paid a new backend
connection, its handshake and its close).

    CloudOne  router 127.0.0.62  image :P        backend 127.0.1.62 (recording)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .backends import RecordingBackend
from .routers import Router, cloud_entry, free_port, start_all, stop_all, write_config

HOST = "127.0.0.62"
CLIENTS = 300  # connections, each with one request in flight in every round
ROUNDS = 4


@dataclass
class Setup:
    router: Router
    backend: RecordingBackend
    image: tuple[str, int]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("pool")
    backend = RecordingBackend("127.0.1.62", "CloudOne-image", keep_body=0).start()
    port = free_port(HOST)
    config = write_config(
        tmp / "federation.yaml",
        {"CloudOne": cloud_entry(HOST, {"image": (port, "", backend.url)})},
    )
    router = Router("CloudOne", config, tmp / "one.log", [(HOST, port)], workers=2)
    start_all([router])
    try:
        yield Setup(router, backend, (HOST, port))
    finally:
        stop_all([router])
        backend.stop()


async def _rounds(host: str, port: int, clients: int, rounds: int) -> list[int]:
    """`clients` keep-alive connections; in each round every one sends a request at once and
    reads its answer. The statuses of every answer."""
    conns = [await asyncio.open_connection(host, port) for _ in range(clients)]
    request = f"GET /v2/images HTTP/1.1\r\nHost: {host}:{port}\r\nX-Auth-Token: t\r\n\r\n".encode()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        return int(head.split(b" ", 2)[1])

    statuses: list[int] = []
    try:
        for _ in range(rounds):
            statuses += await asyncio.gather(*(one(r, w) for r, w in conns))
    finally:
        for _, writer in conns:
            writer.close()
    return statuses


def test_many_requests_in_flight_reuse_the_backend_connections(setup: Setup) -> None:
    """Round after round of CLIENTS requests in flight at once: the backend connections the
    first round opened carry the next rounds (the pool keeps what the load needs idle between
    rounds, not a fixed 64 per origin that made every round above it open and close the rest)."""
    before = setup.backend.connections
    statuses = asyncio.run(_rounds(*setup.image, CLIENTS, ROUNDS))
    assert statuses == [200] * (CLIENTS * ROUNDS)
    opened = setup.backend.connections - before
    # At most one per request in flight (each worker opens what its share needs), and nothing
    # more in the later rounds; a round's share per worker varies a little (a connection is
    # the worker's that accepted it, but the answers come back at different moments).
    assert opened <= CLIENTS * 1.1, f"{opened} backend connections for {CLIENTS} in flight"
