"""Each router addon on its own, driven with mitmproxy's test helpers (taddons, tflow).

The sample federation (config/federation.yaml) is loaded by RouterConfig as in a router of
CloudOne; flows are made to arrive on one of its listeners. No sockets: the integration tests
run the same addons in real router processes.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import exceptions, http
from mitmproxy import flow as mflow
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow
from prometheus_client import REGISTRY

from scoperouter.catalog import Catalog, Limits
from scoperouter.errors import Reject
from scoperouter.identity import Identity, TokenCheck
from scoperouter.proxy import logs, mitm
from scoperouter.proxy.addons import (
    AccessLog,
    CatalogRegion,
    ErrorAnswers,
    HeadGuard,
    InFlight,
    Metrics,
    RouterConfig,
    Routing,
    Timeouts,
    TokenSwap,
    UpstreamHealth,
    accesslog,
    router_addons,
)
from scoperouter.proxy.addons.chain import Chain
from scoperouter.proxy.addons.routing import LOOP_MESSAGE
from scoperouter.proxy.flowstate import REJECT_HOST, FlowState, begin, state_of
from scoperouter.routing import Failover, Forward

from .conftest import SAMPLE

IMAGE_SPEC = "reverse:http://127.0.0.2:9292@127.0.0.2:9292"
PROXY_SPEC = "regular@127.0.0.2:3128"


@pytest.fixture
def config() -> Iterator[RouterConfig]:
    addon = RouterConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, scoperouter_config=str(SAMPLE), scoperouter_cloud="CloudOne")
        yield addon


def image_flow(path: str = "/v2/images", spec: str = IMAGE_SPEC, **headers: str) -> http.HTTPFlow:
    """A request that arrived on a listener of CloudOne's router (reverse: its image frontend)."""
    flow = tflow.tflow()
    flow.client_conn.proxy_mode = ProxyMode.parse(spec)
    flow.client_conn.timestamp_tls_setup = None  # plain HTTP
    flow.request.host, flow.request.port, flow.request.path = "127.0.0.2", 9292, path
    flow.request.headers.clear()
    for name, value in headers.items():
        flow.request.headers[name.replace("_", "-")] = value
    return flow


def routed(config: RouterConfig, flow: http.HTTPFlow) -> FlowState:
    Routing(config).requestheaders(flow)
    state = state_of(flow)
    assert state is not None
    return state


def body(flow: http.HTTPFlow) -> dict[str, Any]:
    assert flow.response is not None
    data = json.loads(flow.response.content or b"")
    assert data["error"]["code"] == flow.response.status_code
    assert flow.response.headers["content-type"] == "application/json"
    return data["error"]  # type: ignore[no-any-return]


# ----------------------------------------------------------------- RouterConfig


def test_config_loads_and_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    addon = RouterConfig()
    seen: list[Catalog] = []
    with taddons.context(addon) as tctx:
        addon.subscribe(seen.append)
        tctx.configure(addon, scoperouter_config=str(SAMPLE), scoperouter_cloud="CloudOne")
        assert addon.current().clouds["CloudOne"].region == "CloudOne"
        assert ("127.0.0.2", 3128) in addon.own_addresses and len(seen) == 1
        with pytest.raises(exceptions.OptionsError, match="cloud 'Nowhere' is not in"):
            tctx.configure(addon, scoperouter_cloud="Nowhere")
        bad = tmp_path / "bad.yaml"
        bad.write_text("clouds: [")
        with pytest.raises(exceptions.OptionsError, match="not valid YAML"):
            tctx.configure(addon, scoperouter_config=str(bad))


def test_reload_swaps_the_catalog_or_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "federation.yaml"
    shutil.copy(SAMPLE, path)
    addon = RouterConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, scoperouter_config=str(path), scoperouter_cloud="CloudOne")
        first = addon.current()
        path.write_text(SAMPLE.read_text().replace("hop_limit: 8", "hop_limit: 5"))
        assert addon.reload() and addon.current().settings.hop_limit == 5
        path.write_text("version: 1\nclouds: {}\n")
        assert not addon.reload() and addon.current().settings.hop_limit == 5
        assert addon.current() is not first


