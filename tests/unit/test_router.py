"""The router's pipeline and its parts (scoperouter.router), without an HTTP engine.

The sample federation (config/federation.yaml) is loaded as in a router of CloudOne; requests
are :class:`Incoming` values and the engine is a recorder. No sockets and no mitmproxy: the
integration tests run the same pipeline in real router processes.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from scoperouter.catalog import Catalog
from scoperouter.errors import ClientGone, ConfigError, Reject
from scoperouter.identity import Identity, TokenCheck
from scoperouter.router import fanout, logs
from scoperouter.router.accesslog import AccessLog
from scoperouter.router.combined import Combiner, Outgoing, Received
from scoperouter.router.config import RouterConfig
from scoperouter.router.health import UpstreamHealth
from scoperouter.router.listeners import Listener
from scoperouter.router.metrics import Metrics
from scoperouter.router.pipeline import Incoming, Outcome, Pipeline, Plan
from scoperouter.router.region import regioned
from scoperouter.router.state import RequestState, new_state, request_id
from scoperouter.router.targets import split_url
from scoperouter.router.tokens import TokenSwap
from scoperouter.routing import Failover, Forward

from .conftest import SAMPLE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def config() -> RouterConfig:
    config = RouterConfig()
    config.load(str(SAMPLE), "CloudOne")
    return config


async def _no_transmit(out: Outgoing) -> Received:
    raise AssertionError(f"nothing is sent in these tests ({out.host}:{out.port})")


def pipeline(config: RouterConfig, clock: Callable[[], float] | None = None) -> Pipeline:
    health = UpstreamHealth(config, clock or Clock())
    tokens = TokenSwap(config)
    return Pipeline(
        config,
        health=health,
        tokens=tokens,
        log=AccessLog(config),
        metrics=Metrics(config, health),
        combiner=Combiner(config, health, tokens, _no_transmit),
    )


def listener(config: RouterConfig, port: int) -> Listener:
    (found,) = [i for i in config.listeners if i.frontend and i.frontend.url.port == port]
    return found


def incoming(
    config: RouterConfig, target: str = "/v2/images", port: int = 9292, **headers: str
) -> Incoming:
    return Incoming(
        method="GET",
        target=target,
        headers={name.replace("_", "-"): value for name, value in headers.items()},
        listener=listener(config, port),
        tls=False,
        started=0.0,
    )


def decided(p: Pipeline, request: Incoming) -> tuple[Any, RequestState]:
    state = new_state(request.method, request.target, request.headers)
    return p.reverse(request, state), state


def planned(p: Pipeline, decision: Any, state: RequestState) -> Plan | Reject:
    """prepare, and swap when the decision asks (the order Pipeline.handle runs)."""
    plan = p.prepare(decision, state)
    if isinstance(plan, Plan) and decision.swap_tokens:
        return asyncio.run(p.swap(plan))
    return plan


class Recorder:
    """An engine that records what the pipeline asks of it."""

    def __init__(self, outcome: Outcome | None = None, body: bytes | Reject = b"") -> None:
        self.outcome = outcome or Outcome(status=200)
        self.body = body
        self.calls: list[tuple[str, Any]] = []

    async def send(self, plan: Plan) -> Outcome:
        self.calls.append(("send", plan))
        return self.outcome

    async def read_body(self, limit: int) -> bytes | Reject:
        self.calls.append(("read_body", limit))
        return self.body

    async def reply(self, state: RequestState, reply: fanout.Reply) -> None:
        self.calls.append(("reply", reply))

    async def refuse(self, state: RequestState, reject: Reject) -> None:
        self.calls.append(("refuse", reject))


# ----------------------------------------------------------------- RouterConfig


def test_config_loads_and_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    config = RouterConfig()
    seen: list[Catalog] = []
    config.subscribe(seen.append)
    config.load(str(SAMPLE), "CloudOne")
    assert config.current().clouds["CloudOne"].region == "CloudOne"
    assert ("127.0.0.2", 3128) in config.own_addresses and len(seen) == 1
    assert {item.kind for item in config.listeners} == {"frontend", "forward"}
    with pytest.raises(ConfigError, match="cloud 'Nowhere' is not defined"):
        RouterConfig().load(str(SAMPLE), "Nowhere")
    bad = tmp_path / "bad.yaml"
    bad.write_text("clouds: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RouterConfig().load(str(bad), "CloudOne")


def test_reload_swaps_the_catalog_or_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "federation.yaml"
    shutil.copy(SAMPLE, path)
    config = RouterConfig()
    config.load(str(path), "CloudOne")
    first = config.current()
    path.write_text(SAMPLE.read_text().replace("hop_limit: 8", "hop_limit: 5"))
    assert config.reload() and config.current().settings.hop_limit == 5
    path.write_text("version: 1\nclouds: {}\n")
    assert not config.reload() and config.current().settings.hop_limit == 5
    path.write_text(SAMPLE.read_text().replace("listen: 127.0.0.2:3128", "listen: 127.0.0.2:3129"))
    assert not config.reload()  # a listener moved: a restart, not a reload
    assert config.current() is not first


# ----------------------------------------------------------------- facts and decide


def test_a_request_is_routed_with_its_edits(config: RouterConfig) -> None:
    p = pipeline(config)
    decision, _state = decided(p, incoming(config, x_auth_token='tok!SCOPE!{"image": "CloudTwo"}'))
    assert isinstance(decision, Forward) and decision.remote
    assert decision.url == "http://127.0.0.3:9292/v2/images"
    assert decision.set_headers["x-scope-hops"] == "1"
    assert decision.set_headers["x-auth-token"].startswith("tok!SCOPE!{")


def test_request_ids_are_kept_when_valid_and_replaced_otherwise() -> None:
    assert new_state("GET", "/", {"x-scope-request-id": "req-abc-12"}).request_id == "req-abc-12"
    made = new_state("GET", "/", {"x-scope-request-id": "no spaces or\nnewlines"}).request_id
    assert made.startswith("req-") and "\n" not in made
    # each new id is this process's prefix and the next count, and a peer keeps it as it is
    first, second = request_id(None), request_id(None)
    assert first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0] == made.rsplit("-", 1)[0]
    assert int(second.rsplit("-", 1)[1]) == int(first.rsplit("-", 1)[1]) + 1
    assert request_id(second) == second


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://127.0.0.3:9292/v2/images?q=1", ("http", "127.0.0.3", 9292, "/v2/images?q=1")),
        ("https://[::1]:443", ("https", "::1", 443, "/")),
        ("http://glance.example:9292/", ("http", "glance.example", 9292, "/")),
        ("http://127.0.0.3:9292/a/b://c", ("http", "127.0.0.3", 9292, "/a/b://c")),
    ],
)
def test_routed_urls_are_split(url: str, parts: tuple[str, str, int, str]) -> None:
    assert split_url(url) == parts
    assert split_url(url) == parts  # again, the upstream's part remembered


def test_each_url_keeps_its_own_path_on_an_upstream_seen_before() -> None:
    assert split_url("http://127.0.0.9:8774/v2.1/servers")[3] == "/v2.1/servers"
    assert split_url("http://127.0.0.9:8774/v2.1/flavors?x=1") == (
        "http", "127.0.0.9", 8774, "/v2.1/flavors?x=1"
    )  # fmt: skip
    assert split_url("http://127.0.0.9:8774") == ("http", "127.0.0.9", 8774, "/")


@pytest.mark.parametrize(
    "url",
    ["127.0.0.3:9292/v2", "http://127.0.0.3/v2", "http://:9292/v2", "http://h:x/", "http://h:1?q"],
)
def test_what_is_not_a_routed_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not a routed URL"):
        split_url(url)


def test_refusals_say_why(config: RouterConfig) -> None:
    decision, _ = decided(pipeline(config), incoming(config, x_scope='{"image": "Nowhere"}'))
    assert isinstance(decision, Reject) and decision.status == 400
    assert "unknown cloud 'Nowhere'" in decision.message


def test_tls_on_a_plain_frontend_is_refused(config: RouterConfig) -> None:
    request = incoming(config)
    request.tls = True
    decision, _ = decided(pipeline(config), request)
    assert isinstance(decision, Reject) and decision.status == 400
    assert "speaks plain HTTP only" in decision.message


@pytest.mark.parametrize(
    ("authority", "status"),
    [
        ("127.0.0.2:9292", None),  # the frontend itself: reduced to its path
        ("evil.example:9292", 421),
        ("127.0.0.2:5000", 421),  # another frontend's authority on this one
        ("127.0.0.2", 421),  # port 80 implied: not this frontend
    ],
)
def test_an_absolute_target_is_reduced_only_when_it_names_the_frontend(
    config: RouterConfig, authority: str, status: int | None
) -> None:
    request = incoming(config)
    request.authority = authority
    decision, _ = decided(pipeline(config), request)
    if status is None:
        assert isinstance(decision, Forward) and decision.url.endswith(":9292/v2/images")
    else:
        assert isinstance(decision, Reject) and decision.status == status
        assert "send the path, not a URL" in decision.message


def test_a_routing_failure_of_the_router_itself_is_a_500(
    config: RouterConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    p = pipeline(config)
    # The routing step fails: the config it decides on (a compiled build calls
    # routing.decide directly, so a patched module attribute would not be called).
    monkeypatch.setattr(config, "current", broken)
    decision, _ = decided(p, incoming(config))
    assert isinstance(decision, Reject) and decision.status == 500
    assert "routing failed" in caplog.text


# ----------------------------------------------------------------- admit, swap, loop


def test_a_peer_that_times_out_is_marked_down_then_probed(config: RouterConfig) -> None:
    clock = Clock()
    p = pipeline(config, clock)
    changes: list[tuple[str, bool]] = []
    p.health.on_change(lambda upstream, up: changes.append((upstream.cloud, up)))

    def prepared() -> Plan | Reject:
        decision, state = decided(p, incoming(config, x_scope='{"image": "CloudTwo"}'))
        return planned(p, decision, state)

    plan = prepared()
    assert isinstance(plan, Plan)
    reject = p.failed(plan, "response", "server closed connection", connected=True)
    assert reject.status == 504 and "did not answer within 120s" in reject.message
    assert changes == [("CloudTwo", False)]
    # Fail fast, naming the cloud and saying for how long.
    refused = prepared()
    assert isinstance(refused, Reject) and refused.status == 503
    assert "router of CloudTwo" in refused.message and "10.0s more" in refused.message
    # Other clouds are not affected.
    decision, state = decided(p, incoming(config, x_scope='{"image": "CloudOne"}'))
    assert isinstance(planned(p, decision, state), Plan)
    # After down_for: one probe goes through, the others still fail fast; its answer heals.
    clock.now += 10.5
    probe = prepared()
    assert isinstance(probe, Plan) and isinstance(prepared(), Reject)
    p.succeeded(probe.decision)
    assert changes == [("CloudTwo", False), ("CloudTwo", True)] and not p.health.down()


def test_backends_are_named_without_their_address(config: RouterConfig) -> None:
    p = pipeline(config)
    decision, state = decided(p, incoming(config))
    plan = planned(p, decision, state)
    assert isinstance(plan, Plan)
    reject = p.failed(plan, None, "[Errno 111] Connect call failed ('127.0.1.2', 9292)", False)
    assert (reject.status, reject.message) == (
        502,
        "the image service of CloudOne is unreachable: connection refused",
    )
    [upstream] = p.health.down()
    assert upstream.kind == "backend" and upstream.reason == "it refused the connection"
    assert upstream.name == "the image service of CloudOne"


@pytest.mark.parametrize(
    ("scope", "error", "timed_out", "connected", "status", "fragment"),
    [
        ('{"image": "CloudTwo"}', "server closed connection", "response", True, 504, "did not"),
        ('{"image": "CloudTwo"}', "connection cancelled", "connect", False, 504, "connecting to"),
        ('{"image": "CloudTwo"}', "[Errno 111] Connect call failed", None, False, 502, "unre"),
        ('{"image": "CloudTwo"}', "reset by peer", None, True, 502, "failed: reset by peer"),
        ('{"image": "CloudOne"}', "to 127.0.1.2 broke", None, True, 502, "<backend> broke"),
    ],
)
def test_each_failure_has_one_wording(
    config: RouterConfig,
    scope: str,
    error: str,
    timed_out: Any,
    connected: bool,
    status: int,
    fragment: str,
) -> None:
    p = pipeline(config)
    decision, state = decided(p, incoming(config, x_scope=scope))
    plan = planned(p, decision, state)
    assert isinstance(plan, Plan)
    reject = p.failed(plan, timed_out, error, connected)
    assert reject.status == status and fragment in reject.message
    assert "127.0.1.2" not in reject.message  # backend addresses stay private


def test_an_address_of_the_router_itself_is_a_508_and_no_fault_of_the_upstream(
    config: RouterConfig,
) -> None:
    p = pipeline(config)
    decision, state = decided(p, incoming(config))
    assert isinstance(decision, Forward)
    decision.url = "http://127.0.0.2:9292/v2/images"  # a backend the config made the router
    refused = planned(p, decision, state)
    assert isinstance(refused, Reject) and refused.status == 508
    assert "routing loop" in refused.message and not p.health.upstreams


def test_token_swap_replaces_a_local_service_token(config: RouterConfig) -> None:
    p = pipeline(config)
    p.tokens.identity = Identity(
        config.current(),
        "CloudOne",
        validate=lambda url, token, verify: TokenCheck(True, frozenset({"service"}), 2e9),
        fetch_token=lambda entry: (f"router-token-from-{entry}", 2e9),
    )
    decision, state = decided(
        p, incoming(config, x_auth_token='u!SCOPE!{"image": "CloudTwo"}', x_service_token="nova")
    )
    assert isinstance(decision, Forward) and decision.swap_tokens
    plan = planned(p, decision, state)
    assert isinstance(plan, Plan)
    assert plan.edits["x-service-token"] == "router-token-from-router-at-cloudtwo"


def test_token_swap_refuses_a_user_token(config: RouterConfig) -> None:
    p = pipeline(config)
    p.tokens.identity = Identity(
        config.current(),
        "CloudOne",
        validate=lambda url, token, verify: TokenCheck(True, frozenset({"member"}), 2e9),
        fetch_token=lambda entry: ("never", 2e9),
    )
    decision, state = decided(
        p, incoming(config, x_auth_token='u!SCOPE!{"image": "CloudTwo"}', x_service_token="user")
    )
    refused = planned(p, decision, state)
    assert isinstance(refused, Reject) and refused.status == 403
    assert state.decision is refused  # logged as the router's refusal


def test_timeouts_per_destination_kind(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(
        SAMPLE.read_text().replace(
            "response_timeout: 120.0", "response_timeout: 5\n  peer_response_timeout: 50"
        )
    )
    config = RouterConfig()
    config.load(str(path), "CloudOne")
    p = pipeline(config)
    timeouts = []
    for scope in ('{"image": "CloudOne"}', '{"image": "CloudTwo"}'):
        decision, state = decided(p, incoming(config, x_scope=scope))
        plan = planned(p, decision, state)
        assert isinstance(plan, Plan)
        timeouts.append((plan.connect_timeout, plan.response_timeout))
    assert timeouts == [(5.0, 5.0), (5.0, 50.0)]


# ----------------------------------------------------------------- the order (handle)


def test_handle_sends_a_forward_and_logs_it_once(
    config: RouterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    p, engine = pipeline(config), Recorder(Outcome(status=201))
    request = incoming(config, "/v2/images?password=hunter2", x_scope='{"image": "CloudTwo"}')
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        asyncio.run(p.handle(request, engine))
    [(what, plan)] = engine.calls
    assert what == "send" and plan.target == "/v2/images?password=hunter2"
    [record] = caplog.records
    fields = record.__dict__["fields"]
    assert (fields["status"], fields["decision"], fields["cloud"]) == (201, "remote", "CloudTwo")
    assert fields["path"] == "/v2/images" and "hunter2" not in json.dumps(fields)


def test_handle_words_an_upstream_failure_and_answers_it(config: RouterConfig) -> None:
    p = pipeline(config)
    engine = Recorder(Outcome(failed=True, timed_out="connect", reason="cancelled"))
    asyncio.run(p.handle(incoming(config, x_scope='{"image": "CloudTwo"}'), engine))
    assert [what for what, _ in engine.calls] == ["send", "refuse"]
    reject = engine.calls[1][1]
    assert reject.status == 504 and "connecting to the router of CloudTwo" in reject.message
    assert p.health.down()  # the breaker heard it


def test_handle_answers_a_refusal_without_sending(config: RouterConfig) -> None:
    p, engine = pipeline(config), Recorder()
    asyncio.run(p.handle(incoming(config, x_scope='{"image": "Nowhere"}'), engine))
    assert [(what, r.status) for what, r in engine.calls] == [("refuse", 400)]


def test_handle_reads_the_body_of_a_combined_request_and_refuses_a_bad_one(
    config: RouterConfig,
) -> None:
    p = pipeline(config)
    engine = Recorder(body=Reject(408, "the request body stopped arriving"))
    scope = '{"image": "CloudOne | CloudTwo"}'
    asyncio.run(p.handle(incoming(config, x_scope=scope), engine))
    assert [what for what, _ in engine.calls] == ["read_body", "refuse"]
    assert engine.calls[1][1].status == 408


def test_a_client_that_goes_away_is_logged_as_499(
    config: RouterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    class Gone(Recorder):
        async def send(self, plan: Plan) -> Outcome:
            raise ClientGone()

    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        asyncio.run(pipeline(config).handle(incoming(config), Gone()))
    assert caplog.records[0].__dict__["fields"]["status"] == 499


# ----------------------------------------------------------------- region, log, metrics


def test_catalog_region_twins_a_remote_validation() -> None:
    catalog = [
        {
            "type": "image",
            "endpoints": [
                {"id": "e", "interface": "public", "region_id": "CloudTwo", "url": "http://x"}
            ],
        }
    ]
    body = json.dumps({"token": {"catalog": catalog}}).encode()
    changed = regioned(body, "CloudOne", 200, "application/json")
    assert changed is not None
    endpoints = json.loads(changed)["token"]["catalog"][0]["endpoints"]
    assert {e["region_id"] for e in endpoints} == {"CloudTwo", "CloudOne"}
    assert regioned(body, "CloudOne", 404, "application/json") is None
    assert regioned(b"not json", "CloudOne", 200, "application/json") is None


class _Refusal:
    status, message, method, path, started, client_address = 431, "too many", "GET", "/x", 0.0, None


def test_refused_heads_are_logged_and_counted(
    config: RouterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    labels = {"service": "-", "cloud": "-", "decision": "refused", "status": "431"}
    before = _sample("scoperouter_requests_total", **labels)
    p = pipeline(config)
    with caplog.at_level(logging.INFO, logger="scoperouter.access"):
        p.refused(_Refusal())
    [record] = caplog.records
    assert record.__dict__["fields"]["status"] == 431
    assert record.__dict__["fields"]["decision"] == "refused"
    p.metrics.flush()  # the worker's tick
    assert _sample("scoperouter_requests_total", **labels) == before + 1


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_each_answer_once(config: RouterConfig) -> None:
    p = pipeline(config)
    labels = {"service": "image", "cloud": "CloudTwo", "decision": "remote", "status": "200"}
    before = _sample("scoperouter_requests_total", **labels)
    decision, state = decided(p, incoming(config, x_scope='{"image": "CloudTwo"}'))
    state.decision = decision
    p.done(state, 200)
    p.done(state, 200)
    p.metrics.flush()  # the worker's tick
    assert _sample("scoperouter_requests_total", **labels) == before + 1


def test_metrics_show_every_upstream_and_its_health(config: RouterConfig) -> None:
    p = pipeline(config)
    peer = {"cloud": "CloudTwo", "kind": "peer", "service": "image"}
    peer["upstream"] = "http://127.0.0.3:9292"
    assert _sample("scoperouter_upstream_up", **peer) == 1
    decision, state = decided(p, incoming(config, x_scope='{"image": "CloudTwo"}'))
    plan = planned(p, decision, state)
    assert isinstance(plan, Plan)
    p.failed(plan, "connect", "cancelled", False)
    assert _sample("scoperouter_upstream_up", **peer) == 0


class _Clock:
    """Fixed clocks for the access log: both of a test's lines get the same times."""

    def __init__(self, elapsed: float) -> None:
        self.elapsed = elapsed

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    def time(self) -> float:
        return 1_700_000_000.5


