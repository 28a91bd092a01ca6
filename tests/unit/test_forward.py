"""The forward proxy's adapter (scoperouter.proxy.forward.addon): mitmproxy's hooks calling the
router's pipeline, driven with mitmproxy's test helpers (tflow). No sockets: the integration
tests run it in real router processes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from scoperouter.catalog import Limits
from scoperouter.proxy.forward import guard
from scoperouter.proxy.forward.addon import REJECT_HOST, ForwardAddon, _authority, _Flow, _spellings
from scoperouter.router.config import RouterConfig
from scoperouter.routing import Forward

from .conftest import SAMPLE
from .test_router import pipeline


@pytest.fixture
def addon() -> ForwardAddon:
    config = RouterConfig()
    config.load(str(SAMPLE), "CloudOne")
    return ForwardAddon(pipeline(config))


def proxied(
    host: str = "127.0.1.3", port: int = 9292, path: str = "/v2/images", **headers: str
) -> http.HTTPFlow:
    """A request a service of CloudOne sent through its router's forward proxy."""
    flow = tflow.tflow()
    flow.client_conn.proxy_mode = ProxyMode.parse("regular@127.0.0.2:3128")
    flow.request.scheme, flow.request.host, flow.request.port = "http", host, port
    flow.request.path = path
    flow.request.headers.clear()
    for name, value in headers.items():
        flow.request.headers[name.replace("_", "-")] = value
    return flow


def entry(flow: http.HTTPFlow) -> _Flow:
    found = flow.metadata["scoperouter"]
    assert isinstance(found, _Flow)
    return found


def error_of(flow: http.HTTPFlow) -> dict[str, Any]:
    assert flow.response is not None
    data = json.loads(flow.response.content or b"")
    assert data["error"]["code"] == flow.response.status_code
    return data["error"]  # type: ignore[no-any-return]


def test_a_proxied_request_is_pointed_at_its_route(addon: ForwardAddon) -> None:
    flow = proxied(x_auth_token='tok!SCOPE!{"image": "CloudTwo"}')
    flow.request.headers["Host"] = "127.0.1.3:9292"
    asyncio.run(addon.requestheaders(flow))
    state = entry(flow).state
    assert isinstance(state.decision, Forward) and state.decision.cloud == "CloudTwo"
    assert state.path == "http://127.0.1.3:9292/v2/images"  # absolute in the access log
    request = flow.request
    assert (request.host, request.port, request.path) == ("127.0.0.3", 9292, "/v2/images")
    assert request.host_header == "127.0.1.3:9292"  # the URL's authority (RFC 9112 3.2.2)
    assert request.headers["x-scope-hops"] == "1"
    assert request.headers["x-scope-request-id"] == state.request_id
    assert flow.response is None


@pytest.mark.parametrize(
    ("scheme", "host", "port", "sent"),
    [
        ("http", "127.0.1.3", 9292, "127.0.1.3:9292"),
        ("http", "glance.example", 80, "glance.example"),
        ("https", "glance.example", 443, "glance.example"),
        ("https", "glance.example", 80, "glance.example:80"),
        ("http", "fd00::3", 9292, "[fd00::3]:9292"),
    ],
)
def test_the_host_sent_on_is_the_urls_authority(
    scheme: str, host: str, port: int, sent: str
) -> None:
    flow = proxied(host, port)
    flow.request.scheme = scheme
    assert _authority(flow.request) == sent
    # a Host naming it (any case; a default port written or not) is kept as written
    explicit = sent if sent.endswith(f":{port}") else f"{sent}:{port}"
    assert set(_spellings(flow.request, sent)) == {sent.lower(), explicit.lower()}


def test_a_refusal_is_answered_with_openstack_json(addon: ForwardAddon) -> None:
    flow = proxied(x_scope='{"image": "Nowhere"}')
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is not None and flow.response.status_code == 400
    assert "unknown cloud 'Nowhere'" in error_of(flow)["message"]


def test_a_streamed_body_is_refused_through_the_error_path(addon: ForwardAddon) -> None:
    flow = proxied(x_scope='{"image": "Nowhere"}', expect="100-continue")
    flow.request.stream = True
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is None and flow.request.host == REJECT_HOST
    assert "expect" not in flow.request.headers  # no "100 Continue" for a refused body
    data = server_hooks.ServerConnectionHookData(
        server=tflow.tserver_conn(), client=flow.client_conn
    )
    data.server.address, data.server.error = (REJECT_HOST, 9), None
    addon.server_connect(data)
    assert data.server.error
    flow.error = mflow.Error(data.server.error)
    addon.error(flow)
    assert entry(flow).state.status == 400


def test_connect_is_refused_and_logged(
    addon: ForwardAddon, caplog: pytest.LogCaptureFixture
) -> None:
    flow = proxied(host="example.com", port=443)
    flow.request.method = "CONNECT"
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        addon.http_connect(flow)
    assert flow.response is not None and flow.response.status_code == 403
    [record] = caplog.records
    fields = record.__dict__["fields"]
    assert (fields["status"], fields["path"], fields["decision"]) == (
        403,
        "example.com:443",
        "refused",
    )


