"""``python -m bench.ab --baseline DIR``: this checkout's router against another, alternating.

On a shared machine absolute figures drift by tens of percent between minutes; two routers
measured in alternation, round after round, on the same backend, load generator and ports, drift
together. Each round restarts CloudOne's router as the baseline (``DIR/scoperouter``, e.g. an
older commit: ``git archive <commit> scoperouter | tar -x -C DIR``), measures the one-router
point, then the same with this checkout; the medians of the rounds are compared. A baseline
that has no ``--workers`` option (before issue 12) is run as one process.

    python -m bench.ab --baseline /tmp/old --connections 1 --rounds 5
    python -m bench.ab --baseline /tmp/old --connections 50 --rounds 3 --workers 2
    python -m bench.ab --baseline /tmp/old --connections 50 --workers 2 --level INFO

``--log-cost`` compares this checkout with itself instead: at INFO (one access line per
request) against WARNING, alternating in the same way (the ``[1b]`` part of the bench, with
rounds):

    python -m bench.ab --log-cost --connections 50 --rounds 5 --workers 2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.procs import BenchError
from bench.run import Bench, say


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--baseline", metavar="DIR", help="compare with DIR/scoperouter")
    what.add_argument(
        "--log-cost", action="store_true", help="compare the router at INFO with WARNING"
    )
    parser.add_argument(
        "--code", metavar="DIR", help="run DIR/scoperouter instead of this checkout's"
    )
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="this checkout's --workers")
    parser.add_argument(
        "--level",
        default="WARNING",
        choices=["WARNING", "INFO"],
        help="both routers' log level with --baseline (INFO: compare the access line's cost)",
    )
    return parser.parse_args(argv)


def has_workers_option(baseline: Path) -> bool:
    """Whether the baseline's ``serve`` takes ``--workers`` (its CLI was one module before
    it became a package of a module per command)."""
    package = baseline / "scoperouter"
    sources = [package / "cli.py", package / "cli" / "serve.py"]
    return any(path.is_file() and "--workers" in path.read_text() for path in sources)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # name -> (DIR of the scoperouter package or None for this checkout, workers, log level)
    variants: dict[str, tuple[Path | None, int, str]]
    code = Path(args.code).resolve() if args.code else None
    for path in (code, args.baseline and Path(args.baseline).resolve()):
        if path and not (path / "scoperouter").is_dir():
            print(f"no scoperouter package in {path}", file=sys.stderr)
            return 2
    if args.log_cost:
        variants = {
            "WARNING": (code, args.workers, "WARNING"),
            "INFO": (code, args.workers, "INFO"),
        }
    else:
        baseline = Path(args.baseline).resolve()
        variants = {
            "baseline": (baseline, args.workers if has_workers_option(baseline) else 0, args.level),
            "this": (code, args.workers, args.level),
        }
    from bench.options import parse_args as bench_args

    options = bench_args(
        [
            "--duration", str(args.duration),
            "--connections", str(args.connections),
            "--router-workers", str(args.workers),
            "--quiet-wait", "10",
        ]
    )  # fmt: skip
    bench = Bench(options)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    try:
        bench.choose_tools()
        bench.start_federation()
        for round_ in range(args.rounds):
            for name, (path, workers, level) in variants.items():
                bench.stop_router("CloudOne")
                bench.args.router_pythonpath = str(path) if path else None
                bench.args.router_workers = workers
                bench.start_router("CloudOne", level)
                row = bench.measure("one router", args.connections)
                rows[name].append(row)
                say(f"round {round_ + 1}, {name}: {row['rps']:,.0f} req/s")
    except (BenchError, subprocess.SubprocessError) as exc:
        say(f"error: {exc}")
        return 1
    finally:
        bench.cleanup()
    print(report(rows, args))
    return 0


def report(rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    base_name, this_name = rows  # the variants, in their order

    def median(name: str, key: str) -> float:
        values = [v for v in (_value(row, key) for row in rows[name]) if v == v]  # not nan
        return statistics.median(values) if values else float("nan")

    lines = [
        f"one router, {args.connections} connection(s), {args.rounds} alternating rounds of "
        f"{args.duration:g} s (medians)",
        f"{'':28}{base_name:>12}{this_name:>12}{'ratio':>9}",
    ]
    for label, key in (
        ("req/s", "rps"),
        ("p50 ms", "p50_ms"),
        ("router CPU us/req", "router_cpu_us_per_req"),
        ("router instructions/req", "router_instructions_per_req"),
    ):
        base, this = median(base_name, key), median(this_name, key)
        lines.append(f"{label:28}{base:12,.3f}{this:12,.3f}{this / base:9.3f}")
    for label, key in (("req/s", "rps"), ("router CPU us/req", "router_cpu_us_per_req")):
        lines.append(
            f"  {label} per round: "
            + "; ".join(
                f"{name} " + ", ".join(f"{_value(row, key):,.0f}" for row in rows[name])
                for name in rows
            )
        )
    return "\n".join(lines)


def _value(row: dict[str, Any], key: str) -> float:
    """A figure of the row (CloudOne's, for per-router ones); nan when it was not measured
    (instructions without perf)."""
    value = row.get(key)
    if isinstance(value, dict):
        value = value.get("CloudOne")
    return float("nan") if value is None else float(value)


if __name__ == "__main__":
    sys.exit(main())
