"""The `lab` subcommand: `scoperouter lab up|status|down`.

`scoperouter/cli.py` calls :func:`register`; ``python -m scoperouter_lab`` runs it standalone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scoperouter_lab.layout import (
    ALL,
    DEFAULT_SERVICES,
    MAX_CLOUDS,
    SELECTABLE,
    default_dir,
    resolve_services,
)

DESCRIPTION = """\
Real OpenStack clouds on this machine, each fronted by a scoperouter.

Cloud i (CloudOne, CloudTwo, ...) runs keystone, glance, placement, nova (fake virt driver) and a
small network stand-in (one shared network and its ports) on 127.0.1.(1+i), and with
--services also cinder (its fake volume driver), swift (storage in the lab dir) and heat; its
router listens on 127.0.0.(1+i) at the same ports (what the keystone catalog advertises) and on
127.0.0.(1+i):3128 (the services' HTTP proxy). PostgreSQL and RabbitMQ on 127.0.0.1 are shared.
Everything listens on loopback only.
"""

UP_HELP = """\
Install what is missing (Debian packages postgresql and rabbitmq-server, a virtualenv with the
pinned OpenStack release in <dir>/venv), start every process that is not already running and
healthy, seed each cloud (region = cloud name; users admin, demo and alt_demo with projects demo
and alt_demo; devstack's flavors m1.tiny .. m1.xlarge, cirros256, ds512M .. ds4G; images tiny and
cirros-0.6.3-x86_64-disk; a shared network `private`) and write <dir>/clouds.yaml and
<dir>/federation.yaml. Safe to re-run: healthy processes are left alone, one-time steps are
skipped. First run ~4-5 minutes, re-runs seconds.
"""


def _dir(value: str | None) -> Path:
    return Path(value).expanduser() if value else default_dir()


def _add_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        metavar="PATH",
        help="lab directory (default: $SCOPEROUTER_LAB_DIR or ~/.local/share/scoperouter/lab; "
        f"now {default_dir()})",
    )


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add `lab` (with up, status, down) to a parent parser's subcommands."""
    lab = subparsers.add_parser(
        "lab",
        help="run real OpenStack clouds on loopback, each behind a scoperouter",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = lab.add_subparsers(dest="lab_command", metavar="{up,status,restart,down}")
    sub.required = True

    up = sub.add_parser(
        "up",
        help="install, start and seed the lab (idempotent)",
        description=UP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument(
        "--clouds",
        type=int,
        metavar="N",
        help=f"number of clouds, 1..{MAX_CLOUDS} (default: 2, or what the lab has)",
    )
    up.add_argument(
        "--services",
        metavar="LIST",
        help=f"comma-separated subset of {','.join(SELECTABLE)}, or {ALL} (default: what the "
        f"lab has, else {','.join(DEFAULT_SERVICES)}); dependencies are added (nova needs "
        "glance and placement; all need keystone); services left out are stopped",
    )
    mode = up.add_mutually_exclusive_group()
    mode.add_argument(
        "--no-router",
        dest="router",
        action="store_const",
        const="no",
        default="auto",
        help="do not start routers: the catalogs point straight at the services",
    )
    mode.add_argument(
        "--require-router",
        dest="router",
        action="store_const",
        const="yes",
        help="fail when `scoperouter serve` is not usable (default: fall back to no router "
        "with a warning)",
    )
    up.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every endpoint of every cloud in https: the services serve TLS with certificates "
        "of the lab's CA (<dir>/pki), the routers' frontends too, the services call each other "
        "through their router's forward proxy (HTTPS_PROXY, intercepted) and trust the lab's "
        "CA and their router's interception CA; clouds.yaml names the CA (cacert). Default: "
        "what the lab had, else plain HTTP (--no-tls turns it off again)",
    )
    _add_dir(up)
    up.set_defaults(lab_func=_up)

    status = sub.add_parser(
        "status",
        help="show each process (PID, RSS) and each endpoint's health",
        description="Show every lab process (PID, state, memory, log) and the HTTP status of "
        "each endpoint through the catalog URL (the router) and at the backend. Exit status 1 "
        "when something is down.",
    )
    _add_dir(status)
    status.set_defaults(lab_func=_status)

    restart = sub.add_parser(
        "restart",
        help="restart named processes whose config or drop-in environment changed",
        description="Restart the named processes of a running lab (e.g. cloudone-glance, "
        "cloudone-nova-compute; `lab status` lists them) whose definition changed since they "
        "started: their config files, or the Environment= lines of their systemd-style "
        "drop-ins in <dir>/systemd/<process>.service.d/*.conf. Nothing else is touched (no "
        "seeding, the catalog stays as it is). Processes that did not change keep running.",
    )
    restart.add_argument("processes", nargs="+", metavar="PROCESS")
    _add_dir(restart)
    restart.set_defaults(lab_func=_restart)

    down = sub.add_parser(
        "down",
        help="stop what `lab up` started (by saved PID)",
        description="Stop exactly the processes `lab up` started, by their saved PIDs and "
        "process groups. Data is kept unless --purge.",
    )
    down.add_argument(
        "--purge",
        action="store_true",
        help="also delete the lab's data, configs, logs, clouds.yaml and federation.yaml "
        "(the OpenStack venv is kept)",
    )
    down.add_argument("--purge-venv", action="store_true", help="with --purge: delete the venv too")
    _add_dir(down)
    down.set_defaults(lab_func=_down)
    lab.set_defaults(func=run)
    return lab


def run(args: argparse.Namespace) -> int:
    from scoperouter_lab.infra import LabError

    try:
        return int(args.lab_func(args))
    except LabError as exc:
        print(f"scoperouter lab: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; processes started so far keep running (scoperouter lab down)",
              file=sys.stderr)  # fmt: skip
        return 130


def _up(args: argparse.Namespace) -> int:
    from scoperouter_lab.lab import Lab

    try:
        services = resolve_services(args.services) if args.services else None
    except ValueError as exc:
        print(f"scoperouter lab up: {exc}", file=sys.stderr)
        return 2
    return Lab(
        _dir(args.dir),
        args.clouds,
        services,
        router=args.router,
        tls=args.tls,
    ).up()


def _status(args: argparse.Namespace) -> int:
    from scoperouter_lab.lab import Lab

    return Lab(_dir(args.dir)).status()


def _restart(args: argparse.Namespace) -> int:
    from scoperouter_lab.lab import Lab

    return Lab(_dir(args.dir)).restart(args.processes)


def _down(args: argparse.Namespace) -> int:
    from scoperouter_lab.lab import Lab

    return Lab(_dir(args.dir)).down(purge=args.purge, purge_venv=args.purge_venv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scoperouter")
    sub = parser.add_subparsers(dest="command", metavar="{lab}")
    sub.required = True
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))
