"""The supervisor's pieces that need no worker: listening sockets, the workers' command line,
the status page's routing (the processes themselves: tests/integration/test_workers.py)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from scoperouter.catalog import Catalog
from scoperouter.proxy import statusserver, supervisor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def sets() -> Iterator[list[dict[tuple[str, int], socket.socket]]]:
    made: list[dict[tuple[str, int], socket.socket]] = []
    yield made
    for copy in made:
        for sock in copy.values():
            sock.close()


def test_one_reuseport_socket_per_worker_and_address(
    sets: list[dict[tuple[str, int], socket.socket]],
) -> None:
    addresses = [("127.0.0.1", free_port()), ("127.0.0.1", free_port())]
    sets += supervisor.bind_listeners(addresses, 3)
    assert len(sets) == 3 and all(set(copy) == set(addresses) for copy in sets)
    for copy in sets:
        for (host, port), sock in copy.items():
            assert sock.getsockname() == (host, port)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            assert sock.get_inheritable()
    # The kernel accepts connections into them before any worker runs.
    socket.create_connection(addresses[0], timeout=2).close()


def test_a_port_taken_by_another_router_is_refused(
    sets: list[dict[tuple[str, int], socket.socket]],
) -> None:
    address = ("127.0.0.1", free_port())
    sets += supervisor.bind_listeners([address], 1)  # another router, with SO_REUSEPORT too
    with pytest.raises(supervisor.StartupError) as info:
        supervisor.bind_listeners([address], 2)
    assert info.value.code == 1 and "address already in use" in str(info.value)


def test_listen_addresses_are_the_frontends_then_the_proxy(catalog: Catalog) -> None:
    found = supervisor.listen_addresses(catalog, "CloudOne")
    assert found[-1] == ("127.0.0.2", 3128)
    assert ("127.0.0.2", 9292) in found and len(found) == len(set(found))


def test_workers_run_with_the_supervisors_optimisation(monkeypatch: pytest.MonkeyPatch) -> None:
    class Flags:
        optimize = 1

    monkeypatch.setattr(sys, "flags", Flags)
    assert supervisor.python_command() == [sys.executable, "-O"]
    Flags.optimize = 0
    assert supervisor.python_command() == [sys.executable]


class FakeSupervisor:
    def health(self) -> tuple[int, dict[str, Any]]:
        return 503, {"status": "starting"}

    def metrics_text(self) -> bytes:
        return b"scoperouter_workers 0\n"


def _call(app: Any, method: str, path: str) -> tuple[str, bytes]:
    seen: dict[str, str] = {}

    def start(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"] = status

    body = b"".join(app({"REQUEST_METHOD": method, "PATH_INFO": path}, start))
    return seen["status"], body


def test_status_page_routes() -> None:
    server = statusserver.StatusServer.__new__(statusserver.StatusServer)
    server.router = FakeSupervisor()  # type: ignore[assignment]
    assert _call(server.app, "GET", "/healthz") == (
        "503 Service Unavailable",
        b'{"status": "starting"}',
    )
    assert _call(server.app, "GET", "/metrics")[1] == b"scoperouter_workers 0\n"
    assert _call(server.app, "GET", "/other")[0] == "404 Not Found"
    assert _call(server.app, "POST", "/metrics")[0] == "405 Method Not Allowed"
