"""``python -m bench.wan``: two clouds 50 ms apart, routers against a direct connection, one run.

Run by hand, as root (network namespaces, TUN devices), from the repository root with the dev
venv::

    sudo .venv/bin/python -m bench.wan                      # ~3 minutes, table on stdout
    .venv/bin/python -m bench.wan --requests 50 --concurrency 1   # a quick look
    .venv/bin/python -m bench.wan --json wan.json

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

from bench.procs import BenchError, Proc, Processes

A_ADDR, B_ADDR = "10.250.0.1", "10.250.0.2"
ROUTER_A = "127.0.0.2"  # CloudOne's router frontend, inside A
BACKEND_B = "127.0.1.3"  # CloudTwo's backend, inside B
PORTS = {
    "plain": 8000,
    "tls": 8443,
    "backend": 8001,
    "router": 9292,
    "identity": 5000,
    "peer": 9443,
}
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

    def __init__(self, name: str) -> None:
        self.body = json.dumps({"images": [{"id": "4b7ca3b4", "name": "cirros"}], "at": name})
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
        await loop.create_server(
            lambda spec=spec: _Server(spec), host, int(port), ssl=context, backlog=512
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

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(request)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
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
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "statuses": statuses,
        "p50_ms": _percentile(latencies, 0.50),
        "p99_ms": _percentile(latencies, 0.99),
        "mean_ms": statistics.fmean(latencies) if latencies else None,
    }


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
        self, url: str, concurrency: int, requests: int, new: bool, headers: dict[str, str]
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
                f", router CPU {' + '.join(map(str, point.router_cpu_us))} us/req"
                if point.router_cpu_us
                else ""
            )
        )
        return point

    # the routers
    def federation(self, tls: bool) -> Path:
        """Plain: CloudOne's router reaches CloudTwo's on its frontend (no peer links). TLS:
        each router has a peer link (https, a certificate of the bench's CA, which
        ``settings.peers.ca`` names), and CloudOne's router keeps warm connections to
        CloudTwo's across the link."""
        scheme = "https" if tls else "http"
        two: dict[str, Any] = {"url": f"http://{B_ADDR}:{PORTS['router']}"}
        settings: dict[str, Any] = {"connect_timeout": 10.0, "response_timeout": 30.0}
        links: dict[str, dict[str, Any]] = {}
        if tls:
            assert self.certs is not None
            for name, host in (("CloudOne", A_ADDR), ("CloudTwo", B_ADDR)):
                cert = self.certs[name]
                links[name] = {
                    "url": f"https://{host}:{PORTS['peer']}",
                    "tls": {"cert": str(cert), "key": str(cert.with_suffix(".key"))},
                }
            settings["peers"] = {"ca": str(self.ca)}

        def cloud(
            router: str, front: dict[str, Any], backend: str, identity_host: str
        ) -> dict[str, Any]:
            return {
                "region": "CloudOne" if router == ROUTER_A else "CloudTwo",
                "frontends": [front, {"url": f"http://{identity_host}:{PORTS['identity']}"}],
                "services": {
                    "image": {"public": {"url": front["url"], "backend": backend}},
                    "identity": {
                        "public": {
                            "url": f"http://{identity_host}:{PORTS['identity']}/v3",
                            "backend": f"{backend}/identity/v3",
                        }
                    },
                },
            }

        clouds = {
            "CloudOne": cloud(
                ROUTER_A,
                {"url": f"http://{ROUTER_A}:{PORTS['router']}"},
                f"http://127.0.1.2:{PORTS['backend']}",
                ROUTER_A,
            ),
            "CloudTwo": cloud(B_ADDR, two, f"http://{BACKEND_B}:{PORTS['backend']}", B_ADDR),
        }
        for name, link in links.items():
            clouds[name]["peer"] = link
        data = {
            "version": 1,
            "settings": settings,
            "clouds": clouds,
        }
        path = self.workdir / f"federation-{scheme}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def routers(self, tls: bool) -> list[Proc]:
        config = self.federation(tls)
        started = []
        for ns, cloud in zip(self.ns, ("CloudOne", "CloudTwo"), strict=True):
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
                "WARNING",
            ]
            started.append(self.start_in(ns, f"router-{cloud}-{'tls' if tls else 'plain'}", argv))
        # Ready when a scoped request goes through both (and says which backend answered).
        url = f"http://{ROUTER_A}:{PORTS['router']}/v2/images"
        deadline = time.monotonic() + 60
        while True:
            for proc in started:
                if not proc.alive():
                    raise BenchError(f"{proc.name} exited; its log:\n{proc.log_tail()}")
            result = self.load(url, 1, 1, True, scoped())
            if result["statuses"].get("200"):
                self.running_routers = started
                return started
            if time.monotonic() > deadline:
                raise BenchError(f"the routers do not answer 200: {result}")
            time.sleep(0.5)

    def run(self) -> dict[str, Any]:
        from tests.integration.certs import federation_ca

        self.ca, self.certs = federation_ca(self.workdir, {"CloudOne": A_ADDR, "CloudTwo": B_ADDR})
        self.setup_link()
        server = [
            sys.executable,
            "-m",
            "bench.wan",
            "serve",
            f"{B_ADDR}:{PORTS['plain']}",
            f"{B_ADDR}:{PORTS['tls']}:tls",
            f"{BACKEND_B}:{PORTS['backend']}",
            "--cert",
            str(self.certs["CloudTwo"]),
            "--key",
            str(self.certs["CloudTwo"].with_suffix(".key")),
        ]
        self.start_in(self.ns[1], "server", server, ready="ready")
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
            say(f"two routers, {'TLS' if tls else 'plain HTTP'} between them")
            started = self.routers(tls)
            url = f"http://{ROUTER_A}:{PORTS['router']}/v2/images"
            for c in levels:
                label = f"routers, {'TLS' if tls else 'plain'} between"
                warmup = self.args.warmup if self.args.warmup is not None else max(60, 10 * c)
                if warmup:
                    # Steady state: the routers' pools grow to what c clients need first (each
                    # worker's pool to the largest share of a burst the kernel gives it).
                    warm = self.point(
                        f"{label} (warm-up)",
                        url,
                        c,
                        new=True,
                        headers=scoped(),
                        requests=warmup,
                    )
                    self.notes.append(
                        f"{label}, {c} clients: warm-up of {warm.requests} requests before the "
                        f"point, {warm.wan_handshakes_per_request:g} WAN handshakes/request"
                    )
                points.append(self.point(label, url, c, new=True, headers=scoped()))
            self.running_routers = []
            for proc in started:
                self.procs.stop(proc)
        return {"points": [asdict(p) for p in points], "notes": self.notes}


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


def scoped() -> dict[str, str]:
    return {"X-Auth-Token": f"{TOKEN}!SCOPE!{SCOPE}", "X-Scope": SCOPE}


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
            f"| {' + '.join(map(str, p.router_cpu_us)) if p.router_cpu_us else ''} |"
            + (f" {p.errors} errors" if p.errors else "")
        )
    lines += [f"\n{note}" for note in result.get("notes", [])]
    return "\n".join(lines)


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
        default=[False, True],
        help="router-to-router transport(s): plain,tls (both)",
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
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work dir (configs, logs), even on success"
    )
    return parser.parse_args(argv)


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
            )
        )
        print(json.dumps(result))
        return 0
    if os.geteuid() != 0 or not Path("/dev/net/tun").exists() or not shutil.which("ip"):
        print("bench.wan needs root, /dev/net/tun and iproute2 (ip)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="scoperouter-wan-"))
    wan = Wan(args, workdir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = wan.run()
    except BenchError as exc:
        print(f"bench.wan: {exc}", file=sys.stderr)
        return 1
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
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