# ----------------------------------------------------------------- Routing


def test_routing_rewrites_the_flow(config: RouterConfig) -> None:
    flow = image_flow(x_auth_token='tok!SCOPE!{"image": "CloudTwo"}', host="127.0.0.2:9292")
    state = routed(config, flow)
    assert isinstance(state.decision, Forward) and state.decision.remote
    request = flow.request
    assert (request.host, request.port, request.path) == ("127.0.0.3", 9292, "/v2/images")
    assert request.host_header == "127.0.0.2:9292"  # the client's Host is kept
    assert request.headers["x-scope-hops"] == "1"
    assert request.headers["x-scope-request-id"] == state.request_id
    assert request.headers["x-auth-token"].startswith("tok!SCOPE!{")
    assert flow.response is None


def test_routing_keeps_a_valid_request_id_and_replaces_a_bad_one(config: RouterConfig) -> None:
    state = routed(config, image_flow(x_scope_request_id="req-abc-12"))
    assert state.request_id == "req-abc-12"
    state = routed(config, image_flow(x_scope_request_id="no spaces or\nnewlines"))
    assert state.request_id.startswith("req-") and "\n" not in state.request_id


def test_routing_answers_refusals_itself(config: RouterConfig) -> None:
    flow = image_flow(x_scope='{"image": "Nowhere"}')
    state = routed(config, flow)
    assert isinstance(state.decision, Reject)
    assert flow.response is not None and flow.response.status_code == 400
    assert "unknown cloud 'Nowhere'" in body(flow)["message"]


def test_routing_refuses_a_streamed_body_through_the_error_path(config: RouterConfig) -> None:
    flow = image_flow(x_scope='{"image": "Nowhere"}', expect="100-continue")
    flow.request.stream = True
    routed(config, flow)
    assert flow.response is None and flow.request.host == REJECT_HOST
    assert "expect" not in flow.request.headers  # no "100 Continue" for a refused body
    data = server_hooks.ServerConnectionHookData(
        server=tflow.tserver_conn(), client=flow.client_conn
    )
    data.server.address = (REJECT_HOST, 9)
    Routing(config).server_connect(data)
    assert data.server.error


def test_duplicate_header_fields_are_read_once_and_joined(config: RouterConfig) -> None:
    flow = image_flow()
    for value in ('{"image":', ' "CloudTwo"}'):
        flow.request.headers.add("X-Scope", value)
    flow.request.headers.add("X-Other", "1")
    # Joined as mitmproxy's Headers would: '{"image":,  "CloudTwo"}' is not a valid scope.
    routed(config, flow)
    assert "not valid JSON" in body(flow)["message"]


def test_plain_http_on_a_forward_listener_and_connect(config: RouterConfig) -> None:
    flow = image_flow(spec=PROXY_SPEC)
    flow.request.host = "127.0.1.3"  # CloudTwo's image backend, through the forward proxy
    state = routed(config, flow)
    assert isinstance(state.decision, Forward)
    assert (state.decision.cloud, state.decision.remote) == ("CloudTwo", True)
    connect = image_flow(spec=PROXY_SPEC)
    connect.request.method = "CONNECT"
    Routing(config).http_connect(connect)
    assert connect.response is not None and connect.response.status_code == 403


def test_unknown_listener_is_a_500_not_a_crash(config: RouterConfig) -> None:
    flow = image_flow(spec="reverse:http://127.0.0.9:1@127.0.0.9:1")
    routed(config, flow)
    assert flow.response is not None and flow.response.status_code == 500


def test_never_connects_to_itself(config: RouterConfig) -> None:
    data = server_hooks.ServerConnectionHookData(
        server=tflow.tserver_conn(), client=tflow.tclient_conn()
    )
    data.server.address = ("127.0.0.2", 9292)
    data.server.error = None
    Routing(config).server_connect(data)
    assert data.server.error == LOOP_MESSAGE


