"""The peer links in the config (settings.peers, clouds.<name>.peer) and in the decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.catalog import Peers
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError
from scoperouter.proxy.supervisor import listen_addresses
from scoperouter.router.listeners import listeners_for
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
