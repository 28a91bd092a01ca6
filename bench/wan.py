"""``python -m bench.wan``: two clouds 50 ms apart, routers against a direct connection, judged.

Run by hand, as root (network namespaces, TUN devices), from the repository root with the dev
venv::

    sudo .venv/bin/python -m bench.wan                      # ~3 minutes, table on stdout
    .venv/bin/python -m bench.wan --requests 50 --concurrency 1   # a quick look
    .venv/bin/python -m bench.wan --json wan.json
    .venv/bin/python -m bench.wan --clouds 10 --router-python-flags=-O   # merged lists, 10 clouds

**The link.** This kernel has no netem, so the delay is made in user space: the ``forward``
subcommand (run by the bench in the root namespace) opens two TUN devices, the bench moves one
into each of two network namespaces it creates (``srwan<pid>a``, ``srwan<pid>b``) and gives them
the two ends of a point-to-point link (10.250.0.1 <-> 10.250.0.2); every IP packet read from
one device is written to the other ``--delay-ms`` (25) later: 50 ms round trip. The forwarder
counts the TCP SYNs that cross from A to B: the *WAN handshakes*. Inside each namespace the
processes use its own loopback (127.x) for everything that does not cross the link.

**What it measures** (client in A; a new connection per request unless said, like the
``openstack`` CLI, one process per command; ``--requests`` per point at each
``--concurrency``):

* the floor: the bench's HTTP server in B, reached directly across the link, plain and TLS,
  with a new connection per request and on an open connection (one round trip: the floor a
  pooled router path can reach);
* the product: CloudOne's router in A (reverse mode, frontend 127.0.0.2 in A), the request
  scoped ``{"image": "CloudTwo"}``, CloudTwo's router in B (its frontend on 10.250.0.2, plain
  or TLS with a CA the bench makes, verified by CloudOne's router through ``ca_bundle``), then
  CloudTwo's backend (the same server, on B's loopback).

Per point: p50/p99 latency, WAN handshakes per request, ratios to the direct open connection
(the floor) and to the direct new connection.

**N clouds** (``--clouds N``; TLS between routers unless ``--between`` says otherwise):
CloudOne's router in A as above, and CloudTwo..CloudN each with its own router in B (on its
own address on B's end of the link: 10.250.0.2, .3, ...; A routes 10.250.0.0/24 to the link)
and its own backend on B's loopback (127.0.1.3, .4, ...; CloudOne's is 127.0.1.2 in A), each
backend answering its cloud's glance-style image list. CloudOne's router has a verified TLS
peer link to every other router (a warm pool to each). Besides the points above, the merged
list ``GET /v2/images`` scoped ``{"image": "CloudTwo & ... & CloudN"}`` and the same with
CloudOne, at each ``--concurrency`` after a warm-up; a merged answer is checked (every cloud's
images, in order) before and after the load. Under the table: the issue-21 target (p50 <= 60
ms at 10 clouds, 25 ms each way) as PASS/MISS (:mod:`bench.wan_clouds`).

**The targets** (:mod:`bench.wan_verdict`), printed under the table as PASS, MISS or
INCONCLUSIVE, over every run of ``--repeat N``: p50 <= 55 ms at 1 and at 20 clients through the
routers (TLS between them, a new client connection per request), 20 clients <= 1.05x the run's
one-round-trip floor, 0 WAN handshakes per request after the warm-up (and the merged list's with
``--clouds``). Only all-PASS exits 0; a target the run did not measure (``--concurrency 1``
alone, ``--between plain``, another ``--delay-ms``) is INCONCLUSIVE and exits 1.

Everything the bench starts is stopped by PID at the end, on an error and on Ctrl-C; the
namespaces are deleted, and the TUN devices vanish with the forwarder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from bench import wan_clouds, wan_verdict
from bench.procs import BenchError, Proc, Processes
from bench.report import as_dicts, exit_status, not_passed, targets_table
from bench.wan_clouds import A_ADDR, B_ADDR, PORTS, ROUTER_A

BACKEND_B = wan_clouds.backend_host(1)  # CloudTwo's backend, inside B
TOKEN = "gAAAAABm" + "x" * 175  # Fernet-sized; the routers do not validate tokens here
SCOPE = '{"image":"CloudTwo"}'

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def say(message: str) -> None:
    print(f"[wan] {message}", file=sys.stderr, flush=True)


# --- the link: two TUN devices and a forwarder that holds packets ---------------------------


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def is_syn(packet: bytes) -> bool:
    """An IPv4 TCP segment with SYN and without ACK: a new connection's first packet."""
    if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != 6:
        return False
    offset = (packet[0] & 0x0F) * 4 + 13
    return len(packet) > offset and packet[offset] & 0x12 == 0x02


