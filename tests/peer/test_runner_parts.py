"""The peer-suite runner's own parts, without a lab: JUnit parsing, the comparison and its
verdict, the clouds.yaml of each mode, the cleanup's name patterns, the selection. Fast: part of
the default run."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ci import need_module
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
    assert "failed in (c) scoped: t.broken" in text and "missing in (b) router: t.lost" in text


def _skip(reason: str) -> Outcome:
    return Outcome(Status.SKIPPED, reason)


def test_a_test_that_passes_direct_and_skips_through_the_router_fails_the_run() -> None:
    """OpenStack's functional tests skip when a service or feature looks absent: a router that
    hid one would turn failures into skips. Passed direct, skipped (or errored) in another
    mode: a regression; skipped everywhere for the same reason: not even a difference."""
    by_mode = {
        "direct": {"t.hidden": _o(P), "t.errs": _o(P), "t.lab": _skip("no swift"),
                   "t.why": _skip("no swift"), "t.skipfail": _skip("no swift")},
        "router": {"t.hidden": _skip("image service not found"), "t.errs": _o(P),
                   "t.lab": _skip("no swift"), "t.why": _skip("no swift"),
                   "t.skipfail": _o(F)},
        "scoped": {"t.hidden": _o(P), "t.errs": _o(F), "t.lab": _skip("no swift"),
                   "t.why": _skip("object-store endpoint not found"),
                   "t.skipfail": _skip("no swift")},
    }  # fmt: skip
    comp = compare(by_mode, ["direct", "router", "scoped"])
    assert comp.regressions() == {
        "t.errs": ["scoped"],
        "t.hidden": ["router"],
        "t.skipfail": ["router"],
        "t.why": ["scoped"],
    }
    assert comp.differences() == ["t.errs", "t.hidden", "t.skipfail", "t.why"]  # not t.lab
    out = io.StringIO()
    assert verdict(comp, by_mode, dict.fromkeys(by_mode, 1), out) == 1
    text = out.getvalue()
    assert "passes in (a) direct, skipped in (b) router: t.hidden" in text
    assert "(b) image service not found" in text
    assert "skipped in (a) direct, skipped in (c) scoped: t.why" in text
    assert "t.lab" not in text
    # the same skip in every mode, the rest passing: the run passes
    same = {m: {"t.ok": _o(P), "t.lab": _skip("no swift")} for m in by_mode}
    assert verdict(compare(same, list(same)), same, dict.fromkeys(same, 0), io.StringIO()) == 0


def test_verdict_refuses_an_empty_or_aborted_mode() -> None:
    by_mode = {"direct": {"t.a": _o(P)}, "router": {"t.a": _o(S)}, "scoped": {"t.a": _o(P)}}
    comp = compare(by_mode, ["direct", "router", "scoped"])
    assert comp.regressions() == {"t.a": ["router"]}  # passed direct, skipped: a regression
    out = io.StringIO()
    assert verdict(comp, by_mode, {"direct": 0, "router": 0, "scoped": 2}, out) == 1
    assert "(b) router ran no test" in out.getvalue()  # ... and a mode that ran nothing fails
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


def test_direct_mode_fills_the_project_of_templated_backends() -> None:
    """openstacksdk's object store builds its URLs from the override as written: keystone's
    %(project_id)s is filled with each entry's project; a system-scoped entry has none and
    keeps the catalog for that service."""
    fed = copy.deepcopy(FEDERATION)
    services = fed["clouds"]["CloudOne"]["services"]
    services["object-store"]["public"] = {
        "url": "http://127.0.0.2:8080/v1/AUTH_%(project_id)s",
        "backend": "http://127.0.1.2:8080/v1/AUTH_%(project_id)s",
    }
    services["orchestration"] = {
        "public": {
            "url": "http://127.0.0.2:8004/v1/%(tenant_id)s",
            "backend": "http://127.0.1.2:8004/v1/%(tenant_id)s",
        }
    }
    ids = {"cloudone": "p-demo", "cloudone-alt": "p-alt", "cloudone-admin": "p-admin"}
    clouds = suite_clouds(LAB_CLOUDS, fed, "CloudOne", "direct", SCOPE, ids)
    assert clouds["devstack"]["object_store_endpoint_override"] == (
        "http://127.0.1.2:8080/v1/AUTH_p-demo"
    )
    assert clouds["devstack-alt"]["orchestration_endpoint_override"] == (
        "http://127.0.1.2:8004/v1/p-alt"
    )
    assert clouds["devstack-admin"]["object_store_endpoint_override"].endswith("AUTH_p-admin")
    system = clouds["devstack-system-admin"]
    assert "object_store_endpoint_override" not in system
    assert system["identity_endpoint_override"] == "http://127.0.1.2:5000/v3"
    without = suite_clouds(LAB_CLOUDS, fed, "CloudOne", "direct", SCOPE)  # no ids: no override
    assert "object_store_endpoint_override" not in without["devstack"]


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
    need_module("xdist", "peer")
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


# --------------------------------------------------------------------------- tempest


def _subunit_stream(path: Path, cut: bool = False) -> None:
    """What stestr --subunit writes: a pass (with tempest's attributes), a failure with its
    traceback, a skip with its reason, a class whose setUpClass failed, non-subunit output, and
    a test that started when the run was stopped."""
    import datetime

    from subunit import StreamResultToBytes

    with open(path, "wb") as f:
        w = StreamResultToBytes(f)
        t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        t1 = t0 + datetime.timedelta(seconds=2)
        ok = "tempest.api.compute.test_versions.TestVersions.test_list_api_versions[id-6c0a,smoke]"
        w.status(test_id=ok, test_status="inprogress", timestamp=t0)
        w.status(test_id=ok, test_status="success", timestamp=t1)
        bad = "tempest.api.image.v2.test_images.ListImagesTest.test_list[id-1234]"
        w.status(test_id=bad, test_status="inprogress", timestamp=t0)
        w.status(test_id=bad, file_name="traceback", file_bytes=TRACEBACK.encode(), eof=True,
                 mime_type="text/plain;charset=utf8")  # fmt: skip
        w.status(test_id=bad, test_status="fail", timestamp=t1)
        skip = "tempest.api.volume.test_volumes_get.VolumesGetTest.test_get[id-99]"
        w.status(test_id=skip, file_name="reason", file_bytes=b"Cinder is not available",
                 eof=True, mime_type="text/plain;charset=utf8")  # fmt: skip
        w.status(test_id=skip, test_status="skip", timestamp=t1)
        fixture = "setUpClass (tempest.api.compute.servers.test_servers.ServersTestJSON)"
        w.status(test_id=fixture, file_name="traceback", eof=True,
                 file_bytes=b"Traceback (most recent call last):\n  x\nTimeoutException: boot",
                 mime_type="text/plain;charset=utf8")  # fmt: skip
        w.status(test_id=fixture, test_status="fail", timestamp=t1)
        f.write(b"some worker's stray output\n")
        stopped = "tempest.api.object_storage.test_object_services.ObjectTest.test_copy[id-7]"
        w.status(test_id=stopped, test_status="inprogress", timestamp=t1)
        if cut:
            f.write(b"\xb3\x29\x01")  # a packet cut short by a killed run


@pytest.mark.parametrize("cut", [False, True])
def test_parse_subunit(tmp_path: Path, cut: bool) -> None:
    need_module("subunit", "peer")
    from tests.peer.results import parse_subunit

    path = tmp_path / "t.subunit"
    _subunit_stream(path, cut)
    res = parse_subunit(path)
    ok = res["tempest.api.compute.test_versions.TestVersions.test_list_api_versions"]
    assert ok == Outcome(Status.PASSED, "", 2.0)
    bad = res["tempest.api.image.v2.test_images.ListImagesTest.test_list"]
    assert bad.status is Status.FAILED
    assert bad.message == "openstack.exceptions.HttpException: 500: Server Error"
    skip = res["tempest.api.volume.test_volumes_get.VolumesGetTest.test_get"]
    assert (skip.status, skip.message) == (Status.SKIPPED, "Cinder is not available")
    fixture = res["tempest.api.compute.servers.test_servers.ServersTestJSON.setUpClass"]
    assert (fixture.status, fixture.message) == (Status.FAILED, "TimeoutException: boot")
    stopped = res["tempest.api.object_storage.test_object_services.ObjectTest.test_copy"]
    assert stopped.status is Status.FAILED and "did not finish" in stopped.message
    assert summarize({k: v for k, v in res.items() if k.startswith("tempest.")}).run == 4


def test_tempest_ids_and_suites() -> None:
    from tests.peer.results import tempest_test_id
    from tests.peer.runner import suite_of

    assert tempest_test_id("tempest.api.a.B.test_c[id-1,smoke]") == "tempest.api.a.B.test_c"
    assert tempest_test_id("tempest.api.a.B.test_c") == "tempest.api.a.B.test_c"
    assert tempest_test_id("tearDownClass (tempest.api.a.B)") == "tempest.api.a.B.tearDownClass"
    assert suite_of("tempest.api.a.B.test_c") == "tempest"
    assert suite_of("openstackclient.tests.functional.x.Y.test_z") == "python-openstackclient"
    assert suite_of("openstack.tests.functional.x.Y.test_z") == "openstacksdk"


LISTED = [
    "tempest.api.compute.flavors.test_flavors.FlavorsV2TestJSON.test_list_flavors[id-e36c,smoke]",
    "tempest.api.compute.servers.test_servers.ServersTestJSON.test_update_server_name[id-5e6c]",
    "tempest.api.compute.servers.test_server_actions.ServerActionsTestJSON.test_rebuild[id-aaa6]",
    "tempest.api.image.v2.test_images.BasicOperationsImagesTest.test_delete_image[id-f848]",
]


def test_tempest_groups_become_include_regexes() -> None:
    import re

    from tests.peer.selection import TEMPEST, Group
    from tests.peer.tempest_suite import include_regexes, rerun_regexes, selected_ids

    groups = [
        Group(TEMPEST, "tempest.api.compute", ("flavors", "servers.test_servers"), listed=True),
        Group(TEMPEST, "tempest.api.identity", ("v3.test_tokens.TokensV3Test",)),
    ]
    assert selected_ids(groups, LISTED) == [
        "tempest.api.compute.flavors.test_flavors.FlavorsV2TestJSON.test_list_flavors",
        "tempest.api.compute.servers.test_servers.ServersTestJSON.test_update_server_name",
    ]
    regexes = include_regexes(groups, LISTED)

    def runs(test_id: str) -> bool:
        return any(re.search(r, test_id) for r in regexes)

    assert runs(LISTED[0]) and runs(LISTED[1])
    assert not runs(LISTED[2]) and not runs(LISTED[3])
    # a subclass, or a test whose name only starts the same, is not the listed test
    assert not runs(LISTED[1].replace("ServersTestJSON", "ServersTestJSONSub"))
    assert not runs(LISTED[1].replace("server_name[", "server_name_twice["))
    assert runs("tempest.api.identity.v3.test_tokens.TokensV3Test.test_create_token[id-6f8e]")
    assert not runs("tempest.api.identity.v3.test_tokens.TokensV3TestX.test_create[id-6f8e]")
    again = rerun_regexes(
        ["tempest.api.image.v2.test_images.BasicOperationsImagesTest.test_delete_image",
         "tempest.api.compute.servers.test_servers.ServersTestJSON.setUpClass"]
    )  # fmt: skip
    assert re.search(again[0], LISTED[3])
    assert re.search(again[1], LISTED[1]) and not re.search(again[1], LISTED[2])


def test_interop_list_names_installed_tempest_tests() -> None:
    """Every line of tempest-interop.txt is a test of the installed tempest under that name,
    with the guideline's idempotent id: a renamed upstream test must not vanish silently."""
    need_module("tempest", "peer")  # not in the README's install: skipped there, run in CI
    import re

    from tests.peer.selection import SELECTIONS
    from tests.peer.tempest_suite import idempotent_id, read_list, selected_ids, site_packages

    root = site_packages()
    listed = read_list()
    assert len(listed) == len(set(listed)) > 200
    sources: dict[str, str] = {}
    for line in listed:
        uid = idempotent_id(line)
        assert uid, line
        parts = line.split("[", 1)[0].split(".")
        path = root / ("/".join(parts[:-2]) + ".py")
        text = sources.setdefault(str(path), path.read_text() if path.is_file() else "")
        assert f"class {parts[-2]}(" in text, line
        assert re.search(rf"def {parts[-1]}\(", text), line
        assert uid.removeprefix("id-") in text, line
    for name, groups in SELECTIONS.items():
        for g in groups:
            if g.listed:
                assert selected_ids([g], listed), (name, g)


TEMPEST_SITE_ADMIN = {"auth_url": "http://127.0.0.2:5000/v3", "username": "admin",
                      "password": "pa$$word", "project_name": "admin",
                      "user_domain_name": "Default", "project_domain_name": "Default"}  # fmt: skip


def test_tempest_conf_says_what_the_lab_runs(tmp_path: Path) -> None:
    import configparser

    from tests.peer.tempest_suite import Site, tempest_conf

    site = Site(
        auth_url="http://127.0.1.2:5000/v3", region="CloudOne", admin=TEMPEST_SITE_ADMIN,
        image_ref="img-1", image_ref_alt="img-2", flavor_ref="f1", flavor_ref_alt="f2",
        services=frozenset({"identity", "image", "compute", "placement", "object-store"}),
    )  # fmt: skip
    conf = configparser.RawConfigParser()
    conf.read_string(tempest_conf(site, tmp_path))
    assert conf["identity"]["uri_v3"] == "http://127.0.1.2:5000/v3"
    assert conf["identity"]["region"] == "CloudOne"
    assert conf["auth"]["admin_password"] == "pa$$$$word"  # oslo.config reads $$ as $
    assert conf["auth"]["use_dynamic_credentials"] == "true"
    assert conf["compute"]["image_ref"] == "img-1" and conf["compute"]["flavor_ref_alt"] == "f2"
    avail = conf["service_available"]
    assert (avail["nova"], avail["glance"], avail["swift"]) == ("true", "true", "true")
    # cinder and heat not run; the network stand-in is not neutron
    assert (avail["cinder"], avail["heat"], avail["neutron"]) == ("false", "false", "false")
    assert conf["DEFAULT"]["log_dir"] == str(tmp_path)
    assert conf["compute-feature-enabled"]["snapshot"] == "false"


def test_tempest_conf_reads_back_through_oslo_config(tmp_path: Path) -> None:
    """tempest itself reads the file: the values it sees are the lab's (the password's $)."""
    need_module("tempest", "peer")
    import subprocess
    import sys

    from tests.peer.tempest_suite import Site, tempest_conf, tempest_env

    site = Site(
        auth_url="http://127.0.0.2:5000/v3", region="CloudOne", admin=TEMPEST_SITE_ADMIN,
        image_ref="img-1", image_ref_alt="img-2", flavor_ref="f1", flavor_ref_alt="f2",
        services=frozenset({"identity", "image", "compute", "block-storage"}),
    )  # fmt: skip
    (tmp_path / "tempest.conf").write_text(tempest_conf(site, tmp_path))
    code = (
        "from tempest import config; c = config.CONF; "
        "print(c.auth.admin_password == 'pa$$word', c.identity.uri_v3, "
        "c.service_available.cinder, c.service_available.swift, c.compute.max_microversion)"
    )
    env = tempest_env({"PATH": "/usr/bin:/bin"}, tmp_path)
    env.pop("SCOPEROUTER_PEER_TEMPEST")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.stdout.split() == ["True", "http://127.0.0.2:5000/v3", "True", "False", "latest"], (
        proc.stderr[-2000:]
    )


def test_hook_config_per_mode() -> None:
    from tests.peer.tempest_suite import hook_config

    fed = copy.deepcopy(FEDERATION)
    fed["clouds"]["CloudOne"]["services"]["compute"] = {
        "public": {"url": "http://127.0.0.2:8774/v2.1", "backend": "http://127.0.1.2:8774/v2.1"},
        "internal": {"url": "http://127.0.0.2:8774/v2.1", "backend": "http://127.0.1.2:8774/v2.1"},
    }
    direct = hook_config("direct", fed, "CloudOne", SCOPE, "CloudOne")
    assert direct["endpoints"] == {
        "http://127.0.0.2:5000": "http://127.0.1.2:5000",
        "http://127.0.0.2:8080": "http://127.0.1.2:8080",
        "http://127.0.0.2:8774": "http://127.0.1.2:8774",
    }
    scoped = hook_config("scoped", fed, "CloudOne", SCOPE, "CloudOne")
    assert json.loads(scoped["scope"]) == SCOPE and scoped["region"] == "CloudOne"
    assert "endpoints" not in scoped and "scope" not in direct
    assert hook_config("router", fed, "CloudOne", SCOPE, "CloudOne") == {"mode": "router"}
    with pytest.raises(ConfigMissing, match="CloudNine"):
        hook_config("direct", fed, "CloudNine", SCOPE, "CloudOne")


def test_hook_moves_endpoints_and_scopes_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook patched into tempest.lib.auth: a request built by tempest's auth provider goes
    to the backend (direct) and carries the completed scope on its token (scoped), with the
    alternate credentials of negative tests too. The patch is undone after the test."""
    need_module("tempest", "peer")
    import datetime

    from tempest.lib import auth

    from tests.peer import tempest_hook

    for cls, name in ((auth.KeystoneV3AuthProvider, "base_url"),
                      (auth.KeystoneV2AuthProvider, "base_url"),
                      (auth.KeystoneAuthProvider, "_decorate_request")):  # fmt: skip
        monkeypatch.setattr(cls, name, getattr(cls, name))  # restored at teardown
    expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )

    def access(url: str) -> dict[str, Any]:
        endpoints = [{"interface": "public", "region": "CloudOne", "url": url}]
        return {"expires_at": expires, "catalog": [
            {"type": "compute", "endpoints": endpoints},
            {"type": "image", "endpoints": [{"interface": "public", "region": "CloudOne",
                                             "url": "http://127.0.0.2:9292"}]},
        ]}  # fmt: skip

    creds = auth.KeystoneV3Credentials(username="u", password="p", project_name="p",
                                       user_domain_name="Default",
                                       project_domain_name="Default")  # fmt: skip
    provider = auth.KeystoneV3AuthProvider(creds, "http://127.0.0.2:5000/v3")
    provider.cache = ("tok", access("http://127.0.0.2:8774/v2.1"))
    filters = {"service": "compute", "region": "CloudOne", "endpoint_type": "publicURL"}
    assert provider.auth_request("GET", "servers", filters=filters)[0] == (
        "http://127.0.0.2:8774/v2.1/servers"
    )

    tempest_hook.install({"endpoints": {"http://127.0.0.2:8774": "http://127.0.1.2:8774"}})
    tempest_hook.install({"scope": json.dumps(SCOPE), "region": "CloudOne"})
    assert "error" not in tempest_hook.PATCHED
    url, headers, _ = provider.auth_request("GET", "servers", headers={"A": "b"}, filters=filters)
    assert url == "http://127.0.1.2:8774/v2.1/servers"
    token, _, scope = headers["X-Auth-Token"].partition("!SCOPE!")
    assert token == "tok" and headers["A"] == "b"
    assert json.loads(scope) == {"compute": "CloudOne", "image": "CloudTwo"}
    assert json.loads(headers["X-Scope"]) == json.loads(scope)
    # a negative test's alternate credentials: their token, scoped the same way
    provider.set_alt_auth_data("headers", ("alt", access("http://127.0.0.2:8774/v2.1")))
    _, alt_headers, _ = provider.auth_request("GET", "servers", filters=filters)
    assert alt_headers["X-Auth-Token"].startswith("alt!SCOPE!")
    # a second install does not wrap twice
    tempest_hook.install({"scope": json.dumps(SCOPE), "region": "CloudOne"})
    _, again, _ = provider.auth_request("GET", "servers", filters=filters)
    assert again["X-Auth-Token"].count("!SCOPE!") == 1
    assert tempest_hook.move("http://127.0.0.9:1/x?y", {}) == "http://127.0.0.9:1/x?y"


def test_sitecustomize_installs_the_hook_in_tempest_processes(tmp_path: Path) -> None:
    """The mode's environment alone (PYTHONPATH, $SCOPEROUTER_PEER_TEMPEST) patches any Python
    process that imports tempest, as stestr's workers do."""
    need_module("tempest", "peer")
    import subprocess
    import sys

    from tests.peer.tempest_suite import sitecustomize, tempest_env

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(sitecustomize())
    (tmp_path / "tempest-hook.json").write_text(json.dumps({"scope": json.dumps(SCOPE)}))
    code = (
        "from tempest.lib import auth; "
        "print(getattr(auth.KeystoneAuthProvider._decorate_request, '_scoperouter_peer', 0), "
        "getattr(auth.KeystoneV3AuthProvider.base_url, '_scoperouter_peer', 0))"
    )
    env = tempest_env({"PATH": "/usr/bin:/bin"}, tmp_path)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.stdout.split() == ["True", "0"], proc.stderr[-2000:]
    (tmp_path / "tempest-hook.json").write_text("{not json")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.stdout.split() == ["0", "0"]
    assert "tempest hook not installed" in proc.stderr  # said, and the preflight fails the mode


def test_stestr_runs_classes_in_workers_and_keeps_the_stream(tmp_path: Path) -> None:
    """run_stestr as the runner uses it (--concurrency 2, an include list, the subunit stream
    parsed live and kept): every test's outcome, a failure's message, attributes stripped."""
    need_module("stestr", "peer")
    from tests.peer.tempest_suite import run_stestr

    pkg = tmp_path / "fake_tests"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "test_things.py").write_text(
        "import os, unittest\n\n"
        "class A(unittest.TestCase):\n"
        "    def test_one(self):\n        assert os.environ['HOOKED'] == '1'\n"
        "    def test_two(self):\n        self.fail('boom: 500')\n\n"
        "class B(unittest.TestCase):\n"
        "    def test_three(self):\n        pass\n"
        "    def test_left_out(self):\n        pass\n"
    )
    (tmp_path / ".stestr.conf").write_text(
        f"[DEFAULT]\ntest_path={pkg}\ntop_dir={tmp_path}\ngroup_regex=([^\\.]*\\.)*\n"
    )
    import os

    env = {**os.environ, "HOOKED": "1"}
    regexes = [r"^fake_tests\.test_things\.A\.", r"^fake_tests\.test_things\.B\.test_three$"]
    out = io.StringIO()
    code = run_stestr(tmp_path, regexes, env, tmp_path / "t.subunit", out, 120, jobs=2)
    from tests.peer.results import parse_subunit

    res = parse_subunit(tmp_path / "t.subunit")
    assert code == 1, out.getvalue()
    assert {k.removeprefix("fake_tests.test_things."): v.status for k, v in res.items()} == {
        "A.test_one": Status.PASSED, "A.test_two": Status.FAILED, "B.test_three": Status.PASSED,
    }  # fmt: skip
    assert "boom: 500" in res["fake_tests.test_things.A.test_two"].message
    assert "FAIL fake_tests.test_things.A.test_two" in out.getvalue()