# ----------------------------------------------------------------- InFlight


def test_inflight_tracks_the_request_of_each_connection(config: RouterConfig) -> None:
    inflight = InFlight()
    flow = image_flow()
    routed(config, flow)
    inflight.requestheaders(flow)
    assert inflight.get(flow.client_conn.id) is state_of(flow)
    assert inflight.busy() == {flow.client_conn.id}
    inflight.response(flow)
    assert len(inflight) == 0 and inflight.get(flow.client_conn.id) is None


# ----------------------------------------------------------------- UpstreamHealth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def failed(config: RouterConfig, health: UpstreamHealth, timed_out: str | None) -> None:
    flow = image_flow(x_scope='{"image": "CloudTwo"}')
    state = routed(config, flow)
    health.requestheaders(flow)
    state.timed_out = timed_out  # type: ignore[assignment]
    flow.error = mflow.Error("server closed connection")
    health.error(flow)


def test_a_peer_that_times_out_is_marked_down_then_probed(config: RouterConfig) -> None:
    clock = Clock()
    health = UpstreamHealth(config, clock)
    changes: list[tuple[str, bool]] = []
    health.on_change(lambda upstream, up: changes.append((upstream.cloud, up)))
    failed(config, health, "response")
    assert changes == [("CloudTwo", False)]
    # Fail fast, naming the cloud and saying for how long.
    flow = image_flow(x_scope='{"image": "CloudTwo"}')
    routed(config, flow)
    health.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 503
    message = body(flow)["message"]
    assert "router of CloudTwo" in message and "did not answer in time" in message
    assert "10.0s more" in message
    # Other clouds are not affected.
    local = image_flow(x_scope='{"image": "CloudOne"}')
    routed(config, local)
    health.requestheaders(local)
    assert local.response is None
    # After down_for: one probe goes through, the others still fail fast; its answer heals.
    clock.now += 10.5
    probe = image_flow(x_scope='{"image": "CloudTwo"}')
    routed(config, probe)
    health.requestheaders(probe)
    assert probe.response is None
    other = image_flow(x_scope='{"image": "CloudTwo"}')
    routed(config, other)
    health.requestheaders(other)
    assert other.response is not None and other.response.status_code == 503
    probe.response = tflow.tresp()
    health.responseheaders(probe)
    assert changes == [("CloudTwo", False), ("CloudTwo", True)] and not health.down()


def test_the_clients_own_faults_say_nothing_about_the_upstream(config: RouterConfig) -> None:
    health = UpstreamHealth(config, Clock())
    flow = image_flow(x_scope='{"image": "CloudTwo"}')
    routed(config, flow)
    flow.error = mflow.Error("Client disconnected.")
    health.error(flow)
    flow.error = mflow.Error(LOOP_MESSAGE)
    health.error(flow)
    assert not health.upstreams or not health.down()


def test_backends_are_named_without_their_address(config: RouterConfig) -> None:
    health = UpstreamHealth(config, Clock())
    flow = image_flow()
    routed(config, flow)
    flow.error = mflow.Error("[Errno 111] Connect call failed ('127.0.1.2', 9292)")
    health.error(flow)
    [upstream] = health.down()
    assert upstream.kind == "backend" and upstream.reason == "it refused the connection"
    assert upstream.name == "the image service of CloudOne"


# ----------------------------------------------------------------- TokenSwap


def test_token_swap_replaces_a_local_service_token(config: RouterConfig) -> None:
    addon = TokenSwap(config)
    catalog = config.current()
    addon.identity = Identity(
        catalog,
        "CloudOne",
        validate=lambda url, token, verify: TokenCheck(True, frozenset({"service"}), 2e9),
        fetch_token=lambda entry: (f"router-token-from-{entry}", 2e9),
    )
    flow = image_flow(x_auth_token='u!SCOPE!{"image": "CloudTwo"}', x_service_token="nova")
    state = routed(config, flow)
    assert isinstance(state.decision, Forward) and state.decision.swap_tokens
    pending = addon.requestheaders(flow)
    assert pending is not None
    asyncio.run(pending)  # type: ignore[arg-type]
    assert flow.request.headers["x-service-token"] == "router-token-from-router-at-cloudtwo"