def forward(names: tuple[str, str], delay: float) -> None:
    """The link: A's packets reach B `delay` seconds later and back; "count" on stdin prints
    the counters as one JSON line."""
    fds = (open_tun(names[0]), open_tun(names[1]))
    counters = {"syn_ab": 0, "syn_ba": 0, "packets_ab": 0, "packets_ba": 0}
    loop = asyncio.new_event_loop()

    def write(fd: int, packet: bytes) -> None:
        with contextlib.suppress(OSError):  # the namespace went away: the run is over
            os.write(fd, packet)

    def readable(index: int) -> None:
        src, dst = fds[index], fds[1 - index]
        way = "ab" if index == 0 else "ba"
        while True:
            try:
                packet = os.read(src, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            counters[f"packets_{way}"] += 1
            if is_syn(packet):
                counters[f"syn_{way}"] += 1
            loop.call_at(loop.time() + delay, write, dst, packet)

    def command() -> None:
        line = sys.stdin.readline()
        if not line:
            loop.stop()
            return
        print(json.dumps(counters), flush=True)

    loop.add_reader(fds[0], readable, 0)
    loop.add_reader(fds[1], readable, 1)
    loop.add_reader(sys.stdin.fileno(), command)
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    print("ready", flush=True)
    loop.run_forever()


# --- the server in B: direct floor (plain and TLS) and CloudTwo's backend -------------------


class _Server(asyncio.Protocol):
    """A minimal keep-alive HTTP/1.1 server for GETs: a small JSON body, like a tiny API."""

    def __init__(self, name: str, body: str | None = None) -> None:
        self.body = body or json.dumps(
            {"images": [{"id": "4b7ca3b4", "name": "cirros"}], "at": name}
        )
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            close = b"connection: close" in head.lower()
            body = self.body.encode()
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n".encode()
                + (b"Connection: close\r\n" if close else b"")
                + b"\r\n"
                + body
            )
            if close:
                self.transport.close()
                return


