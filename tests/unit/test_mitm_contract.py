"""The contract between scoperouter.proxy.mitm and mitmproxy's internals (no sockets).

Each item of mitm.py's docstring has its test here: the internal it relies on is where it was
(source checks that fail loudly on an upgrade) and the router's piece behaves as intended when
driven the way mitmproxy drives it. End-to-end behaviour is in tests/integration.
"""

from __future__ import annotations

import asyncio
import configparser
import contextvars
import inspect
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mitmproxy
import pytest
from mitmproxy import connection, master, options, tls
from mitmproxy import flow as mflow
from mitmproxy.addons import proxyserver, tlsconfig
from mitmproxy.proxy import commands, events, mode_servers, server
from mitmproxy.proxy import layers as proxy_layers
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import http as http_layers
from mitmproxy.proxy.layers import tls as tls_layers
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import RequestHeaders, RequestProtocolError
from mitmproxy.test import taddons, tflow

from scoperouter import pki
from scoperouter.catalog import Limits
from scoperouter.proxy.forward import compat, guard, mitm

MITMPROXY_12 = compat.MITMPROXY_MAJOR >= 12


def test_written_for_this_mitmproxy() -> None:
    assert mitmproxy.version.VERSION in compat.MITMPROXY_VERSIONS


def test_the_router_extra_pins_the_checked_releases() -> None:
    """setup.cfg's `router` extra installs exactly the releases this test checks: 11.0.2 on
    Python 3.11 (mitmproxy 11.1+ needs 3.12), 12.x on 3.12+."""
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    pins = [
        line.strip()
        for line in setup["options.extras_require"]["router"].splitlines()
        if line.strip().startswith("mitmproxy")
    ]
    assert pins == [
        f'mitmproxy=={compat.MITMPROXY_VERSIONS[0]}; python_version < "3.12"',
        f'mitmproxy=={compat.MITMPROXY_VERSIONS[1]}; python_version >= "3.12"',
    ]


# ----------------------------------------------------------------- what mitmproxy 12 changed


def test_protocol_error_codes_are_what_the_installed_release_takes() -> None:
    """11 takes an HTTP status, 12 an ErrorCode (its constructor asserts it): a failed body's
    RequestProtocolError is built with what the installed release takes."""
    for status in (408, 413, 431):
        code = compat.request_error_code(status)
        RequestProtocolError(1, "body failed", code)  # 12 asserts the type
        if MITMPROXY_12:
            from mitmproxy.proxy.layers.http._events import ErrorCode

            assert isinstance(code, ErrorCode) and code.http_status_code() in (400, 413)
        else:
            assert code == status


def test_mitmproxys_crl_hook_answers_nothing(tmp_path: Path) -> None:
    """mitmproxy 12's TlsConfig answers a request whose path ends in its CRL's name itself
    (before the router's addon): the router's subclass switches that hook off. 11 has none."""
    assert compat.TLSCONFIG_HAS_REQUEST_HOOK == MITMPROXY_12
    if not MITMPROXY_12:
        assert not hasattr(mitm.InterceptingTlsConfig, "request")
        return
    ours = mitm.InterceptingTlsConfig(lambda host, port: None, pki.new_key())
    theirs = tlsconfig.TlsConfig()
    for addon in (theirs, ours):
        with taddons.context(addon) as tctx:
            tctx.configure(addon, confdir=str(tmp_path / "mitmproxy"))
            flow = tflow.tflow()
            flow.request.path = "/v2/images" + addon.crl_path()
            addon.request(flow)
            answered = flow.response is not None
        assert answered == (addon is theirs), addon


@pytest.fixture
def installed() -> Iterator[None]:
    mitm.install()
    try:
        yield
    finally:
        mitm.uninstall()


