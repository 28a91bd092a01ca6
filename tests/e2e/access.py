"""The routers' access lines as the e2e tests read them from a lab router's log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def access_lines(
    path: Path, since: int, match: Callable[[dict[str, Any]], bool], count: int = 1
) -> list[dict[str, Any]]:
    """The access lines a router wrote after byte `since` of its log that `match`, once there
    are `count` of them (lines are written in batches, up to half a second late; 10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        with path.open("rb") as fh:
            fh.seek(since)
            lines = fh.read().decode(errors="replace").splitlines()
        found = [
            entry
            for entry in (
                json.loads(line)
                for line in lines
                if line.startswith("{") and '"scoperouter.access"' in line
            )
            if match(entry)
        ]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
