"""TLS interception on the forward proxy, without sockets: which ``CONNECT`` destinations are
intercepted (routing.tunnel, pure), the certificates (an LRU, catalog hosts only, made again
near their end), the CA read as the router reads it, the adapter's ``http_connect``, and a
reload that would change the CA (refused: a restart applies it)."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from scoperouter import pki
from scoperouter.catalog import Catalog
from scoperouter.config import build_catalog
from scoperouter.errors import ConfigError
from scoperouter.proxy.forward import intercept
from scoperouter.proxy.forward.addon import ForwardAddon
from scoperouter.proxy.forward.intercept import Certificates, Interception, signing_ca
from scoperouter.router.config import RouterConfig
from scoperouter.router.listeners import listener_signature, listeners_for
from scoperouter.routing import tunnel

from .conftest import SAMPLE
from .test_router import pipeline


@pytest.fixture
def ca_files(tmp_path: Path) -> tuple[Path, Path]:
    return pki.make_ca(tmp_path, "proxy-ca")


def intercepting(ca_files: tuple[Path, Path]) -> dict[str, Any]:
    """The sample config, CloudOne's forward proxy intercepting with `ca_files`."""
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    data["clouds"]["CloudOne"]["proxy"].update(ca=str(ca_files[0]), ca_key=str(ca_files[1]))
    return data


def test_which_connect_destinations_are_intercepted(
    catalog: Catalog, ca_files: tuple[Path, Path]
) -> None:
    # Without proxy.ca, no tunnel at all (the refusal says what to do instead).
    refused = tunnel("127.0.0.2", 9292, catalog, "CloudOne")
    assert refused is not None and refused.status == 403
    assert "CONNECT tunnels are not supported by the forward proxy of CloudOne" in refused.message
    with_ca = build_catalog(intercepting(ca_files))
    # Intercepted: where the catalog publishes an endpoint URL (a router's frontend) or a
    # backend, of this cloud or another (a plain request there is routed the same way).
    for host, port in (("127.0.0.2", 9292), ("127.0.1.2", 9292), ("127.0.0.3", 5000)):
        assert tunnel(host, port, with_ca, "CloudOne") is None, (host, port)
    assert tunnel("127.0.1.3", 9292, with_ca, "CloudOne") is None
    # Anything else: 403, never a certificate.
    for host, port in (("127.0.0.2", 3128), ("127.0.0.2", 443), ("example.com", 443)):
        refused = tunnel(host, port, with_ca, "CloudOne")
        assert refused is not None and refused.status == 403
        assert "not a destination of the federation catalog" in refused.message
    # Another cloud's proxy has no CA of its own: it intercepts nothing.
    assert tunnel("127.0.0.2", 9292, with_ca, "CloudTwo") is not None


def test_certificates_are_an_lru_of_n_made_once_per_host(ca_files: tuple[Path, Path]) -> None:
    made = Certificates(pki.load_signing_ca(*ca_files), size=2)
    first = made.get("127.0.1.2")
    assert made.get("127.0.1.2") is first and made.made == 1
    made.get("127.0.1.3")
    made.get("127.0.1.2")  # used: 127.0.1.3 is now the least recently used
    made.get("127.0.1.4")  # one too many: 127.0.1.3 goes
    assert len(made) == 2 and made.made == 3
    assert made.get("127.0.1.2") is first and made.made == 3
    made.get("127.0.1.3")
    assert made.made == 4 and len(made) == 2
    # Every certificate has the worker's one key; the CA's key only signs.
    assert first.public_key() == made.key.public_key()
    assert first.public_key() != made.ca.cert.public_key()


def test_a_certificate_near_its_end_is_made_again(ca_files: tuple[Path, Path]) -> None:
    made = Certificates(pki.load_signing_ca(*ca_files), days=1)  # within RENEW at once
    first = made.get("127.0.1.2")
    assert first.not_valid_after_utc - datetime.datetime.now(datetime.UTC) <= intercept.RENEW
    assert made.get("127.0.1.2") is not first and made.made == 2


def test_certificates_only_for_catalog_destinations(
    ca_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    catalog = build_catalog(intercepting(ca_files))
    ca = signing_ca(catalog, "CloudOne", "f.yaml")
    assert ca is not None
    interception = Interception(Certificates(ca), catalog, "CloudOne")
    cert = interception.certificate("127.0.1.2", 9292)
    assert cert is not None and pki.addresses_of(cert) == {"127.0.1.2"}
    with caplog.at_level(logging.INFO, logger="scoperouter"):
        assert interception.certificate("example.com", 443) is None
        assert interception.certificate(None, None) is None  # TLS sent to the proxy itself
    assert len(interception.certificates) == 1
    # A reload that drops the destination: no certificate for it from then on.
    data = intercepting(ca_files)
    del data["clouds"]["CloudOne"]["services"]["image"]
    interception.configure(build_catalog(data))
    assert interception.certificate("127.0.1.2", 9292) is None


def test_the_ca_is_read_as_the_router_reads_it(ca_files: tuple[Path, Path]) -> None:
    catalog = build_catalog(intercepting(ca_files))
    assert signing_ca(catalog, "CloudTwo", "f.yaml") is None  # no proxy.ca
    ca_files[1].chmod(0o644)
    with pytest.raises(ConfigError) as info:
        signing_ca(catalog, "CloudOne", "f.yaml")
    assert info.value.location == "f.yaml: clouds.CloudOne.proxy.ca_key"
    assert "mode 0644" in info.value.message and "chmod 600" in info.value.message
    ca_files[1].unlink()  # not on this router's host: the loader let it be, the router does not
    with pytest.raises(ConfigError, match=r"cannot read .*proxy-ca\.key: No such file"):
        signing_ca(catalog, "CloudOne", "f.yaml")


def test_connect_to_a_catalog_destination_is_let_through_to_interception(
    ca_files: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(intercepting(ca_files)))
    config = RouterConfig()
    config.load(str(path), "CloudOne")
    addon = ForwardAddon(pipeline(config))

    def connect(host: str, port: int) -> Any:
        flow = tflow.tflow()
        flow.client_conn.proxy_mode = ProxyMode.parse("regular@127.0.0.2:3128")
        flow.request.method = "CONNECT"
        flow.request.host, flow.request.port = host, port
        with caplog.at_level(logging.INFO, logger="scoperouter.access"):
            addon.http_connect(flow)
        return flow.response

    caplog.clear()
    assert connect("127.0.1.2", 9292) is None  # mitmproxy answers 200; TLS is intercepted
    assert not caplog.records  # the requests inside are logged, each on its own line
    response = connect("127.0.1.9", 443)
    assert response is not None and response.status_code == 403
    [record] = caplog.records
    assert record.__dict__["fields"]["path"] == "127.0.1.9:443"


def test_a_reload_that_changes_the_ca_needs_a_restart(ca_files: tuple[Path, Path]) -> None:
    plain = yaml.safe_load(SAMPLE.read_text())
    before = listener_signature(listeners_for(build_catalog(plain), "CloudOne"))
    after = listener_signature(listeners_for(build_catalog(intercepting(ca_files)), "CloudOne"))
    assert before != after
