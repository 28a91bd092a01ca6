"""Where a router worker's time goes under load: `python -m bench.profile`.

The two-cloud federation of `python -m bench` (CloudOne's router, `--router-workers` workers,
`python -O`), wrk on CloudOne's image frontend with a scope naming CloudOne, and at each
connection count, while wrk runs:

* each worker's user and system CPU per request (from ``/proc/<pid>/stat``),
* with ``--strace``: ``strace -c`` on each worker (system calls per request; strace slows the
  worker, so the CPU figures of that pass are not comparable),
* with ``--py-spy PATH``: a py-spy sampling profile of each worker (``-f raw``), summed into the
  functions with the most samples, on their own (self) and with what they call (inclusive).

    .venv/bin/python -m bench.profile --connections 1,50,1000
    .venv/bin/python -m bench.profile --connections 50 --py-spy ~/tools/bin/py-spy --top 25
    .venv/bin/python -m bench.profile --connections 50 --py-spy ~/tools/bin/py-spy --native
    .venv/bin/python -m bench.profile --connections 1,50 --strace

Run it on a quiet machine; see bench/README.md, "Profiling a router".
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import load
from .options import parse_args
from .procs import BenchError
from .run import Bench, say

FRAME = re.compile(r"(?P<func>.*) \((?P<file>[^()]*?):\d+\)$")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(user, system) clock ticks of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def frame_name(frame: str) -> str:
    m = FRAME.match(frame)
    return f"{m['func']} ({Path(m['file']).name})" if m else frame


def summarize(files: list[Path]) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Self and inclusive samples per function of py-spy's raw (collapsed stack) files."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for path in files:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = [frame_name(f) for f in stack.split(";")]
            own[frames[-1]] += n
            for name in set(frames):
                inclusive[name] += n
    return own, inclusive, total


def spies(args: argparse.Namespace, workers: list[int], out: Path, conns: int) -> list[Path]:
    """Start the profilers of one point; returns the files py-spy will write."""
    files: list[Path] = []
    for pid in workers:
        if args.py_spy:
            path = out / f"py-spy-{conns}-{pid}.txt"
            files.append(path)
            argv = [args.py_spy, "record", "-p", str(pid), "-d", str(round(args.seconds))]
            argv += ["-r", "250", "-f", "raw", "-o", str(path)]
            # --native stops the worker to read its C stack (py-spy refuses it with
            # --nonblocking): the CPU figures of a native pass are not comparable
            argv.append("--native" if args.native else "--nonblocking")
        elif args.strace:
            path = out / f"strace-{conns}-{pid}.txt"
            files.append(path)
            argv = ["timeout", "-s", "INT", str(round(args.seconds) - 1), "strace", "-c"]
            argv += ["-p", str(pid), "-o", str(path)]
        else:
            continue
        subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", default="1,50,1000", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of load per point")
    parser.add_argument("--router-workers", type=int, default=2)
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy's binary: sample each worker")
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --py-spy: C frames too (the compiled build's functions are C: without it "
        "their time is their Python caller's)",
    )
    parser.add_argument("--strace", action="store_true", help="count each worker's syscalls")
    parser.add_argument("--top", type=int, default=15, help="functions shown per point")
    parser.add_argument("--out", default="profile-out", help="directory for the raw files")
    args = parser.parse_args(argv)
    if args.strace and not shutil.which("strace"):
        parser.error("strace is not installed")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench_args = parse_args(
        ["--router-python-flags=-O", "--router-workers", str(args.router_workers)]
    )
    bench = Bench(bench_args)
    try:
        bench.choose_tools()
        bench.start_federation()
        bench.sanity_check()
        assert bench.tool is not None
        host, port, headers, _ = bench.targets()["one router"]
        url = f"http://{host}:{port}/v2/images"
        router = bench.routers["CloudOne"]
        bench.procs.remember_children(router)
        workers = sorted(router.children)
        tick = os.sysconf("SC_CLK_TCK")
        for conns in [int(c) for c in args.connections.split(",")]:
            load.run_load(bench.tool, url, conns, 2, headers, bench.workdir, bench._sub_env())
            before = {pid: cpu_ticks(pid) for pid in workers}
            files = spies(args, workers, out, conns)
            time.sleep(0.3)
            result = load.run_load(
                bench.tool, url, conns, args.seconds, headers, bench.workdir, bench._sub_env()
            )
            after = {pid: cpu_ticks(pid) for pid in workers}
            time.sleep(1.5)  # the profilers write their files
            requests = result.rps * args.seconds
            user = sum(after[p][0] - before[p][0] for p in workers) / tick
            system = sum(after[p][1] - before[p][1] for p in workers) / tick
            print(
                f"\n{conns} connection(s): {result.rps:,.0f} req/s; workers' CPU per request: "
                f"user {1e6 * user / requests:.1f} µs, system {1e6 * system / requests:.1f} µs "
                f"({100 * system / max(user + system, 1e-9):.0f} % system)"
            )
            if args.strace:
                for path in files:
                    print(f"  {path.name}:\n" + path.read_text() if path.exists() else "")
            elif args.py_spy:
                own, inclusive, total = summarize([f for f in files if f.exists()])
                print(f"  py-spy: {total} samples; self:")
                for name, n in own.most_common(args.top):
                    print(f"    {100 * n / max(total, 1):5.1f} % {name}")
                print("  inclusive:")
                for name, n in inclusive.most_common(args.top + 10):
                    print(f"    {100 * n / max(total, 1):5.1f} % {name}")
    except BenchError as exc:
        say(f"error: {exc}")
        return 1
    finally:
        bench.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