# What a request's method and path may be in the line: the usual (printable ASCII, written as
# it is), anything (quotes, backslashes, control characters, non-ASCII), and bytes that are not
# UTF-8 as a surrogateescape-decoded path carries them (lone surrogates).
_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_SURROGATE_ESCAPED = st.binary(max_size=30).map(lambda b: b.decode("utf-8", "surrogateescape"))
_HOSTILE = st.text(_PRINTABLE, max_size=30) | st.text(max_size=30) | _SURROGATE_ESCAPED
_LINES = logs.BatchingHandler(io.StringIO())  # one for all examples (each starts a thread)
_LINES.setFormatter(logs.JsonFormatter({"pid": 7, "router": "CloudOne", "worker": 0}))


@settings(max_examples=300, deadline=None)
@given(
    method=st.text(_PRINTABLE, min_size=1, max_size=8) | _HOSTILE.filter(bool),
    path=_HOSTILE,
    request=st.sampled_from(["req-1", 'req-"2\\', "req-\udcff"]),
    status=st.sampled_from([0, 200, 204, 400, 404, 502, 508]),
    elapsed=st.floats(min_value=0, max_value=200_000, allow_nan=False),
    decision=st.sampled_from(["local", "remote", "refused", "none", "failover"]),
    message=st.none() | st.text(max_size=200) | _SURROGATE_ESCAPED,
    error=st.none() | st.text(max_size=200),
    tried=st.none() | st.text(max_size=400) | _SURROGATE_ESCAPED,
    stripped=st.sampled_from([(), ("x-roles",), ("x-is-admin-project", "x-roles", "x-user-id")]),
)
def test_the_direct_access_line_is_the_logging_line(
    method: str,
    path: str,
    request: str,
    status: int,
    elapsed: float,
    decision: str,
    message: str | None,
    error: str | None,
    tried: str | None,
    stripped: tuple[str, ...],
) -> None:
    """The access line is written straight to the router's JSON handler (no LogRecord: a
    third of its cost); it must be the very line the logging machinery writes for the same
    request when another handler is in the way (a test's caplog, a filter), whatever the
    request sent: one line of valid JSON (lone surrogates escaped: it is valid UTF-8), the
    values as they were, the free-text fields within their caps."""
    handler, formatter = _LINES, _LINES.formatter
    assert isinstance(formatter, logs.JsonFormatter)
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
    lines: list[str] = []
    handler._pending.clear()
    try:
        for capture in (False, True):
            state = RequestState(
                request_id=request, headers={}, method=method, path=path, started=1000.0
            )
            state.decision, state.message, state.tried = chosen, message, tried
            state.stripped = stripped
            extra = logging.NullHandler()
            if capture:
                root.addHandler(extra)  # the logging machinery's turn
            AccessLog(None, _Clock(elapsed)).write(state, status, error)  # type: ignore[arg-type]
            root.removeHandler(extra)
            [line] = handler._pending
            handler._pending.clear()
            lines.append(line)
    finally:
        root.handlers[:], logs._direct = saved[0], saved[2]
        root.setLevel(saved[1])
    # the direct writer's line has the fixed clock's time, the machinery's record its own
    assert lines[0].startswith('{"ts":"2023-11-14T22:13:20.500Z"')
    assert not lines[1].startswith('{"ts":"2023-11-14T22:13:20.500Z"')
    direct, machinery = (json.loads(line) for line in lines)
    assert direct.pop("ts").endswith("Z") and machinery.pop("ts").endswith("Z")
    # the same text after the timestamp (the machinery's record has its own clock)
    assert lines[0].partition('","level"')[2] == lines[1].partition('","level"')[2]
    assert direct == machinery and direct["method"] == method and direct["path"] == path
    assert direct["request_id"] == request and direct["msg"].startswith(f"{method} {path} ")
    assert direct.get("stripped", "") == ",".join(stripped)
    assert len(direct.get("reason", "")) <= 160 and len(direct.get("error", "")) <= 160
    assert len(direct.get("tried", "")) <= 300
    for line in lines:  # strict UTF-8 (no lone surrogate left), one line to any reader
        assert line.encode("utf-8").splitlines() == [line.encode("utf-8")]
        assert not any(ord(c) < 0x20 for c in line)
