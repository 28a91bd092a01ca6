"""The bench's command line (see bench/README.md)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any


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
        "--router-workers",
        type=int,
        default=2,
        help="worker processes per router (scoperouter serve --workers; 0: do not pass the "
        "option, for a router from before it)",
    )
    parser.add_argument(
        "--no-log-cost",
        action="store_true",
        help="skip the INFO vs WARNING point (the cost of the per-request log line)",
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


def apply_preset(args: argparse.Namespace, preset: Mapping[str, Any]) -> None:
    """The options left unset (None) take the preset's value: a bench's full-run defaults or
    its --smoke ones, the options given on the command line kept."""
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
