"""The bench's processes and measurements: a federation of two routers, the load points, the
cost of the per-request log line, the large transfers (see bench/README.md)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import backend, federation, load, report, transfer
from bench.machine import ROOT, busy_others, machine_context, prime_processes
from bench.procs import (
    BenchError,
    Proc,
    Processes,
    cpu_sample,
    finish_instruction_count,
    free_port,
    rss_max_mb,
    rss_mb,
    start_instruction_count,
    wait_listening,
)

TOKEN = "gAAAAABm" + "t" * 175  # the size of a Fernet token; routers do not validate it
SMALL_PATH = "/v2/images"
PATH_LABELS = ("direct", "one router", "two routers")
LOG_COST_ROUNDS = 3  # per level, alternating


@dataclass
class PointCost:
    """What the cores did during one load point (:meth:`Bench.load_point`)."""

    wall: float  # seconds
    cpu: dict[str, float]  # CPU seconds of each watched process, its children included
    instructions: float | None  # user-space instructions of the counted processes (perf)
    loadgen_cpu_cores: float
    machine_busy_cores: float  # the whole machine
    softirq_cores: float  # the kernel's network processing (loopback TCP), charged to no one
    other_cpu_cores: float  # used by neither the bench's processes, nor wrk, nor softirq
    other_cpu_cores_before: float | None  # others' load when the point started
    other_busy_processes: list[dict[str, Any]]

    @staticmethod
    def per_request(value: float | None, result: load.LoadResult) -> float | None:
        return value / result.requests if value and result.requests else None

    def noise(self) -> dict[str, Any]:
        """The row's figures about the machine (the bench's JSON keys)."""
        return {
            "loadgen_cpu_cores": self.loadgen_cpu_cores,
            "machine_busy_cores": self.machine_busy_cores,
            "softirq_cores": self.softirq_cores,
            "other_cpu_cores": self.other_cpu_cores,
            "other_cpu_cores_before": self.other_cpu_cores_before,
            "other_busy_processes": self.other_busy_processes,
        }


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def scoped_headers(scope: dict[str, str]) -> dict[str, str]:
    """What a scoped client sends: the scope on the token and in X-Scope."""
    text = json.dumps(scope)
    return {"X-Auth-Token": f"{TOKEN}!SCOPE!{text}", "X-Scope": text, "Accept": "application/json"}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="scoperouter-bench-"))
        self.procs = Processes(self.workdir)
        self.results: dict[str, Any] = {"settings": {}, "http": [], "decision": [], "transfers": []}
        self.routers: dict[str, Proc] = {}
        self.backends: dict[str, Proc] = {}
        self.clouds: dict[str, federation.CloudAddresses] = {}
        self.tool: load.LoadTool | None = None
        self.small: backend.Backend | None = None
        self.config: Path | None = None

    # ------------------------------------------------------------------ setup

    def cleanup(self) -> None:
        self.procs.stop_all()
        if self.args.keep:
            say(f"work dir kept: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _sub_env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(ROOT)]
        if self.args.router_pythonpath:
            paths.insert(0, str(Path(self.args.router_pythonpath).resolve()))
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def choose_tools(self) -> None:
        allow_apt = not self.args.no_apt
        if self.args.load in ("auto", "wrk"):
            self.tool = load.ensure_wrk(allow_apt, say)
            if self.tool is None:
                if self.args.load == "wrk":
                    raise BenchError("wrk is not available (and could not be installed)")
                say("wrk unavailable: using the Python load generator (bench/pyload.py)")
        if self.tool is None:
            self.tool = load.python_tool()

    def _addresses(self) -> None:
        for name in federation.CLOUDS:
            router_host = federation.ROUTER_HOSTS[name]
            backend_host = federation.BACKEND_HOSTS[name]
            self.clouds[name] = federation.CloudAddresses(
                name=name,
                router_host=router_host,
                image_port=free_port(router_host),
                identity_port=free_port(router_host),
                object_port=free_port(router_host),
                backend_host=backend_host,
                small_port=free_port(backend_host),
                big_port=free_port(backend_host),
            )

    def router_argv(self, name: str, log_level: str) -> list[str]:
        assert self.config is not None
        flags = self.args.router_python_flags.split()
        argv = [sys.executable, *flags, "-m", "scoperouter.cli", "serve"]
        argv += ["--config", str(self.config), "--cloud", name]
        if self.args.router_workers:  # 0: a router from before --workers (one process)
            argv += ["--workers", str(self.args.router_workers)]
        return [*argv, "--log-level", log_level]

    def start_router(self, name: str, log_level: str) -> None:
        workers = self.args.router_workers or 1
        say(f"starting the router of {name} ({workers} worker(s), {log_level})")
        proc = self.procs.start(
            f"router-{name}-{log_level.lower()}", self.router_argv(name, log_level), self._sub_env()
        )
        self.routers[name] = proc
        for host, port in self.clouds[name].frontends():
            wait_listening(host, port, proc, timeout=60)
        # The supervisor's sockets accept before its workers run (connections wait in the
        # queue): one answered request says a worker serves.
        cloud = self.clouds[name]
        try:
            _get(cloud.router_host, cloud.image_port, "GET", "/", {}, timeout=60)
        except OSError as exc:
            raise BenchError(f"router {name} does not answer ({exc}): {proc.log_tail()}") from None
        self.procs.remember_children(proc)

    def stop_router(self, name: str) -> None:
        self.procs.stop(self.routers.pop(name))

    def federation_data(self) -> dict[str, Any]:
        """The config the routers run (``bench.soak`` adds to it)."""
        return federation.two_clouds(list(self.clouds.values()))

    def start_federation(self) -> None:
        self._addresses()
        small = [(c.backend_host, c.small_port, c.name) for c in self.clouds.values()]
        big = [(c.backend_host, c.big_port, c.name) for c in self.clouds.values()]
        say("starting the backends")
        self.small = backend.start_small(
            self.procs, small, prefer_nginx=self.args.backend != "asyncio", say=say
        )
        if self.args.backend == "nginx" and self.small.kind != "nginx":
            raise BenchError("nginx was asked for but is not available")
        self.backends["small"] = self.small.proc
        self.backends["big"] = backend.start_asyncio(self.procs, big, "backend-big").proc
        self.config = federation.write_config(
            self.federation_data(), self.workdir / "federation.yaml"
        )
        for name in reversed(federation.CLOUDS):  # CloudTwo first: CloudOne forwards to it
            self.start_router(name, self.args.router_log_level)
        argv = self.router_argv("NAME", self.args.router_log_level)
        self.results["settings"].update(
            {
                "backend_small": self.small.description,
                "backend_big": backend.BIG_HINT,
                "load_generator": self.tool.description if self.tool else "",
                "router_command": " ".join(argv).replace(str(self.config), "FILE"),
                "router_workers": self.args.router_workers,
                "router_pythonpath": self.args.router_pythonpath,
                "addresses": {
                    n: {
                        "router": f"{c.router_host} (image :{c.image_port}, identity "
                        f":{c.identity_port}, object-store :{c.object_port})",
                        "backends": f"{c.backend_host} (small :{c.small_port}, big :{c.big_port})",
                    }
                    for n, c in self.clouds.items()
                },
            }
        )

    # ------------------------------------------------------------------ part 1

    def targets(self) -> dict[str, tuple[str, int, dict[str, str], str]]:
        """label -> (host, port, headers, the cloud whose backend must answer)."""
        one, two = self.clouds["CloudOne"], self.clouds["CloudTwo"]
        return {
            "direct": (
                two.backend_host,
                two.small_port,
                scoped_headers({"image": "CloudTwo"}),
                "CloudTwo",
            ),
            "one router": (
                one.router_host,
                one.image_port,
                scoped_headers({"image": "CloudOne"}),
                "CloudOne",
            ),
            "two routers": (
                one.router_host,
                one.image_port,
                scoped_headers({"image": "CloudTwo"}),
                "CloudTwo",
            ),
        }

    def sanity_check(self) -> None:
        """One request on every path: right status, answered by the right cloud's backend."""
        for label, (host, port, headers, cloud) in self.targets().items():
            status, body = _get(host, port, "GET", SMALL_PATH, headers)
            if status != 200 or not backend.check_small(body, cloud):
                raise BenchError(
                    f"sanity check failed for {label} (http://{host}:{port}{SMALL_PATH}): "
                    f"{status} {body[:300]!r}; router logs:\n"
                    + "\n".join(p.log_tail(8) for p in self.routers.values())
                )
        # Large-body path: the object-store request must reach CloudTwo's backend, with the
        # routers' hop count (two routers crossed).
        one = self.clouds["CloudOne"]
        status, body = _get(
            one.router_host,
            one.object_port,
            "PUT",
            "/v1/AUTH_bench/c/o",
            scoped_headers({"object-store": "CloudTwo"}),
            b"x" * 1000,
        )
        answer = json.loads(body) if status == 200 else {}
        if answer.get("cloud") != "CloudTwo" or answer.get("body_bytes") != 1000:
            raise BenchError(f"sanity check failed for object-store: {status} {body[:300]!r}")
        if answer.get("hops") != "2":
            raise BenchError(f"X-Scope-Hops at the backend: {answer.get('hops')!r}, expected '2'")

    def wait_quiet(self) -> float:
        """Wait (up to --quiet-wait s) until the machine is quiet; the busy cores last seen.
        Between load points the bench's own processes are idle, so what is busy is others."""
        start = time.monotonic()
        cpus = os.cpu_count() or 1
        told = False
        while True:
            busy = psutil.cpu_percent(interval=0.5) / 100 * cpus
            waited = time.monotonic() - start
            if busy <= self.args.quiet_cores or waited >= self.args.quiet_wait:
                if told:
                    say(f"  waited {waited:.0f} s; other processes now use {busy:.2f} cores")
                return busy
            if not told:
                say(f"  other processes use {busy:.2f} cores: waiting for a quieter moment")
                told = True

    def load_point(
        self,
        url: str,
        conns: int,
        headers: dict[str, str],
        watched: dict[str, int],
        counted: tuple[int, ...] = (),
        threads: int = 1,
    ) -> tuple[load.LoadResult, PointCost]:
        """Wait for a quiet machine, warm up, then one load point on `url`, with the CPU time
        of the `watched` processes (each with its children), the user-space instructions of
        the `counted` ones (perf, when installed), and what the rest of the machine did."""
        assert self.tool is not None
        args = self.args
        env = self._sub_env()
        busy_before = self.wait_quiet() if args.quiet_wait > 0 else None
        if args.warmup > 0:
            load.run_load(self.tool, url, conns, args.warmup, headers, self.workdir, env, threads)
        primed = prime_processes()
        counter = start_instruction_count(counted, args.duration)
        before = cpu_sample(watched)
        rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = load.run_load(
            self.tool, url, conns, args.duration, headers, self.workdir, env, threads
        )
        rusage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = cpu_sample(watched)
        instructions = finish_instruction_count(counter)
        ours = {os.getpid(), *(p.pid for p in self.procs.procs)}
        for p in self.procs.procs:
            self.procs.remember_children(p)  # nginx forks its worker after listening
            ours |= p.children
        wall = after.wall - before.wall
        cpu = {k: after.per_process[k] - before.per_process[k] for k in watched}
        loadgen_cpu = (rusage_after.ru_utime - rusage_before.ru_utime) + (
            rusage_after.ru_stime - rusage_before.ru_stime
        )
        machine_busy = (after.machine_busy - before.machine_busy) / wall
        softirq = (after.softirq - before.softirq) / wall
        used_by_bench = (sum(cpu.values()) + loadgen_cpu) / wall
        if result.error_count:
            say(f"  errors: {result.errors}")
        say(f"  {result.rps:,.0f} req/s, p50 {result.p50_ms:.3f} ms, p99 {result.p99_ms:.3f} ms")
        return result, PointCost(
            wall=wall,
            cpu=cpu,
            instructions=instructions,
            loadgen_cpu_cores=loadgen_cpu / wall,
            machine_busy_cores=machine_busy,
            softirq_cores=softirq,
            other_cpu_cores=max(0.0, machine_busy - used_by_bench - softirq),
            other_cpu_cores_before=busy_before,
            other_busy_processes=busy_others(primed, ours),
        )

    def measure(self, label: str, conns: int) -> dict[str, Any]:
        """One load point: `conns` connections on the path `label`; every figure of the row."""
        host, port, headers, _ = self.targets()[label]
        url = f"http://{host}:{port}{SMALL_PATH}"
        say(f"load: {label}, {conns} connection(s), {self.args.duration:g} s")
        watched = {f"router {n}": p.pid for n, p in self.routers.items()}
        watched["backend"] = self.backends["small"].pid
        involved = {"direct": [], "one router": ["CloudOne"]}.get(label, ["CloudOne", "CloudTwo"])
        counted = tuple(self.routers[n].pid for n in involved)
        result, cost = self.load_point(url, conns, headers, watched, counted)
        used = {n: cost.cpu[f"router {n}"] for n in involved}
        return {
            "path": label,
            "connections": conns,
            **result.as_dict(),
            "router_cpu_us_per_req": {
                n: used[n] / result.requests * 1e6 if result.requests else None for n in involved
            },
            "router_cpu_cores": {n: used[n] / cost.wall for n in involved},
            # user-space instructions of the routers on the path per request (perf stat):
            # unlike CPU time, not inflated by other processes competing for the cores
            "router_instructions_per_req": cost.per_request(cost.instructions, result),
            "backend_cpu_cores": cost.cpu["backend"] / cost.wall,
            **cost.noise(),
            "router_rss_mb": {n: rss_max_mb(self.routers[n].pid) for n in involved},
            "router_rss_total_mb": {n: rss_mb(self.routers[n].pid) for n in involved},
        }

    def run_http(self) -> None:
        for conns in self.args.conns:
            for label in PATH_LABELS:
                self.results["http"].append(self.measure(label, conns))

    def run_log_cost(self) -> None:
        """The per-request INFO log line: one router at the most connections, at WARNING and at
        INFO in alternation, ``LOG_COST_ROUNDS`` times each (WARNING, INFO, INFO, WARNING...:
        the machine's drift cancels out), compared by the medians."""
        conns = max(self.args.conns)
        rows: dict[str, list[dict[str, Any]]] = {"INFO": [], "WARNING": []}
        order = [("WARNING", "INFO"), ("INFO", "WARNING")]
        for round_ in range(LOG_COST_ROUNDS):
            for level in order[round_ % 2]:
                self.stop_router("CloudOne")
                self.start_router("CloudOne", level)
                rows[level].append(self.measure("one router", conns))

        def median(level: str, pick: Any) -> float | None:
            values = [v for v in (pick(row) for row in rows[level]) if v is not None]
            return statistics.median(values) if values else None

        def rps(row: dict[str, Any]) -> float:
            return float(row["rps"])

        def cpu(row: dict[str, Any]) -> float | None:
            value = row["router_cpu_us_per_req"]["CloudOne"]
            return float(value) if value is not None else None

        def instructions(row: dict[str, Any]) -> float | None:
            value = row.get("router_instructions_per_req")
            return float(value) if value is not None else None

        self.results["log_cost"] = {
            "connections": conns,
            "rounds": LOG_COST_ROUNDS,
            "rps_info": median("INFO", rps),
            "rps_warning": median("WARNING", rps),
            "rps_info_all": [rps(r) for r in rows["INFO"]],
            "rps_warning_all": [rps(r) for r in rows["WARNING"]],
            "cpu_us_info": median("INFO", cpu),
            "cpu_us_warning": median("WARNING", cpu),
            "instructions_info": median("INFO", instructions),
            "instructions_warning": median("WARNING", instructions),
        }

    # ------------------------------------------------------------------ part 3

    def run_bodies(self) -> None:
        size = self.args.body_mb * 2**20
        one, two = self.clouds["CloudOne"], self.clouds["CloudTwo"]
        pids = {n: p.pid for n, p in self.routers.items()}
        headers = scoped_headers({"object-store": "CloudTwo"})
        paths = {
            "direct": (two.backend_host, two.big_port, {}),
            "two routers": (one.router_host, one.object_port, pids),
        }
        for direction in ("upload", "download"):
            for label, (host, port, watched) in paths.items():
                best: transfer.TransferResult | None = None
                for i in range(self.args.transfer_repeats):
                    say(f"{direction} {self.args.body_mb} MiB, {label} (run {i + 1})")
                    res = transfer.measure(
                        direction, label, host, port, headers, size, watched or pids, "CloudTwo"
                    )
                    if not res.ok:
                        raise BenchError(f"{direction} {label} went wrong: {res.detail}")
                    if best is None:
                        best = res
                    else:
                        peak = {
                            k: max(best.rss_peak_mb[k], res.rss_peak_mb[k]) for k in res.rss_peak_mb
                        }
                        if res.seconds < best.seconds:
                            best = res
                        best.rss_peak_mb = peak
                    say(f"  {res.mb_per_s:,.0f} MB/s, peak RSS {res.rss_peak_mb}")
                assert best is not None
                self.results["transfers"].append(best.as_dict())

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        args = self.args
        say("measuring what else the machine is doing (1 s)")
        self.results["context"] = machine_context()
        ctx = self.results["context"]
        say(
            f"{ctx['cpus']} CPUs, load average {ctx['loadavg_before']}, "
            f"{ctx['busy_pct_before']:.0f}% busy before start"
        )
        if "decision" not in args.skip:
            from bench import decision  # imports scoperouter: after --router-pythonpath is set

            say(f"routing decision: {args.iterations:,} calls x 5 per case")
            results, builds = decision.run((2, 1000), iterations=args.iterations, repeats=5)
            self.results["decision"] = decision.as_dicts(results)
            self.results["catalog_builds"] = decision.as_dicts(builds)
            say(f"catalog build: {report.CATALOG_BUILD_CLOUDS:,} clouds x 10 services, 3 times")
            self.results["catalog_build_large"] = decision.build_cpu(report.CATALOG_BUILD_CLOUDS)
        if {"http", "bodies"} <= args.skip:
            return self.results
        self.choose_tools()
        self.start_federation()
        self.sanity_check()
        for name, proc in self.routers.items():
            self.results.setdefault("router_rss_idle_mb", {})[name] = rss_max_mb(proc.pid)
        if "http" not in args.skip:
            self.run_http()
        if "bodies" not in args.skip:
            self.run_bodies()
        if "http" not in args.skip and not args.no_log_cost:
            self.run_log_cost()
        for name, proc in self.routers.items():
            self.results.setdefault("router_rss_end_mb", {})[name] = rss_max_mb(proc.pid)
            if not proc.alive():
                raise BenchError(f"router {name} died: {proc.log_tail()}")
        self.results["router_log_tail"] = {n: p.log_tail(5) for n, p in self.routers.items()}
        return self.results


def _get(
    host: str,
    port: int,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"",
    timeout: float = 30,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
