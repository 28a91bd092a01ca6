"""Entry point of one router worker process (started by the supervisor, not by hand).

    python -m scoperouter.proxy.worker --config F --cloud C --control-fd N \\
        --listen-fd HOST:PORT=FD ... [--drain S] [--worker I]

The listening sockets and the control socket are inherited file descriptors.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from scoperouter.proxy import logs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scoperouter.proxy.worker")
    parser.add_argument("--config", required=True, help="the copy checked by the supervisor")
    parser.add_argument("--config-source", help="the original file (for messages)")
    parser.add_argument("--config-dir", help="the original's directory (for relative paths)")
    parser.add_argument("--cloud", required=True)
    parser.add_argument("--control-fd", type=int)
    parser.add_argument("--listen-fd", action="append", default=[], metavar="HOST:PORT=FD")
    parser.add_argument("--drain", type=float, default=10.0)
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    args = parser.parse_args(argv)
    logs.setup(args.log_level, args.log_format, args.cloud, worker=args.worker)
    sockets: dict[tuple[str, int], socket.socket] = {}
    for item in args.listen_fd:
        address, _, fd = item.rpartition("=")
        host, _, port = address.rpartition(":")
        sockets[(host.strip("[]").lower(), int(port))] = socket.socket(fileno=int(fd))
    control = socket.socket(fileno=args.control_fd) if args.control_fd is not None else None

    from scoperouter.proxy.engine import run_worker  # mitmproxy is imported from here on

    base_dir = Path(args.config_dir) if args.config_dir else None
    return run_worker(
        args.config, args.cloud, sockets, control, args.drain, args.config_source, base_dir
    )


if __name__ == "__main__":
    sys.exit(main())
