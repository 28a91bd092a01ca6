"""Hostile input, byte for byte, against real router processes in front of recording backends.

Each of issue 20's findings is a test here: raw bytes on a socket, then the answer, the access
log line (exactly one per request), and what the backend received (:class:`RecordingBackend`
records every byte). The rules are in docs/router/http.md.

    CloudOne  router 127.0.0.60  image :P  forward proxy :P     backend 127.0.1.60 (recording)
    CloudTwo  router 127.0.0.61  image :P                        backend 127.0.1.61 (recording)
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .backends import Received, RecordingBackend
from .routers import Router, cloud_entry, free_port, start_all, stop_all, write_config

ONE, TWO = "127.0.0.60", "127.0.0.61"
BODY_TIMEOUT = 1.0
SCOPE_TWO = b'X-Scope: {"image": "CloudTwo"}\r\n'
EARLY = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 2\r\n\r\nno"
STALLED = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc"  # then nothing more
RESPONSE_TIMEOUT = 3.0


def _early(received: Received) -> bytes | None:
    """The backend answers these before reading the body (as glance does for some errors),
    or begins an answer it never ends."""
    if b"/early" in received.target:
        return EARLY
    return STALLED if b"/stalled-answer" in received.target else None


@dataclass
class Hostile:
    one: Router
    two: Router
    backend_one: RecordingBackend
    backend_two: RecordingBackend
    image: tuple[str, int]  # CloudOne's image frontend
    proxy: tuple[str, int]  # CloudOne's forward proxy

    @property
    def front(self) -> bytes:
        """The Host a client of CloudOne's image frontend sends."""
        return f"{self.image[0]}:{self.image[1]}".encode()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    tmp = tmp_path_factory.mktemp("hostile")
    backend_one = RecordingBackend("127.0.1.60", "CloudOne-image", early=_early).start()
    backend_two = RecordingBackend("127.0.1.61", "CloudTwo-image").start()
    image_one, image_two, proxy = free_port(ONE), free_port(TWO), free_port(ONE)
    config = write_config(
        tmp / "federation.yaml",
        {
            "CloudOne": cloud_entry(
                ONE, {"image": (image_one, "", backend_one.url)}, proxy_port=proxy
            ),
            "CloudTwo": cloud_entry(TWO, {"image": (image_two, "", backend_two.url)}),
        },
        connect_timeout=1.0,
        response_timeout=RESPONSE_TIMEOUT,
        limits={"body_timeout": BODY_TIMEOUT, "header_timeout": 3.0},
        breaker={"failures": 1000},
    )
    one = Router("CloudOne", config, tmp / "one.log", [(ONE, image_one), (ONE, proxy)])
    two = Router("CloudTwo", config, tmp / "two.log", [(TWO, image_two)])
    start_all([one, two])
    try:
        yield Hostile(one, two, backend_one, backend_two, (ONE, image_one), (ONE, proxy))
    finally:
        codes = stop_all([one, two])
        backend_one.stop()
        backend_two.stop()
    # No connection's handling ever ended in a traceback or an unlogged error.
    for router in (one, two):
        log = router.log_text()
        assert "Traceback" not in log and '"level":"ERROR"' not in log, log[-3000:]
    assert set(codes.values()) == {0}


def talk(address: tuple[str, int], *pieces: bytes, wait: float = 6.0) -> bytes:
    """Send `pieces` (a pause between them), then read until the router closes the
    connection or nothing comes for `wait` seconds."""
    return _talk(address, pieces, wait)[0]


def closed_within(address: tuple[str, int], data: bytes, wait: float) -> bytes:
    """Send `data`; what the router answered before it closed the connection, which it must
    do within `wait` seconds."""
    got, closed = _talk(address, (data,), wait)
    assert closed, f"the router did not close the connection within {wait}s: {got[:300]!r}"
    return got


