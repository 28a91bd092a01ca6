"""Helpers for the integration tests: router processes, federation configs, an HTTP client.

Routers are real ``scoperouter serve --config F --cloud NAME`` processes on loopback addresses;
they are stopped by PID (SIGTERM, then SIGKILL) and their log is kept in a file for assertions
and for failure reports.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

START_TIMEOUT = 20.0


def free_port(host: str) -> int:
    """A port that is free on `host` right now (loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def scoperouter_command() -> list[str]:
    script = Path(sys.executable).with_name("scoperouter")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "scoperouter.cli"]


def write_config(path: Path, clouds: Mapping[str, Any], **settings: Any) -> Path:
    doc: dict[str, Any] = {"version": 1, "clouds": dict(clouds)}
    doc["settings"] = settings
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cloud_entry(
    host: str,
    services: Mapping[str, tuple[int, str, str]],
    proxy_port: int | None = None,
    scheme: str = "http",
    tls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A cloud whose router listens on `host`; services: type -> (frontend port, path, backend)."""
    frontends = []
    for port, _, _ in services.values():
        entry: dict[str, Any] = {"url": f"{scheme}://{host}:{port}"}
        if tls:
            entry["tls"] = dict(tls)
        frontends.append(entry)
    body: dict[str, Any] = {
        "frontends": frontends,
        "services": {
            service: {"public": {"url": f"{scheme}://{host}:{port}{path}", "backend": backend}}
            for service, (port, path, backend) in services.items()
        },
    }
    if proxy_port is not None:
        body["proxy"] = {"listen": f"{host}:{proxy_port}"}
    return body


@dataclass
class Router:
    cloud: str
    config: Path
    log: Path
    addresses: list[tuple[str, int]]
    watch: bool = False
    workers: int = 1
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _terminated: bool = field(default=False, repr=False)

    def start(self) -> Router:
        self._terminated = False  # a router stopped and started again is SIGTERMed again
        command = [*scoperouter_command(), "serve", "--config", str(self.config)]
        command += ["--cloud", self.cloud, "--workers", str(self.workers)]
        command += (["--watch"] if self.watch else []) + self.extra_args
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until every worker listens (the supervisor says so, and every listener accepts
        connections); fails with the log if the router died."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        pending = list(self.addresses)
        ready = f"router of {self.cloud}: {self.workers} worker"
        while pending or ready not in self.log_text():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"router {self.cloud} exited with {self.proc.returncode}:\n{self.log_text()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"router {self.cloud} not ready ({pending}):\n{self.log_text()}"
                )
            if not pending:
                time.sleep(0.05)
                continue
            try:
                socket.create_connection(pending[0], timeout=0.5).close()
            except OSError:
                time.sleep(0.05)
            else:
                pending.pop(0)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM this router (by PID), SIGKILL if it does not exit; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def terminate(self) -> None:
        """SIGTERM, once."""
        assert self.proc is not None
        if not self._terminated and self.proc.poll() is None:
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def signal(self, sig: int) -> None:
        assert self.proc is not None and self.proc.poll() is None, "router is not running"
        self.proc.send_signal(sig)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 10.0) -> str:
        """Until `text` appears `count` times in the log; returns the log."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.log_text()
            if log.count(text) >= count:
                return log
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not in the log of {self.cloud}:\n{log}")
            time.sleep(0.05)

    def access(self) -> list[dict[str, Any]]:
        """The access log entries (JSON lines of the logger scoperouter.access) so far."""
        entries = []
        for line in self.log_text().splitlines():
            if line.startswith("{") and '"scoperouter.access"' in line:
                entries.append(json.loads(line))
        return entries

    def wait_for_access(
        self, count: int = 1, timeout: float = 10.0, **match: Any
    ) -> list[dict[str, Any]]:
        """Until `count` access entries have every field of `match`; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.access() if all(e.get(k) == v for k, v in match.items())]
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no access entry {match} of {self.cloud}:\n{self.log_text()}")
            time.sleep(0.05)


def stop_all(routers: Iterable[Router], timeout: float = 10.0) -> dict[str, int | None]:
    """SIGTERM all routers at once, then collect their exit codes (SIGKILL stragglers)."""
    routers = list(routers)
    for router in routers:
        if router.proc is not None:
            router.terminate()
    return {router.cloud: router.stop(timeout) for router in routers}


def start_all(routers: Iterable[Router]) -> list[Router]:
    """Start routers in parallel and wait until all listen (stopping them all on failure)."""
    started = [router.start() for router in routers]
    try:
        for router in started:
            router.wait_ready()
    except BaseException:
        stop_all(started)
        raise
    return started


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    fields: tuple[tuple[str, str], ...] = ()  # the head's fields as sent, repeated ones too

    def json(self) -> Any:
        return json.loads(self.body)

    def error_message(self) -> str:
        data = self.json()
        assert set(data) == {"error"}, data
        assert data["error"]["code"] == self.status, data
        return data["error"]["message"]


def request(
    method: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    body: bytes | Iterable[bytes] | None = None,
    proxy: str | None = None,
    timeout: float = 15.0,
    context: Any = None,
) -> Reply:
    """One HTTP request (no environment proxies); through `proxy` in absolute form if given."""
    parts = urlsplit(url)
    target = url if proxy else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _connection(proxy or url, timeout, context)
    try:
        conn.request(method, target, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        data = response.read()
        fields = tuple((k.lower(), v) for k, v in response.getheaders())
        return Reply(response.status, dict(fields), data, fields)
    finally:
        conn.close()


def download(url: str, headers: Mapping[str, str], timeout: float = 60.0) -> tuple[int, int, str]:
    """GET streaming the body: (status, length, sha256)."""
    parts = urlsplit(url)
    conn = _connection(url, timeout, None)
    try:
        conn.request("GET", parts.path, headers=dict(headers))
        response = conn.getresponse()
        digest, length = hashlib.sha256(), 0
        while chunk := response.read(256 * 1024):
            digest.update(chunk)
            length += len(chunk)
        return response.status, length, digest.hexdigest()
    finally:
        conn.close()


def _connection(url: str, timeout: float, context: Any) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    assert parts.hostname is not None
    if parts.scheme == "https":
        return http.client.HTTPSConnection(
            parts.hostname, parts.port or 443, timeout=timeout, context=context
        )
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


def raw_exchange(host: str, port: int, data: bytes, timeout: float = 10.0) -> Reply:
    """Send `data` as is (it may be a partial request), then read one response."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the router may answer and close before the end
            sock.sendall(data)
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        body = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)


