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
``openstack`` CLI, one process per command; at each ``--concurrency``, ``--requests`` per point
(50 rounds of its clients, at least 200) after ``--warmup`` requests (10 rounds, at least 60)
sent by the same clients without a pause, their first requests spread over one round trip:
the steady state of independent clients, not the burst of clients started in the same
millisecond, in step for rounds after):

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
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import wan_clouds, wan_verdict
from bench.procs import BenchError
from bench.report import as_dicts, exit_status, not_passed, targets_table
from bench.wan_http import _load, _serve
from bench.wan_link import forward
from bench.wan_render import render
from bench.wan_run import Wan, say


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
    load.add_argument("--warmup", type=int, default=0, help="requests before -n, not measured")
    load.add_argument(
        "--spread-ms", type=float, default=0.0, help="with --warmup: the clients' starts spread"
    )
    parser.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay (25)")
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="measured per point (50 rounds of the point's clients, at least 200)",
    )
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
        help="requests sent before each point by the same clients, not measured, the point's "
        "requests following without a pause; the clients' starts spread over one round trip "
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
                args.warmup,
                args.spread_ms / 1000,
                lambda: print("warm", flush=True),  # the bench reads its counters then
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
        "requests": args.requests or "50 rounds of each point's clients, at least 200",
        "router_workers": args.router_workers,
    }
    if args.clouds is not None:
        result["machine"]["clouds"] = args.clouds
    return result


if __name__ == "__main__":
    sys.exit(main())