@pytest.mark.parametrize(
    ("error", "status", "fragment"),
    [
        ("Client disconnected.", 499, "went away"),
        (f"{guard.BODY_FAILED}408: the request body stopped arriving", 408, "stopped"),
        ("HTTP/1 protocol error: bad chunk", 400, "malformed request body"),
        ("server closed connection", 502, "at http://127.0.0.3:9292 failed: server closed"),
    ],
)
def test_error_answers(addon: ForwardAddon, error: str, status: int, fragment: str) -> None:
    flow = proxied(x_scope='{"image": "CloudTwo"}')
    asyncio.run(addon.requestheaders(flow))
    flow.request.timestamp_end = None  # the body had not ended
    flow.error = mflow.Error(error)
    addon.error(flow)
    state = entry(flow).state
    assert state.status == status and fragment in (state.message or "")
    assert flow.client_conn.id not in addon.inflight


def test_response_timeouts_per_destination_kind_and_the_sweep(addon: ForwardAddon) -> None:
    local, remote = proxied(host="127.0.1.2"), proxied(x_scope='{"image": "CloudTwo"}')
    for flow in (local, remote):
        asyncio.run(addon.requestheaders(flow))
        flow.server_conn = tflow.tserver_conn()
        asyncio.run(addon.request(flow))
    deadlines = [entry(f).deadlines for f in (local, remote)]
    left = [d.response_at - time.monotonic() for d in deadlines]  # type: ignore[operator]
    assert 119 < left[0] <= 120 and 119 < left[1] <= 120
    # An answer stops the clock; time passes for the other: the sweep gives it up.
    remote.response = tflow.tresp()
    addon.responseheaders(remote)
    assert deadlines[1].response_at is None
    deadlines[0].response_at -= 200  # type: ignore[operator]
    addon.sweep(time.monotonic())
    assert (entry(local).state.timed_out, entry(remote).state.timed_out) == ("response", None)


def test_a_streamed_upload_restarts_the_clock_on_every_chunk(addon: ForwardAddon) -> None:
    flow = proxied()
    flow.request.stream = True
    asyncio.run(addon.requestheaders(flow))
    deadlines = entry(flow).deadlines
    assert callable(flow.request.stream)
    deadlines.response_at -= 100  # type: ignore[operator]
    assert flow.request.stream(b"chunk") == b"chunk"
    assert deadlines.response_at > time.monotonic() + 100  # type: ignore[operator]


def test_connect_timeout_cancels_the_connecting_task(addon: ForwardAddon) -> None:
    async def scenario() -> tuple[Any, bool]:
        flow = proxied(x_scope='{"image": "CloudTwo"}')
        await addon.requestheaders(flow)
        server = tflow.tserver_conn()
        server.timestamp_tcp_setup = server.timestamp_end = None
        server.timestamp_start = time.time()
        connecting = asyncio.get_running_loop().create_future()

        async def connect() -> None:
            data = server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn)
            data.server.error = None
            addon.server_connect(data)
            await connecting  # stands in for asyncio.open_connection

        task = asyncio.create_task(connect())
        await asyncio.sleep(0)
        entry(flow).deadlines.connect_at -= 100  # type: ignore[operator]
        addon.sweep(time.monotonic())
        await asyncio.sleep(0)
        return entry(flow).state, task.cancelled()

    state, cancelled = asyncio.run(scenario())
    assert state.timed_out == "connect" and cancelled


def test_an_answer_gets_the_request_id_and_one_access_line(
    addon: ForwardAddon, caplog: pytest.LogCaptureFixture
) -> None:
    flow = proxied(x_auth_token='secret-token!SCOPE!{"image": "CloudTwo"}')
    flow.request.path = "/v2/images?password=hunter2"
    asyncio.run(addon.requestheaders(flow))
    flow.response = tflow.tresp()
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        addon.responseheaders(flow)
        addon.response(flow)
        flow.error = mflow.Error("late")
        addon.error(flow)  # already written: not again
    [record] = caplog.records
    fields = record.__dict__["fields"]
    state = entry(flow).state
    assert fields["request_id"] == state.request_id == flow.response.headers["x-scope-request-id"]
    assert (fields["service"], fields["cloud"], fields["status"]) == ("image", "CloudTwo", 200)
    text = json.dumps(fields) + record.getMessage()
    assert "secret-token" not in text and "hunter2" not in text


def test_the_head_limits_follow_the_config_and_refusals_reach_the_pipeline(
    addon: ForwardAddon, caplog: pytest.LogCaptureFixture
) -> None:
    from scoperouter.proxy.forward.engine import ForwardProxy

    ForwardProxy._configure(None, addon.config.current())  # type: ignore[arg-type]
    assert guard.GuardedHttp1Server.limits == addon.config.current().settings.limits
    addon.running()
    refusal = guard.Refusal(
        client=tflow.tclient_conn(), status=408, message="slow", method="-", path="-", started=0.0
    )
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        guard._refusal_handler(refusal)
    addon.done()
    assert caplog.records[0].__dict__["fields"]["status"] == 408
    guard.set_head_limits(Limits())