async def _serve(listeners: list[str], cert: str | None, key: str | None) -> None:
    loop = asyncio.get_running_loop()
    for spec in listeners:
        host, port, *flags = spec.split(":")
        context = None
        if "tls" in flags:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            assert cert and key
            context.load_cert_chain(cert, key)
        # glance=<cloud>: that cloud's image list (bench.wan --clouds), else a tiny body
        body = next(
            (json.dumps(wan_clouds.glance_list(f[7:])) for f in flags if f.startswith("glance=")),
            None,
        )
        await loop.create_server(
            lambda spec=spec, body=body: _Server(spec, body),
            host,
            int(port),
            ssl=context,
            backlog=512,
        )
    print("ready", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


# --- the client in A ------------------------------------------------------------------------


async def _load(
    url: str,
    concurrency: int,
    requests: int,
    new_connections: bool,
    cafile: str | None,
    headers: dict[str, str],
    keep_body: bool = False,
) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    context = ssl.create_default_context(cafile=cafile) if parts.scheme == "https" else None
    head = f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (head + ("Connection: close\r\n" if new_connections else "") + "\r\n").encode()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []
    left = [requests]
    last_body = [b""]

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(request)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        if keep_body:
            last_body[0] = body
        return int(status_line.split()[1])

    async def worker(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        while left[0] > 0:
            left[0] -= 1
            start = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port, ssl=context)
                status = await asyncio.wait_for(exchange(*conn), 30)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                errors.append(type(exc).__name__)
                conn = None
                continue
            latencies.append((time.perf_counter() - start) * 1000)
            statuses[status] = statuses.get(status, 0) + 1
            if new_connections:
                conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    # An open connection's point starts with its connections open (the floor is one round trip).
    opened = (
        [None] * concurrency
        if new_connections
        else await asyncio.gather(
            *(asyncio.open_connection(host, port, ssl=context) for _ in range(concurrency))
        )
    )
    await asyncio.gather(*(worker(conn) for conn in opened))
    latencies.sort()
    result = {
        "requests": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "statuses": statuses,
        "p50_ms": _percentile(latencies, 0.50),
        "p99_ms": _percentile(latencies, 0.99),
        "mean_ms": statistics.fmean(latencies) if latencies else None,
    }
    if keep_body:  # the last answer's body (the sanity check of a merged list)
        result["body"] = last_body[0].decode("utf-8", "replace")
    return result


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


# --- the orchestration ----------------------------------------------------------------------


@dataclass
class Point:
    path: str
    connection: str  # "new per request" or "open"
    concurrency: int
    requests: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    wan_handshakes_per_request: float
    statuses: dict[int, int]
    router_cpu_us: list[float] | None = None  # CPU per request of each router (all processes)


class Wan:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.procs = Processes(workdir)
        tag = str(os.getpid())
        self.ns = (f"srwan{tag}a", f"srwan{tag}b")
        self.tuns = (f"srwa{tag}", f"srwb{tag}")
        self.link: Proc | None = None
        self.certs: dict[str, Path] | None = None  # cloud -> certificate (its key beside it)
        self.ca: Path | None = None
        self.notes: list[str] = []
        self.running_routers: list[Proc] = []  # their CPU time is measured per point
        # --clouds N: CloudOne in A, CloudTwo..CloudN in B, merged lists measured too
        self.names = wan_clouds.cloud_names(args.clouds or 2)
        self.merged_checks: list[dict[str, Any]] = []
        self.timelines: list[dict[str, Any]] = []  # from the access lines, when logged

    # namespaces and the link
    def ip(self, *argv: str, ns: str | None = None) -> None:
        command = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *argv]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise BenchError(f"{' '.join(command)}: {done.stderr.strip()}")

    def setup_link(self) -> None:
        say(f"link: {self.tuns[0]} <-> {self.tuns[1]}, {self.args.delay_ms} ms each way")
        log = self.workdir / "link.log"
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.wan",
                "forward",
                *self.tuns,
                "--delay-ms",
                str(self.args.delay_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(log, "wb"),  # noqa: SIM115 (closed with the process)
            text=True,
            env=_env(),
            start_new_session=True,
        )
        self.link = Proc("link", popen, log)
        self.procs.procs.append(self.link)
        assert popen.stdout is not None
        if popen.stdout.readline().strip() != "ready":
            raise BenchError(f"the link forwarder did not start: {self.link.log_tail()}")
        for ns, tun, here, there in zip(
            self.ns, self.tuns, (A_ADDR, B_ADDR), (B_ADDR, A_ADDR), strict=True
        ):
            self.ip("netns", "add", ns)
            self.ip("link", "set", tun, "netns", ns)
            self.ip("link", "set", "lo", "up", ns=ns)
            self.ip("addr", "add", here, "peer", there, "dev", tun, ns=ns)
            self.ip("link", "set", tun, "up", ns=ns)
        if len(self.names) > 2:
            # CloudThree.. have their own addresses on B's end of the link, A routes to them.
            for index in range(2, len(self.names)):
                here = wan_clouds.peer_host(index)
                self.ip("addr", "add", here, "dev", self.tuns[1], ns=self.ns[1])
            self.ip("route", "add", "10.250.0.0/24", "dev", self.tuns[0], ns=self.ns[0])

    def counters(self) -> dict[str, int]:
        assert self.link is not None
        popen = self.link.popen
        assert popen.stdin is not None and popen.stdout is not None
        popen.stdin.write("count\n")
        popen.stdin.flush()
        result: dict[str, int] = json.loads(popen.stdout.readline())
        return result

    def teardown(self) -> None:
        self.procs.stop_all()
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    # processes in a namespace
    def start_in(self, ns: str, name: str, argv: list[str], ready: str | None = None) -> Proc:
        proc = self.procs.start(name, ["ip", "netns", "exec", ns, *argv], env=_env())
        if ready is not None:
            deadline = time.monotonic() + 30
            while ready not in proc.log.read_text(errors="replace"):
                if not proc.alive() or time.monotonic() > deadline:
                    raise BenchError(f"{name} did not start; its log:\n{proc.log_tail()}")
                time.sleep(0.05)
        return proc

    def load(
        self,
        url: str,
        concurrency: int,
        requests: int,
        new: bool,
        headers: dict[str, str],
        keep_body: bool = False,
    ) -> dict[str, Any]:
        argv = [
            "ip",
            "netns",
            "exec",
            self.ns[0],
            sys.executable,
            "-m",
            "bench.wan",
            "load",
            url,
            "-c",
            str(concurrency),
            "-n",
            str(requests),
            "--connection",
            "new" if new else "open",
            "--header-json",
            json.dumps(headers),
        ]
        if self.ca is not None:
            argv += ["--cafile", str(self.ca)]
        if keep_body:
            argv.append("--keep-body")
        done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=900)
        if done.returncode:
            raise BenchError(f"the load client failed: {done.stderr.strip()[-2000:]}")
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def point(
        self,
        label: str,
        url: str,
        concurrency: int,
        new: bool,
        headers: dict[str, str] | None = None,
        requests: int | None = None,
    ) -> Point:
        headers = headers or {}
        before = self.counters()
        cpu_before = [_cpu(proc.pid) for proc in self.running_routers]
        result = self.load(url, concurrency, requests or self.args.requests, new, headers)
        cpu_after = [_cpu(proc.pid) for proc in self.running_routers]
        after = self.counters()
        syns = after["syn_ab"] - before["syn_ab"]
        if not new:  # the open connections are opened before the clock starts
            syns = max(0, syns - concurrency)
        done = max(result["requests"], 1)
        point = Point(
            label,
            "new per request" if new else "open",
            concurrency,
            result["requests"],
            result["errors"],
            result["p50_ms"],
            result["p99_ms"],
            round(syns / done, 3),
            result["statuses"],
            [round((b - a) * 1e6 / done) for a, b in zip(cpu_before, cpu_after, strict=True)]
            or None,
        )
        say(
            f"{label:28s} {point.connection:15s} c={concurrency:<3d} p50 {_ms(point.p50_ms)} ms "
            f"p99 {_ms(point.p99_ms)} ms, {point.wan_handshakes_per_request:g} WAN handshakes/req"
            + (f", {point.errors} errors" if point.errors else "")
            + (
                f", router CPU {_cpu_text(point.router_cpu_us)} us/req"
                if point.router_cpu_us
                else ""
            )
        )
        return point

    # the routers
    def federation(self, tls: bool) -> Path:
        """The routers' config (:func:`bench.wan_clouds.federation_config`). Plain: CloudOne's
        router reaches the others on their frontends (no peer links). TLS: each router has a
        peer link (https, a certificate of the bench's CA, which ``settings.peers.ca`` names),
        and CloudOne's router keeps warm connections to every other across the link."""
        scheme = "https" if tls else "http"
        data = wan_clouds.federation_config(self.names, tls, self.certs, self.ca)
        path = self.workdir / f"federation-{scheme}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def routers(self, tls: bool) -> list[Proc]:
        config = self.federation(tls)
        started = []
        for index, cloud in enumerate(self.names):
            ns = self.ns[0] if index == 0 else self.ns[1]
            argv = [
                sys.executable,
                *self.args.router_python_flags.split(),
                "-m",
                "scoperouter.cli",
                "serve",
                "--config",
                str(config),
                "--cloud",
                cloud,
                "--workers",
                str(self.args.router_workers),
                "--log-level",
                self.args.router_log_level,
            ]
            started.append(self.start_in(ns, f"router-{cloud}-{'tls' if tls else 'plain'}", argv))
        # Ready when a scoped request goes through CloudOne's router and every other (a merged
        # list of theirs: 200 only when each answered).
        url = f"http://{ROUTER_A}:{PORTS['router']}/v2/images"
        headers = (
            scoped() if len(self.names) == 2 else scoped(wan_clouds.merged_scope(self.names[1:]))
        )
        deadline = time.monotonic() + 60 + 5 * len(self.names)
        while True:
            for proc in started:
                if not proc.alive():
                    raise BenchError(f"{proc.name} exited; its log:\n{proc.log_tail()}")
            result = self.load(url, 1, 1, True, headers)
            if result["statuses"].get("200"):
                self.running_routers = started
                return started
            if time.monotonic() > deadline:
                raise BenchError(f"the routers do not answer 200: {result}")
            time.sleep(0.5)

    def check_merged(self, clouds: list[str], label: str) -> None:
        """One merged list through the routers: every cloud's images there, in order (as
        bench.run's sanity_check does for its paths); a BenchError with the routers' logs
        when not."""
        url = f"http://{ROUTER_A}:{PORTS['router']}/v2/images"
        result = self.load(url, 1, 1, True, scoped(wan_clouds.merged_scope(clouds)), keep_body=True)
        status = int(next(iter(result["statuses"]), 0))
        problem = wan_clouds.check_merged(status, result.get("body", ""), clouds)
        images = len(clouds) * wan_clouds.IMAGES_PER_CLOUD
        self.merged_checks.append(
            {"path": label, "clouds": clouds, "status": status, "ok": problem is None}
        )
        if problem is not None:
            raise BenchError(
                f"sanity check failed for {label}: {problem}; router logs:\n"
                + "\n".join(p.log_tail(8) for p in self.running_routers)
            )
        say(f"{label}: the merged list holds the {images} images of {len(clouds)} clouds")

    def access_logged(self) -> bool:
        return self.args.router_log_level.upper() in ("INFO", "DEBUG")

    def log_marks(self) -> list[int]:
        """Where each running router's log ends now (its lines after this are a point's)."""
        time.sleep(1.0)  # the lines of what came before, written in batches (every 0.5 s)
        return [_size(proc.log) for proc in self.running_routers]

    def timeline(self, marks: list[int], label: str, clients: int) -> None:
        """Where a merged point's time went, from the routers' access lines since `marks`
        (:func:`bench.wan_clouds.timeline`): a note under the table and in the JSON."""
        time.sleep(1.0)  # the routers write their access lines in batches (every 0.5 s)
        texts = []
        for proc, mark in zip(self.running_routers, marks, strict=True):
            with open(proc.log, "rb") as log:
                log.seek(mark)
                texts.append(log.read().decode("utf-8", "replace").splitlines())
        found = wan_clouds.timeline(texts[0], (line for text in texts[1:] for line in text))
        if found is None:
            return
        self.timelines.append({"path": label, "concurrency": clients, **asdict(found)})
        clients_text = f"{clients} client{'' if clients == 1 else 's'}"
        self.notes.append(f"Where the time goes, {label}, {clients_text}: {found.text()}")
        say(f"  {found.text()}")

    def run(self) -> dict[str, Any]:
        from tests.integration.certs import federation_ca

        self.ca, self.certs = federation_ca(
            self.workdir,
            {name: wan_clouds.peer_host(index) for index, name in enumerate(self.names)},
        )
        self.setup_link()
        server = [
            sys.executable,
            "-m",
            "bench.wan",
            "serve",
            f"{B_ADDR}:{PORTS['plain']}",
            f"{B_ADDR}:{PORTS['tls']}:tls",
        ]
        if self.args.clouds is None:
            server.append(f"{BACKEND_B}:{PORTS['backend']}")
        else:  # every cloud in B has its own backend, answering its own image list
            server += [
                f"{wan_clouds.backend_host(index)}:{PORTS['backend']}:glance={name}"
                for index, name in enumerate(self.names)
                if index
            ]
        server += [
            "--cert",
            str(self.certs["CloudTwo"]),
            "--key",
            str(self.certs["CloudTwo"].with_suffix(".key")),
        ]
        self.start_in(self.ns[1], "server", server, ready="ready")
        if self.args.clouds is not None:  # CloudOne's backend, in A
            one = f"{wan_clouds.backend_host(0)}:{PORTS['backend']}:glance={self.names[0]}"
            argv = [sys.executable, "-m", "bench.wan", "serve", one]
            self.start_in(self.ns[0], "server-CloudOne", argv, ready="ready")
        points: list[Point] = []
        levels = self.args.concurrency
        say("direct (the floor)")
        for c in levels:
            for scheme, port in (("http", PORTS["plain"]), ("https", PORTS["tls"])):
                url = f"{scheme}://{B_ADDR}:{port}/v2/images"
                label = f"direct {'TLS' if scheme == 'https' else 'plain'}"
                points.append(self.point(label, url, c, new=False))
                points.append(self.point(label, url, c, new=True))
        for tls in self.args.between:
            say(
                f"{'two' if len(self.names) == 2 else len(self.names)} routers, "
                f"{'TLS' if tls else 'plain HTTP'} between them"
            )
            started = self.routers(tls)
            url = f"http://{ROUTER_A}:{PORTS['router']}/v2/images"
            between = "TLS" if tls else "plain"
            paths = [(f"routers, {between} between", SCOPE)]
            if self.args.clouds is not None:
                for clouds in wan_clouds.merged_sets(self.names):
                    label = f"merged {wan_clouds.span(clouds)}, {between} between"
                    self.check_merged(clouds, label)
                    paths.append((label, wan_clouds.merged_scope(clouds)))
            for label, scope in paths:
                for c in levels:
                    warmup = self.args.warmup if self.args.warmup is not None else max(60, 10 * c)
                    if warmup:
                        # Steady state: the routers' pools grow to what c clients need first
                        # (each worker's pool to the largest share of a burst the kernel gives
                        # it).
                        warm = self.point(
                            f"{label} (warm-up)",
                            url,
                            c,
                            new=True,
                            headers=scoped(scope),
                            requests=warmup,
                        )
                        self.notes.append(
                            f"{label}, {c} clients: warm-up of {warm.requests} requests before "
                            f"the point, {warm.wan_handshakes_per_request:g} WAN "
                            "handshakes/request"
                        )
                    timed = label.startswith("merged ") and self.access_logged()
                    marks = self.log_marks() if timed else []
                    points.append(self.point(label, url, c, new=True, headers=scoped(scope)))
                    if timed:
                        self.timeline(marks, label, c)
            if self.args.clouds is not None:  # the answers are still whole after the load
                for clouds in wan_clouds.merged_sets(self.names):
                    label = f"merged {wan_clouds.span(clouds)}, {between} between, after"
                    self.check_merged(clouds, label)
            self.running_routers = []
            for proc in started:
                self.procs.stop(proc)
        result: dict[str, Any] = {"points": [asdict(p) for p in points], "notes": self.notes}
        if self.args.clouds is not None:
            lines, overall = wan_clouds.target_lines(
                result["points"], len(self.names), self.args.delay_ms
            )
            result["merged"] = {
                "clouds": self.names,
                "images_per_cloud": wan_clouds.IMAGES_PER_CLOUD,
                "scopes": [wan_clouds.merged_scope(c) for c in wan_clouds.merged_sets(self.names)],
                "checks": self.merged_checks,
                "timelines": self.timelines,
                "target": {
                    "p50_ms_at_most": wan_clouds.TARGET_P50_MS,
                    "clouds": wan_clouds.TARGET_CLOUDS,
                    "delay_ms": wan_clouds.TARGET_DELAY_MS,
                    "verdict": overall,
                    "lines": lines,
                },
            }
        return result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children (a router's workers)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for item in procs:
        try:
            times = item.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def scoped(scope: str = SCOPE) -> dict[str, str]:
    return {"X-Auth-Token": f"{TOKEN}!SCOPE!{scope}", "X-Scope": scope}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def render(result: dict[str, Any]) -> str:
    points = [Point(**p) for p in result["points"]]
    floor = {
        (p.path.split()[-1], p.concurrency): p.p50_ms
        for p in points
        if p.path.startswith("direct") and p.connection == "open"
    }
    fresh = {
        (p.path.split()[-1], p.concurrency): p.p50_ms
        for p in points
        if p.path.startswith("direct") and p.connection != "open"
    }
    lines = [
        "| path | connection | clients | p50 ms | p99 ms | WAN handshakes / request "
        "| p50 / floor (direct, open) | p50 / direct new connection | router CPU us/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        kind = "TLS" if "TLS" in p.path else "plain"
        base, new = floor.get((kind, p.concurrency)), fresh.get((kind, p.concurrency))
        ratio = f"{p.p50_ms / base:.2f}" if p.p50_ms and base else "-"
        ratio_new = f"{p.p50_ms / new:.2f}" if p.p50_ms and new else "-"
        lines.append(
            f"| {p.path} | {p.connection} | {p.concurrency} | {_ms(p.p50_ms)} | {_ms(p.p99_ms)} "
            f"| {p.wan_handshakes_per_request:g} | {ratio} | {ratio_new} "
            f"| {_cpu_text(p.router_cpu_us) if p.router_cpu_us else ''} |"
            + (f" {p.errors} errors" if p.errors else "")
        )
    merged = result.get("merged")
    if merged:
        lines += ["", *merged["target"]["lines"]]
    lines += [f"\n{note}" for note in result.get("notes", [])]
    return "\n".join(lines)


def _cpu_text(per_router: list[float]) -> str:
    """Each router's CPU per request; with more than two, CloudOne's + the others' in all."""
    if len(per_router) <= 2:
        return " + ".join(map(str, per_router))
    others = per_router[1:]
    return f"{per_router[0]} + {round(sum(others))} ({len(others)} routers)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.wan", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    fwd = sub.add_parser("forward", help="(internal) the delaying link between two TUN devices")
    fwd.add_argument("tuns", nargs=2)
    fwd.add_argument("--delay-ms", type=float, default=25.0)
    srv = sub.add_parser("serve", help="(internal) the server in B: HOST:PORT[:tls] ...")
    srv.add_argument("listeners", nargs="+")
    srv.add_argument("--cert")
    srv.add_argument("--key")
    load = sub.add_parser("load", help="(internal) the client: one JSON line of figures")
    load.add_argument("url")
    load.add_argument("-c", type=int, default=1)
    load.add_argument("-n", type=int, default=100)
    load.add_argument("--connection", choices=("new", "open"), default="new")
    load.add_argument("--cafile")
    load.add_argument("--header-json", default="{}")
    load.add_argument("--keep-body", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay (25)")
    parser.add_argument("--requests", type=int, default=200, help="per point (200)")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 20],
        help="concurrent clients per point, comma-separated (1,20)",
    )
    parser.add_argument(
        "--between",
        type=lambda s: [x == "tls" for x in s.split(",")],
        default=None,
        help="router-to-router transport(s): plain,tls (both; tls with --clouds)",
    )
    parser.add_argument(
        "--clouds",
        type=int,
        default=None,
        help="N clouds: CloudOne's router in A, CloudTwo..CloudN's routers and backends in B, "
        "and merged lists over them measured too (without it: two clouds, no merged list)",
    )
    parser.add_argument(
        "--router-log-level",
        default="WARNING",
        help="the routers' --log-level (WARNING; INFO: one access line per request, in the "
        "work dir's router-*.log with --keep)",
    )
    parser.add_argument("--router-workers", type=int, default=1, help="per router (1)")
    parser.add_argument(
        "--router-python-flags",
        default="",
        help="interpreter flags of the routers, e.g. -O (as production routers run)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="requests sent through the routers before each of their points, not measured "
        "(10 rounds of the point's clients, at least 60)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="whole runs (1); each target must hold in every one ('5 runs of 5': 5)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work dir (configs, logs), even on success"
    )
    args = parser.parse_args(argv)
    if args.clouds is not None:
        try:
            wan_clouds.cloud_names(args.clouds)
        except ValueError as exc:
            parser.error(str(exc))
    if args.between is None:
        args.between = [True] if args.clouds is not None else [False, True]
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "forward":
        forward(tuple(args.tuns), args.delay_ms / 1000)
        return 0
    if args.command == "serve":
        asyncio.run(_serve(args.listeners, args.cert, args.key))
        return 0
    if args.command == "load":
        result = asyncio.run(
            _load(
                args.url,
                args.c,
                args.n,
                args.connection == "new",
                args.cafile,
                json.loads(args.header_json),
                args.keep_body,
            )
        )
        print(json.dumps(result))
        return 0
    if os.geteuid() != 0 or not Path("/dev/net/tun").exists() or not shutil.which("ip"):
        print("bench.wan needs root, /dev/net/tun and iproute2 (ip)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for run in range(args.repeat):
        if args.repeat > 1:
            say(f"run {run + 1} of {args.repeat}")
        result = _one_run(args)
        if result is None:
            return 1
        results.append(result)
        print(render(result))
    return judge(args, results)


def judge(args: argparse.Namespace, results: list[dict[str, Any]]) -> int:
    """Print the targets over `results` (and write --json): 0 only when every row is PASS."""
    rows = wan_verdict.targets(results, args.delay_ms, args.warmup)
    print(f"\nTargets ({len(results)} run{'' if len(results) == 1 else 's'}):")
    print(targets_table(rows))
    for line in not_passed(rows):
        print(line)
    if args.json:
        data = results[0] if len(results) == 1 else {"runs": results}
        data["verdicts"] = as_dicts(rows)
        args.json.write_text(json.dumps(data, indent=1))
    return exit_status(rows)


def _one_run(args: argparse.Namespace) -> dict[str, Any] | None:
    """One run of the bench (its own namespaces, link and processes), or None when it failed."""
    workdir = Path(tempfile.mkdtemp(prefix="scoperouter-wan-"))
    wan = Wan(args, workdir)
    try:
        result = wan.run()
    except BenchError as exc:
        print(f"bench.wan: {exc}", file=sys.stderr)
        return None
    finally:
        wan.teardown()
        if not args.keep:  # a failed run too (its work dir was left behind)
            shutil.rmtree(workdir, ignore_errors=True)
    result["machine"] = {
        "load_average": os.getloadavg(),
        "delay_ms": args.delay_ms,
        "requests": args.requests,
        "router_workers": args.router_workers,
    }
    if args.clouds is not None:
        result["machine"]["clouds"] = args.clouds
    return result


if __name__ == "__main__":
    sys.exit(main())
