"""The federation model: loading, validation messages, and URL matching."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter import catalog as catalog_module
from scoperouter.catalog import (
    URL,
    Catalog,
    Cloud,
    Endpoint,
    Settings,
    parse_url,
    strip_version,
)
from scoperouter.config import build_catalog, load_catalog
from scoperouter.errors import ConfigError

from .conftest import SAMPLE


def sample() -> dict[str, Any]:
    return yaml.safe_load(SAMPLE.read_text())


def test_sample_loads(catalog: Catalog) -> None:
    assert set(catalog.clouds) == {"CloudOne", "CloudTwo"}
    assert catalog.service_types == {"identity", "image", "compute", "placement"}
    assert catalog.clouds["CloudOne"].proxy_listen == ("127.0.0.2", 3128)


def test_match_longest_prefix_and_rest(catalog: Catalog) -> None:
    m = catalog.match("127.0.0.2", 5000, "/v3/auth/tokens?nocatalog")
    assert m is not None
    assert (m.endpoint.cloud, m.endpoint.service_type, m.kind) == ("CloudOne", "identity", "public")
    assert m.rest == "/auth/tokens?nocatalog"
    assert not m.versionless


def test_match_versionless_root_for_discovery(catalog: Catalog) -> None:
    m = catalog.match("127.0.0.2", 8774, "/")
    assert m is not None and m.versionless and m.endpoint.service_type == "compute"
    assert m.target(m.endpoint.backend) == "http://127.0.1.2:8774/"


def test_match_backend_urls_and_misses(catalog: Catalog) -> None:
    m = catalog.match("127.0.1.3", 9292, "/v2/images")
    assert m is not None and m.kind == "backend" and m.endpoint.cloud == "CloudTwo"
    assert catalog.match("127.0.0.9", 9292, "/v2/images") is None
    assert catalog.match("127.0.0.2", 5000, "/v2.0/x") is not None  # version-less prefix ""


def test_segment_boundaries() -> None:
    data = sample()
    data["clouds"]["CloudOne"]["services"]["image"]["public"]["url"] = "http://127.0.0.2:9292/image"
    cat = build_catalog(data)
    assert cat.match("127.0.0.2", 9292, "/images/x") is None
    m = cat.match("127.0.0.2", 9292, "/image/v2/images")
    assert m is not None and m.rest == "/v2/images"


def test_endpoint_lookup_falls_back_to_public(catalog: Catalog) -> None:
    ep = catalog.endpoint("CloudTwo", "image", "internal")
    assert ep is not None and ep.interface == "public" and ep.cloud == "CloudTwo"
    assert catalog.endpoint("CloudTwo", "volume", "public") is None


def _error(mutate: Any) -> ConfigError:
    data = sample()
    mutate(data)
    with pytest.raises(ConfigError) as info:
        build_catalog(data, source="f.yaml")
    return info.value


@pytest.mark.parametrize(
    ("mutate", "location", "fragment"),
    [
        (lambda d: d.pop("clouds"), "f.yaml: (top level)", "missing key(s): clouds"),
        (lambda d: d.update(version=2), "f.yaml: version", "unsupported version"),
        (
            lambda d: d["settings"].update(hop_limit=0),
            "f.yaml: settings.hop_limit",
            "positive integer",
        ),
        (
            lambda d: d["settings"].update(connect_timeout="soon"),
            "f.yaml: settings.connect_timeout",
            "seconds",
        ),
        (lambda d: d["settings"].update(colour="blue"), "f.yaml: settings.colour", "unknown key"),
        (
            lambda d: d["clouds"]["CloudOne"].pop("frontends"),
            "f.yaml: clouds.CloudOne",
            "missing key(s): frontends",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["services"]["image"]["public"].update(
                backend="ftp://x"
            ),
            "f.yaml: clouds.CloudOne.services.image.public.backend",
            "not an http:// or https:// URL",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["services"]["image"]["public"].update(
                url="http://127.0.0.9:9292"
            ),
            "f.yaml: clouds.CloudOne.services.image.public.url",
            "not on one of this cloud's frontends",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["services"]["image"].update(private={}),
            "f.yaml: clouds.CloudOne.services.image.private",
            "unknown key",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["frontends"].append(
                {"url": "https://127.0.0.2:8443"}
            ),
            "f.yaml: clouds.CloudOne.frontends[4].tls",
            "https frontend needs tls",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["proxy"].update(listen="nowhere"),
            "f.yaml: clouds.CloudOne.proxy.listen",
            "is not HOST:PORT",
        ),
        (
            lambda d: d["clouds"].update({"Bad Name": copy.deepcopy(d["clouds"]["CloudTwo"])}),
            "f.yaml: clouds.Bad Name",
            "cannot be empty or contain spaces",
        ),
        (
            lambda d: d["clouds"]["CloudTwo"]["services"]["image"]["public"].update(
                backend="http://127.0.1.2:9292"
            ),
            "f.yaml: clouds.CloudTwo.services.image.public",
            "also the backend URL of image in CloudOne",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["services"]["image"]["public"].update(
                backend="http://127.0.0.2:9292"
            ),
            "f.yaml: clouds.CloudOne.services.image.public.backend",
            "is where the router of CloudOne listens",
        ),
        (  # another cloud's router as a backend: requests would bounce between the two
            lambda d: d["clouds"]["CloudOne"]["services"]["image"]["public"].update(
                backend="http://127.0.0.3:9292"
            ),
            "f.yaml: clouds.CloudOne.services.image.public.backend",
            "is where the router of CloudTwo listens",
        ),
        (  # the forward proxy is the router too
            lambda d: d["clouds"]["CloudTwo"]["services"]["image"]["public"].update(
                backend="http://127.0.0.2:3128"
            ),
            "f.yaml: clouds.CloudTwo.services.image.public.backend",
            "is where the router of CloudOne listens",
        ),
        (
            lambda d: d["settings"].update(limits={"max_headers": 0}),
            "f.yaml: settings.limits.max_headers",
            "positive integer",
        ),
        (
            lambda d: d["settings"].update(limits={"max_request_line": 100000}),
            "f.yaml: settings.limits.max_request_line",
            "not be larger than max_header_bytes",
        ),
        (
            lambda d: d["settings"].update(limits={"header_time": 3}),
            "f.yaml: settings.limits.header_time",
            "unknown key",
        ),
        (
            lambda d: d["settings"].update(breaker={"down_for": -1}),
            "f.yaml: settings.breaker.down_for",
            "positive number",
        ),
        (
            lambda d: d["settings"].update(peer_response_timeout=0),
            "f.yaml: settings.peer_response_timeout",
            "positive number",
        ),
        (
            lambda d: d["clouds"]["CloudOne"].update(metrics={"listen": "x"}),
            "f.yaml: clouds.CloudOne.metrics.listen",
            "is not HOST:PORT",
        ),
        (  # the forward proxy's CA: its key with it, files that exist; metrics has neither
            lambda d: d["clouds"]["CloudOne"]["proxy"].update(ca=SAMPLE.name),
            "f.yaml: clouds.CloudOne.proxy.ca_key",
            "required with ca (TLS interception)",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["proxy"].update(ca_key=SAMPLE.name),
            "f.yaml: clouds.CloudOne.proxy.ca",
            "required with ca_key",
        ),
        (
            lambda d: d["clouds"]["CloudOne"]["proxy"].update(ca="", ca_key="k"),
            "f.yaml: clouds.CloudOne.proxy.ca",
            "expected a file path",
        ),
        (
            lambda d: d["clouds"]["CloudOne"].update(metrics={"listen": "x:1", "ca": "c"}),
            "f.yaml: clouds.CloudOne.metrics.ca",
            "unknown key",
        ),
    ],
)
def test_config_errors_say_where(mutate: Any, location: str, fragment: str) -> None:
    err = _error(mutate)
    assert err.location == location
    assert fragment in err.message


def test_settings_defaults_and_peer_timeouts() -> None:
    data = sample()
    data["settings"] = {"connect_timeout": 2, "response_timeout": 30}
    settings = build_catalog(data).settings
    assert settings.timeouts(remote=False) == (2.0, 30.0)
    assert settings.timeouts(remote=True) == (2.0, 30.0)  # peers default to the same
    data["settings"].update(peer_connect_timeout=1, peer_response_timeout=10)
    data["settings"]["limits"] = {"max_headers": 50, "header_timeout": 5}
    settings = build_catalog(data).settings
    assert settings.timeouts(remote=True) == (1.0, 10.0)
    assert settings.limits.max_headers == 50 and settings.limits.header_timeout == 5.0
    assert settings.limits.max_header_bytes == 65536  # the rest stays default
    assert settings.breaker.failures == 1 and settings.breaker.down_for == 10.0


def test_interfaces_sharing_a_url_are_fine_public_wins() -> None:
    data = sample()
    svc = data["clouds"]["CloudOne"]["services"]["image"]
    svc["internal"] = dict(svc["public"])
    cat = build_catalog(data)
    m = cat.match("127.0.0.2", 9292, "/v2")
    assert m is not None and m.endpoint.interface == "public"


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_catalog(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("clouds: [\n")
    with pytest.raises(ConfigError) as info:
        load_catalog(bad)
    assert info.value.location.startswith(f"{bad}:")
    assert "not valid YAML" in info.value.message


def test_tls_files_resolve_relative_to_config(tmp_path: Path) -> None:
    data = sample()
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    data["clouds"]["CloudOne"]["frontends"].append(
        {"url": "https://127.0.0.2:8443", "tls": {"cert": "c.pem", "key": "k.pem"}}
    )
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(data))
    cat = load_catalog(path)
    fe = cat.clouds["CloudOne"].frontends[-1]
    assert fe.cert == str(tmp_path / "c.pem") and fe.listen_port == 8443


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://Host:80/a/", ("http", "host", 80, "/a")),
        ("https://h", ("https", "h", 443, "")),
        ("http://[::1]:5000/v3", ("http", "::1", 5000, "/v3")),
    ],
)
def test_parse_url(text: str, expected: tuple[str, str, int, str]) -> None:
    url = parse_url(text)
    assert (url.scheme, url.host, url.port, url.path) == expected


@pytest.mark.parametrize("text", ["", "h:80", "http://", "http://h:99999", "http://h/?q=1"])
def test_parse_url_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_url(text)


def test_hop_limit_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="hop_limit must be at least 1"):
        Settings(hop_limit=0)


# Many prefixes at one address (a gateway publishing every service on port 80): found by
# walking the path's segments when there are more than catalog._SCAN_MAX, by trying them
# longest first otherwise. Both must find what the definition says.
_GATEWAY_PATHS = ("", "/image", "/image/v2", "/compute/v2.1", "/compute", "/identity/v3")
_GATEWAY_PATHS += ("/a", "/a/b/c", "/volume/v3", "/placement", "/x.y")


def _gateway(paths: tuple[str, ...]) -> Catalog:
    endpoints = tuple(
        Endpoint(
            cloud="One",
            service_type=f"s{i}",
            interface="public",
            url=parse_url(f"http://gw.example{path}"),
            backend=parse_url(f"http://127.0.1.2:{9000 + i}{path}"),
        )
        for i, path in enumerate(paths)
    )
    return Catalog({"One": Cloud(name="One", region="R", frontends=(), endpoints=endpoints)})


def _reference(paths: tuple[str, ...], path: str) -> tuple[str, str] | None:
    """(service type, rest) of the longest published path that is a segment prefix of
    `path`, by the definition; version-less forms ("/compute/v2.1" also answers at "/compute")
    count when no endpoint publishes that path itself."""
    published = {p: (f"s{i}", False) for i, p in enumerate(paths)}
    for i, p in enumerate(paths):
        bare = strip_version(p)
        published.setdefault(bare, (f"s{i}", True))
    bare_path = path.partition("?")[0].rstrip("/")
    hits = [p for p in published if not p or bare_path == p or bare_path.startswith(p + "/")]
    if not hits:
        return None
    best = max(hits, key=len)
    return published[best][0], path[len(best) :]


_SEGMENTS = st.sampled_from(["image", "v2", "compute", "v2.1", "a", "b", "c", "x.y", "x", ""])


@settings(max_examples=400, deadline=None)
@given(
    segments=st.lists(_SEGMENTS, max_size=5),
    trailing=st.sampled_from(["", "/", "//"]),
    query=st.sampled_from(["", "?", "?q=/a/b", "?limit=20"]),
    count=st.sampled_from([1, 3, len(_GATEWAY_PATHS)]),
)
def test_match_is_the_longest_segment_prefix(
    segments: list[str], trailing: str, query: str, count: int
) -> None:
    paths = _GATEWAY_PATHS[:count]
    path = "/" + "/".join(segments) + trailing + query
    for scan_max in (0, 100):  # the walk, then the scan
        with patch.object(catalog_module, "_SCAN_MAX", scan_max):
            cat = _gateway(paths)
        m = cat.match("gw.example", 80, path)
        expected = _reference(paths, path)
        assert (None if m is None else (m.endpoint.service_type, m.rest)) == expected, scan_max
        backend = cat.match("127.0.1.2", 9000, path)  # one prefix at that address
        assert (backend is not None) == (paths[0] == "" or _reference(paths[:1], path) is not None)


@pytest.mark.parametrize(
    ("url", "fixed", "rest"),
    [
        ("http://h:8080/v1/AUTH_%(project_id)s", "http://h:8080/v1", "/AUTH_%(project_id)s"),
        ("http://h:8004/v1/$(tenant_id)s", "http://h:8004/v1", "/$(tenant_id)s"),
        ("http://h:8004/heat/v1/%(tenant_id)s/x", "http://h:8004/heat/v1", "/%(tenant_id)s/x"),
        ("http://h:9292", "http://h:9292", ""),
        ("http://h:8776/v3", "http://h:8776/v3", ""),
    ],
)  # fmt: skip
def test_untemplated_splits_at_the_first_substituted_segment(
    url: str, fixed: str, rest: str
) -> None:
    found, tail = catalog_module.untemplated(parse_url(url))
    assert (str(found), tail) == (fixed, rest)


def test_templated_endpoint_urls_match_the_projects_paths() -> None:
    """Keystone lists object storage as ``/v1/AUTH_%(project_id)s``: the config takes the URL
    as keystone lists it, and a request for any project's account is that endpoint's, its path
    forwarded unchanged to the backend."""
    data = sample()
    data["clouds"]["CloudOne"]["frontends"].append({"url": "http://127.0.0.2:8080"})
    data["clouds"]["CloudOne"]["services"]["object-store"] = {
        "public": {
            "url": "http://127.0.0.2:8080/v1/AUTH_%(project_id)s",
            "backend": "http://127.0.1.2:8080/v1/AUTH_%(project_id)s",
        }
    }
    cat = build_catalog(data)
    m = cat.match("127.0.0.2", 8080, "/v1/AUTH_0123abcd/container/object?multipart-manifest=get")
    assert m is not None and m.endpoint.service_type == "object-store"
    assert m.target(m.endpoint.backend) == (
        "http://127.0.1.2:8080/v1/AUTH_0123abcd/container/object?multipart-manifest=get"
    )
    info = cat.match("127.0.0.2", 8080, "/info")  # swift's capabilities, at the root
    assert info is not None and info.target(info.endpoint.backend) == "http://127.0.1.2:8080/info"


def test_templated_url_and_backend_must_end_alike() -> None:
    data = sample()
    data["clouds"]["CloudOne"]["frontends"].append({"url": "http://127.0.0.2:8080"})
    data["clouds"]["CloudOne"]["services"]["object-store"] = {
        "public": {
            "url": "http://127.0.0.2:8080/v1/AUTH_%(project_id)s",
            "backend": "http://127.0.1.2:8080/v1/KEY_%(project_id)s",
        }
    }
    with pytest.raises(ConfigError, match="templated part") as err:
        build_catalog(data)
    assert "object-store.public.backend" in str(err.value)


_URL_PIECES = st.sampled_from(["a", "Z", "0", "9", ".", "-", "_", ":", "/", "?", "#", " ", "@"])


@settings(max_examples=600, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "ftp", ""]),
    host=st.text(_URL_PIECES, max_size=12),
    port=st.one_of(st.just(""), st.integers(0, 999_999).map(lambda n: f":{n}")),
    path=st.text(_URL_PIECES, max_size=12),
)
def test_parse_url_reads_simple_urls_as_urlsplit_does(
    scheme: str, host: str, port: str, path: str
) -> None:
    """parse_url reads the common URL forms without urlsplit (a big config has 300,000 of
    them): the same URL, or the same refusal, as urlsplit's reading."""
    text = f"{scheme}://{host}{port}{path}"
    try:
        expected: URL | str = catalog_module._parse_any_url(text)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: URL | str = parse_url(text)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