def _parse(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


# ----------------------------------------------------------------- 1. error pages


def test_renderer_is_the_module_function_http1_calls(installed: None) -> None:
    source = inspect.getsource(_http1.Http1Server.send)
    if MITMPROXY_12:  # the status is the ErrorCode's (none: no page), the renderer the same
        assert "status = event.code.http_status_code()" in source
        assert "make_error_response(status, event.message)" in source
    else:
        assert "make_error_response(event.code, event.message)" in source
    assert _http1.make_error_response is mitm.render_error


def test_uninstall_restores_mitmproxy() -> None:
    mitm.install()
    mitm.uninstall()
    assert _http1.make_error_response is not mitm.render_error
    assert proxy_layers.http.Http1Server is _http1.Http1Server


def test_error_hook_runs_before_the_error_response() -> None:
    source = inspect.getsource(http_layers.HttpStream.handle_protocol_error)
    hook = source.index("yield HttpErrorHook(self.flow)")
    send = source.index("yield SendHttp(event, self.context.client)")
    assert hook < send
    # The hook task feeds HookCompleted back in the same task: the ContextVar hand-over.
    hook_task = inspect.getsource(server.ConnectionHandler.hook_task)
    assert "await self.handle_hook(hook)" in hook_task
    assert "await self.server_event(events.HookCompleted(hook))" in hook_task


def test_fallback_is_json_with_mitmproxys_status() -> None:
    status, headers, body = _parse(mitm.render_error(400, "Bad HTTP request line"))
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert body == {
        "error": {"code": 400, "title": "Bad Request", "message": "Bad HTTP request line"}
    }


def test_pending_error_applies_once_and_only_to_its_message() -> None:
    def scenario() -> list[tuple[int, str]]:
        flow = tflow.tflow()
        flow.error = mflow.Error("Connection killed: boom")
        mitm.set_error_response(flow, 504, "CloudTwo did not answer")
        results = []
        for message in ("something else", "Connection killed: boom", "Connection killed: boom"):
            status, _, body = _parse(mitm.render_error(502, message))
            results.append((status, body["error"]["message"]))
        return results

    assert contextvars.copy_context().run(scenario) == [
        (502, "something else"),
        (504, "CloudTwo did not answer"),
        (502, "Connection killed: boom"),
    ]
    # Another context (another task) never sees it.
    status, _, body = _parse(mitm.render_error(502, "Connection killed: boom"))
    assert (status, body["error"]["message"]) == (502, "Connection killed: boom")


def test_508_has_its_reason_phrase() -> None:
    head = guard.error_page(508, "loop").split(b"\r\n", 1)[0]
    assert head == b"HTTP/1.1 508 Loop Detected"


# ----------------------------------------------------------------- 2. the request head


def test_http_layer_makes_its_http1_server_by_module_name(installed: None) -> None:
    source = inspect.getsource(http_layers.HttpLayer._handle_event)
    assert "http_conn = Http1Server(self.context.fork())" in source
    assert proxy_layers.http.Http1Server is guard.GuardedHttp1Server
    # Wakeups a connection layer requests come back to it.
    assert "isinstance(command, commands.RequestWakeup)" in inspect.getsource(
        http_layers.HttpLayer.event_to_child
    )


def test_the_head_reading_the_guard_replaces_is_unchanged() -> None:
    """GuardedHttp1Server.read_headers does what mitmproxy's does, after its checks."""
    source = inspect.getsource(_http1.Http1Server.read_headers)
    for step in (
        "request_head = self.buf.maybe_extract_lines()",
        "self.request = http1.read_request_head(",
        "expected_body_size = http1.expected_http_body_size(self.request)",
        "self.stream_id, self.request, expected_body_size == 0",
        "self.body_reader = make_body_reader(expected_body_size)",
        "self.state = self.read_body",
        "yield from self.state(event)",
    ):
        assert step in source, step
    handle = inspect.getsource(_http1.Http1Connection._handle_event)
    assert "self.buf += event.data" in handle


class Conn:
    """A GuardedHttp1Server driven as mitmproxy drives it; commands are collected."""

    def __init__(self, limits: Limits | None = None) -> None:
        guard.set_head_limits(limits or Limits())
        self.refusals: list[guard.Refusal] = []
        guard.set_refusal_handler(self.refusals.append)
        client = tflow.tclient_conn()
        self.layer = guard.GuardedHttp1Server(Context(client, options.Options()))
        self.commands = list(self.layer.handle_event(events.Start()))

    def send(self, data: bytes) -> list[Any]:
        got = list(self.layer.handle_event(events.DataReceived(self.layer.conn, data)))
        self.commands += got
        return got

    def wake(self) -> list[Any]:
        wakeups = [c for c in self.commands if isinstance(c, commands.RequestWakeup)]
        got = list(self.layer.handle_event(events.Wakeup(wakeups[-1])))
        self.commands += got
        return got

    def sent(self) -> bytes:
        return b"".join(c.data for c in self.commands if isinstance(c, commands.SendData))

    def heads(self) -> list[Any]:
        return [
            c.event.request
            for c in self.commands
            if isinstance(c, ReceiveHttp) and isinstance(c.event, RequestHeaders)
        ]


@pytest.fixture(autouse=False)
def guarded() -> Iterator[None]:
    yield
    guard.set_head_limits(Limits())
    guard.set_refusal_handler(None)


def test_a_good_request_passes_in_one_piece_or_many(guarded: None) -> None:
    conn = Conn()
    conn.send(b"GET /v2/images HTTP/1.1\r\nHost: x\r\nX-Scope: {}\r\n\r\n")
    assert [r.path for r in conn.heads()] == ["/v2/images"]
    conn = Conn()
    for byte in b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n":
        conn.send(bytes([byte]))
    assert [r.path for r in conn.heads()] == ["/a"]
    assert not conn.sent() and not conn.refusals


@pytest.mark.parametrize(
    ("head", "status", "fragment"),
    [
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431, "101 header fields"),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431, "larger than 65536"),
        (b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\n\r\n", 414, "request line is longer"),
        (b"GET / HTTP/1.1\r\nX-A: b\x00c\r\n\r\n", 400, "control character"),
        (b"GET / HTTP/1.1\r\nX-A: b\rc\r\n\r\n", 400, "control character"),
        (b"GET / HTTP/1.1\r\nX-A: b\r\n  folded\r\n\r\n", 400, "obs-fold"),
        (b"GET / HTTP/1.1\r\nBad Name: b\r\n\r\n", 400, "invalid header name"),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "malformed request",
        ),
        (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400, "content-length"),
        (b"NOT A REQUEST\r\n\r\n", 400, "malformed request"),
    ],
)
def test_bad_heads_are_the_clients_error(
    guarded: None, head: bytes, status: int, fragment: str
) -> None:
    conn = Conn()
    conn.send(head)
    assert not conn.heads()
    got, headers, body = _parse(conn.sent())
    assert got == status and headers["content-type"] == "application/json"
    assert fragment in body["error"]["message"], body
    assert "validate_inbound_headers" not in body["error"]["message"]
    assert [r.status for r in conn.refusals] == [status]
    # Half-closed, lingering: what the client still sends is dropped, not parsed or buffered.
    assert any(isinstance(c, commands.CloseTcpConnection) for c in conn.commands)
    assert not conn.send(b"GET / HTTP/1.1\r\n\r\n" * 1000)
    assert len(conn.layer.buf) == 0


