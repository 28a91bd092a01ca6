"""MkDocs hook: the ``--help`` of a ``scoperouter`` command, generated when the site is built.

A page line ``<!-- generated: scoperouter pki issue --help -->`` becomes that command's help,
as ``scoperouter pki issue --help`` prints it (100 columns wide), in a code block. A command
that does not exist fails the build. ``python docs/hooks/cli_help.py pki issue`` prints one.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from scoperouter.cli import build_parser

MARKER = re.compile(
    r"^<!-- generated: scoperouter(?P<command>(?: [a-z][a-z-]*)*) --help -->$", re.M
)
WIDTH = "100"


class NoSuchCommand(Exception):
    """A page asks for the help of a command the CLI does not have."""


def subcommand(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.ArgumentParser:
    for word in words:
        choices: dict[str, argparse.ArgumentParser] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                choices = action.choices
        if word not in choices:
            found = ", ".join(choices) or "none"
            raise NoSuchCommand(f"{parser.prog} has no command {word!r} (commands: {found})")
        parser = choices[word]
    return parser


def help_text(words: Sequence[str]) -> str:
    """What ``scoperouter WORDS --help`` prints, without what depends on this machine."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        text = subcommand(build_parser(), words).format_help()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    # `serve --workers`: "(default: the number of cores, 2 here)" names the build machine's
    return re.sub(r"the number of cores, \d+ here", "the number of cores", text).rstrip()


def _block(match: re.Match[str]) -> str:
    words = match.group("command").split()
    return "```text\n" + help_text(words) + "\n```"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(_block, markdown)


if __name__ == "__main__":
    print(help_text(sys.argv[1:]))
