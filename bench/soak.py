"""``python -m bench.soak``: the two-cloud federation under a steady load for a long time.

    python -m bench.soak                      # 1 hour at 500 req/s (by hand, a quiet machine)
    python -m bench.soak --smoke              # 3 minutes at 200 req/s (.ci/run)
    python -m bench.soak --duration 20m --rate 300 --json soak.json

The routers and backends of ``python -m bench`` (:class:`bench.run.Bench`: CloudOne's and
CloudTwo's routers, ``--workers`` each, nginx and the asyncio large-body backend), plus a cloud
in the config whose router never runs (``CloudDown``) and each router's ``/metrics``. Open-loop
generators (:mod:`bench.soak_traffic`) send the scope mix at ``--rate``; meanwhile every
``--reload-every`` seconds each router's supervisor gets a SIGHUP, every ``--transfer-every``
seconds a 100 MiB upload then download crosses both routers (SHA-256 checked), and every
``--sample-every`` seconds each router process's RSS and open files are sampled and the routers'
logs read. At the end: a timeline, the findings and the verdicts (:mod:`bench.soak_verdict`),
PASS or MISS; exit status 1 on a MISS. Progress goes to stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import http.client
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench import soak_reloads, soak_verdict, transfer
from bench.machine import machine_context
from bench.options import apply_preset
from bench.options import parse_args as bench_args
from bench.procs import (
    BenchError,
    CpuSample,
    Proc,
    cpu_sample,
    free_port,
    interrupt_on_termination,
)
from bench.report import exit_status, fmt, mark, not_passed
from bench.run import Bench, scoped_headers
from bench.soak_traffic import DOWN_CLOUD, MIX, Kind, check, merge, percentile
from bench.soak_verdict import LogFindings, Record, clock

DOWN_HOST = "127.0.0.4"  # CloudDown's router would be there: nothing listens
SMOKE = {
    "duration": 180.0,
    "rate": 200.0,
    "reload_every": 30.0,
    "transfer_every": 180.0,  # one transfer, at 45 s
    "sample_every": 5.0,
}
DEFAULTS = {
    "duration": 3600.0,
    "rate": 500.0,
    "reload_every": 300.0,
    "transfer_every": 300.0,
    "sample_every": 10.0,
}
RELOAD_PHASE = 0.5  # reloads at 150 s, 450 s, ... (every 300 s)
TRANSFER_PHASE = 0.25  # transfers at 75 s, 375 s, ...: never at a reload's time by default


def say(message: str) -> None:
    print(f"[soak] {message}", file=sys.stderr, flush=True)


def seconds(text: str) -> float:
    """3600, 90s, 20m, 1h."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 90s, 20m, 1h)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="The two-cloud federation under a steady load: every request answered, "
        "no error in the logs, memory and open files flat, p99 stable (bench/README.md).",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the CI-sized run: 3 minutes at 200 req/s, a reload every 30 s, one transfer "
        "(options given too override these)",
    )
    parser.add_argument("--duration", type=seconds, help="of the traffic (default 1h; smoke 3m)")
    parser.add_argument("--rate", type=float, help="requests a second (default 500; smoke 200)")
    parser.add_argument(
        "--reload-every", type=seconds, help="SIGHUP each router every S (300; smoke 30; 0: never)"
    )
    parser.add_argument(
        "--transfer-every",
        type=seconds,
        help="a 100 MiB upload + download every S (300; smoke 180: one; 0: never)",
    )
    parser.add_argument("--transfer-mb", type=int, default=100, help="MiB per transfer")
    parser.add_argument(
        "--sample-every", type=seconds, help="RSS, open files and logs every S (10; smoke 5)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes per router")
    parser.add_argument(
        "--generators",
        type=int,
        default=1,
        help="load generator processes sharing the rate (more when one falls behind)",
    )
    parser.add_argument("--deadline", type=float, default=10.0, help="each request's, seconds")
    parser.add_argument(
        "--late-ms",
        type=float,
        default=100.0,
        help="a request sent this much after it was due counts as late (the generator's)",
    )
    parser.add_argument("--seed", type=int, default=1, help="of the scope mix")
    parser.add_argument(
        "--kinds",
        type=lambda text: [k.strip() for k in text.split(",") if k.strip()],
        help="only these kinds of the mix (comma-separated names, as the summary shows "
        "them): to narrow a finding down; the verdicts are the same",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the time series as JSON")
    parser.add_argument("--backend", choices=["auto", "nginx", "asyncio"], default="auto")
    parser.add_argument("--no-apt", action="store_true", help="never call apt-get")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (configs, logs)")
    args = parser.parse_args(argv)
    apply_preset(args, SMOKE if args.smoke else DEFAULTS)
    if args.duration <= 0 or args.rate <= 0 or args.generators < 1 or args.workers < 1:
        parser.error("--duration, --rate, --generators and --workers must be positive")
    unknown = set(args.kinds or ()) - {k.name for k in MIX}
    if unknown:
        parser.error(f"--kinds: no such kind {sorted(unknown)}; the kinds: {[k.name for k in MIX]}")
    return args


class SoakBench(Bench):
    """The bench's federation, with a cloud whose router never runs and the routers' metrics."""

    def __init__(self, args: argparse.Namespace) -> None:
        options = ["--router-workers", str(args.workers), "--backend", args.backend]
        options += ["--no-apt"] * args.no_apt + ["--keep"] * args.keep
        super().__init__(bench_args(options))
        self.metrics: dict[str, tuple[str, int]] = {}

    def federation_data(self) -> dict[str, Any]:
        data = super().federation_data()
        for name, cloud in self.clouds.items():
            self.metrics[name] = (cloud.router_host, free_port(cloud.router_host))
            data["clouds"][name]["metrics"] = {
                "listen": f"{cloud.router_host}:{self.metrics[name][1]}"
            }
        down, backend = (f"http://{DOWN_HOST}:{free_port(DOWN_HOST)}" for _ in range(2))
        data["clouds"][DOWN_CLOUD] = {
            "region": DOWN_CLOUD,
            "frontends": [{"url": down}],
            "services": {"image": {"public": {"url": down, "backend": backend}}},
        }
        return data

    def addresses(self) -> dict[str, dict[str, tuple[str, int]]]:
        """Where each kind of the mix enters: cloud -> service -> (host, port)."""
        return {
            name: {
                "image": (c.router_host, c.image_port),
                "identity": (c.router_host, c.identity_port),
                "object-store": (c.router_host, c.object_port),
            }
            for name, c in self.clouds.items()
        }

    def check_mix(self) -> None:
        """One request of each kind of the mix, before the load: each gets what it deserves."""
        addresses = self.addresses()
        for kind in MIX:
            status, ctype, body = _send(kind, addresses[kind.entry][kind.service])
            wrong = check(kind, status, ctype, body)
            if wrong is not None:
                raise BenchError(f"the mix's first requests: {wrong[0]}: {wrong[1]}")

    def scrape(self, name: str) -> dict[str, float]:
        """The router's /metrics figures the verdicts use."""
        host, port = self.metrics[name]
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    wanted = {
        'scoperouter_config_reloads_total{result="ok"}': "reloads_ok",
        'scoperouter_config_reloads_total{result="refused"}': "reloads_refused",
        "scoperouter_worker_restarts_total": "worker_restarts",
        'scoperouter_workers{state="running"}': "workers",
        "scoperouter_open_connections": "open_connections",
    }
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            out[wanted[name]] = float(value)
    out.setdefault("reloads_ok", 0.0)
    return out


def _send(kind: Kind, address: tuple[str, int]) -> tuple[int, str, bytes]:
    """One request of `kind` on a new connection: (status, Content-Type, body)."""
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        body = b"x" * kind.body_bytes or None
        conn.request(kind.method, kind.path, body=body, headers=kind.headers())
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


class LogReader:
    """Reads a router's log as it grows, line by line, into its findings."""

    def __init__(self, proc: Proc) -> None:
        self.path = proc.log
        self.offset = 0
        self.partial = b""
        self.findings = LogFindings()

    def read(self) -> None:
        with contextlib.suppress(OSError), self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
            self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self.findings.scan(line.decode(errors="replace"))


def sample(routers: dict[str, Proc]) -> dict[str, dict[str, float]]:
    """Each router process's RSS (MB) and open files: its supervisor and each worker."""
    out = {}
    for name, proc in routers.items():
        try:
            supervisor = psutil.Process(proc.pid)
            members = [("supervisor", supervisor)]
            members += [("worker", c) for c in supervisor.children(recursive=True)]
        except psutil.Error:
            continue
        for role, member in members:
            with contextlib.suppress(psutil.Error):
                out[f"{name} {role} {member.pid}"] = {
                    "rss_mb": round(member.memory_info().rss / 2**20, 2),
                    "fds": member.num_fds(),
                }
    return out


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.bench = SoakBench(args)
        duration = float(args.duration)
        self.interval = soak_verdict.interval_for(duration)
        self.reloads = soak_verdict.schedule(duration, args.reload_every, RELOAD_PHASE)
        self.transfers = soak_verdict.schedule(duration, args.transfer_every, TRANSFER_PHASE)
        self.record = Record(
            duration=duration,
            rate=float(args.rate),
            interval=self.interval,
            baseline_t=duration * soak_verdict.BASELINE_SHARE,
            workers=args.workers,
            transfers_planned=2 * len(self.transfers),  # an upload and a download each
            late_ms=args.late_ms,
        )
        self.logs: dict[str, LogReader] = {}
        self.generators: list[tuple[Proc, Path]] = []
        self.transfer_thread: threading.Thread | None = None
        self.first_transfer_end: float | None = None
        self.cpu: CpuSample | None = None
        self.t0 = 0.0

    # -- set-up

    def start(self) -> None:
        bench = self.bench
        bench.start_federation()
        bench.sanity_check()
        bench.check_mix()
        for name, proc in bench.routers.items():
            self.logs[name] = LogReader(proc)
            self.record.reloads_sent[name] = 0
        start_at = time.time() + 2.0  # the generators import and connect meanwhile
        n = self.args.generators
        for k in range(n):
            spec = {
                "start_at": start_at,
                "duration": self.record.duration,
                "rate": self.record.rate / n,
                "phase": k / n,
                "interval": self.interval,
                "deadline": self.args.deadline,
                "late_ms": self.args.late_ms,
                "seed": self.args.seed + k,
                "reloads_at": self.reloads,  # each request near one is recorded on its own
                "reload_margin": soak_reloads.MARGIN_S,
                "kinds": self.args.kinds,
                "addresses": bench.addresses(),
            }
            path = bench.workdir / f"soak-load-{k}.json"
            path.write_text(json.dumps(spec))
            out = bench.workdir / f"soak-load-{k}.jsonl"
            argv = [sys.executable, "-m", "bench.soak_traffic", str(path), str(out)]
            self.generators.append(
                (bench.procs.start(f"soak-load-{k}", argv, bench._sub_env()), out)
            )
        self.t0 = time.monotonic() + (start_at - time.time())

    # -- during the run

    def now(self) -> float:
        return time.monotonic() - self.t0

    def take_sample(self) -> None:
        t = round(self.now(), 2)
        entry: dict[str, Any] = {"t": t, "procs": sample(self.bench.routers)}
        # what the machine did since the last sample, and how much of it was not the soak's
        ours = {p.name: p.pid for p in self.bench.procs.procs} | {"soak": os.getpid()}
        cpu = cpu_sample(ours)
        if self.cpu is not None:
            wall = cpu.wall - self.cpu.wall
            used = sum(cpu.per_process[k] - self.cpu.per_process.get(k, 0.0) for k in ours)
            busy = cpu.machine_busy - self.cpu.machine_busy
            if wall > 0:
                entry["machine_cores"] = round(busy / wall, 2)
                entry["others_cores"] = round(
                    max(0.0, busy - used - (cpu.softirq - self.cpu.softirq)) / wall, 2
                )
        self.cpu = cpu
        entry["router_cpu_s"] = {  # each router's CPU time so far: supervisor and workers
            name: round(cpu.per_process[proc.name], 3) for name, proc in self.bench.routers.items()
        }
        self.record.samples.append(entry)
        for reader in self.logs.values():
            reader.read()

    def reload(self, planned: float) -> None:
        self.record.reload_times.append((planned, round(self.now(), 3)))
        for name, proc in self.bench.routers.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGHUP)
                self.record.reloads_sent[name] += 1

    def start_transfer(self) -> None:
        if self.transfer_thread is not None and self.transfer_thread.is_alive():
            say("a transfer is still running: the next one is skipped")
            return
        self.transfer_thread = threading.Thread(target=self._transfer, name="transfer")
        self.transfer_thread.start()

    def _transfer(self) -> None:
        one = self.bench.clouds["CloudOne"]
        size = self.args.transfer_mb * 2**20
        headers = scoped_headers({"object-store": "CloudTwo"})
        for direction in ("upload", "download"):
            t = round(self.now(), 1)
            try:
                ok, took, detail = transfer.checked(
                    direction, one.router_host, one.object_port, headers, size, "CloudTwo"
                )
            except (OSError, BenchError) as exc:
                ok, took, detail = False, 0.0, f"failed: {exc}"
            self.record.transfers.append(
                {
                    "t": t,
                    "direction": direction,
                    "ok": ok,
                    "seconds": round(took, 2),
                    "mb_per_s": round(size / took / 1e6, 1) if took else None,
                    "detail": detail,
                }
            )
            say(f"transfer: {direction} {self.args.transfer_mb} MiB {'intact' if ok else detail}")
        if self.first_transfer_end is None:
            self.first_transfer_end = self.now()

    def progress(self) -> None:
        lines: list[dict[str, Any]] = []
        for _, out in self.generators:
            with contextlib.suppress(OSError):
                lines += [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        recent = soak_verdict.merge_intervals(lines)[-3:]
        hist = merge([i["hist"] for i in recent])
        due = sum(i["due"] for i in recent)
        problems = sum(sum(i["problems"].values()) for i in recent)
        late = sum(i["late"] for i in recent)
        p99 = percentile(hist, 99)
        last = self.record.samples[-1]["procs"] if self.record.samples else {}
        total = sum(v["rss_mb"] for v in last.values())
        say(
            f"{clock(self.now())}/{clock(self.record.duration)}: "
            f"{due / (len(recent) * self.interval) if recent else 0:,.0f} req/s, "
            f"p99 {fmt(p99)} ms, {problems} problems, {late} late "
            f"(last {len(recent) * self.interval:g} s); routers' RSS {total:,.0f} MB in all"
        )
        if late:
            say("  the generator is falling behind (its problem, not the router's)")

    def run(self) -> None:
        args = self.args
        duration = self.record.duration
        samples = soak_verdict.schedule(duration + args.sample_every, args.sample_every, 0.0)
        events: list[tuple[float, str]] = [(t, "sample") for t in samples]
        events += [(t, "reload") for t in self.reloads] + [(t, "transfer") for t in self.transfers]
        report_every = max(30.0, duration / 30)
        events += [(t, "progress") for t in soak_verdict.schedule(duration, report_every, 1.0)]
        events.sort()
        say(
            f"{clock(duration)} at {args.rate:g} req/s: {len(self.reloads)} reloads, "
            f"{len(self.transfers)} transfers, samples every {args.sample_every:g} s"
        )
        for at, what in events:
            wait = at - self.now()
            if wait > 0:
                time.sleep(wait)
            for name, proc in self.bench.routers.items():
                if not proc.alive():
                    raise BenchError(f"the router of {name} exited: {proc.log_tail()}")
            if what == "sample":
                self.take_sample()
            elif what == "reload":
                self.reload(at)
            elif what == "transfer":
                self.start_transfer()
            else:
                self.progress()
        for proc, _ in self.generators:
            try:
                proc.popen.wait(args.deadline + 30)
            except Exception:
                raise BenchError(f"{proc.name} did not finish: {proc.log_tail()}") from None
            if proc.popen.returncode:
                raise BenchError(f"{proc.name} failed: {proc.log_tail()}")
        if self.transfer_thread is not None:
            self.transfer_thread.join()
        time.sleep(1.0)  # the routers' log lines are written in batches, at most 0.5 s late
        self.take_sample()
        for name in self.bench.routers:
            self.record.metrics[name] = self.bench.scrape(name)
        # and stopped as an operator stops them (SIGTERM: drain, exit 0), their last lines read
        for name, proc in list(self.bench.routers.items()):
            self.bench.stop_router(name)
            self.record.exit_codes[name] = proc.popen.returncode
        for reader in self.logs.values():
            reader.read()

    def finish(self) -> None:
        lines: list[dict[str, Any]] = []
        for _, out in self.generators:
            lines += [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        self.record.intervals = soak_verdict.merge_intervals(lines)
        self.record.logs = {name: reader.findings for name, reader in self.logs.items()}
        if self.first_transfer_end is not None:
            self.record.baseline_t = max(self.record.baseline_t, self.first_transfer_end)


def as_json(soak: Soak, rows: list[Any], context: dict[str, Any], elapsed: float) -> dict[str, Any]:
    record = soak.record
    intervals = [
        {**i, "hist": {str(k): v for k, v in sorted(i["hist"].items())}} for i in record.intervals
    ]
    return {
        "context": context,
        "settings": {
            **soak.bench.results["settings"],
            "args": vars(soak.args),
            "interval_s": record.interval,
            "baseline_s": record.baseline_t,
            "window_s": soak_verdict.window(record.duration),
            "reloads_at_s": soak.reloads,
            "transfers_at_s": soak.transfers,
            "mix": [{"name": k.name, "weight": k.weight, "scope": k.scope} for k in MIX],
        },
        "verdicts": [
            {"name": r.name, "goal": r.goal, "measured": r.measured, "result": mark(r.ok)}
            for r in rows
        ],
        "timeline": soak_verdict.timeline(record),
        "intervals": intervals,
        "samples": record.samples,
        "logs": {name: f.as_dict() for name, f in record.logs.items()},
        "reloads_sent": record.reloads_sent,
        "reload_times": record.reload_times,
        "metrics": record.metrics,
        "transfers": record.transfers,
        "elapsed_s": round(elapsed, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    soak = Soak(args)
    atexit.register(soak.bench.procs.stop_all)
    interrupt_on_termination()
    try:
        say("measuring what else the machine is doing (1 s)")
        context = machine_context()
        say(f"load average {context['loadavg_before']}, {context['busy_pct_before']:.0f}% busy")
        soak.start()
        soak.run()
        soak.finish()
    except KeyboardInterrupt:
        say("interrupted: stopping the soak's processes")
        soak.bench.cleanup()
        return 130
    except BenchError as exc:
        say(f"error: {exc}")
        soak.bench.cleanup()
        return 1
    soak.bench.cleanup()
    rows = soak_verdict.verdicts(soak.record)
    elapsed = time.monotonic() - started
    print(soak_verdict.render(soak.record, rows))
    print(f"\n(soak took {elapsed:.0f} s, {clock(args.duration)} of traffic)")
    if args.json:
        data = as_json(soak, rows, context, elapsed)
        Path(args.json).write_text(json.dumps(data, indent=1, default=str) + "\n")
        say(f"time series written to {args.json}")
    for line in not_passed(rows):
        print(line)
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