def test_an_endless_head_is_refused_as_soon_as_it_is_too_large(guarded: None) -> None:
    conn = Conn(Limits(max_header_bytes=1000, max_request_line=500))
    conn.send(b"GET / HTTP/1.1\r\n")
    for _ in range(100):
        conn.send(b"X-Header: " + b"v" * 90 + b"\r\n")
        if conn.sent():
            break
    assert _parse(conn.sent())[0] == 431
    assert len(conn.layer.buf) == 0


def test_a_slow_head_times_out_with_408(guarded: None) -> None:
    conn = Conn(Limits(header_timeout=0.05))
    conn.send(b"GET /slow HTTP/1.1\r\nHost:")
    wakeups = [c for c in conn.commands if isinstance(c, commands.RequestWakeup)]
    assert min(w.delay for w in wakeups) <= 0.05  # a timer shorter than the idle one is armed
    import time

    time.sleep(0.06)
    conn.wake()
    status, _, body = _parse(conn.sent())
    assert status == 408 and "header_timeout" in body["error"]["message"]
    assert (conn.refusals[0].method, conn.refusals[0].path) == ("GET", "/slow")


def test_an_idle_connection_is_closed(guarded: None) -> None:
    conn = Conn(Limits(idle_timeout=0.01))
    import time

    time.sleep(0.02)
    got = conn.wake()
    assert any(isinstance(c, commands.CloseConnection) for c in got)
    assert not conn.sent() and not conn.refusals  # closed quietly: no request, no answer


