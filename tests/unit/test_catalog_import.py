"""The catalog import (`scoperouter import-catalog`): keystone endpoint lists -> federation
config, as the lab and playbooks/federation.yml use it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from scoperouter.catalog_import import (
    FRONTEND_CERT,
    FRONTEND_KEY,
    PEER_CA,
    PEER_CERT,
    PEER_KEY,
    CloudEndpoints,
    PeerLinks,
    TlsFiles,
    import_catalog,
    import_request,
    router_url,
)
from scoperouter.cli import main
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError

ONE_ROWS = [
    {"service_type": "identity", "interface": "public", "url": "http://10.0.1.5:5000/v3",
     "region": "CloudOne"},
    {"service_type": "identity", "interface": "internal", "url": "http://10.0.1.5:5000/v3/",
     "region": "CloudOne"},
    {"service_type": "image", "interface": "public", "url": "http://10.0.1.5:9292",
     "region": "CloudOne"},
    {"service_type": "compute", "interface": "public", "url": "https://10.0.1.5:8774/v2.1",
     "region": "CloudOne"},
    # another region of the same keystone, and a disabled endpoint: not this cloud's
    {"service_type": "image", "interface": "public", "url": "http://10.9.9.9:9292",
     "region": "Elsewhere"},
    {"service_type": "image", "interface": "admin", "url": "http://10.0.1.5:9393",
     "region": "CloudOne", "enabled": False},
]  # fmt: skip
TWO_ROWS = [
    {"service_type": "identity", "interface": "public", "url": "http://10.0.2.5:5000/v3",
     "region": "CloudTwo"},
    {"service_type": "image", "interface": "public", "url": "http://10.0.2.5:9292",
     "region": "CloudTwo"},
]  # fmt: skip


def _clouds() -> list[CloudEndpoints]:
    return [
        CloudEndpoints(
            name="CloudOne",
            region="CloudOne",
            endpoints=ONE_ROWS,
            router_host="10.0.1.6",
            proxy_listen="10.0.1.6:3128",
            credentials={"CloudTwo": "router-at-cloudtwo"},
        ),
        CloudEndpoints(
            name="CloudTwo",
            region="CloudTwo",
            endpoints=TWO_ROWS,
            router_host="10.0.2.5",
            router_ports={5000: 15000, 9292: 19292},
            metrics_listen="10.0.2.5:9180",
        ),
    ]


def test_backends_are_advertised_on_the_router_address_with_same_port_and_path():
    config = import_catalog(_clouds(), {"hop_limit": 4})
    one = config["clouds"]["CloudOne"]
    assert one["services"]["identity"] == {
        "public": {"url": "http://10.0.1.6:5000/v3", "backend": "http://10.0.1.5:5000/v3"},
        "internal": {"url": "http://10.0.1.6:5000/v3", "backend": "http://10.0.1.5:5000/v3"},
    }
    assert one["services"]["compute"]["public"] == {
        "url": "https://10.0.1.6:8774/v2.1",
        "backend": "https://10.0.1.5:8774/v2.1",
    }
    # the other region's and the disabled endpoint are left out
    assert one["services"]["image"] == {
        "public": {"url": "http://10.0.1.6:9292", "backend": "http://10.0.1.5:9292"}
    }
    assert [f["url"] for f in one["frontends"]] == [
        "http://10.0.1.6:5000",
        "https://10.0.1.6:8774",
        "http://10.0.1.6:9292",
    ]
    assert one["proxy"] == {"listen": "10.0.1.6:3128"}
    assert one["credentials"] == {"CloudTwo": "router-at-cloudtwo"}
    assert config["settings"] == {"hop_limit": 4}


def test_a_router_on_the_services_address_takes_other_ports():
    two = import_catalog(_clouds())["clouds"]["CloudTwo"]
    assert two["services"]["image"]["public"] == {
        "url": "http://10.0.2.5:19292",
        "backend": "http://10.0.2.5:9292",
    }
    assert two["metrics"] == {"listen": "10.0.2.5:9180"}
    assert "proxy" not in two and "credentials" not in two


def test_the_result_is_what_the_router_loads():
    clouds = _clouds()
    # without the https endpoint (an https frontend needs a certificate)
    clouds[0] = dataclasses.replace(clouds[0], endpoints=ONE_ROWS[:3] + ONE_ROWS[4:])
    catalog = build_catalog(import_catalog(clouds))
    match = catalog.match("10.0.1.6", 9292, "/v2/images")
    assert match is not None and str(match.endpoint.backend) == "http://10.0.1.5:9292"
    assert str(catalog.endpoint("CloudTwo", "identity", "public").url) == (  # type: ignore[union-attr]
        "http://10.0.2.5:15000/v3"
    )


def test_only_the_chosen_service_types():
    cloud = CloudEndpoints(
        name="CloudOne",
        region="CloudOne",
        endpoints=ONE_ROWS,
        router_host="10.0.1.6",
        service_types=["identity"],
    )
    assert set(import_catalog([cloud])["clouds"]["CloudOne"]["services"]) == {"identity"}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "no endpoint in region CloudOne"),
        (ONE_ROWS[:1] * 2, "two public endpoints in region CloudOne"),
        ([{**ONE_ROWS[0], "url": "ftp://x:1/v3"}], "not an http:// or https:// URL"),
        ([{"interface": "public", "url": "http://x:1"}], "without service_type"),
    ],
)
def test_bad_endpoint_lists_are_refused_with_the_key(rows, message):
    cloud = CloudEndpoints(name="CloudOne", region="CloudOne", endpoints=rows, router_host="h")
    with pytest.raises(ConfigError, match=message) as err:
        import_catalog([cloud])
    assert err.value.location.startswith("clouds.CloudOne")


def test_router_url_keeps_scheme_path_and_brackets_ipv6():
    assert router_url("https://a:443/x/", "::1", {}) == "https://[::1]:443/x"
    assert router_url("http://a/identity", "b", {80: 8080}) == "http://b:8080/identity"


def test_request_reads_the_identity_api_and_osc_formats():
    data = {
        "clouds": {
            "CloudOne": {
                "router": {"host": "10.0.1.6", "ports": {"9292": "19292"}},
                "services": [{"id": "s1", "type": "image"}],
                "endpoints": [
                    # the identity API's /v3/endpoints row: service_id, region_id
                    {"id": "e1", "service_id": "s1", "interface": "public",
                     "url": "http://10.0.1.5:9292", "region_id": "CloudOne", "enabled": True,
                     "links": {"self": "http://k/v3/endpoints/e1"}},
                    # `openstack endpoint list -f json`
                    {"ID": "e2", "Service Type": "identity", "Interface": "public",
                     "URL": "http://10.0.1.5:5000/v3", "Region": "CloudOne", "Enabled": True},
                ],
            }
        }
    }  # fmt: skip
    clouds, settings = import_request(data)
    config = import_catalog(clouds, settings)
    services = config["clouds"]["CloudOne"]["services"]
    assert services["image"]["public"]["url"] == "http://10.0.1.6:19292"
    assert services["identity"]["public"]["url"] == "http://10.0.1.6:5000/v3"
    assert "settings" not in config


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({}, "clouds"),
        ({"clouds": {}, "extra": 1}, "extra"),
        ({"clouds": {"A": {"endpoints": []}}}, "clouds.A.router.host"),
        ({"clouds": {"A": {"router": {"host": "h"}, "endpoints": {}}}}, "clouds.A.endpoints"),
        ({"clouds": {"A": {"router": {"host": "h"}, "endpoints": [], "x": 1}}}, "clouds.A.x"),
        ({"clouds": {"A": {"router": {"host": "h", "ports": {"a": 1}}, "endpoints": []}}},
         "clouds.A.router.ports"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_key(data, where):
    with pytest.raises(ConfigError) as err:
        import_request(data)
    assert err.value.location == where


def test_cli_writes_a_config_that_check_config_accepts(tmp_path: Path, capsys):
    request = tmp_path / "in.json"
    request.write_text(
        json.dumps(
            {
                "clouds": {
                    "CloudTwo": {
                        "router": {"host": "10.0.2.6"},
                        "proxy": {"listen": "10.0.2.6:3128"},
                        "endpoints": TWO_ROWS,
                    }
                }
            }
        )
    )
    out = tmp_path / "federation.yaml"
    assert main(["import-catalog", str(request), "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["clouds"]["CloudTwo"]["proxy"] == {
        "listen": "10.0.2.6:3128"
    }
    assert main(["check-config", str(out), "--cloud", "CloudTwo"]) == 0


def test_cli_refuses_what_the_router_would_refuse(tmp_path: Path, capsys):
    request = tmp_path / "in.yaml"
    # the router on the backend's own address and port: a loop the loader refuses
    loop = {"clouds": {"CloudTwo": {"router": {"host": "10.0.2.5"}, "endpoints": TWO_ROWS}}}
    request.write_text(yaml.safe_dump(loop))
    assert main(["import-catalog", str(request)]) == 1
    err = capsys.readouterr().err
    assert "in.yaml" in err and "CloudTwo" in err
    assert main(["import-catalog", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


# ------------------------------------------------------------------------- peer links


def test_without_peer_options_there_is_no_peer_link():
    config = import_catalog(_clouds(), {"hop_limit": 4})
    assert all("peer" not in cloud for cloud in config["clouds"].values())
    assert config["settings"] == {"hop_limit": 4}


def test_peer_links_for_every_cloud_on_the_router_host():
    links = PeerLinks(port=9443)
    config = import_catalog(_clouds(), {"peers": {"warm": 3}}, links)
    one, two = config["clouds"]["CloudOne"], config["clouds"]["CloudTwo"]
    assert one["peer"] == {
        "url": "https://10.0.1.6:9443",
        "tls": {"cert": PEER_CERT, "key": PEER_KEY},
    }
    assert two["peer"]["url"] == "https://10.0.2.5:9443"
    # right after the frontends, as in config/federation.yaml; the CA in settings.peers
    assert list(one)[:3] == ["region", "frontends", "peer"]
    assert config["settings"] == {"peers": {"warm": 3, "ca": PEER_CA}}
    assert list(config) == ["version", "settings", "clouds"]


def test_peer_link_patterns_and_a_cloud_of_its_own():
    clouds = _clouds()
    clouds[1] = dataclasses.replace(
        clouds[1],
        peer={"url": "https://router.two.example.org:443", "listen": "0.0.0.0:9443"},
    )
    links = PeerLinks(port=9443, cert="/pki/{slug}.crt", key="/pki/{cloud}.key", ca="/pki/ca")
    config = import_catalog(clouds, None, links)
    assert config["clouds"]["CloudOne"]["peer"]["tls"] == {
        "cert": "/pki/cloudone.crt",
        "key": "/pki/CloudOne.key",
    }
    assert config["clouds"]["CloudTwo"]["peer"] == {
        "url": "https://router.two.example.org:443",
        "listen": "0.0.0.0:9443",
        "tls": {"cert": "/pki/cloudtwo.crt", "key": "/pki/CloudTwo.key"},
    }
    assert config["settings"] == {"peers": {"ca": "/pki/ca"}}


def test_an_ipv6_router_host_is_bracketed():
    cloud = CloudEndpoints(
        name="CloudOne",
        region="CloudOne",
        endpoints=[{**ONE_ROWS[2], "url": "http://[fd00::5]:9292"}],
        router_host="fd00::6",
    )
    config = import_catalog([cloud], None, PeerLinks(port=9443))
    assert config["clouds"]["CloudOne"]["peer"]["url"] == "https://[fd00::6]:9443"


def test_peer_links_from_the_request_only():
    """playbooks/federation.yml gives each cloud's block (its files on its own host) and the
    CA in the settings; no option."""
    data = {
        "settings": {"peers": {"ca": "/etc/a/federation-ca.crt"}},
        "clouds": {
            "CloudTwo": {
                "router": {"host": "10.0.2.6"},
                "peer": {
                    "url": "https://10.0.2.6:9443",
                    "tls": {"cert": "/etc/b/peer.crt", "key": "/etc/b/peer.key"},
                },
                "endpoints": TWO_ROWS,
            }
        },
    }
    clouds, settings = import_request(data)
    config = import_catalog(clouds, settings)
    assert config["clouds"]["CloudTwo"]["peer"] == data["clouds"]["CloudTwo"]["peer"]
    assert config["settings"] == {"peers": {"ca": "/etc/a/federation-ca.crt"}}


@pytest.mark.parametrize(
    ("peer", "where"),
    [
        ("https://x:1", "clouds.A.peer"),
        ({"url": "https://x:1", "port": 1}, "clouds.A.peer.port"),
        ({"url": 9443}, "clouds.A.peer.url"),
        ({"url": "https://x:1", "tls": {"cert": "c"}}, "clouds.A.peer.tls"),
    ],
)
def test_bad_peer_requests_name_the_key(peer, where):
    data = {"clouds": {"A": {"router": {"host": "h"}, "endpoints": [], "peer": peer}}}
    with pytest.raises(ConfigError) as err:
        import_request(data)
    assert err.value.location == where


def test_a_peer_link_needs_an_address():
    clouds = [dataclasses.replace(_clouds()[1], peer={})]
    with pytest.raises(ConfigError, match="--peer-port") as err:
        import_catalog(clouds)
    assert err.value.location == "clouds.CloudTwo.peer.url"


def _request(tmp_path: Path) -> Path:
    request = tmp_path / "in.yaml"
    clouds = {
        "CloudOne": {"router": {"host": "10.0.1.6"}, "endpoints": ONE_ROWS[:3]},
        "CloudTwo": {"router": {"host": "10.0.2.6"}, "endpoints": TWO_ROWS},
    }
    request.write_text(yaml.safe_dump({"clouds": clouds}))
    return request


def test_cli_peer_links_pass_check_config_once_the_files_are_made(tmp_path: Path, capsys):
    """The import names the files each router's host will have; it says which are not there
    yet, and check-config accepts the config once `scoperouter pki` has made them."""
    pki = tmp_path / "pki"
    out = tmp_path / "federation.yaml"
    argv = ["import-catalog", str(_request(tmp_path)), "-o", str(out), "--peer-port", "9443",
            "--peer-cert", f"{pki}/{{slug}}.crt", "--peer-key", f"{pki}/{{slug}}.key",
            "--peer-ca", f"{pki}/ca.crt"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "not there yet" in err and f"{pki}/cloudone.key" in err
    config = yaml.safe_load(out.read_text())
    assert config["clouds"]["CloudTwo"]["peer"] == {
        "url": "https://10.0.2.6:9443",
        "tls": {"cert": f"{pki}/cloudtwo.crt", "key": f"{pki}/cloudtwo.key"},
    }
    assert main(["check-config", str(out)]) == 1
    ca = ["--ca-cert", f"{pki}/ca.crt", "--ca-key", f"{pki}/ca.key"]
    assert main(["pki", "ca", "--cert", ca[1], "--key", ca[3]]) == 0
    for slug, host in (("cloudone", "10.0.1.6"), ("cloudtwo", "10.0.2.6")):
        files = ["--cert", f"{pki}/{slug}.crt", "--key", f"{pki}/{slug}.key"]
        assert main(["pki", "issue", *ca, *files, host]) == 0
    capsys.readouterr()
    assert main(["check-config", str(out), "--cloud", "CloudOne"]) == 0
    summary = capsys.readouterr().out
    assert f"peer links, TLS verified against {pki}/ca.crt" in summary
    assert "peer link https://10.0.1.6:9443" in summary
    # the files there now: no note
    assert main(argv) == 0
    assert "not there yet" not in capsys.readouterr().err


def test_cli_refuses_peer_links_for_some_clouds_only(tmp_path: Path, capsys):
    request = _request(tmp_path)
    data = yaml.safe_load(request.read_text())
    data["clouds"]["CloudTwo"]["peer"] = {"url": "https://10.0.2.6:9443"}
    request.write_text(yaml.safe_dump(data))
    assert main(["import-catalog", str(request)]) == 1
    assert "CloudOne's router in plain HTTP" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["import-catalog", str(request), "--peer-port", "70000"])


def test_https_frontends_get_the_certificate_their_routers_host_has():
    one = import_catalog(_clouds())["clouds"]["CloudOne"]
    tls = {"cert": FRONTEND_CERT, "key": FRONTEND_KEY}
    assert one["frontends"][1] == {"url": "https://10.0.1.6:8774", "tls": tls}
    assert all("tls" not in f for f in one["frontends"] if f["url"].startswith("http:"))
    files = TlsFiles(frontend_cert="/pki/{slug}-front.crt", frontend_key="/pki/{cloud}.key")
    one = import_catalog(_clouds(), tls=files)["clouds"]["CloudOne"]
    assert one["frontends"][1]["tls"] == {
        "cert": "/pki/cloudone-front.crt",
        "key": "/pki/CloudOne.key",
    }
    own = dataclasses.replace(_clouds()[0], router_tls={"cert": "/c.crt", "key": "/c.key"})
    one = import_catalog([own], tls=files)["clouds"]["CloudOne"]
    assert one["frontends"][1]["tls"] == {"cert": "/c.crt", "key": "/c.key"}


def test_the_router_as_the_internal_endpoint_on_an_address_of_its_own():
    """kolla's TLS-internal way: internal URLs on the router's internal address (its own
    https frontends), public ones on its public address; the peer link on router.host."""
    rows = [
        {"service_type": "image", "interface": "public", "url": "https://203.0.113.5:9292"},
        {"service_type": "image", "interface": "internal", "url": "https://10.0.0.5:9292"},
    ]
    cloud = CloudEndpoints(
        name="CloudOne",
        region="CloudOne",
        endpoints=rows,
        router_host="203.0.113.10",
        router_hosts={"internal": "10.0.0.10"},
    )
    config = import_catalog([cloud], peers=PeerLinks(port=9443))
    one = config["clouds"]["CloudOne"]
    assert one["services"]["image"] == {
        "internal": {"url": "https://10.0.0.10:9292", "backend": "https://10.0.0.5:9292"},
        "public": {"url": "https://203.0.113.10:9292", "backend": "https://203.0.113.5:9292"},
    }
    assert [f["url"] for f in one["frontends"]] == [
        "https://10.0.0.10:9292",
        "https://203.0.113.10:9292",
    ]
    assert one["peer"]["url"] == "https://203.0.113.10:9443"


def test_forward_proxies_intercept_tls_with_their_clouds_ca_when_asked():
    assert "ca" not in import_catalog(_clouds())["clouds"]["CloudOne"]["proxy"]
    files = TlsFiles(proxy_ca="/pki/{slug}-proxy-ca.crt", proxy_ca_key="/pki/{slug}-proxy-ca.key")
    config = import_catalog(_clouds(), tls=files)
    assert config["clouds"]["CloudOne"]["proxy"] == {
        "listen": "10.0.1.6:3128",
        "ca": "/pki/cloudone-proxy-ca.crt",
        "ca_key": "/pki/cloudone-proxy-ca.key",
    }
    assert "proxy" not in config["clouds"]["CloudTwo"]  # no forward proxy: nothing to intercept
    own = dataclasses.replace(_clouds()[0], proxy_ca={"ca": "/a.crt", "ca_key": "/a.key"})
    proxy = import_catalog([own], tls=files)["clouds"]["CloudOne"]["proxy"]
    assert (proxy["ca"], proxy["ca_key"]) == ("/a.crt", "/a.key")


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"router": {"host": "h", "hosts": {"private": "x"}}}, "clouds.CloudOne.router.hosts"),
        ({"router": {"host": "h", "tls": {"cert": "c"}}}, "clouds.CloudOne.router.tls"),
        ({"proxy": {"listen": "h:1", "ca": "c"}}, "clouds.CloudOne.proxy"),
    ],
)
def test_bad_tls_requests_name_the_key(change, where):
    spec = {"router": {"host": "10.0.1.6"}, "endpoints": ONE_ROWS[:3], **change}
    with pytest.raises(ConfigError) as err:
        import_request({"clouds": {"CloudOne": spec}})
    assert err.value.location == where


def test_cli_tls_files_pass_check_config_once_made(tmp_path: Path, capsys):
    """A TLS cloud through the CLI: the https frontends' and the proxy CA's files are named,
    noted as not there yet, and check-config accepts the config once they are made."""
    pki = tmp_path / "pki"
    request = tmp_path / "in.yaml"
    rows = [{"service_type": "image", "interface": "public", "url": "https://10.0.1.5:9292"}]
    spec = {"router": {"host": "10.0.1.6"}, "proxy": {"listen": "10.0.1.6:3128"}, "endpoints": rows}
    request.write_text(yaml.safe_dump({"clouds": {"CloudOne": spec}}))
    out = tmp_path / "federation.yaml"
    argv = ["import-catalog", str(request), "-o", str(out),
            "--frontend-cert", f"{pki}/front.crt", "--frontend-key", f"{pki}/front.key",
            "--proxy-ca", f"{pki}/proxy-ca.crt",
            "--proxy-ca-key", f"{pki}/proxy-ca.key"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "not there yet" in err and f"{pki}/front.key" in err and f"{pki}/proxy-ca.key" in err
    assert main(["pki", "ca", "--cert", f"{pki}/ca.crt", "--key", f"{pki}/ca.key"]) == 0
    ca = ["--ca-cert", f"{pki}/ca.crt", "--ca-key", f"{pki}/ca.key"]
    files = ["--cert", f"{pki}/front.crt", "--key", f"{pki}/front.key"]
    assert main(["pki", "issue", *ca, *files, "10.0.1.6"]) == 0
    assert main(["pki", "ca", "--cert", f"{pki}/proxy-ca.crt", "--key", f"{pki}/proxy-ca.key"]) == 0
    capsys.readouterr()
    assert main(["check-config", str(out), "--cloud", "CloudOne"]) == 0
    assert f"intercepting TLS with {pki}/proxy-ca.crt" in capsys.readouterr().out