def test_token_swap_refuses_a_user_token(config: RouterConfig) -> None:
    addon = TokenSwap(config)
    addon.identity = Identity(
        config.current(),
        "CloudOne",
        validate=lambda url, token, verify: TokenCheck(True, frozenset({"member"}), 2e9),
        fetch_token=lambda entry: ("never", 2e9),
    )
    flow = image_flow(x_auth_token='u!SCOPE!{"image": "CloudTwo"}', x_service_token="user")
    routed(config, flow)
    asyncio.run(addon.requestheaders(flow))  # type: ignore[arg-type]
    assert flow.response is not None and flow.response.status_code == 403


def test_no_swap_no_coroutine(config: RouterConfig) -> None:
    flow = image_flow(x_scope='{"image": "CloudTwo"}')
    routed(config, flow)
    assert TokenSwap(config).requestheaders(flow) is None


# ----------------------------------------------------------------- Timeouts


def test_response_timeout_per_destination_kind(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    text = SAMPLE.read_text().replace(
        "response_timeout: 120.0", "response_timeout: 5\n  peer_response_timeout: 50"
    )
    path.write_text(text)
    config = RouterConfig()
    with taddons.context(config) as tctx:
        tctx.configure(config, scoperouter_config=str(path), scoperouter_cloud="CloudOne")
        inflight = InFlight()
        timeouts = Timeouts(config, inflight)
        local, remote = image_flow(), image_flow(x_scope='{"image": "CloudTwo"}')
        for flow in (local, remote):
            routed(config, flow)
            inflight.requestheaders(flow)
            timeouts.request(flow)
        states = [state_of(local), state_of(remote)]
        deadlines = [s.watches.response_at - time.monotonic() for s in states]  # type: ignore[union-attr]
        assert 4.5 < deadlines[0] <= 5 and 49.5 < deadlines[1] <= 50
        # Time passes: the sweep gives up on the backend's answer only.
        for state in states:
            state.watches.response_at -= 10  # type: ignore[union-attr]
        timeouts.sweep()
        assert [s.timed_out for s in states] == ["response", None]  # type: ignore[union-attr]
        # An answer stops the clock.
        timeouts.responseheaders(remote)
        states[1].watches.response_at = None  # type: ignore[union-attr]
        timeouts.sweep()
        assert states[1].timed_out is None  # type: ignore[union-attr]


def test_a_streamed_upload_restarts_the_clock_on_every_chunk(config: RouterConfig) -> None:
    timeouts = Timeouts(config, InFlight())
    flow = image_flow()
    flow.request.stream = True
    state = routed(config, flow)
    timeouts.requestheaders(flow)
    assert callable(flow.request.stream)
    state.watches.response_at -= 100  # type: ignore[union-attr]
    assert flow.request.stream(b"chunk") == b"chunk"
    assert state.watches.response_at > time.monotonic() + 100  # type: ignore[union-attr]


def test_connect_timeout_cancels_the_connecting_task(config: RouterConfig) -> None:
    async def scenario() -> tuple[FlowState, bool]:
        inflight = InFlight()
        timeouts = Timeouts(config, inflight)
        flow = image_flow(x_scope='{"image": "CloudTwo"}')
        state = routed(config, flow)
        inflight.requestheaders(flow)
        server = tflow.tserver_conn()
        server.timestamp_tcp_setup = server.timestamp_end = None
        server.timestamp_start = time.time()
        connecting = asyncio.get_running_loop().create_future()

        async def connect() -> None:
            data = server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn)
            data.server.error = None
            timeouts.server_connect(data)
            await connecting  # stands in for asyncio.open_connection

        task = asyncio.create_task(connect())
        await asyncio.sleep(0)
        state.watches.connect_at -= 100  # type: ignore[union-attr]
        timeouts.sweep()
        await asyncio.sleep(0)
        return state, task.cancelled()

    state, cancelled = asyncio.run(scenario())
    assert state.timed_out == "connect" and cancelled