def test_one_timer_at_a_time_per_connection(guarded: None) -> None:
    conn = Conn()
    for _ in range(50):
        conn.send(b"GET / HTTP/1.1\r\n")  # a head in progress, many packets
    wakeups = [c for c in conn.commands if isinstance(c, commands.RequestWakeup)]
    assert len(wakeups) == 2  # the idle timer from the start, and the header timer


# ----------------------------------------------------------------- 3. upstreams


def test_connect_cancellation_point() -> None:
    source = inspect.getsource(server.ConnectionHandler.open_connection)
    start = source.index("command.connection.timestamp_start = time.time()")
    connect = source.index("await asyncio.open_connection(")
    caught = source.index("except (OSError, asyncio.CancelledError) as e:")
    setup = source.index("command.connection.timestamp_tcp_setup = time.time()")
    hook = source.index("server_hooks.ServerConnectHook(hook_data)")
    assert hook < start < connect < caught < setup


def test_connection_table_and_transports() -> None:
    assert "self.connections[connection_id] = handler" in inspect.getsource(
        proxyserver.Proxyserver.register_connection
    )
    fields = set(inspect.signature(server.ConnectionIO).parameters)
    assert {"handler", "reader", "writer"} <= fields
    assert "transports" in server.ConnectionHandler.__annotations__


# ----------------------------------------------------------------- 4. listening


def test_listeners_are_made_by_listen(installed: None) -> None:
    source = inspect.getsource(mode_servers.AsyncioServerInstance._start)
    assert "self._servers = await self.listen(host, port)" in source
    params = list(inspect.signature(mitm._original_listen).parameters)
    assert params == ["self", "host", "port"]


def test_registered_socket_is_served_and_outlives_the_server(installed: None) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    host, port = sock.getsockname()
    mitm.use_listen_sockets({(host, port): sock})

    class Instance:
        class mode:
            transport_protocol = "tcp"

        async def handle_stream(self, reader: Any, writer: Any) -> None:
            writer.close()

    async def scenario() -> None:
        servers = await mitm._listen(Instance(), host, port)
        assert servers[0].sockets[0].getsockname() == (host, port)
        servers[0].close()

    try:
        asyncio.run(scenario())
        assert sock.fileno() != -1  # still open: the server had a duplicate
    finally:
        mitm.use_listen_sockets({})
        sock.close()


# ----------------------------------------------------------------- 5 and 6


def test_legacy_log_events_can_be_switched_off() -> None:
    async def scenario() -> None:
        m = master.Master(options.Options(), with_termlog=False)
        assert hasattr(m._legacy_log_events, "uninstall")
        mitm.quiet_master(m)

    asyncio.run(scenario())


def test_error_messages_the_router_recognises() -> None:
    assert f'f"{mitm.CLIENT_GONE}."' in inspect.getsource(_http1.Http1Connection.wait)
    assert mitm.CLIENT_PROTOCOL_ERROR in inspect.getsource(_http1.Http1Connection.read_body)
    assert f'f"{mitm.TLS_VERIFY_FAILED}{{error}}"' in inspect.getsource(tls_layers)
    assert mitm.upstream_reason(f"{mitm.TLS_VERIFY_FAILED}IP address mismatch") == (
        "TLS certificate verification failed: IP address mismatch"
    )


