"""The fixtures the bench's tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import Processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The processes a test starts, stopped by PID at its end."""
    group = Processes(tmp_path)
    yield group
    group.stop_all()