def _talk(address: tuple[str, int], pieces: tuple[bytes, ...], wait: float) -> tuple[bytes, bool]:
    got = b""
    with socket.create_connection(address, timeout=wait) as sock:
        for index, piece in enumerate(pieces):
            if index:
                time.sleep(0.2)
            try:
                sock.sendall(piece)
            except OSError:
                break  # refused and closed: what it answered is read below
        sock.settimeout(wait)
        closed = True
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            closed = False
        except OSError:
            pass
    return got, closed


def statuses(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^HTTP/1\.1 (\d{3}) ", data, re.MULTILINE)]


def message(data: bytes) -> str:
    body = json.loads(data.partition(b"\r\n\r\n")[2])
    return str(body["error"]["message"])


def received(backend: RecordingBackend, path: bytes) -> list[Received]:
    return [r for r in backend.requests if path in r.target]


def arrived(backend: RecordingBackend, path: bytes, within: float = 5.0) -> list[Received]:
    """What reached the backend for `path`, once something has: a message cut short is
    recorded when the backend sees its connection end, which may come a little after the
    client's answer."""
    deadline = time.monotonic() + within
    while not (seen := received(backend, path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen


def logged_once(router: Router, path: str, status: int) -> dict[str, object]:
    """The one access line of the request to `path`: it comes, and no second one."""
    [entry] = router.wait_for_access(path=path, status=status)
    time.sleep(0.2)
    assert len([e for e in router.access() if e.get("path") == path]) == 1, router.access()
    return entry


# --------------------------------------------------------------------- 1, 2. trailers


def test_trailer_fields_never_become_request_headers(hostile: Hostile) -> None:
    """Finding 1: trailer fields were appended to the head, after routing and the log used
    it: a second Host, X-Injected and a scoped subject token reached the backend."""
    for scope, backend, path in (
        (b"", hostile.backend_one, b"/v2/images/trailers"),
        (SCOPE_TWO, hostile.backend_two, b"/v2/images/trailers-hop"),
    ):
        got = talk(
            hostile.image,
            b"POST %s HTTP/1.1\r\nHost: %s\r\n%sTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n3\r\nabc\r\n0\r\nHost: evil.example\r\n"
            b'X-Injected: 1\r\nX-Subject-Token: T!SCOPE!{"identity":"CloudTwo"}\r\n\r\n'
            % (path, hostile.front, scope),
        )
        assert statuses(got) == [200], got
        [seen] = received(backend, path)
        assert seen.complete and bytes(seen.body) == b"abc" and seen.trailers == []
        assert seen.values(b"host") == [hostile.front]
        assert not seen.values(b"x-injected") and not seen.values(b"x-subject-token")
        assert b"evil.example" not in backend.raw and b"X-Injected" not in backend.raw
        logged_once(hostile.one, path.decode(), 200)


def test_an_endless_trailer_field_is_refused_at_the_head_limit(hostile: Hostile) -> None:
    """Finding 2: one trailer field had no size limit (16 MiB cost 0.27 s of worker CPU, the
    cost quadratic in its size, RSS +200 MiB). It is refused at max_header_bytes (431)."""
    path = b"/v2/images/endless-trailer"
    head = (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\nX-Big: " % (path, hostile.front)
    )
    got = talk(hostile.image, head, *[b"a" * (1 << 20)] * 16, wait=4.0)
    assert statuses(got) == [431], got[:300]
    assert "trailer fields are larger than 65536 bytes" in message(got)
    # The head and the body went on as they came; the request never ended upstream.
    [seen] = arrived(hostile.backend_one, path)
    assert not seen.complete and bytes(seen.body) == b"abc" and seen.trailers == []
    logged_once(hostile.one, path.decode(), 431)


def test_the_forward_proxy_answers_a_request_with_trailers(hostile: Hostile) -> None:
    """Finding 5: mitmproxy raised NotImplementedError on any trailer ("mitmproxy has
    crashed!") and the connection hung unanswered. The trailers are dropped."""
    path = b"/v2/images/forward-trailers"
    backend = f"{hostile.backend_one.host}:{hostile.backend_one.port}".encode()
    got = talk(
        hostile.proxy,
        b"POST http://%s%s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n3\r\nabc\r\n0\r\nX-Injected: 1\r\n\r\n"
        % (backend, path, backend),
    )
    assert statuses(got) == [200], got
    [seen] = received(hostile.backend_one, path)
    assert seen.complete and bytes(seen.body) == b"abc" and seen.trailers == []
    assert not seen.values(b"x-injected")
    logged_once(hostile.one, f"http://{backend.decode()}{path.decode()}", 200)
    assert "crashed" not in hostile.one.log_text()


# --------------------------------------------------------------------- 3, 6. CONNECT, Upgrade


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (b"CONNECT 81/admin HTTP/1.1", 405),  # was sent as CONNECT /admin to port 8081
        (b"CONNECT evil.example:443 HTTP/1.1", 405),
        (b"CONNECT 127.0.1.60:99999 HTTP/1.1", 405),  # was an OverflowError
    ],
)
def test_connect_on_a_frontend_is_refused_and_never_forwarded(
    hostile: Hostile, line: bytes, status: int
) -> None:
    """Finding 3 (and 6: CONNECT escaped the error handling as HttpParserUpgrade)."""
    before = hostile.backend_one.connections
    got = talk(hostile.image, line + b"\r\nHost: %s\r\n\r\n" % hostile.front)
    assert statuses(got) == [status], got
    assert b"\r\nAllow: GET, HEAD" in got and "not tunnels" in message(got)
    assert hostile.backend_one.connections == before
    path = line.split(b" ")[1].decode()
    logged_once(hostile.one, path.partition("?")[0], status)


def test_an_upgrade_is_refused_and_never_forwarded(hostile: Hostile) -> None:
    """Finding 6: the upgrade escaped the error handling, the client was closed, yet the
    request queued behind it was forwarded."""
    path = b"/v2/images/upgrade"
    got = talk(
        hostile.image,
        b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        b"GET /v2/images/after-upgrade HTTP/1.1\r\nHost: %s\r\n\r\n"
        % (path, hostile.front, hostile.front),
    )
    assert statuses(got) == [400] and "does not switch protocols" in message(got)
    assert not received(hostile.backend_one, b"upgrade")
    logged_once(hostile.one, path.decode(), 400)


# --------------------------------------------------------------------- 4. bodies that stop


def test_a_body_that_stops_arriving_is_answered_408_and_its_upstream_closed(
    hostile: Hostile,
) -> None:
    """Finding 4: Content-Length 10, 5 bytes, silence: never answered nor closed."""
    path = b"/v2/images/stalled"
    got = closed_within(
        hostile.image,
        b"PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 10\r\n\r\n12345" % (path, hostile.front),
        BODY_TIMEOUT + 5,
    )
    assert statuses(got) == [408] and "body_timeout" in message(got)
    assert b"Connection: close" in got
    [seen] = arrived(hostile.backend_one, path)  # the upstream's connection was closed
    assert not seen.complete and bytes(seen.body) == b"12345"
    logged_once(hostile.one, path.decode(), 408)


def test_an_upstream_that_answers_before_the_body_is_complete_is_relayed(
    hostile: Hostile,
) -> None:
    """An upstream may answer before it read the body (glance's 500 after 4 s): its answer
    is relayed at once, then the client's connection closes (the rest is not read)."""
    path = b"/v2/images/early"
    got = talk(
        hostile.image,
        b"PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000000\r\n\r\n12345"
        % (path, hostile.front),
        wait=BODY_TIMEOUT + 5,
    )
    assert statuses(got) == [413] and got.endswith(b"\r\n\r\nno"), got
    assert b"Connection: close" in got
    logged_once(hostile.one, path.decode(), 413)


def test_an_answer_that_stops_in_its_body_is_cut_off(hostile: Hostile) -> None:
    """An upstream that sends a head and part of its body, then nothing: after the response
    timeout of silence the client's connection is cut (a truncated body is never taken for a
    whole one), and the line is logged with the upstream's status and the error."""
    path = b"/v2/images/stalled-answer"
    got = closed_within(
        hostile.image,
        b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, hostile.front),
        RESPONSE_TIMEOUT + 5,
    )
    assert statuses(got) == [200] and got.endswith(b"\r\n\r\nabc"), got
    entry = logged_once(hostile.one, path.decode(), 200)
    assert entry["error"] == "response timeout"