def test_addon_manager_dispatch_the_fast_one_replaces() -> None:
    from mitmproxy import addonmanager
    from mitmproxy.proxy.layers.http import HttpRequestHeadersHook

    assert "for i in self.chain:" in inspect.getsource(addonmanager.AddonManager.trigger_event)
    assert "UpdateHook([message])" in inspect.getsource(addonmanager.AddonManager.handle_lifecycle)
    assert callable(addonmanager.safecall) and callable(addonmanager.traverse)
    calls: list[str] = []

    class Broken:
        def requestheaders(self, flow: Any) -> None:
            calls.append("broken")
            raise RuntimeError("an addon's bug")

    class Later:
        def requestheaders(self, flow: Any) -> Any:
            async def later() -> None:
                calls.append("later")

            return later()

        def update(self, flows: Any) -> None:
            calls.append("update")

    class Silent:
        pass

    async def scenario() -> None:
        m = master.Master(options.Options(), with_termlog=False)
        mitm.fast_hooks(m)
        m.addons.add(Silent(), Broken())
        flow = tflow.tflow()
        await m.addons.handle_lifecycle(HttpRequestHeadersHook(flow))
        assert calls == ["broken"]  # the bug is logged, not raised; no update hook, no call
        m.addons.add(Later())  # the cache follows the addons
        await m.addons.handle_lifecycle(HttpRequestHeadersHook(flow))
        assert calls == ["broken", "broken", "later", "update"]

    asyncio.run(scenario())


def _body_events(conn: Conn) -> list[Any]:
    return [c.event for c in conn.commands if isinstance(c, ReceiveHttp)]


