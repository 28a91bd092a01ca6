"""The SIGKILL tests of tests/broker/test_crash.py on PostgreSQL: real `broker serve` processes
killed at several points of a provision, a bind and a deprovision, on a throwaway cluster.

They need no lab; they run in CI's e2e step (`python -m pytest -m e2e tests/e2e`) rather than
in the default run, whose time they dominated (about 30 s for these two; the same tests on
SQLite stay in the default run)."""

from __future__ import annotations

import pytest

from tests.broker import test_crash as crash
from tests.broker.pg import Cluster
from tests.broker.test_crash import env  # noqa: F401  (the fixture: a broker on db_url)

pytestmark = pytest.mark.e2e


@pytest.fixture
def db_url(pg_cluster: Cluster | None) -> str:
    if pg_cluster is None:  # (under CI=true, pg_cluster fails instead)
        pytest.skip("PostgreSQL is not installed")
    return pg_cluster.url(pg_cluster.new_database(template="broker_template"))


def test_sigkill_during_provision_at_three_points_on_postgresql(env: crash.Env) -> None:  # noqa: F811
    crash.test_sigkill_during_provision_at_three_points(env)


def test_sigkill_during_bind_and_deprovision_on_postgresql(env: crash.Env) -> None:  # noqa: F811
    crash.test_sigkill_during_bind_and_deprovision(env)