def test_the_forward_proxy_answers_a_body_that_stops_with_408(hostile: Hostile) -> None:
    path = b"/v2/images/forward-stalled"
    backend = f"{hostile.backend_one.host}:{hostile.backend_one.port}".encode()
    got = talk(
        hostile.proxy,
        b"PUT http://%s%s HTTP/1.1\r\nHost: %s\r\nContent-Length: 10\r\n\r\n12345"
        % (backend, path, backend),
        wait=BODY_TIMEOUT + 5,
    )
    assert statuses(got) == [408] and "body_timeout" in message(got)
    logged_once(hostile.one, f"http://{backend.decode()}{path.decode()}", 408)


# --------------------------------------------------------------------- 7. targets


def test_an_absolute_target_naming_another_authority_is_421(hostile: Hostile) -> None:
    """Finding 7: GET http://evil.example:80/x was a ValueError traceback, no answer, and a
    garbage access-log target (and forwarded with the client's authority by mitmproxy)."""
    path = b"/v2/images/absolute-evil"
    got = talk(
        hostile.image,
        b"GET http://evil.example:80%s HTTP/1.1\r\nHost: evil.example\r\n\r\n" % path,
    )
    assert statuses(got) == [421] and "send the path, not a URL" in message(got)
    assert b"evil.example" not in hostile.backend_one.raw
    logged_once(hostile.one, path.decode(), 421)


