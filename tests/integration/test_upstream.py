"""The contract between scoperouter.proxy.upstream and mitmproxy's internals (no sockets).

These fail first when a mitmproxy upgrade moves what the router relies on: the HTTP/1 error
renderer, the order "error hook, then error response" and where a connection attempt can be
cancelled. The behaviour itself is covered end to end by test_errors.py.
"""

from __future__ import annotations

import contextvars
import inspect
import json

import pytest
from mitmproxy import flow as mflow
from mitmproxy.proxy import server
from mitmproxy.proxy.layers import http as http_layers
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.test import tflow

from scoperouter.proxy import upstream

pytestmark = pytest.mark.integration


def _parse(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


def test_renderer_is_the_module_function_http1_calls() -> None:
    source = inspect.getsource(_http1.Http1Server.send)
    assert "make_error_response(event.code, event.message)" in source
    upstream.install()
    try:
        assert _http1.make_error_response is upstream.render_error
    finally:
        upstream.uninstall()
    assert _http1.make_error_response is not upstream.render_error


def test_error_hook_runs_before_the_error_response() -> None:
    source = inspect.getsource(http_layers.HttpStream.handle_protocol_error)
    hook = source.index("yield HttpErrorHook(self.flow)")
    send = source.index("yield SendHttp(event, self.context.client)")
    assert hook < send
    # The hook task feeds HookCompleted back in the same task: the ContextVar hand-over.
    hook_task = inspect.getsource(server.ConnectionHandler.hook_task)
    assert "await self.handle_hook(hook)" in hook_task
    assert "await self.server_event(events.HookCompleted(hook))" in hook_task


def test_connect_cancellation_point() -> None:
    source = inspect.getsource(server.ConnectionHandler.open_connection)
    start = source.index("command.connection.timestamp_start = time.time()")
    connect = source.index("await asyncio.open_connection(")
    caught = source.index("except (OSError, asyncio.CancelledError) as e:")
    setup = source.index("command.connection.timestamp_tcp_setup = time.time()")
    hook = source.index("server_hooks.ServerConnectHook(hook_data)")
    assert hook < start < connect < caught < setup


def test_fallback_is_json_with_mitmproxys_status() -> None:
    status, headers, body = _parse(upstream.render_error(400, "Bad HTTP request line"))
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert body == {
        "error": {"code": 400, "title": "Bad Request", "message": "Bad HTTP request line"}
    }


def test_pending_error_applies_once_and_only_to_its_message() -> None:
    def scenario() -> list[tuple[int, str]]:
        flow = tflow.tflow()
        flow.error = mflow.Error("Connection killed: boom")
        upstream.set_error_response(flow, 504, "CloudTwo did not answer")
        results = []
        for message in ("something else", "Connection killed: boom", "Connection killed: boom"):
            status, _, body = _parse(upstream.render_error(502, message))
            results.append((status, body["error"]["message"]))
        return results

    assert contextvars.copy_context().run(scenario) == [
        (502, "something else"),
        (504, "CloudTwo did not answer"),
        (502, "Connection killed: boom"),
    ]
    # Another context (another task) never sees it.
    status, _, body = _parse(upstream.render_error(502, "Connection killed: boom"))
    assert (status, body["error"]["message"]) == (502, "Connection killed: boom")