# ----------------------------------------------------------------- ErrorAnswers


@pytest.mark.parametrize(
    ("scope", "error", "timed_out", "status", "fragment"),
    [
        ('{"image": "CloudTwo"}', "server closed connection", "response", 504, "did not answer"),
        ('{"image": "CloudTwo"}', "connection cancelled", "connect", 504, "connecting to"),
        ('{"image": "CloudTwo"}', "[Errno 111] Connect call failed", None, 502, "unreachable"),
        (
            '{"image": "CloudOne"}',
            "[Errno 111] Connect call failed ('127.0.1.2', 9292)",
            None,
            502,
            "connection refused",
        ),
        ('{"image": "CloudOne"}', LOOP_MESSAGE, None, 508, "routing loop"),
        ('{"image": "CloudTwo"}', "Client disconnected.", None, 499, "went away"),
    ],
)
def test_error_answers(
    config: RouterConfig,
    scope: str,
    error: str,
    timed_out: str | None,
    status: int,
    fragment: str,
) -> None:
    flow = image_flow(x_scope=scope)
    state = routed(config, flow)
    state.timed_out = timed_out  # type: ignore[assignment]
    flow.server_conn.timestamp_tcp_setup = None
    flow.error = mflow.Error(error)
    ErrorAnswers(config).error(flow)
    assert state.status == status and state.message is not None
    assert fragment in state.message
    assert "127.0.1.2" not in state.message  # backend addresses stay private


def test_a_malformed_body_is_the_clients_400(config: RouterConfig) -> None:
    flow = image_flow()
    state = routed(config, flow)
    flow.request.timestamp_end = None
    flow.error = mflow.Error("HTTP/1 protocol error: bad chunk")
    ErrorAnswers(config).error(flow)
    assert state.status == 400 and "malformed request body" in (state.message or "")


# ----------------------------------------------------------------- CatalogRegion


def test_catalog_region_twins_a_remote_validation(config: RouterConfig) -> None:
    flow = image_flow("/v3/auth/tokens")
    flow.request.port = 5000
    flow.client_conn.proxy_mode = ProxyMode.parse("reverse:http://127.0.0.2:5000@127.0.0.2:5000")
    flow.request.headers["x-auth-token"] = "glance-token"
    flow.request.headers["x-subject-token"] = 'user!SCOPE!{"identity": "CloudTwo"}'
    routed(config, flow)
    catalog = [
        {
            "type": "image",
            "endpoints": [
                {
                    "id": "e",
                    "interface": "public",
                    "region_id": "CloudTwo",
                    "url": "http://127.0.0.3:9292",
                }
            ],
        }
    ]
    flow.response = http.Response.make(
        200, json.dumps({"token": {"catalog": catalog}}), {"Content-Type": "application/json"}
    )
    CatalogRegion().response(flow)
    endpoints = json.loads(flow.response.content or b"")["token"]["catalog"][0]["endpoints"]
    assert {e["region_id"] for e in endpoints} == {"CloudTwo", "CloudOne"}


# ----------------------------------------------------------------- AccessLog