def test_an_absolute_target_naming_the_frontend_is_reduced_to_its_path(
    hostile: Hostile,
) -> None:
    path = b"/v2/images/absolute-own"
    got = talk(
        hostile.image,
        b"GET http://%s%s?x=1 HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        % (hostile.front, path),
    )
    assert statuses(got) == [200], got
    [seen] = received(hostile.backend_one, path)
    assert seen.target == path + b"?x=1" and seen.values(b"host") == [hostile.front]
    assert b"evil.example" not in hostile.backend_one.raw
    logged_once(hostile.one, path.decode(), 200)


@pytest.mark.parametrize("where", ["frontend", "forward proxy"])
def test_an_asterisk_target_is_refused(hostile: Hostile, where: str) -> None:
    """Finding 7: OPTIONS * was a 500 and a traceback on mitmproxy."""
    address = hostile.image if where == "frontend" else hostile.proxy
    got = talk(address, b"OPTIONS * HTTP/1.1\r\nHost: %s\r\n\r\n" % hostile.front)
    assert statuses(got) == [400] and "asterisk-form" in message(got)
    logged_once(hostile.one, "*", 400)


# --------------------------------------------------------------------- 8, 9, 10. fields


@pytest.mark.parametrize(
    ("name", "fields", "status", "fragment"),
    [
        # Finding 8: a Connection value outside latin-1 was a UnicodeEncodeError, no answer.
        ("connection", b"Connection: \xc3\xa9\xe2\x82\xac\r\n", 400, "list of tokens"),
        # Finding 9: an unknown coding without Content-Length was forwarded without its body.
        ("te-blegh", b"Transfer-Encoding: blegh\r\n", 501, "'blegh' is not supported"),
        ("te-gzip", b"Transfer-Encoding: gzip, chunked\r\n", 501, "only 'chunked'"),
        # Finding 10: a second Host was forwarded (HAProxy: 400; RFC 9112 3.2: must be 400).
        ("two-hosts", b"Host: evil.example\r\n", 400, "more than one Host"),
    ],
)
def test_fields_the_router_cannot_honour_are_refused_before_any_backend(
    hostile: Hostile, name: str, fields: bytes, status: int, fragment: str
) -> None:
    path = f"/v2/images/{name}".encode()
    before = hostile.backend_one.connections
    got = talk(
        hostile.image,
        b"POST %s HTTP/1.1\r\nHost: %s\r\n%s\r\n3\r\nabc\r\n0\r\n\r\n"
        % (path, hostile.front, fields),
    )
    assert statuses(got) == [status] and fragment in message(got), got
    assert hostile.backend_one.connections == before and not received(hostile.backend_one, path)
    logged_once(hostile.one, path.decode(), status)


