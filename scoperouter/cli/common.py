"""What several commands share: reading the federation config, argument types, usage."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TypeAlias

from scoperouter.catalog import Catalog
from scoperouter.config import load_catalog
from scoperouter.errors import ConfigError

if TYPE_CHECKING:
    # What a command's ``register(subparsers)`` receives: the parent parser's subcommands.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def load(path: str, cloud: str | None = None) -> Catalog | None:
    """The federation config at `path`, or None after saying on stderr why not (invalid, or
    `cloud` not in it)."""
    try:
        catalog = load_catalog(path)
    except ConfigError as exc:
        print(f"scoperouter: invalid config: {exc}", file=sys.stderr)
        return None
    if cloud is not None and cloud not in catalog.clouds:
        print(
            f"scoperouter: cloud {cloud!r} is not in {path} "
            f"(clouds: {', '.join(sorted(catalog.clouds))})",
            file=sys.stderr,
        )
        return None
    return catalog


def usage(parser: argparse.ArgumentParser) -> int:
    """A command group run without its subcommand: its help on stderr, exit 2."""
    parser.print_help(sys.stderr)
    return 2


def cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}")
    return int(text)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
