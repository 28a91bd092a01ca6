"""``python -m bench``: the scoperouter benchmark, in one run (see bench/README.md).

1. small requests: a tiny backend direct, through one router (local routing) and through two
   routers (cross-cloud), at 1 and 50 connections: req/s, p50/p99, router CPU and RSS;
2. the routing decision alone at 2 and 1000 clouds x 10 services;
3. a 100 MiB upload and download through two routers vs direct, with the routers' peak RSS.

Progress goes to stderr, the table to stdout, the figures to --json FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import backend, federation, load, report, transfer
from bench.procs import BenchError, Proc, Processes, cpu_sample, free_port, rss_mb, wait_listening

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "gAAAAABm" + "t" * 175  # the size of a Fernet token; routers do not validate it
SMALL_PATH = "/v2/images"
PATH_LABELS = ("direct", "one router", "two routers")


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def scoped_headers(scope: dict[str, str]) -> dict[str, str]:
    """What a scoped client sends: the scope on the token and in X-Scope."""
    text = json.dumps(scope)
    return {"X-Auth-Token": f"{TOKEN}!SCOPE!{text}", "X-Scope": text, "Accept": "application/json"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark scoperouter: routers vs direct, the routing decision, "
        "large bodies. Default run: about 2 minutes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="short runs (~1 minute in all)")
    parser.add_argument(
        "--duration", type=float, help="seconds per load point (default 8, quick 3)"
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per point")
    parser.add_argument(
        "--connections", default="1,50", help="comma-separated connection counts per load point"
    )
    parser.add_argument("--body-mb", type=int, default=100, help="MiB per large transfer")
    parser.add_argument(
        "--transfer-repeats",
        type=int,
        help="runs per large transfer, best kept (default 2, quick 1)",
    )
    parser.add_argument("--iterations", type=int, help="decide() calls per timing (default 100k)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument(
        "--skip", default="", help="parts to skip: comma list of http,decision,bodies"
    )
    parser.add_argument("--backend", choices=["auto", "nginx", "asyncio"], default="auto")
    parser.add_argument("--load", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--no-apt", action="store_true", help="never call apt-get")
    parser.add_argument(
        "--router-log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="--log-level of the routers (INFO logs one line per request)",
    )
    parser.add_argument(
        "--router-python-flags",
        default="-O",
        help="flags for the routers' python (default -O, as the lab runs them; '' for none)",
    )
    parser.add_argument(
        "--router-pythonpath",
        metavar="DIR",
        help="import scoperouter from DIR/scoperouter, in the routers and in the decision "
        "timing (bench a modified copy without touching the checkout)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=15.0,
        metavar="S",
        help="before each load point, wait up to S seconds for the machine to be quiet "
        "(other processes under --quiet-cores); 0: never wait",
    )
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=0.2,
        help="CPU cores other processes may use for the machine to count as quiet",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (configs, logs)")
    args = parser.parse_args(argv)
    args.duration = args.duration or (3.0 if args.quick else 8.0)
    args.transfer_repeats = args.transfer_repeats or (1 if args.quick else 2)
    args.iterations = args.iterations or (20_000 if args.quick else 100_000)
    args.conns = [int(c) for c in args.connections.split(",") if c.strip()]
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    return args


def machine_context() -> dict[str, Any]:
    """What else the machine was doing when the bench started (figures depend on it)."""
    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
    busy = psutil.cpu_percent(interval=1.0)
    others = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            pct = p.cpu_percent(None)
            if pct >= 5 and p.pid != os.getpid():
                cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:80]
                others.append({"pid": p.pid, "cpu_pct": pct, "cmd": cmd})
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    try:
        from mitmproxy.version import VERSION as mitm_version
    except ImportError:
        mitm_version = "?"
    import scoperouter
    from scoperouter import __version__

    return {
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "mitmproxy": mitm_version,
        "scoperouter": __version__,
        "commit": commit,
        "scoperouter_path": str(Path(scoperouter.__file__).resolve().parent),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "busy_pct_before": busy,
        "busy_processes_before": sorted(others, key=lambda o: -o["cpu_pct"])[:5],
    }


def prime_processes() -> list[psutil.Process]:
    """Start measuring every process's CPU (see busy_others)."""
    procs = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
            procs.append(p)
    return procs