def test_a_config_written_as_json_is_the_same_config(tmp_path: Path) -> None:
    """JSON (read by the JSON parser, for big generated configs) and YAML of one document
    make the same catalog; YAML's flow style, which starts like JSON, is still YAML."""
    data = sample()
    as_yaml, as_json = tmp_path / "f.yaml", tmp_path / "f.json"
    as_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    as_json.write_text(json.dumps(data))
    flow = tmp_path / "flow.yaml"
    flow.write_text(yaml.safe_dump(data, default_flow_style=True, sort_keys=False))
    assert flow.read_text().startswith("{") and not _is_json(flow.read_text())
    catalogs = [load_catalog(p) for p in (as_yaml, as_json, flow)]
    assert catalogs[0].clouds == catalogs[1].clouds == catalogs[2].clouds
    assert catalogs[0].settings == catalogs[1].settings == catalogs[2].settings
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "clouds": ')
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_catalog(bad)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_the_forward_proxys_ca_and_where_the_catalog_publishes(catalog: Catalog) -> None:
    data = sample()
    data["clouds"]["CloudOne"]["proxy"].update(ca=str(SAMPLE), ca_key=str(SAMPLE))
    loaded = build_catalog(data, source="f.yaml")
    one = loaded.clouds["CloudOne"]
    assert (one.proxy_ca, one.proxy_ca_key) == (str(SAMPLE), str(SAMPLE))
    assert catalog.clouds["CloudOne"].proxy_ca is None
    # Another router's host need not have them: only CloudOne's router reads them.
    data["clouds"]["CloudOne"]["proxy"].update(ca="proxy-ca.crt", ca_key="/nowhere/ca.key")
    one = build_catalog(data, source="f.yaml", base_dir=Path("/etc/r")).clouds["CloudOne"]
    assert (one.proxy_ca, one.proxy_ca_key) == ("/etc/r/proxy-ca.crt", "/nowhere/ca.key")
    # endpoint URLs (the routers' frontends) and backends, of every cloud; nothing else
    assert catalog.published("127.0.0.2", 9292) and catalog.published("127.0.1.3", 9292)
    assert catalog.published("127.0.0.2".upper(), 5000)
    assert not catalog.published("127.0.0.2", 3128)  # the forward proxy itself
    assert not catalog.published("127.0.0.9", 9292)
