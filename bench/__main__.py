"""``python -m bench``: the scoperouter benchmark, in one run (see bench/README.md).

1. small requests: a tiny backend direct, through one router (local routing) and through two
   routers (cross-cloud), at 1 and 50 connections: req/s, p50/p99, router CPU and RSS; then the
   cost of the per-request INFO log line;
2. the routing decision alone at 2 and 1000 clouds x 10 services;
3. a 100 MiB upload and download through two routers vs direct, with the routers' peak RSS.

Progress goes to stderr, the table to stdout, the figures to --json FILE. The parts:
``options`` (command line), ``machine`` (context and noise), ``run`` (processes and
measurements), ``render`` (the report), with ``load``, ``backend``, ``transfer``, ``decision``.
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from pathlib import Path

from bench.options import parse_args
from bench.procs import BenchError, interrupt_on_termination
from bench.render import render
from bench.run import Bench, say


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.router_pythonpath:
        sys.path.insert(0, str(Path(args.router_pythonpath).resolve()))
    bench = Bench(args)
    atexit.register(bench.procs.stop_all)
    interrupt_on_termination()
    started = time.monotonic()
    status = 0
    try:
        results = bench.run()
        results["elapsed_s"] = round(time.monotonic() - started, 1)
        results["args"] = {k: v for k, v in vars(args).items() if k not in ("skip",)}
        print(render(results, args))
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
