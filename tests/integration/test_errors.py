"""Failures answered as OpenStack JSON naming the cloud and service: 502, 504, 508, and refusals
of requests whose body is still on its way."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CONNECT_TIMEOUT, RESPONSE_TIMEOUT, Federation
from .routers import (
    Router,
    cloud_entry,
    free_port,
    raw_exchange,
    request,
    start_all,
    stop_all,
    write_config,
)

pytestmark = pytest.mark.integration


def assert_json_error(reply, status: int, *parts: str) -> str:
    assert reply.status == status, reply
    assert reply.headers["content-type"] == "application/json"
    message = reply.error_message()
    for part in parts:
        assert part in message, message
    return message


def test_remote_router_down_is_502_naming_the_cloud(federation: Federation) -> None:
    headers = {"X-Scope": '{"image": "CloudDown"}'}
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    assert_json_error(reply, 502, "CloudDown", "image", "unreachable")


def test_local_backend_down_is_502_naming_the_service(federation: Federation) -> None:
    reply = request("GET", federation.url("CloudOne", "placement", "/resource_providers"))
    message = assert_json_error(reply, 502, "placement service of CloudOne", "unreachable")
    # The backend address of the cloud is not disclosed to clients.
    assert "127.0.1." not in message


def test_remote_answering_garbage_is_502(federation: Federation) -> None:
    headers = {"X-Scope": '{"image": "CloudGarbage"}'}
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    assert_json_error(reply, 502, "router of CloudGarbage", "image", "failed")


def test_remote_router_down_through_the_forward_proxy(federation: Federation) -> None:
    url = federation.url("CloudDown", "image", "/v2/images")
    reply = request("GET", url, proxy=federation.proxies["CloudTwo"])
    assert_json_error(reply, 502, "CloudDown")


def test_remote_that_never_answers_is_504(federation: Federation) -> None:
    headers = {"X-Scope": '{"image": "CloudSilent"}'}
    started = time.monotonic()
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    elapsed = time.monotonic() - started
    assert_json_error(reply, 504, "CloudSilent", "image", "did not answer")
    assert RESPONSE_TIMEOUT - 0.1 <= elapsed < RESPONSE_TIMEOUT + 3


def test_upload_to_a_remote_that_never_answers_is_504(federation: Federation) -> None:
    # 3 MiB: the body streams (over 1 MiB); the remote reads nothing and answers nothing. The
    # router answers 504 once the response timeout runs from the end of what it could send.
    headers = {"X-Scope": '{"image": "CloudSilent"}', "Content-Length": str(3 << 20)}
    host, port = federation.frontends["CloudOne"]["image"].removeprefix("http://").split(":")
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    data = f"PUT /v2/images/x/file HTTP/1.1\r\nHost: {host}:{port}\r\n{head}\r\n".encode()
    reply = raw_exchange(host, int(port), data + b"x" * (3 << 20), timeout=30)
    assert reply.status == 504
    assert "CloudSilent" in reply.error_message()


@pytest.fixture
def full_listener(federation: Federation) -> Iterator[None]:
    """CloudFull's frontend: a listening socket whose accept queue is full, so a new connect
    waits for the TCP handshake until it gives up (the kernel drops the SYNs)."""
    host, port = federation.full_address
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        filler.setblocking(False)
        filler.connect_ex((host, port))
        fillers.append(filler)
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.settimeout(0.3)
    try:
        probe.connect((host, port))
    except TimeoutError:
        pass
    else:
        pytest.skip("this kernel completes connections beyond the accept queue")
    finally:
        probe.close()
    try:
        yield
    finally:
        for sock in [*fillers, server]:
            sock.close()


def test_connect_that_hangs_is_504(federation: Federation, full_listener: None) -> None:
    headers = {"X-Scope": '{"image": "CloudFull"}'}
    started = time.monotonic()
    reply = request("GET", federation.url("CloudOne", "image", "/v2/images"), headers=headers)
    elapsed = time.monotonic() - started
    assert_json_error(reply, 504, "CloudFull", "image", "connecting")
    assert CONNECT_TIMEOUT - 0.1 <= elapsed < CONNECT_TIMEOUT + 3


def test_refusing_a_large_upload_answers_before_the_body(federation: Federation) -> None:
    # A bad scope on a 100 MB upload: the router answers at once (and closes), without
    # waiting for, buffering or forwarding the body. Only the first 64 KiB are sent here.
    host, port = federation.frontends["CloudOne"]["image"].removeprefix("http://").split(":")
    for framing in (f"Content-Length: {100 << 20}", "Transfer-Encoding: chunked"):
        data = (
            f"PUT /v2/images/x/file HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f'X-Scope: {{"image": "Nowhere"}}\r\nExpect: 100-continue\r\n{framing}\r\n\r\n'
        ).encode()
        body = b"x" * 65536 if "Length" in framing else b"10000\r\n" + b"x" * 65536 + b"\r\n"
        started = time.monotonic()
        reply = raw_exchange(host, int(port), data + body, timeout=10)
        assert time.monotonic() - started < 5
        assert reply.status == 400
        assert "unknown cloud 'Nowhere'" in reply.error_message()
    # Nothing reached a backend, and the router still routes.
    assert request("GET", federation.url("CloudOne", "image", "/after-refusal")).status == 200


def test_router_survives_garbage(federation: Federation) -> None:
    host, port = federation.frontends["CloudOne"]["image"].removeprefix("http://").split(":")
    for data in (b"HELLO THERE\r\n\r\n", b"\x16\x03\x01\x00\x05hello", b"\x00" * 100):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # whatever the router makes of it, it must finish
            while sock.recv(65536):
                pass
    bad = raw_exchange(host, int(port), b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n")
    assert bad.status == 400
    assert bad.headers["content-type"] == "application/json"
    assert json.loads(bad.body)["error"]["code"] == 400
    assert request("GET", federation.url("CloudOne", "image", "/still-up")).status == 200


@pytest.fixture
def looping_routers(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two routers whose configs disagree: each believes LoopTwo lives behind the other.

    Router A (LoopOne, 127.0.0.7) sends LoopTwo's image requests to 127.0.0.8; router B,
    started as LoopThree on 127.0.0.8, has LoopTwo at 127.0.0.7, so it sends them back.
    """
    port_a, port_b = free_port("127.0.0.7"), free_port("127.0.0.8")
    image = lambda host, port: cloud_entry(host, {"image": (port, "", f"http://127.0.1.9:{port}")})  # noqa: E731
    config_a = write_config(
        tmp_path / "a.yaml",
        {"LoopOne": image("127.0.0.7", port_a), "LoopTwo": image("127.0.0.8", port_b)},
        hop_limit=3,
    )
    config_b = write_config(
        tmp_path / "b.yaml",
        {
            "LoopOne": image("127.0.0.9", free_port("127.0.0.9")),
            "LoopTwo": image("127.0.0.7", port_a),
            "LoopThree": image("127.0.0.8", port_b),
        },
        hop_limit=3,
    )
    routers = start_all(
        [
            Router("LoopOne", config_a, tmp_path / "a.log", [("127.0.0.7", port_a)]),
            Router("LoopThree", config_b, tmp_path / "b.log", [("127.0.0.8", port_b)]),
        ]
    )
    try:
        yield {"url": f"http://127.0.0.7:{port_a}"}
    finally:
        assert set(stop_all(routers).values()) == {0}