def test_an_http11_request_without_host_and_an_invalid_host_are_400(hostile: Hostile) -> None:
    for path, host, fragment in (
        (b"/v2/images/no-host", b"", "must have a Host"),
        (b"/v2/images/bad-host", b"Host: a b/c\r\n", "not a valid authority"),
    ):
        got = talk(hostile.image, b"GET %s HTTP/1.1\r\n%s\r\n" % (path, host))
        assert statuses(got) == [400] and fragment in message(got), got
        logged_once(hostile.one, path.decode(), 400)
    assert not received(hostile.backend_one, b"-host")


def test_a_refused_connect_on_the_forward_proxy_is_logged(hostile: Hostile) -> None:
    """Finding 10: refused forward-proxy CONNECTs were missing from the access log."""
    got = talk(hostile.proxy, b"CONNECT 127.0.1.60:443 HTTP/1.1\r\nHost: 127.0.1.60:443\r\n\r\n")
    assert statuses(got) == [403] and "CONNECT tunnels are not supported" in message(got)
    logged_once(hostile.one, "127.0.1.60:443", 403)


def test_every_refusal_is_one_json_answer_and_the_router_serves_on(hostile: Hostile) -> None:
    """After all of the above, a plain request is served (no worker died) and answered."""
    got = talk(
        hostile.image,
        b"GET /v2/images/still-fine HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
        % hostile.front,
    )
    assert statuses(got) == [200]
    assert json.loads(got.partition(b"\r\n\r\n")[2])["backend"] == "CloudOne-image"


def test_log_lines_never_carry_what_a_hostile_client_sent_as_a_token(
    hostile: Hostile, tmp_path: Path
) -> None:
    talk(
        hostile.image,
        b"GET /v2/images/secret HTTP/1.1\r\nHost: %s\r\nX-Auth-Token: s3cr3t-t0ken\r\n"
        b"Connection: close\r\n\r\n" % hostile.front,
    )
    logged_once(hostile.one, "/v2/images/secret", 200)
    assert "s3cr3t-t0ken" not in hostile.one.log_text()


@pytest.mark.parametrize(
    ("line", "status", "fragment"),
    [
        (b"GET /v2/images/fragment#x HTTP/1.1", 400, "no fragment"),
        (b"GET /v2/images/no-version", 505, "HTTP/0.9 is not supported"),  # HTTP/0.9-style
    ],
)
def test_targets_and_versions_the_router_does_not_serve(
    hostile: Hostile, line: bytes, status: int, fragment: str
) -> None:
    """Found by the fuzz harness (HAProxy refuses both; llhttp passed them on)."""
    got = talk(hostile.image, line + b"\r\nHost: %s\r\n\r\n" % hostile.front)
    assert statuses(got) == [status] and fragment in message(got), got
    assert not received(hostile.backend_one, line.split(b" ")[1].partition(b"#")[0])


def test_the_forward_proxy_refuses_a_bare_lf_and_adds_a_missing_host(hostile: Hostile) -> None:
    """Found by the fuzz harness: mitmproxy ends a head at a bare LF (llhttp refuses it), and
    forwards an absolute-form request without Host as it came."""
    backend = f"{hostile.backend_one.host}:{hostile.backend_one.port}".encode()
    path = b"/v2/images/forward-bare-lf"
    got = talk(
        hostile.proxy, b"GET http://%s%s HTTP/1.1\nHost: %s\r\n\r\n" % (backend, path, backend)
    )
    assert statuses(got) == [400] and "bare LF" in message(got)
    path = b"/v2/images/forward-no-host"
    got = talk(
        hostile.proxy, b"GET http://%s%s HTTP/1.1\r\nConnection: close\r\n\r\n" % (backend, path)
    )
    assert statuses(got) == [200], got
    [seen] = received(hostile.backend_one, path)
    assert seen.values(b"host") == [backend]
