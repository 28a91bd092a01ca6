"""The peer links in the config (settings.peers, clouds.<name>.peer) and in the decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.catalog import Peers
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError
from scoperouter.proxy.listeners import listeners_for
from scoperouter.proxy.supervisor import listen_addresses
from scoperouter.routing import Forward, RequestFacts, decide

from .conftest import SAMPLE


def linked(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    """The sample with a TLS peer link on each cloud (dummy files: the loader checks they
    exist, the TLS stack reads them)."""
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    for cloud, host in (("CloudOne", "127.0.0.2"), ("CloudTwo", "127.0.0.3")):
        data["clouds"][cloud]["peer"] = {
            "url": f"https://{host}:9443",
            "tls": {"cert": "cert.pem", "key": "key.pem"},
        }
    data["settings"]["peers"] = {"ca": "ca.pem", **settings}
    return data


def error(data: dict[str, Any], tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build_catalog(data, source="f.yaml", base_dir=tmp_path)
    return info.value


def test_peer_links_load(tmp_path: Path) -> None:
    catalog = build_catalog(linked(tmp_path, warm=3), source="f.yaml", base_dir=tmp_path)
    peers = catalog.settings.peers
    assert peers == Peers(ca=str(tmp_path / "ca.pem"), warm=3, plain=False)
    peer = catalog.clouds["CloudTwo"].peer
    assert peer is not None and peer.url.base == "https://127.0.0.3:9443"
    assert peer.cert == str(tmp_path / "cert.pem")
    assert ("127.0.0.3", 9443) in catalog.clouds["CloudTwo"].listen_addresses()
    assert ("127.0.0.3", 9443) in listen_addresses(catalog, "CloudTwo")
    (link,) = [item for item in listeners_for(catalog, "CloudTwo") if item.peer]
    assert link.frontend is peer and (link.host, link.port) == ("127.0.0.3", 9443)


def test_a_remote_hop_goes_over_the_peer_link_naming_the_frontend(tmp_path: Path) -> None:
    catalog = build_catalog(linked(tmp_path), source="f.yaml", base_dir=tmp_path)
    facts = RequestFacts(
        method="GET",
        scheme="http",
        host="127.0.0.2",
        port=8774,
        path="/v2.1/servers?limit=2",
        headers={"x-auth-token": 'tok!SCOPE!{"compute": "CloudTwo", "placement": "CloudTwo"}'},
    )
    decision = decide(facts, catalog, "CloudOne")
    assert isinstance(decision, Forward) and decision.remote
    assert decision.url == "https://127.0.0.3:9443/v2.1/servers?limit=2"
    assert decision.set_headers["x-scope-frontend"] == "http://127.0.0.3:8774"
    # A local request never carries it.
    local = decide(
        RequestFacts(
            method="GET",
            scheme="http",
            host="127.0.0.2",
            port=9292,
            path="/v2/images",
            headers={},
        ),
        catalog,
        "CloudOne",
    )
    assert isinstance(local, Forward) and "x-scope-frontend" not in local.set_headers


@pytest.mark.parametrize(
    ("change", "location", "fragment"),
    [
        (
            lambda d: d["clouds"]["CloudTwo"].pop("peer"),
            "f.yaml: clouds.CloudTwo",
            "would reach CloudTwo's router in plain HTTP",
        ),
        (
            lambda d: d["clouds"]["CloudTwo"].update(peer={"url": "http://127.0.0.3:9080"}),
            "f.yaml: clouds.CloudTwo.peer.url",
            "needs settings.peers.plain: true",
        ),
        (
            lambda d: d["clouds"]["CloudTwo"]["peer"].pop("tls"),
            "f.yaml: clouds.CloudTwo.peer.tls",
            "needs tls",
        ),
        (
            lambda d: d["clouds"]["CloudTwo"]["peer"].update(url="https://127.0.0.3:9292"),
            "f.yaml: clouds.CloudTwo.peer",
            "an address of its own",
        ),
        (
            lambda d: d["settings"]["peers"].update(ca="missing.pem"),
            "f.yaml: settings.peers.ca",
            "no such file",
        ),
        (
            lambda d: d["settings"]["peers"].update(warm=-1),
            "f.yaml: settings.peers.warm",
            "an integer from 0 to 64",
        ),
        (
            lambda d: d["settings"]["peers"].update(plain="yes"),
            "f.yaml: settings.peers.plain",
            "true or false",
        ),
        (
            lambda d: d["settings"]["peers"].update(tls=True),
            "f.yaml: settings.peers.tls",
            "unknown key",
        ),
    ],
)
def test_peer_link_errors_say_where(
    tmp_path: Path, change: Any, location: str, fragment: str
) -> None:
    data = linked(tmp_path)
    change(data)
    exc = error(data, tmp_path)
    assert exc.location == location and fragment in exc.message, exc


def test_plain_links_when_configured_so(tmp_path: Path) -> None:
    data = linked(tmp_path, plain=True)
    data["clouds"]["CloudTwo"]["peer"] = {"url": "http://127.0.0.3:9080"}
    data["clouds"]["CloudOne"].pop("peer")
    catalog = build_catalog(data, source="f.yaml", base_dir=tmp_path)
    assert catalog.settings.peers.plain
    # No peer link anywhere: the routers reach each other on their frontends, as before.
    data = yaml.safe_load(SAMPLE.read_text())
    assert build_catalog(data).clouds["CloudTwo"].peer is None


@pytest.mark.parametrize(
    ("peer_idle", "pool_idle"), [(60.0, 54.0), (10.0, 8.0), (4.0, 2.0), (1.0, 0.5), (300.0, 270.0)]
)
def test_the_pool_drops_peer_connections_before_the_peer_does(
    peer_idle: float, pool_idle: float
) -> None:
    assert Peers().idle_seconds(peer_idle) == pytest.approx(pool_idle)


def test_the_pool_keeps_peer_links_warm_across_reloads(tmp_path: Path) -> None:
    from scoperouter.catalog import Settings
    from scoperouter.proxy.lean import Pool

    pool = Pool()
    settings = Settings(peers=Peers(warm=3))
    pool.configure(settings, ["https://127.0.0.3:9443"])
    warm = pool.warm["https://127.0.0.3:9443"]
    warm.opening = 2  # connects under way when the config is reloaded
    pool.configure(Settings(peers=Peers(warm=1)), ["https://127.0.0.3:9443"])
    assert pool.warm["https://127.0.0.3:9443"] is warm and (warm.count, warm.opening) == (1, 2)
    assert pool.idle_seconds == {"https://127.0.0.3:9443": 54.0}
    pool.configure(settings, [])  # the peer left the federation
    assert pool.warm == {} and pool.idle_seconds == {}


# -- the pool's size toward a peer router (scoperouter.proxy.lean.Pool, Warm) ---------------

PEER = "https://127.0.0.3:9443"


class _Transport:
    """What the pool calls on an idle connection's transport."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _pool(warm: int = 2) -> Any:
    from scoperouter.catalog import Settings
    from scoperouter.proxy.lean import Pool

    pool = Pool()
    pool.configure(Settings(peers=Peers(warm=warm)), [PEER])
    pool.refill = lambda key: None  # opens nothing here (no event loop): the counts are checked
    return pool


