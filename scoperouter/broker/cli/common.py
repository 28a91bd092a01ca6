"""What the broker's commands share: the ``--config`` argument, reading it, opening the
database, config errors as one line, a plain table."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from scoperouter.broker.config import BrokerConfig, BrokerConfigError, load_config

if TYPE_CHECKING:
    from scoperouter.broker.store import Store

Command = Callable[[argparse.Namespace], int]


def guard(func: Command) -> Command:
    """Config errors as one line on stderr and exit 2, not a traceback."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except BrokerConfigError as exc:
            print(f"scoperouter broker: {exc}", file=sys.stderr)
            return 2

    return guarded


def config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="broker config (YAML)")


def load(args: argparse.Namespace) -> BrokerConfig:
    return load_config(args.config)


def open_store(config: BrokerConfig) -> Store:
    """The database the config names, refused (BrokerConfigError) when its schema is not
    current: the operator commands never upgrade it behind the operator's back."""
    from scoperouter.broker import migrate
    from scoperouter.broker.store import Store

    url = config.database_url()
    if not migrate.is_current(url):
        raise BrokerConfigError(
            "the database schema is not current: run `scoperouter broker db upgrade --config "
            "FILE` first"
        )
    return Store(url)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())