def test_lab_service_types(tmp_path: Path) -> None:
    from tests.peer.runner import Lab

    (tmp_path / "clouds.yaml").write_text(yaml.safe_dump({"clouds": LAB_CLOUDS}))
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(FEDERATION))
    lab = Lab(tmp_path)
    assert lab.service_types == {"identity", "image", "placement", "compute"}  # no state: default
    (tmp_path / "lab.json").write_text(json.dumps(
        {"services": ["keystone", "glance", "nova", "swift", "cinder"], "secrets": {"x": "y"}}
    ))  # fmt: skip
    assert Lab(tmp_path).service_types == {
        "identity", "image", "compute", "object-store", "block-storage"
    }  # fmt: skip


def test_groups_run_only_with_their_service() -> None:
    from tests.peer.runner import selected

    ids, regexes = selected("full", ["openstacksdk", "tempest"], {"identity", "image", "compute"})
    assert not any("object_store" in i or "block_storage" in i for i in ids)
    assert not any("object_storage" in r or "api\\.volume" in r for r in regexes)
    assert any("api\\.compute" in r for r in regexes)
    more, more_regexes = selected(
        "full", ["openstacksdk", "tempest"], {"identity", "image", "compute", "object-store"}
    )
    assert any("object_store" in i for i in more)
    assert any("object_storage" in r for r in more_regexes)
    _, filtered = selected("full", ["tempest"], None, "test_flavors")
    import re

    assert filtered and all(
        bool(re.search(r, "tempest.api.compute.flavors.test_flavors.F.test_list[id-1]"))
        or not re.search(r, "tempest.api.image.v2.test_images.X.test_list[id-2]")
        for r in filtered
    )
    assert not any(re.search(r, "tempest.api.image.v2.test_images.X.test_list[id-2]")
                   for r in filtered)  # fmt: skip


