"""``bench.wan``'s run: the namespaces and the link, the processes in them (the server, the
routers, the load client), and the points measured through them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from bench import wan_clouds
from bench.procs import BenchError, Proc, Processes
from bench.wan_clouds import A_ADDR, B_ADDR, PORTS, ROUTER_A
from bench.wan_render import Point, _cpu_text, _ms

BACKEND_B = wan_clouds.backend_host(1)  # CloudTwo's backend, inside B
TOKEN = "gAAAAABm" + "x" * 175  # Fernet-sized; the routers do not validate tokens here
SCOPE = '{"image":"CloudTwo"}'


def say(message: str) -> None:
    print(f"[wan] {message}", file=sys.stderr, flush=True)


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
        self.marks: list[int] = []  # the routers' log sizes as the last point started
        self.measured_since = 0.0  # when its measured requests started (epoch ms)

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
        warmup: int = 0,
        on_warm: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """The load client's figures; with a `warmup`, `on_warm` is called when its measured
        requests start (see :func:`bench.wan_http._load`)."""
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
        if warmup:  # the clients' first requests spread over one round trip
            argv += ["--warmup", str(warmup), "--spread-ms", str(2 * self.args.delay_ms)]
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        ) as popen:
            assert popen.stdout is not None and popen.stderr is not None
            try:
                line = popen.stdout.readline()
                warmed = line.strip() == "warm"
                if warmup and warmed:
                    if on_warm is not None:
                        on_warm()
                    line = popen.stdout.readline()
                popen.wait(timeout=900)
            finally:
                if popen.poll() is None:
                    popen.kill()
            errors = popen.stderr.read()
        if popen.returncode or not line.strip():
            raise BenchError(f"the load client failed: {errors.strip()[-2000:]}")
        if warmup and not warmed:  # the counters would hold the warm-up: no figure of it
            raise BenchError("the load client never said where its measured requests start")
        result: dict[str, Any] = json.loads(line)
        return result

    def point(
        self,
        label: str,
        url: str,
        concurrency: int,
        new: bool,
        headers: dict[str, str] | None = None,
        requests: int | None = None,
        warmup: int = 0,
    ) -> Point:
        """`requests` measured; after `warmup` not measured, by the same clients without a
        pause (the warm-up's own figures go to the notes)."""
        headers = headers or {}
        self.marks = [_size(proc.log) for proc in self.running_routers]
        self.measured_since = time.time() * 1000
        start = self.counters()
        at: dict[str, Any] = {
            "counters": start,
            "cpu": [_cpu(proc.pid) for proc in self.running_routers],
        }

        def warm() -> None:  # the measured requests start: the counters from here
            at["counters"] = self.counters()
            at["cpu"] = [_cpu(proc.pid) for proc in self.running_routers]
            self.measured_since = time.time() * 1000

        result = self.load(
            url,
            concurrency,
            requests or self.measured(concurrency),
            new,
            headers,
            False,
            warmup,
            warm,
        )
        cpu_after = [_cpu(proc.pid) for proc in self.running_routers]
        after = self.counters()
        before, cpu_before = at["counters"], at["cpu"]
        syns = after["syn_ab"] - before["syn_ab"]
        if not new and not warmup:  # the open connections are opened before the clock starts
            syns = max(0, syns - concurrency)
        if warmup:
            warmed = result["warmup"]  # the load client's figures of its warm-up
            opened = 0 if new else concurrency
            handshakes = max(0, before["syn_ab"] - start["syn_ab"] - opened)
            rate = round(handshakes / max(warmed["requests"], 1), 3)
            say(
                f"{label + ' (warm-up)':28s} c={concurrency:<3d} "
                f"{warmed['requests']} requests, p50 {_ms(warmed['p50_ms'])} ms, "
                f"{rate:g} WAN handshakes/req"
            )
            self.notes.append(
                f"{label}, {concurrency} clients: warm-up of {warmed['requests']} requests "
                f"before the point (the same clients, no pause), {rate:g} WAN handshakes/request"
            )
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

    def measured(self, clients: int) -> int:
        """Requests measured in a point of `clients` clients: 50 rounds of them, at least 200
        (a p50 of 200 requests at 20 clients moved by 3 ms from one run to the next)."""
        return self.args.requests or max(200, 50 * clients)

    def warmup(self, clients: int) -> int:
        """Requests before a point of `clients` clients (10 rounds of them, at least 60)."""
        return self.args.warmup if self.args.warmup is not None else max(60, 10 * clients)

    def timeline(self, label: str, clients: int) -> None:
        """Where the last point's time went, from the routers' access lines of its measured
        requests (:func:`bench.wan_clouds.timeline`): a note under the table and in the JSON."""
        time.sleep(1.0)  # the routers write their access lines in batches (every 0.5 s)
        texts = []
        for proc, mark in zip(self.running_routers, self.marks, strict=True):
            with open(proc.log, "rb") as log:
                log.seek(mark)
                texts.append(log.read().decode("utf-8", "replace").splitlines())
        found = wan_clouds.timeline(
            texts[0], (line for text in texts[1:] for line in text), self.measured_since
        )
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
                points.append(self.point(label, url, c, new=False, warmup=self.warmup(c)))
                points.append(self.point(label, url, c, new=True, warmup=self.warmup(c)))
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
                    # Steady state: the routers' pools grow to what c clients need first (each
                    # worker's pool to the largest share of a burst the kernel gives it).
                    timed = label.startswith("merged ") and self.access_logged()
                    point = self.point(
                        label, url, c, new=True, headers=scoped(scope), warmup=self.warmup(c)
                    )
                    points.append(point)
                    if timed:
                        self.timeline(label, c)
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