def busy_others(procs: list[psutil.Process], ours: set[int], limit: int = 3) -> list[dict]:
    """The busiest processes since prime_processes() that are not the bench's."""
    out = []
    for p in procs:
        if p.pid in ours:
            continue
        with contextlib.suppress(psutil.Error):
            pct = p.cpu_percent(None)
            if pct >= 10:
                cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:60]
                out.append({"pid": p.pid, "cpu_pct": round(pct), "cmd": cmd})
    return sorted(out, key=lambda o: -o["cpu_pct"])[:limit]


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

    def start_federation(self) -> None:
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

        config = federation.write_config(
            federation.two_clouds(list(self.clouds.values())), self.workdir / "federation.yaml"
        )
        flags = self.args.router_python_flags.split()
        for name in reversed(federation.CLOUDS):  # CloudTwo first: CloudOne forwards to it
            say(f"starting the router of {name}")
            argv = [sys.executable, *flags, "-m", "scoperouter.cli", "serve"]
            argv += ["--config", str(config), "--cloud", name]
            argv += ["--log-level", self.args.router_log_level]
            self.routers[name] = self.procs.start(f"router-{name}", argv, env=self._sub_env())
        for name, proc in self.routers.items():
            for host, port in self.clouds[name].frontends():
                wait_listening(host, port, proc, timeout=60)
        self.results["settings"].update(
            {
                "backend_small": self.small.description,
                "backend_big": backend.BIG_HINT,
                "load_generator": self.tool.description if self.tool else "",
                "router_command": " ".join([*argv[:-6], "--config", "FILE", "--cloud", "NAME"])
                + f" --log-level {self.args.router_log_level}",
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
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                conn.request("GET", SMALL_PATH, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
            finally:
                conn.close()
            if resp.status != 200 or not backend.check_small(body, cloud):
                raise BenchError(
                    f"sanity check failed for {label} (http://{host}:{port}{SMALL_PATH}): "
                    f"{resp.status} {body[:300]!r}; router logs:\n"
                    + "\n".join(p.log_tail(8) for p in self.routers.values())
                )
        # Large-body path: the object-store request must reach CloudTwo's backend without the
        # router's hop counter.
        one = self.clouds["CloudOne"]
        conn = http.client.HTTPConnection(one.router_host, one.object_port, timeout=30)
        try:
            conn.request(
                "PUT",
                "/v1/AUTH_bench/c/o",
                body=b"x" * 1000,
                headers=scoped_headers({"object-store": "CloudTwo"}),
            )
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        answer = json.loads(body) if resp.status == 200 else {}
        if answer.get("cloud") != "CloudTwo" or answer.get("body_bytes") != 1000:
            raise BenchError(f"sanity check failed for object-store: {resp.status} {body[:300]!r}")
        if answer.get("hops") is not None:
            say(
                f"note: X-Scope-Hops reached the backend ({answer['hops']!r}); rule 8 says it "
                "is removed before a backend"
            )

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

    def run_http(self) -> None:
        assert self.tool is not None
        args = self.args
        env = dict(self._sub_env())
        for conns in args.conns:
            for label, (host, port, headers, _) in self.targets().items():
                url = f"http://{host}:{port}{SMALL_PATH}"
                say(f"load: {label}, {conns} connection(s), {args.duration:g} s")
                busy_before = self.wait_quiet() if args.quiet_wait > 0 else None
                if args.warmup > 0:
                    load.run_load(
                        self.tool, url, conns, args.warmup, headers, self.workdir, env=env
                    )
                watched = {f"router {n}": p.pid for n, p in self.routers.items()}
                watched["backend"] = self.backends["small"].pid
                primed = prime_processes()
                before = cpu_sample(watched)
                rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
                result = load.run_load(
                    self.tool, url, conns, args.duration, headers, self.workdir, env=env
                )
                rusage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
                after = cpu_sample(watched)
                ours = {os.getpid(), *(p.pid for p in self.procs.procs)}
                for p in self.procs.procs:
                    self.procs.remember_children(p)  # nginx forks its worker after listening
                    ours |= p.children
                others_top = busy_others(primed, ours)
                wall = after.wall - before.wall
                cpu = {k: after.per_process[k] - before.per_process[k] for k in watched}
                loadgen_cpu = (rusage_after.ru_utime - rusage_before.ru_utime) + (
                    rusage_after.ru_stime - rusage_before.ru_stime
                )
                used = {n: cpu[f"router {n}"] for n in self.routers}
                involved = (
                    []
                    if label == "direct"
                    else ["CloudOne"]
                    if label == "one router"
                    else ["CloudOne", "CloudTwo"]
                )
                machine_busy = (after.machine_busy - before.machine_busy) / wall
                softirq = (after.softirq - before.softirq) / wall
                used_by_bench = (sum(cpu.values()) + loadgen_cpu) / wall
                row = {
                    "path": label,
                    "connections": conns,
                    **result.as_dict(),
                    "router_cpu_us_per_req": {
                        n: used[n] / result.requests * 1e6 if result.requests else None
                        for n in involved
                    },
                    "router_cpu_cores": {n: used[n] / wall for n in involved},
                    "backend_cpu_cores": cpu["backend"] / wall,
                    "loadgen_cpu_cores": loadgen_cpu / wall,
                    "machine_busy_cores": machine_busy,
                    "softirq_cores": softirq,
                    "other_cpu_cores": max(0.0, machine_busy - used_by_bench - softirq),
                    "other_cpu_cores_before": busy_before,
                    "other_busy_processes": others_top,
                    "router_rss_mb": {n: rss_mb(self.routers[n].pid) for n in involved},
                }
                self.results["http"].append(row)
                if result.error_count:
                    say(f"  errors: {result.errors}")
                say(
                    f"  {result.rps:,.0f} req/s, p50 {result.p50_ms:.3f} ms, p99 "
                    f"{result.p99_ms:.3f} ms"
                )

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
        if {"http", "bodies"} <= args.skip:
            return self.results
        self.choose_tools()
        self.start_federation()
        self.sanity_check()
        for name, proc in self.routers.items():
            self.results.setdefault("router_rss_idle_mb", {})[name] = rss_mb(proc.pid)
        if "http" not in args.skip:
            self.run_http()
        if "bodies" not in args.skip:
            self.run_bodies()
        for name, proc in self.routers.items():
            self.results.setdefault("router_rss_end_mb", {})[name] = rss_mb(proc.pid)
            if not proc.alive():
                raise BenchError(f"router {name} died: {proc.log_tail()}")
        self.results["router_log_tail"] = {n: p.log_tail(5) for n, p in self.routers.items()}
        return self.results


# ---------------------------------------------------------------------- rendering


def _find(rows: list[dict], path: str, conns: int) -> dict | None:
    for row in rows:
        if row["path"] == path and row["connections"] == conns:
            return row
    return None


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    out: list[str] = []
    ctx = results.get("context", {})
    settings = results.get("settings", {})
    out.append("scoperouter bench")
    out.append(
        f"machine: {ctx.get('cpus')} CPUs ({ctx.get('cpu_model')}), {ctx.get('memory_gib')} GiB, "
        f"{ctx.get('os')}; Python {ctx.get('python')}, mitmproxy {ctx.get('mitmproxy')}, "
        f"scoperouter {ctx.get('scoperouter')} ({ctx.get('commit') or 'no commit'})"
    )
    if args.router_pythonpath or args.router_python_flags:
        out.append(
            f"VARIANT: scoperouter from {ctx.get('scoperouter_path')}"
            + (
                f", routers run with python {args.router_python_flags}"
                if args.router_python_flags
                else ""
            )
        )
    others = ", ".join(
        f"pid {o['pid']} {o['cpu_pct']:.0f}% {o['cmd'][:40]}"
        for o in ctx.get("busy_processes_before", [])
    )
    out.append(
        f"load before start: loadavg {ctx.get('loadavg_before')}, {ctx.get('busy_pct_before')}% "
        f"busy over 1 s" + (f" ({others})" if others else "")
    )
    if settings:
        out.append(f"load generator: {settings.get('load_generator')}")
        out.append(f"small backend: {settings.get('backend_small')}")
        out.append(f"routers: {settings.get('router_command')}")
    out.append("")

    targets: list[report.Target] = []
    rows = results.get("http", [])
    if rows:
        out.append(
            f"[1] small requests: GET {SMALL_PATH} (~100-byte JSON), keep-alive, "
            f"{args.duration:g} s per point after {args.warmup:g} s warm-up; scope on the token "
            "and in X-Scope"
        )
        out.append(
            "    one router = CloudOne's router, image scoped to CloudOne (local backend); "
            "two routers = CloudOne's router -> CloudTwo's router -> CloudTwo's backend"
        )
        table_rows = []
        for row in rows:
            direct = _find(rows, "direct", row["connections"])
            vs = row["rps"] / direct["rps"] if direct and direct["rps"] else None
            p50_add = row["p50_ms"] - direct["p50_ms"] if direct else None
            cpu = row["router_cpu_us_per_req"]
            rss = row["router_rss_mb"]
            table_rows.append(
                [
                    row["path"],
                    str(row["connections"]),
                    f"{row['rps']:,.0f}",
                    f"{vs:.3f}" if vs is not None and row["path"] != "direct" else "1",
                    f"{row['p50_ms']:.3f}",
                    f"{row['p99_ms']:.3f}",
                    f"+{p50_add:.3f}" if row["path"] != "direct" and p50_add is not None else "",
                    " + ".join(f"{v:,.0f}" for v in cpu.values() if v is not None) or "",
                    " / ".join(f"{v:.0f}" for v in rss.values()) or "",
                    f"{row['machine_busy_cores']:.2f} ({row['other_cpu_cores']:.2f})",
                    str(
                        row["error_count"] if "error_count" in row else sum(row["errors"].values())
                    ),
                ]
            )
        out.append(
            report.table(
                [
                    "path",
                    "conns",
                    "req/s",
                    "x direct",
                    "p50 ms",
                    "p99 ms",
                    "p50 added",
                    "router CPU us/req",
                    "router RSS MB",
                    "busy cores (others)",
                    "errors",
                ],
                table_rows,
            )
        )
        out.append(
            "    router CPU us/req: CPU time of each router on the path per request (CloudOne + "
            "CloudTwo); router RSS after the point; busy cores: the whole machine during the "
            "point, (others) = not the bench's processes"
        )
        noisy = max(r["other_cpu_cores"] for r in rows)
        if noisy > 0.25:
            out.append(
                f"    WARNING: other processes used up to {noisy:.2f} cores during these points "
                "(2 cores in all): absolute figures are low and noisy; compare ratios, rerun "
                "on a quiet machine"
            )
            seen: dict[str, int] = {}
            for r in rows:
                for o in r.get("other_busy_processes", []):
                    seen[o["cmd"]] = max(seen.get(o["cmd"], 0), o["cpu_pct"])
            if seen:
                out.append(
                    "    busiest other processes: "
                    + "; ".join(
                        f"{c} ({v}%)" for c, v in sorted(seen.items(), key=lambda x: -x[1])[:4]
                    )
                )
        # Per-hop figures and targets.
        d1, r1, t1 = (_find(rows, p, 1) for p in PATH_LABELS)
        lines = []
        hop_values = []
        if d1 and r1:
            hop = r1["p50_ms"] - d1["p50_ms"]
            hop_values.append(hop)
            lines.append(f"one router: +{hop:.3f} ms")
        if d1 and t1:
            hop2 = (t1["p50_ms"] - d1["p50_ms"]) / 2
            hop_values.append(hop2)
            extra = f"; second hop alone +{t1['p50_ms'] - r1['p50_ms']:.3f} ms" if r1 else ""
            lines.append(f"two routers: +{hop2:.3f} ms per hop{extra}")
        if lines:
            out.append("    added p50 per hop at 1 connection: " + "; ".join(lines))
            worst = max(hop_values)
            targets.append(
                report.Target(
                    "added p50 per hop, 1 connection",
                    f"<= {report.TARGET_HOP_P50_MS:g} ms",
                    " / ".join(f"{h:.3f} ms" for h in hop_values)
                    + " (one router / per hop of two)",
                    worst <= report.TARGET_HOP_P50_MS,
                )
            )
        max_conns = max(r["connections"] for r in rows)
        r50 = _find(rows, "one router", max_conns)
        t50 = _find(rows, "two routers", max_conns)
        if r50:
            cpu_us = r50["router_cpu_us_per_req"].get("CloudOne")
            cap = f", CPU-bound capacity {1e6 / cpu_us:,.0f} req/s per core" if cpu_us else ""
            out.append(
                f"    one router at {max_conns} connections: {r50['rps']:,.0f} req/s, "
                f"{r50['router_cpu_cores']['CloudOne']:.2f} cores used{cap}"
            )
            targets.append(
                report.Target(
                    "req/s per router process",
                    f">= {report.TARGET_RPS:,.0f}",
                    f"{r50['rps']:,.0f} (one router, {max_conns} conns)",
                    r50["rps"] >= report.TARGET_RPS,
                )
            )
        if t50:
            cpus = t50["router_cpu_us_per_req"]
            out.append(
                f"    two routers at {max_conns} connections: {t50['rps']:,.0f} req/s through the "
                "chain (both routers, wrk and the backend share 2 cores); router CPU per request: "
                + ", ".join(f"{n} {v:,.0f} us" for n, v in cpus.items() if v)
            )
        rss_after = {
            n: max((r["router_rss_mb"].get(n, 0) for r in rows), default=0)
            for n in ("CloudOne", "CloudTwo")
        }
        out.append(
            "    router RSS: idle "
            + ", ".join(f"{n} {v:.0f} MB" for n, v in results.get("router_rss_idle_mb", {}).items())
            + "; after the load "
            + ", ".join(f"{n} {v:.0f} MB" for n, v in rss_after.items())
        )
        out.append("")

    dec = results.get("decision", [])
    if dec:
        out.append(
            "[2] routing decision alone: scoperouter.routing.decide(), GET /v2/images?limit=20 on "
            "the image frontend, the client plugin's complete 5-service scope on the token and in "
            "X-Scope; best of 5 timings"
        )
        builds = {b["clouds"]: b for b in results.get("catalog_builds", [])}
        table_rows = []
        for d in dec:
            b = builds.get(d["clouds"])
            # The target is for requests of a running session; a new scope's first request is
            # shown for information.
            targeted = d["clouds"] >= 1000 and "cache miss" not in d["case"]
            ok = d["us_per_decision"] <= report.TARGET_DECISION_US if targeted else None
            table_rows.append(
                [
                    f"{d['clouds']} x {d['services']}",
                    d["case"],
                    f"{d['us_per_decision']:.2f}",
                    f"{d['us_median']:.2f}",
                    f"{d['iterations']:,}",
                    d["outcome"],
                    f"{b['build_ms']:.0f}" if b else "",
                    report.mark(ok) if ok is not None else "",
                ]
            )
        out.append(
            report.table(
                [
                    "clouds x services",
                    "case",
                    "us best",
                    "us median",
                    "calls",
                    "decided",
                    "catalog build ms",
                    "<=5us",
                ],
                table_rows,
                align="llrrrlrr",
            )
        )
        typical = next(
            (
                d
                for d in dec
                if d["clouds"] >= 1000 and d["case"].startswith("scoped, image on another")
            ),
            None,
        )
        if typical:
            targets.append(
                report.Target(
                    "routing decision, 1000 clouds",
                    f"<= {report.TARGET_DECISION_US:g} us",
                    f"{typical['us_per_decision']:.2f} us (scoped, cross-cloud)",
                    typical["us_per_decision"] <= report.TARGET_DECISION_US,
                )
            )
        out.append("")

    transfers = results.get("transfers", [])
    if transfers:
        size_mb = transfers[0]["size"] / 2**20
        out.append(
            f"[3] large bodies: {size_mb:.0f} MiB PUT and GET on object-store, scoped to CloudTwo, "
            f"entering at CloudOne's router; backend: {backend.BIG_HINT}"
        )
        table_rows = []
        peak_all = 0.0
        for t in transfers:
            direct = next(
                (
                    x
                    for x in transfers
                    if x["direction"] == t["direction"] and x["path"] == "direct"
                ),
                None,
            )
            vs = t["mb_per_s"] / direct["mb_per_s"] if direct else None
            routed = t["path"] != "direct"
            if routed:
                peak_all = max(peak_all, *t["rss_peak_mb"].values())
            table_rows.append(
                [
                    t["direction"],
                    t["path"],
                    f"{t['seconds']:.2f}",
                    f"{t['mb_per_s'] * 1e6 / 2**20:,.0f}",
                    f"{vs:.2f}" if vs is not None and routed else "1",
                    " / ".join(f"{v:.0f}" for v in t["rss_before_mb"].values()) if routed else "",
                    " / ".join(f"{v:.0f}" for v in t["rss_peak_mb"].values()) if routed else "",
                ]
            )
        out.append(
            report.table(
                [
                    "transfer",
                    "path",
                    "seconds",
                    "MiB/s",
                    "x direct",
                    "router RSS before MB",
                    "router RSS peak MB",
                ],
                table_rows,
                align="llrrrrr",
            )
        )
        out.append("    RSS: CloudOne / CloudTwo, sampled every 10 ms during the transfer")
        targets.append(
            report.Target(
                f"router RSS during {size_mb:.0f} MiB transfers",
                f"<= {report.TARGET_RSS_MB:g} MB",
                f"{peak_all:.0f} MB peak",
                peak_all <= report.TARGET_RSS_MB,
            )
        )
        out.append("")

    if targets:
        out.append("targets (this machine: 2 cores)")
        out.append(report.targets_table(targets))
    return "\n".join(out)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.router_pythonpath:
        sys.path.insert(0, str(Path(args.router_pythonpath).resolve()))
    bench = Bench(args)
    import atexit

    atexit.register(bench.procs.stop_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    started = time.monotonic()
    status = 0
    try:
        results = bench.run()
        results["elapsed_s"] = round(time.monotonic() - started, 1)
        results["args"] = {k: v for k, v in vars(args).items() if k not in ("skip",)}
        text = render(results, args)
        print(text)
        print(f"\n(bench took {results['elapsed_s']:.0f} s)")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
            say(f"figures written to {args.json}")
    except KeyboardInterrupt:
        say("interrupted: stopping the bench's processes")
        status = 130
    except BenchError as exc:
        say(f"error: {exc}")
        status = 1
    finally:
        bench.cleanup()
    return status


if __name__ == "__main__":
    sys.exit(main())