def test_trailer_fields_are_dropped_not_a_crash(guarded: None) -> None:
    """mitmproxy raises NotImplementedError on trailers (the connection then hangs): the
    guarded server drops them, and the request ends as any chunked one."""
    conn = Conn()
    conn.send(b"POST /v2/images HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    conn.send(b"3\r\nabc\r\n0\r\nHost: evil.example\r\nX-Injected: 1\r\n\r\n")
    events_seen = _body_events(conn)
    assert [type(e).__name__ for e in events_seen] == [
        "RequestHeaders",
        "RequestData",
        "RequestEndOfMessage",
    ]
    assert events_seen[1].data == b"abc" and not conn.sent()
    assert conn.heads()[0].headers.get_all("host") == ["x"]


def test_over_long_trailers_are_refused_with_431(guarded: None) -> None:
    conn = Conn(Limits(max_header_bytes=1000, max_request_line=500))
    conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Big: ")
    for _ in range(20):
        conn.send(b"v" * 100)
    status, _, body = _parse(conn.sent())
    assert status == 431 and "trailer" in body["error"]["message"]
    [failed] = [e for e in _body_events(conn) if isinstance(e, RequestProtocolError)]
    assert guard.BODY_FAILED in failed.message
    assert failed.code == compat.request_error_code(431)
    assert len(conn.layer.buf) == 0


def test_a_body_that_stops_arriving_is_answered_408(guarded: None) -> None:
    import time

    conn = Conn(Limits(body_timeout=0.05))
    conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    time.sleep(0.06)
    conn.wake()
    status, _, body = _parse(conn.sent())
    assert status == 408 and "body_timeout" in body["error"]["message"]
    [failed] = [e for e in _body_events(conn) if isinstance(e, RequestProtocolError)]
    assert failed.code == compat.request_error_code(408)
    assert any(isinstance(c, commands.CloseTcpConnection) for c in conn.commands)
    assert not conn.send(b"more" * 1000) and len(conn.layer.buf) == 0


def test_tlsconfig_asks_get_cert_for_the_clients_certificate() -> None:
    source = inspect.getsource(tlsconfig.TlsConfig.tls_start_client)
    assert "entry = self.get_cert(tls_start.context)" in source
    if MITMPROXY_12:  # the cryptography key as is; a chain only from entry.chain_certs (none)
        assert "tls_start.ssl_conn.use_privatekey(entry.privatekey)" in source
        assert "if entry.chain_file is None and len(entry.chain_certs) > 1:" in source
    else:
        assert "crypto.PKey.from_cryptography_key(entry.privatekey)" in source


def test_intercepted_handshakes_get_the_routers_certificate(tmp_path: Path) -> None:
    ca = pki.load_signing_ca(*pki.make_ca(tmp_path, "proxy-ca"))
    key = pki.new_key()

    def certificate_for(host: str | None, port: int | None) -> Any:
        if (host, port) != ("127.0.1.2", 9292):
            return None
        return pki.host_certificate(ca, key, host, 1)

    addon = mitm.InterceptingTlsConfig(certificate_for, key)

    def answered(address: tuple[str, int] | None) -> Any:
        client = connection.Client(
            peername=("127.0.0.1", 1234), sockname=("127.0.0.2", 3128), timestamp_start=0
        )
        context = Context(client, tctx.options)
        context.server.address = address
        data = tls.TlsData(client, context=context)
        addon.tls_start_client(data)
        assert data.ssl_conn is not None
        return data.ssl_conn.get_certificate().to_cryptography()

    with taddons.context(addon) as tctx:
        tctx.configure(addon, confdir=str(tmp_path / "mitmproxy"))
        ours = answered(("127.0.1.2", 9292))
        assert ours.issuer == ca.cert.subject and pki.addresses_of(ours) == {"127.0.1.2"}
        # Not a tunnel to a catalog destination: mitmproxy's own, from its CA nobody trusts.
        for address in (None, ("127.0.1.9", 443)):
            theirs = answered(address)
            assert (
                theirs.issuer != ca.cert.subject and "mitmproxy" in theirs.issuer.rfc4514_string()
            )


def test_an_upgrade_is_refused_by_the_guarded_server(guarded: None) -> None:
    """Issue 30, finding 4: as the frontends (llhttp's upgrade: Upgrade and Connection:
    upgrade), before any hook; Upgrade alone asks for nothing and passes the guard."""
    for head in (
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: close, UPGRADE\r\n\r\n",
    ):
        conn = Conn()
        conn.send(head)
        assert not conn.heads()
        status, _, body = _parse(conn.sent())
        assert status == 400 and "does not switch protocols" in body["error"]["message"]
        assert [r.status for r in conn.refusals] == [400]
    conn = Conn()
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n")
    assert [r.path for r in conn.heads()] == ["/"] and not conn.sent()


def test_a_websocket_needs_an_option_the_router_turns_off() -> None:
    """Issue 30, finding 4: mitmproxy's websocket layer takes over a 101 only with the
    ``websocket`` option; the engine turns it off (and raw TCP), so a 101 is never relayed
    as a protocol switch."""
    from scoperouter.proxy.forward.engine import BASE_OPTIONS

    assert "self.context.options.websocket" in inspect.getsource(
        http_layers.HttpStream.send_response
    )
    assert "self.context.options.rawtcp" in inspect.getsource(http_layers.HttpStream.flow_done)
    assert BASE_OPTIONS["websocket"] is False and BASE_OPTIONS["rawtcp"] is False
    assert options.Options().websocket is True  # on by default: the engine must set it


# ----------------------------------------------------------------- 8. tunnels


def test_a_tunnel_keeps_an_absolute_form_targets_authority() -> None:
    """Issue 30, finding 3: inside a tunnel mitmproxy's HTTP layer is in transparent mode:
    host and port come from the tunnel, and an absolute-form target keeps its authority, which
    the request line sent upstream is made of; the adapter clears it (origin-form)."""
    source = inspect.getsource(http_layers.HttpStream.state_wait_for_request_headers)
    assert "if self.mode is HTTPMode.transparent:" in source
    assert "self.flow.request.data.host = self.context.server.address[0]" in source
    assert 'self.flow.request.authority = ""' in source  # regular mode only
    next_layer_source = inspect.getsource(
        __import__("mitmproxy.addons.next_layer", fromlist=["NextLayer"]).NextLayer._next_layer
    )
    assert "return layers.HttpLayer(context, HTTPMode.transparent)" in next_layer_source
    from mitmproxy.net.http import http1

    request = tflow.treq(authority=b"127.0.8.99:80", path=b"/x")
    assert http1.assemble_request_head(request).startswith(b"GET http://127.0.8.99:80/x ")
    request.data.authority = b""
    assert http1.assemble_request_head(request).startswith(b"GET /x ")


def test_the_connect_address_is_taken_after_the_connect_hook() -> None:
    """Issue 30, finding 6: the adapter's http_connect sets the request's host to the
    catalog's spelling; mitmproxy takes the tunnel's address from it after the hook."""
    source = inspect.getsource(http_layers.HttpStream.handle_connect)
    hook = source.index("yield HttpConnectHook(self.flow)")
    address = source.index(
        "self.context.server.address = (self.flow.request.host, self.flow.request.port)"
    )
    assert hook < address


def test_next_layer_hook_and_the_tls_test() -> None:
    """Issue 30, finding 8: what the adapter's next_layer hook relies on."""
    from mitmproxy.proxy import layer

    source = inspect.getsource(layer.NextLayer._ask)
    assert "yield NextLayerHook(self)" in source and "if self.layer:" in source
    assert "for e in self.events:" in source  # what came before the decision is replayed
    assert "yield from self._ask()" in inspect.getsource(layer.NextLayer._handle_event)
    assert mitm.NextLayer is layer.NextLayer
    hello = b"\x16\x03\x01\x02\x00\x01"
    assert mitm.could_be_tls(hello) and not mitm.could_be_tls(b"GET / HTTP/1.1\r\n")
    assert not mitm.could_be_tls(b"\x16\x01") and not mitm.could_be_tls(b"\x00")
    for start in (b"\x16", b"\x16\x03"):  # not enough to tell: the addons after wait
        with pytest.raises(mitmproxy.exceptions.AddonHalt):
            mitm.could_be_tls(start)
    assert "except exceptions.AddonHalt:" in inspect.getsource(mitm.FastAddonManager.trigger_event)


def test_the_refusing_layer_answers_lingers_and_closes(guarded: None) -> None:
    refusals: list[guard.Refusal] = []
    guard.set_refusal_handler(refusals.append)
    client = tflow.tclient_conn()
    refusing = mitm.refuse_layer(Context(client, options.Options()), 400, "not TLS", "h:1")
    got = list(refusing.handle_event(events.Start()))
    got += list(refusing.handle_event(events.DataReceived(client, b"\x00garbage")))
    sent = b"".join(c.data for c in got if isinstance(c, commands.SendData))
    status, headers, body = _parse(sent)
    assert (status, body["error"]["message"]) == (400, "not TLS")
    assert headers["connection"] == "close"
    assert [type(c) for c in got if not isinstance(c, commands.SendData)] == [
        commands.CloseTcpConnection,
        commands.RequestWakeup,
    ]
    [wakeup] = [c for c in got if isinstance(c, commands.RequestWakeup)]
    [closed] = refusing.handle_event(events.Wakeup(wakeup))
    assert type(closed) is commands.CloseConnection and closed.connection is client
    assert [(r.status, r.path, r.method) for r in refusals] == [(400, "h:1", "-")]


def test_a_finished_client_handshake_is_a_hook_with_its_client() -> None:
    """The sweep watches a tunnel until ``tls_established_client`` (issue 30, finding 8)."""
    from mitmproxy.proxy.layers.tls import TlsEstablishedClientHook

    assert TlsEstablishedClientHook.name == "tls_established_client"
    assert mitm.TlsData is tls.TlsData
    source = inspect.getsource(tls_layers.TLSLayer.receive_handshake_data)
    assert "yield TlsEstablishedClientHook(" in source
    assert "context" in {f.name for f in __import__("dataclasses").fields(tls.TlsData)}


def test_a_schemes_case_is_not_an_upstream_failure(guarded: None) -> None:
    """mitmproxy answered ``GET HTTPS://...`` with 502 (``Invalid request scheme``): the
    scheme is case-insensitive (RFC 9110 4.2.3); one the proxy does not carry is the
    client's error, 400."""
    assert "Invalid request scheme" in inspect.getsource(http_layers.validate_request)
    conn = Conn()
    conn.send(b"GET HTTP://x:80/a HTTP/1.1\r\nHost: x:80\r\n\r\n")
    [request] = conn.heads()
    assert request.scheme == "http" and not conn.sent()
    assert http_layers.validate_request(http_layers.HTTPMode.regular, request, True) is None
    conn = Conn()
    conn.send(b"GET ftp://x:21/a HTTP/1.1\r\nHost: x:21\r\n\r\n")
    status, _, body = _parse(conn.sent())
    assert (status, body["error"]["message"]) == (400, guard.SCHEME_MESSAGE)
    assert [r.status for r in conn.refusals] == [400] and not conn.heads()