def test_hook_lets_the_network_stand_ins_refusal_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tempest's dynamic credentials delete each project's default security group; the lab's
    network stand-in refuses (403 naming itself): that refusal passes, any other error not."""
    need_module("tempest", "peer")
    from tempest.lib import exceptions as lib_exc
    from tempest.lib.common import cred_provider

    from tests.peer import tempest_hook

    cls = cred_provider.CredentialProvider
    monkeypatch.setattr(cls, "cleanup_default_secgroup", cls.cleanup_default_secgroup)

    class Groups:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def list_security_groups(self, **_: Any) -> dict[str, Any]:
            return {"security_groups": [{"id": "g1", "name": "default"}]}

        def delete_security_group(self, _: str) -> None:
            raise self.error

    stand_in = lib_exc.Forbidden("the lab's network stand-in keeps networks; DELETE ...")
    other = lib_exc.Forbidden("policy does not allow")
    provider: Any = None  # the method reads nothing of its provider
    with pytest.raises(lib_exc.Forbidden):
        cls.cleanup_default_secgroup(provider, Groups(stand_in), "p")  # unpatched: fails
    tempest_hook.install({"network_stand_in": True})
    cls.cleanup_default_secgroup(provider, Groups(stand_in), "p")
    with pytest.raises(lib_exc.Forbidden, match="policy"):
        cls.cleanup_default_secgroup(provider, Groups(other), "p")


def test_mode_directory_holds_what_the_suites_open_from_the_tree(tmp_path: Path) -> None:
    from tests.peer.runner import SDK_TREE_FILES, prepare

    clouds = suite_clouds(LAB_CLOUDS, FEDERATION, "CloudOne", "router", SCOPE)
    d = prepare(tmp_path, "router", clouds)
    assert (d / "CONTRIBUTING.rst").stat().st_size > 0
    for relative in SDK_TREE_FILES:
        assert (d / relative).read_bytes() == (site_root() / relative).read_bytes()
    assert not (d / "openstack" / "__init__.py").exists()  # never shadows the installed one
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    assert oct((d / "clouds.yaml").stat().st_mode & 0o777) == "0o600"


def test_cleanup_deletes_the_unused_access_rules_of_the_suites_users() -> None:
    """Keystone keeps an access rule after its application credential is deleted: the suites'
    users' unused rules go, a rule still in use and other users' rules stay."""
    from types import SimpleNamespace as NS

    users = [NS(id="u1", name="admin"), NS(id="u2", name="osb-user"),
             NS(id="u3", name="tempest-X-1")]  # fmt: skip
    rules = {"u1": [NS(id="r1"), NS(id="r2")], "u2": [NS(id="r3")], "u3": [NS(id="r4")]}
    creds = {"u1": [NS(access_rules=[{"id": "r2"}])], "u2": [], "u3": [NS(access_rules=None)]}
    deleted: list[str] = []

    class Ident:
        def users(self) -> list[Any]:
            return users

        def application_credentials(self, user: Any) -> list[Any]:
            return creds[user.id]

        def access_rules(self, user: Any) -> list[Any]:
            return rules[user.id]

        def delete_access_rule(self, user: Any, rule: Any) -> None:
            deleted.append(f"{user.name}:{rule.id}")

    report = cleanup.Report()
    cleanup._sweep_access_rules(report, Ident())
    assert deleted == ["admin:r1", "tempest-X-1:r4"]
    assert report.line() == "2 access rules"
