from __future__ import annotations

from pathlib import Path

import pytest

from scoperouter.catalog import Catalog
from scoperouter.config import load_catalog

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "federation.yaml"


@pytest.fixture
def catalog() -> Catalog:
    """The documented sample config: it must load, and it is the federation most tests use."""
    return load_catalog(SAMPLE)