def _idle(pool: Any, key: str, n: int) -> list[Any]:
    """`n` open connections given back to `pool` (as if each had carried an exchange)."""
    from scoperouter.proxy.lean import UpstreamConnection

    conns = []
    for _ in range(n):
        conn = UpstreamConnection(key)
        conn.transport, conn.open = _Transport(), True  # type: ignore[assignment]
        pool.give_back(conn)
        conns.append(conn)
    return conns


def test_a_warm_target_doubles_on_a_miss_and_shrinks_as_connections_expire() -> None:
    from scoperouter.proxy.lean import POOL_IDLE_MAX, Warm

    warm = Warm("https", "127.0.0.3", 9443, count=2, timeout=5.0, target=2)
    warm.missed(3)  # a request found none idle with 3 in use, its own included
    assert warm.target == 6
    warm.missed(2)  # a smaller burst never lowers it
    assert warm.target == 6
    warm.expired(3)
    assert warm.target == 3
    warm.expired(10)  # never below the configured warm set
    assert warm.target == 2
    off = Warm("https", "127.0.0.3", 9443, count=0, timeout=5.0, target=0)
    off.missed(40)  # settings.peers.warm: 0 opens nothing ahead, whatever the load
    assert off.target == 0
    assert POOL_IDLE_MAX == 64


def test_the_pool_lends_peer_connections_least_recently_used_first_and_counts_them() -> None:
    pool = _pool()
    first, second, third = _idle(pool, PEER, 3)
    # All of a peer's connections carry traffic in turn: none sits idle until it expires.
    assert pool.take(PEER) is first
    assert pool.lent[PEER] == 1
    pool.give_back(first)
    assert pool.lent[PEER] == 0
    assert [pool.take(PEER) for _ in range(3)] == [second, third, first]
    assert pool.lent[PEER] == 3
    assert pool.take(PEER) is None  # none idle: the caller connects (Pool.connect)
    second.connection_lost(None)  # an exchange's connection that closed is returned too
    assert pool.lent[PEER] == 2 and second.lender is None
    second.connection_lost(None)  # once
    assert pool.lent[PEER] == 2


def test_the_pool_lends_a_backends_connections_most_recently_used_first() -> None:
    backend = "http://127.0.1.2:9292"
    pool = _pool()
    first, second = _idle(pool, backend, 2)
    # A backend's pool shrinks to what the load needs: the least used expire.
    assert pool.take(backend) is second
    assert pool.take(backend) is first


def test_an_expired_peer_connection_lowers_the_target_one_the_peer_closed_does_not() -> None:
    import time

    pool = _pool(warm=2)
    warm = pool.warm[PEER]
    warm.target = 8
    conns = _idle(pool, PEER, 3)
    conns[0].open = False  # the peer closed it: the load still wants it, it is opened again
    conns[1].idle_since = time.monotonic() - 1000  # unused for longer than the idle time
    pool.sweep(time.monotonic())
    assert warm.target == 7
    assert list(pool.idle[PEER]) == [conns[2]]
    assert conns[1].transport.closed  # type: ignore[union-attr]