def sample_rss(
    pids: Iterable[int], stop: Any, into: dict[int, int], interval: float = 0.02
) -> None:
    """Record the peak RSS of each pid until `stop` (a threading.Event) is set."""
    import psutil

    procs = [psutil.Process(pid) for pid in pids]
    while True:
        for proc in procs:
            rss = proc.memory_info().rss
            into[proc.pid] = max(into.get(proc.pid, 0), rss)
        if stop.wait(interval):
            return


def token_headers(token: str, scope: str | None) -> dict[str, str]:
    value = token if scope is None else f"{token}!SCOPE!{scope}"
    return {"X-Auth-Token": value}


def metric(status_url: str, prefix: str) -> float:
    """The sum of the samples whose line starts with `prefix` (``name{labels}``, or ``name ``
    for one without labels) in the router's ``/metrics`` (`status_url`: http://host:port)."""
    text = request("GET", status_url + "/metrics").body.decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def wait_for_metric(status_url: str, prefix: str, expected: float, timeout: float = 10.0) -> float:
    """:func:`metric` once it is `expected` (or at the deadline: the caller asserts). Workers
    hand their counts to /metrics once per tick (0.1 s), not per request."""
    deadline = time.monotonic() + timeout
    while True:
        value = metric(status_url, prefix)
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def settled_metric(status_url: str, prefix: str, quiet: float = 0.3) -> float:
    """:func:`metric` once it stayed the same for `quiet` seconds (several ticks): what was
    answered before is in it (a figure to count from)."""
    value = metric(status_url, prefix)
    for _ in range(50):
        time.sleep(quiet)
        again = metric(status_url, prefix)
        if again == value:
            break
        value = again
    return value