def test_one_access_line_per_request_with_its_fields(
    config: RouterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    log = AccessLog(config)
    flow = image_flow(x_auth_token='secret-token!SCOPE!{"image": "CloudTwo"}')
    flow.request.path = "/v2/images?password=hunter2"
    state = routed(config, flow)
    flow.response = tflow.tresp()
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        log.responseheaders(flow)
        log.response(flow)
        log.error(flow)  # already written: not again
    [record] = caplog.records
    fields = record.__dict__["fields"]
    assert fields["request_id"] == state.request_id == flow.response.headers["x-scope-request-id"]
    assert (fields["service"], fields["cloud"], fields["decision"]) == (
        "image",
        "CloudTwo",
        "remote",
    )
    assert fields["status"] == 200 and fields["path"] == "/v2/images"
    text = json.dumps(fields) + record.getMessage()
    assert "secret-token" not in text and "hunter2" not in text


def test_a_refusal_is_logged_with_its_reason(
    config: RouterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    flow = image_flow(x_scope='{"image": "Nowhere"}')
    routed(config, flow)
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        AccessLog(config).response(flow)
    fields = caplog.records[0].__dict__["fields"]
    assert fields["status"] == 400 and fields["decision"] == "refused"
    assert "unknown cloud 'Nowhere'" in fields["reason"]


def test_refused_heads_are_logged_too(
    config: RouterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = mitm.Refusal(
        client=tflow.tclient_conn(),
        status=431,
        message="too many",
        method="GET",
        path="/x",
        started=0.0,
    )
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        AccessLog(config).refused(refusal)
    [record] = caplog.records
    assert record.__dict__["fields"]["status"] == 431
    assert record.__dict__["fields"]["decision"] == "refused"


# ----------------------------------------------------------------- Metrics


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_each_answer_once(config: RouterConfig) -> None:
    metrics = Metrics(config, UpstreamHealth(config))
    labels = {"service": "image", "cloud": "CloudTwo", "decision": "remote", "status": "200"}
    before = _sample("scoperouter_requests_total", **labels)
    flow = image_flow(x_scope='{"image": "CloudTwo"}')
    routed(config, flow)
    flow.response = tflow.tresp()
    metrics.response(flow)
    metrics.response(flow)
    assert _sample("scoperouter_requests_total", **labels) == before + 1
    refused = {"service": "-", "cloud": "-", "decision": "refused", "status": "431"}
    before = _sample("scoperouter_requests_total", **refused)
    metrics.refused(
        mitm.Refusal(
            client=tflow.tclient_conn(), status=431, message="", method="-", path="-", started=0.0
        )
    )
    assert _sample("scoperouter_requests_total", **refused) == before + 1


def test_metrics_show_every_upstream_and_its_health(config: RouterConfig) -> None:
    health = UpstreamHealth(config, Clock())
    Metrics(config, health)
    peer = {
        "cloud": "CloudTwo",
        "kind": "peer",
        "service": "image",
        "upstream": "http://127.0.0.3:9292",
    }
    assert _sample("scoperouter_upstream_up", **peer) == 1
    failed(config, health, "connect")
    assert _sample("scoperouter_upstream_up", **peer) == 0


# ----------------------------------------------------------------- HeadGuard


def test_head_guard_applies_the_limits_and_forwards_refusals(config: RouterConfig) -> None:
    seen: list[mitm.Refusal] = []

    class Sink:
        def refused(self, refusal: mitm.Refusal) -> None:
            seen.append(refusal)

    guard = HeadGuard(config, sinks=[Sink()])
    assert mitm.GuardedHttp1Server.limits == config.current().settings.limits
    guard.running()
    refusal = mitm.Refusal(
        client=tflow.tclient_conn(), status=408, message="slow", method="-", path="-", started=0.0
    )
    mitm._refusal_handler(refusal)
    guard.done()
    assert seen == [refusal]
    mitm.set_head_limits(Limits())


# ----------------------------------------------------------------- Chain


def test_chain_calls_the_hooks_each_addon_has_in_order() -> None:
    calls: list[str] = []

    class Sync:
        def requestheaders(self, flow: Any) -> None:
            calls.append("sync")

    class Async:
        def requestheaders(self, flow: Any) -> Any:
            async def later() -> None:
                await asyncio.sleep(0)
                calls.append("async")

            return later()

    class Last:
        def requestheaders(self, flow: Any) -> None:
            calls.append("last")

        def response(self, flow: Any) -> None:
            calls.append("response")

    chain = Chain([Sync(), Async(), Last()])
    assert not hasattr(chain, "addons")  # mitmproxy would call the members' hooks again
    pending = chain.requestheaders(None)
    assert calls == ["sync"] and pending is not None
    asyncio.run(pending)  # type: ignore[arg-type]
    assert calls == ["sync", "async", "last"]
    assert chain.response(None) is None and calls[-1] == "response"
    assert chain.error(None) is None  # nobody has it


def test_router_addons_share_one_config(config: RouterConfig) -> None:
    addons = router_addons(config)
    assert addons[0] is config
    kinds = [type(a) for a in addons]
    assert kinds.index(Routing) < kinds.index(UpstreamHealth) < kinds.index(TokenSwap)
    assert kinds.index(ErrorAnswers) < kinds.index(AccessLog) < kinds.index(Metrics)


def test_begin_makes_forward_mode_paths_absolute() -> None:
    flow = image_flow(spec=PROXY_SPEC)
    flow.request.scheme = "http"
    state = begin(flow)
    assert state.path == "http://127.0.0.2:9292/v2/images"


class _Clock:
    """Fixed clocks for the access log: both of a test's lines get the same times."""

    def __init__(self, elapsed: float) -> None:
        self.elapsed = elapsed

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    def time(self) -> float:
        return 1_700_000_000.5


@settings(max_examples=200, deadline=None)
@given(
    method=st.text(min_size=1, max_size=8),
    path=st.text(max_size=30),
    status=st.sampled_from([0, 200, 204, 400, 404, 502, 508]),
    elapsed=st.floats(min_value=0, max_value=200_000, allow_nan=False),
    decision=st.sampled_from(["local", "remote", "refused", "none", "failover"]),
    message=st.none() | st.text(max_size=200),
    error=st.none() | st.text(max_size=200),
    tried=st.none() | st.text(max_size=400),
)
def test_the_direct_access_line_is_the_logging_line(
    method: str,
    path: str,
    status: int,
    elapsed: float,
    decision: str,
    message: str | None,
    error: str | None,
    tried: str | None,
) -> None:
    """The access line is written straight to the router's JSON handler (no LogRecord: a
    third of its cost); it must be the very line the logging machinery writes for the same
    request when another handler is in the way (a test's caplog, a filter)."""
    stream = io.StringIO()
    handler = logs.BatchingHandler(stream)
    formatter = logs.JsonFormatter({"pid": 7, "router": "CloudOne", "worker": 0})
    handler.setFormatter(formatter)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logs._direct)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logs._direct = logs.Direct(handler, formatter)
    chosen: Forward | Failover | Reject | None = {
        "local": Forward(
            cloud="CloudOne", service_type="image", interface="public", remote=False,
            url="http://127.0.1.2:9292/v2/images?limit=1",
        ),
        "remote": Forward(
            cloud='Cloud"Two', service_type="compute", interface="public", remote=True,
            url="http://127.0.0.3:8774/v2.1/servers",
        ),
        "refused": Reject(400, "unknown cloud 'Nowhere'"),
        "none": None,
        "failover": Failover("image", "CloudDown | Cloud\"Two", ()),
    }[decision]  # fmt: skip
    lines = []
    try:
        for capture in (False, True):
            state = FlowState(
                request_id="req-1", headers={}, method=method, path=path, started=1000.0
            )
            state.decision, state.message, state.tried = chosen, message, tried
            extra = logging.NullHandler()
            if capture:
                root.addHandler(extra)  # the logging machinery's turn
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(accesslog, "time", _Clock(elapsed))
                AccessLog(None).write(state, status, error)  # type: ignore[arg-type]
            root.removeHandler(extra)
            [line] = handler._pending
            handler._pending.clear()
            lines.append(line)
    finally:
        root.handlers[:], logs._direct = saved[0], saved[2]
        root.setLevel(saved[1])
    direct, machinery = (json.loads(line) for line in lines)
    assert direct.pop("ts").endswith("Z") and machinery.pop("ts").endswith("Z")
    # the same text after the timestamp (the machinery's record has its own clock)
    assert lines[0].partition('","level"')[2] == lines[1].partition('","level"')[2]
    assert direct == machinery and direct["method"] == method and direct["path"] == path