def test_routers_pointing_at_each_other_answer_508(looping_routers: dict[str, str]) -> None:
    headers = {"X-Scope": '{"image": "LoopTwo"}'}
    reply = request("GET", looping_routers["url"] + "/v2/images", headers=headers)
    assert_json_error(reply, 508, "routing loop", "hop_limit 3")


def test_router_that_cannot_listen_exits_with_1(federation: Federation, tmp_path: Path) -> None:
    # The addresses of CloudOne are taken by its running router.
    second = Router("CloudOne", federation.config, tmp_path / "second.log", []).start()
    assert second.proc is not None
    assert second.proc.wait(timeout=30) == 1
    assert "could not start the listeners of CloudOne" in second.log_text()
    assert "address already in use" in second.log_text()


@pytest.fixture
def backend_loop(tmp_path: Path) -> Iterator[tuple[str, list[Router]]]:
    """Two routers, each with a config that is fine on its own, whose image backends are each
    other's frontends (an operator's copy-paste): requests bounce between them."""
    port_a, port_b = free_port("127.0.0.26"), free_port("127.0.0.27")
    config_a = write_config(
        tmp_path / "a.yaml",
        {
            "LoopA": cloud_entry(
                "127.0.0.26", {"image": (port_a, "", f"http://127.0.0.27:{port_b}")}
            )
        },
        hop_limit=4,
    )
    config_b = write_config(
        tmp_path / "b.yaml",
        {
            "LoopB": cloud_entry(
                "127.0.0.27", {"image": (port_b, "", f"http://127.0.0.26:{port_a}")}
            )
        },
        hop_limit=4,
    )
    routers = start_all(
        [
            Router("LoopA", config_a, tmp_path / "a.log", [("127.0.0.26", port_a)]),
            Router("LoopB", config_b, tmp_path / "b.log", [("127.0.0.27", port_b)]),
        ]
    )
    try:
        yield f"http://127.0.0.26:{port_a}", routers
    finally:
        assert set(stop_all(routers).values()) == {0}


def test_a_backend_loop_stops_with_508_within_hop_limit(
    backend_loop: tuple[str, list[Router]],
) -> None:
    url, routers = backend_loop
    reply = request("GET", url + "/v2/images", headers={"X-Auth-Token": "tok"})
    assert_json_error(reply, 508, "routing loop", "hop_limit 4", "no backend is a router")
    # Bounded: hop_limit passes, then the refusal; every router logged its part once.
    entries = [e for r in routers for e in r.wait_for_access(path="/v2/images")]
    assert len(entries) == 5, entries
    assert len({e["request_id"] for e in entries}) == 1  # one request id along the loop


def test_answers_mitmproxy_makes_itself_are_json_and_logged(
    federation: Federation, one: Router
) -> None:
    """A forward-proxy request in origin form without a host is refused before any hook runs."""
    host, port = federation.proxies["CloudOne"].removeprefix("http://").split(":")
    reply = raw_exchange(host, int(port), b"GET /no-host HTTP/1.1\r\n\r\n")
    message = assert_json_error(reply, 400, "no host header")
    deadline = time.monotonic() + 10
    while not any(e.get("reason", "").startswith(message[:30]) for e in one.access()):
        assert time.monotonic() < deadline, one.log_text()[-2000:]
        time.sleep(0.1)
