"""The shared federation: CloudOne and CloudTwo, each with its own router process.

    CloudOne router 127.0.0.2  identity :P/v3  image :P  placement :P  proxy :P
    CloudTwo router 127.0.0.3  identity :P/v3  image :P  placement :P  proxy :P
    (placement backends are closed ports: a local service that is down -> 502)
    backends        127.0.1.2 (CloudOne), 127.0.1.3 (CloudTwo): echo servers
    CloudDown       127.0.0.4  frontends on closed ports (its router is down)        -> 502
    CloudSilent     127.0.0.5  frontends on a server that accepts and never answers  -> 504
    CloudFull       127.0.0.6  frontends on a port a test fills (connect hangs)      -> 504
    CloudGarbage    127.0.0.17 frontend answering bytes that are not HTTP            -> 502

Short timeouts (connect 1 s, response 1.5 s) keep the error tests fast; the circuit breaker
never trips here (test_health.py has its own routers for it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .backends import EchoBackend, RawServer, SilentServer
from .routers import Router, cloud_entry, free_port, start_all, stop_all, write_config

CONNECT_TIMEOUT = 1.0
RESPONSE_TIMEOUT = 1.5
SERVICES = ("identity", "image")
PATHS = {"identity": "/v3", "image": "", "placement": ""}


@dataclass
class Federation:
    config: Path
    routers: dict[str, Router]
    backends: dict[tuple[str, str], EchoBackend]
    frontends: dict[str, dict[str, str]]  # cloud -> service -> frontend base URL (no path)
    proxies: dict[str, str]  # cloud -> forward proxy URL
    full_address: tuple[str, int]  # CloudFull's frontend (image): nothing listens there

    def url(self, cloud: str, service: str, rest: str = "") -> str:
        """The public URL of a service (with its path) followed by `rest`."""
        return self.frontends[cloud][service] + PATHS[service] + rest


@pytest.fixture(scope="session")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    tmp = tmp_path_factory.mktemp("federation")
    backends: dict[tuple[str, str], EchoBackend] = {}
    for cloud, host in (("CloudOne", "127.0.1.2"), ("CloudTwo", "127.0.1.3")):
        for service in SERVICES:
            backends[(cloud, service)] = EchoBackend(host, name=f"{cloud}-{service}").start()
    silent = SilentServer("127.0.0.5").start()
    garbage = RawServer(b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "127.0.0.17").start()

    clouds: dict[str, dict] = {}
    frontends: dict[str, dict[str, str]] = {}
    proxies: dict[str, str] = {}
    routers: dict[str, Router] = {}
    for cloud, host in (("CloudOne", "127.0.0.2"), ("CloudTwo", "127.0.0.3")):
        services = {
            s: (free_port(host), PATHS[s], backends[(cloud, s)].url + PATHS[s]) for s in SERVICES
        }
        backend_host = backends[(cloud, "image")].host  # placement: a local service that is down
        services["placement"] = (
            free_port(host),
            "",
            f"http://{backend_host}:{free_port(backend_host)}",
        )
        proxy_port = free_port(host)
        clouds[cloud] = cloud_entry(host, services, proxy_port=proxy_port)
        frontends[cloud] = {s: f"http://{host}:{port}" for s, (port, _, _) in services.items()}
        proxies[cloud] = f"http://{host}:{proxy_port}"
        addresses = [(host, port) for port, _, _ in services.values()] + [(host, proxy_port)]
        routers[cloud] = Router(cloud, tmp / "federation.yaml", tmp / f"{cloud}.log", addresses)

    clouds["CloudDown"] = cloud_entry(
        "127.0.0.4",
        {
            s: (free_port("127.0.0.4"), PATHS[s], f"http://127.0.1.4:{9 + i}")
            for i, s in enumerate(SERVICES)
        },
    )
    clouds["CloudSilent"] = cloud_entry(
        "127.0.0.5", {"image": (silent.port, "", "http://127.0.1.5:9")}
    )
    full_port = free_port("127.0.0.6")
    clouds["CloudFull"] = cloud_entry("127.0.0.6", {"image": (full_port, "", "http://127.0.1.6:9")})
    clouds["CloudGarbage"] = cloud_entry(
        "127.0.0.17", {"image": (garbage.port, "", "http://127.0.1.17:9")}
    )
    for name in ("CloudDown", "CloudSilent", "CloudFull", "CloudGarbage"):
        frontends[name] = {
            s: entry["public"]["url"].removesuffix(PATHS[s])
            for s, entry in clouds[name]["services"].items()
        }

    config = write_config(
        tmp / "federation.yaml",
        clouds,
        connect_timeout=CONNECT_TIMEOUT,
        response_timeout=RESPONSE_TIMEOUT,
        # Each error test expects its own timeout or refusal: no upstream is marked down here
        # (test_health.py tests the breaker with routers of its own).
        breaker={"failures": 1000},
    )
    start_all(routers.values())
    try:
        yield Federation(config, routers, backends, frontends, proxies, ("127.0.0.6", full_port))
    finally:
        codes = stop_all(routers.values())
        silent.stop()
        garbage.stop()
        for backend in backends.values():
            backend.stop()
    # Routers exit cleanly on SIGTERM (and did not crash during the session).
    assert codes == {name: 0 for name in routers}, {
        name: routers[name].log_text()[-3000:] for name in routers
    }


@pytest.fixture
def one(federation: Federation) -> Router:
    return federation.routers["CloudOne"]


@pytest.fixture
def two(federation: Federation) -> Router:
    return federation.routers["CloudTwo"]
