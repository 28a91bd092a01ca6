"""What every test run shares: the tests of the lab never run in parallel.

The README's test command runs in parallel (pyproject.toml's addopts: pytest-xdist workers).
The e2e and deploy tests share one lab (the e2e session fixture runs `scoperouter lab up`,
deploy applies roles to this machine): a run whose ``-m`` can select them (``pytest -m e2e``,
as the docs show it) runs serially, as if given ``-n 0``. .ci/run's lab steps say ``-n 0``.
A ``--pdb`` run is serial too (a debugger needs the test in this process).
"""

from __future__ import annotations

import re

import pytest

LAB = re.compile(r"(?<!not )\b(e2e|deploy)\b")
"""A -m expression naming a lab marker but not as `not e2e`: it may select the lab's tests
(a false positive, `not (e2e or deploy)`, only runs serially)."""


def selects_the_lab(markexpr: str) -> bool:
    return LAB.search(markexpr) is not None


@pytest.hookimpl(tryfirst=True)  # a conftest's runs before xdist's, which reads -n
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist") or not config.option.numprocesses:
        return
    # --pdb too, as xdist does for `-n auto` (with `-n 2` it refuses to start)
    if selects_the_lab(config.option.markexpr or "") or config.getoption("usepdb"):
        config.option.numprocesses = 0  # xdist: no workers, serial in this process
