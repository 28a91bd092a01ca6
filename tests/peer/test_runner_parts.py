"""The peer-suite runner's own parts, without a lab: JUnit parsing, the comparison and its
verdict, the clouds.yaml of each mode, the cleanup's name patterns, the selection. Fast: part of
the default run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.peer import cleanup
from tests.peer.clouds import ConfigMissing, suite_clouds
from tests.peer.results import Outcome, Status, compare, parse_report_log, summarize
from tests.peer.runner import main, node_id_of, node_ids, site_root, verdict
from tests.peer.selection import NOT_RUN, SELECTIONS

TRACEBACK = """NOTE: Incompatible Exception Representation, displaying natively:

testtools.testresult.real._StringException: Traceback (most recent call last):
  File "x.py", line 3, in test_bad
    boom()
    ^^^^^^
openstack.exceptions.HttpException: 500: Server Error"""


def _report_log(path: Path) -> None:
    """What pytest --report-log writes (pytest-reportlog): a passing test, a testtools failure,
    a skip, a teardown error after a passing call, a module that does not import, and a test
    that started when the run was stopped (no call, no teardown, a cut last line)."""
    sdk, osc = "openstack/tests/functional/x.py::TestA", "openstackclient/tests/functional/y.py"
    crash = {"reprcrash": {"path": "x", "lineno": 1, "message": "Failed: " + TRACEBACK}}
    teardown = {"reprcrash": {"message": "tempest.lib.exceptions.CommandFailed: exit 1"}}
    skipped = ["x.py", 3, "Skipped: block-storage service not supported by cloud"]

    def rep(nodeid: str, when: str, outcome: str, longrepr: Any = None) -> dict[str, Any]:
        return {"$report_type": "TestReport", "nodeid": nodeid, "when": when,
                "outcome": outcome, "longrepr": longrepr, "duration": 0.5}  # fmt: skip

    reports = [
        {"$report_type": "SessionStart", "pytest_version": "8"},
        rep(f"{sdk}::test_ok", "setup", "passed"),
        rep(f"{sdk}::test_ok", "call", "passed"),
        rep(f"{sdk}::test_ok", "teardown", "passed"),
        rep(f"{sdk}::test_bad", "setup", "passed"),
        rep(f"{sdk}::test_bad", "call", "failed", crash),
        rep(f"{sdk}::test_bad", "teardown", "passed"),
        rep(f"{sdk}::test_skip", "setup", "skipped", skipped),
        rep(f"{osc}::TestB::test_teardown", "setup", "passed"),
        rep(f"{osc}::TestB::test_teardown", "call", "passed"),
        rep(f"{osc}::TestB::test_teardown", "teardown", "failed", teardown),
        {
            "$report_type": "CollectReport",
            "nodeid": "openstackclient/tests/functional/z.py",
            "outcome": "failed",
            "longrepr": "ImportError: No module named 'tempest'",
        },
        rep(f"{sdk}::test_stopped", "setup", "passed"),
    ]
    text = "".join(json.dumps(r) + "\n" for r in reports) + '{"$report_type": "TestRe'
    path.write_text(text)


def test_parse_report_log(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _report_log(path)
    res = parse_report_log(path)
    sdk = "openstack.tests.functional.x.TestA"
    assert res[f"{sdk}.test_ok"] == Outcome(Status.PASSED, "", 1.5)
    bad = res[f"{sdk}.test_bad"]
    assert bad.status is Status.FAILED
    assert bad.message == "openstack.exceptions.HttpException: 500: Server Error"
    skip = res[f"{sdk}.test_skip"]
    assert (skip.status, skip.message) == (
        Status.SKIPPED,
        "block-storage service not supported by cloud",
    )
    td = res["openstackclient.tests.functional.y.TestB.test_teardown"]
    assert (td.status, td.message) == (
        Status.FAILED,
        "tempest.lib.exceptions.CommandFailed: exit 1 (teardown)",
    )
    broken = res["openstackclient.tests.functional.z"]
    assert broken.status is Status.FAILED and "tempest" in broken.message
    stopped = res[f"{sdk}.test_stopped"]
    assert stopped == Outcome(Status.FAILED, "did not finish (the run was stopped)", 0.5)
    s = summarize(res)
    assert (s.passed, s.failed, s.skipped, s.run) == (1, 4, 1, 5)


def _o(status: Status) -> Outcome:
    return Outcome(status, f"why {status}")


P, F, S = Status.PASSED, Status.FAILED, Status.SKIPPED


def test_comparison_finds_regressions_and_differences() -> None:
    by_mode = {
        "direct": {"t.same": _o(P), "t.broken": _o(P), "t.lost": _o(P), "t.lab": _o(F),
                   "t.fixed": _o(F), "t.skip": _o(S)},
        "router": {"t.same": _o(P), "t.broken": _o(P), "t.lab": _o(F), "t.fixed": _o(P),
                   "t.skip": _o(P)},
        "scoped": {"t.same": _o(P), "t.broken": _o(F), "t.lost": _o(P), "t.lab": _o(F),
                   "t.fixed": _o(F), "t.skip": _o(S)},
    }  # fmt: skip
    comp = compare(by_mode, ["direct", "router", "scoped"])
    assert comp.regressions() == {"t.broken": ["scoped"], "t.lost": ["router"]}
    assert comp.status("t.lost", "router") is Status.MISSING
    assert comp.differences() == ["t.broken", "t.fixed", "t.lost", "t.skip"]
    assert comp.failing_everywhere() == ["t.lab"]
    out = io.StringIO()
    assert verdict(comp, by_mode, {"direct": 1, "router": 1, "scoped": 1}, out) == 1
    text = out.getvalue()
    assert "fails in (c) scoped: t.broken" in text and "fails in (b) router: t.lost" in text


def test_verdict_refuses_an_empty_or_aborted_mode() -> None:
    by_mode = {"direct": {"t.a": _o(P)}, "router": {"t.a": _o(S)}, "scoped": {"t.a": _o(P)}}
    comp = compare(by_mode, ["direct", "router", "scoped"])
    assert comp.regressions() == {}  # skipped is not failed ...
    out = io.StringIO()
    assert verdict(comp, by_mode, {"direct": 0, "router": 0, "scoped": 2}, out) == 1
    assert "(b) router ran no test" in out.getvalue()  # ... but a mode that ran nothing fails
    assert "(c) scoped: pytest exit 2" in out.getvalue()
    good = {m: {"t.a": _o(P)} for m in ("direct", "router", "scoped")}
    assert verdict(compare(good, list(good)), good, dict.fromkeys(good, 0), io.StringIO()) == 0


LAB_CLOUDS: dict[str, Any] = {
    "cloudone": {"auth": {"auth_url": "http://127.0.0.2:5000/v3", "username": "demo",
                          "password": "d", "project_name": "demo",
                          "user_domain_name": "Default", "project_domain_name": "Default"},
                 "region_name": "CloudOne", "interface": "public", "identity_api_version": 3},
    "cloudone-alt": {"auth": {"auth_url": "http://127.0.0.2:5000/v3", "username": "alt_demo",
                              "password": "l", "project_name": "alt_demo"},
                     "region_name": "CloudOne"},
    "cloudone-admin": {"auth": {"auth_url": "http://127.0.0.2:5000/v3", "username": "admin",
                                "password": "a", "project_name": "admin",
                                "project_domain_name": "Default"},
                       "region_name": "CloudOne"},
}  # fmt: skip
FEDERATION: dict[str, Any] = {
    "clouds": {
        "CloudOne": {
            "services": {
                "identity": {"public": {"url": "http://127.0.0.2:5000/v3",
                                        "backend": "http://127.0.1.2:5000/v3"}},
                "object-store": {"public": {"url": "http://127.0.0.2:8080",
                                            "backend": "http://127.0.1.2:8080"}},
            }
        }
    }
}  # fmt: skip
SCOPE = {"image": "CloudTwo"}


def test_router_mode_is_the_lab_entries_under_devstack_names() -> None:
    clouds = suite_clouds(LAB_CLOUDS, FEDERATION, "CloudOne", "router", SCOPE)
    assert set(clouds) == {"devstack", "devstack-alt", "devstack-admin", "devstack-system-admin"}
    assert clouds["devstack"] == LAB_CLOUDS["cloudone"]
    assert clouds["devstack-alt"]["auth"]["username"] == "alt_demo"
    system = clouds["devstack-system-admin"]["auth"]
    assert system["system_scope"] == "all" and "project_name" not in system
    assert "project_domain_name" not in system
    assert LAB_CLOUDS["cloudone-admin"]["auth"]["project_name"] == "admin"  # not mutated


def test_direct_mode_overrides_every_routed_endpoint_with_its_backend() -> None:
    clouds = suite_clouds(LAB_CLOUDS, FEDERATION, "CloudOne", "direct", SCOPE)
    for entry in clouds.values():
        assert entry["auth"]["auth_url"] == "http://127.0.1.2:5000/v3"
        assert entry["identity_endpoint_override"] == "http://127.0.1.2:5000/v3"
        assert entry["object_store_endpoint_override"] == "http://127.0.1.2:8080"
        assert "scope" not in entry
    yaml.safe_dump(clouds)


def test_scoped_mode_adds_the_scope_and_the_sdk_hook() -> None:
    clouds = suite_clouds(LAB_CLOUDS, FEDERATION, "CloudOne", "scoped", SCOPE)
    for entry in clouds.values():
        assert entry["scope"] == SCOPE
        assert entry["vendor_hook"] == "scoperouter.client:connection_hook"
        assert entry["auth"]["auth_url"] == "http://127.0.0.2:5000/v3"


def test_an_old_lab_is_named_not_crashed_on() -> None:
    lab = {k: v for k, v in LAB_CLOUDS.items() if k != "cloudone-alt"}
    with pytest.raises(ConfigMissing, match="cloudone-alt"):
        suite_clouds(lab, FEDERATION, "CloudOne", "router", SCOPE)
    with pytest.raises(ConfigMissing, match="CloudNine"):
        suite_clouds(LAB_CLOUDS, FEDERATION, "CloudNine", "direct", SCOPE)
    with pytest.raises(ValueError, match="unknown mode"):
        suite_clouds(LAB_CLOUDS, FEDERATION, "CloudOne", "sideways", SCOPE)


@pytest.mark.parametrize(
    "name",
    [
        "project-1763901234-0123456789abcdef0123456789abcdef",  # openstacksdk getUniqueString
        "1763901234-0123456789abcdef0123456789abcdef",
        "tempest-TestDomain-1234567",  # tempest rand_name (python-openstackclient)
        "tempest-123",
        "0123456789abcdef0123456789abcdef",  # uuid4().hex
        "CUSTOM_0123456789ABCDEF0123456789ABCDEF",
        "test_abcde",
        "test_abcde_create",
        "Test Image",
    ],
)
def test_cleanup_matches_the_suites_names(name: str) -> None:
    assert cleanup.leaked(name)


@pytest.mark.parametrize(
    "name",
    [
        None, "", "demo", "alt_demo", "admin", "service", "tiny", "cirros-0.6.3-x86_64-disk",
        "m1.tiny", "cirros256", "private", "cloudone-compute", "scoperouter",
        "osb-1763901234-project", "osb0123456789abcdef0123456789abcdef",
        "e2e-0123abcd", "e2e-0123456789abcdef0123456789abcdef", "peer-auto", "test_abc",
        "test_abcdef", "tempest", "CUSTOM_MAGIC", "0123456789abcdef0123456789abcdeg",
    ],
)  # fmt: skip
def test_cleanup_never_matches_other_names(name: str | None) -> None:
    """The lab's seed data and other users' resources (osb..., e2e-..., peer-...) are safe."""
    assert not cleanup.leaked(name)


def test_cleanup_deletes_only_what_matches() -> None:
    class Thing:
        def __init__(self, name: str) -> None:
            self.name = name

    deleted: list[str] = []
    report = cleanup.Report()
    things = [Thing("demo"), Thing("tempest-TestRole-42"), Thing("e2e-x"), Thing("x" * 3)]
    cleanup._sweep(report, "roles", lambda: things, lambda t: deleted.append(t.name))
    assert deleted == ["tempest-TestRole-42"]
    assert report.line() == "1 roles"

    def refuse(_: object) -> None:
        raise RuntimeError("409 in use")

    cleanup._sweep(report, "roles", lambda: things, refuse)
    assert "could not be deleted" in report.line() and "409 in use" in report.errors[0]


def test_every_selection_names_installed_tests() -> None:
    """A renamed upstream module must not turn the run silently empty: every selected module
    exists in the installed packages, and node ids map back from test ids."""
    root = site_root()
    for name, groups in SELECTIONS.items():
        ids = node_ids(groups, root)
        assert ids, name
        for nid in ids:
            assert (root / nid.split("::")[0]).exists(), nid
    for nid in NOT_RUN:
        path, _cls, test = nid.split("::")
        assert f"def {test}(" in (root / path).read_text(), nid
    tid = "openstack.tests.functional.cloud.test_compute.TestCompute.test_list_all_servers"
    assert node_id_of(tid, root) == (
        "openstack/tests/functional/cloud/test_compute.py::TestCompute::test_list_all_servers"
    )
    assert node_id_of("no.such.module.Test.test", root) is None


def test_cli_lists_the_selection_and_refuses_unknown_modes() -> None:
    out = io.StringIO()
    assert main(["--list", "--selection", "ci"], out=out) == 0
    listed = out.getvalue().split()
    assert "openstack/tests/functional/identity" in listed
    assert any(i.startswith("openstackclient/tests/functional/") for i in listed)
    out = io.StringIO()
    assert main(["--modes", "direct,sideways"], out=out) == 2
    assert "unknown mode(s) sideways" in out.getvalue()
    with pytest.raises(SystemExit) as exc:
        main(["--help"], out=io.StringIO())
    assert exc.value.code == 0


def test_jobs_run_test_modules_in_xdist_workers_and_keep_the_report(tmp_path: Path) -> None:
    """--jobs 2: two modules run in two pytest-xdist workers (``--dist loadfile``) and the
    report log still holds every test, as the comparison needs."""
    pytest.importorskip("xdist")
    from tests.peer.runner import run_pytest

    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os\n\n"
            f"def test_{name}_one():\n    assert os.environ['PYTEST_XDIST_WORKER']\n\n"
            f"def test_{name}_two():\n    assert os.environ['PYTEST_XDIST_WORKER']\n"
        )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report, out = tmp_path / "r.jsonl", io.StringIO()
    code = run_pytest(tmp_path, ["test_a.py", "test_b.py"], tmp_path, report, out, 120, jobs=2)
    results = parse_report_log(report)
    assert code == 0, out.getvalue()
    assert sorted(t.rsplit(".", 1)[-1] for t in results) == [
        "test_a_one", "test_a_two", "test_b_one", "test_b_two"
    ]  # fmt: skip
    assert {r.status for r in results.values()} == {Status.PASSED}
