"""Tables as the ``openstack`` CLI prints them (cliff's table formatter): boxed, a header row."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """`rows` under `header` in a box of ``+---+`` and ``|`` lines, each cell left-aligned."""
    cells = [[str(v) for v in header], *([str(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |"

    return "\n".join([rule, line(cells[0]), rule, *(line(row) for row in cells[1:]), rule])
