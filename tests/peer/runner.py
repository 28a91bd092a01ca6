"""``python -m tests.peer``: run OpenStack's own functional tests against the lab three ways and
compare them test by test (see tests/peer/__init__.py)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from tests.peer import cleanup
from tests.peer import tempest_suite as tempest
from tests.peer.clouds import MODES, ConfigMissing, backends, suite_clouds
from tests.peer.results import (
    Comparison,
    Results,
    Status,
    compare,
    parse_report_log,
    summarize,
    worse,
)
from tests.peer.selection import (
    NOT_RUN,
    OSC,
    SDK,
    SELECTIONS,
    SUITES,
    TEMPEST,
    Group,
    runnable,
)

LETTER = dict(zip(MODES, "abc", strict=True))
DESCRIPTION = """\
Run the selected functional tests of the installed openstacksdk and python-openstackclient, and
Tempest's API tests of the refstack interop guideline, against the lab's cloud (default
CloudOne) three ways and compare them test by test:

  (a) direct   every request of the suites straight to the services (the backends)
  (b) router   through the cloud's router, as the keystone catalog advertises, no scope
  (c) scoped   through the router, every request scoped (default {"image": "CloudTwo"})

Prints the tests run per mode, every test whose result differs between modes and the tests that
fail in all three; exits 1 when a test passes in (a) and fails, errors, is skipped or is
missing in (b) or (c), or is skipped in (a) and fails, is missing or is skipped for another
reason there (after one re-run, to tell a flake from a difference), or when a mode ran no test
at all.
Before each mode and at the end, what the suites leaked is deleted from every lab cloud, by the
suites' own naming patterns only. Needs a running lab (`scoperouter lab up`) and the `peer`
extra (pip install -e '.[peer]').
"""
# The image the openstacksdk tests pick (the lab seeds it in every cloud), and Tempest's
# [compute] image_ref; its image_ref_alt (rebuilds) and flavors, also seeded by the lab.
SDK_IMAGE = "cirros-0.6.3-x86_64-disk"
TEMPEST_IMAGE_ALT = "tiny"
TEMPEST_FLAVORS = ("m1.tiny", "m1.small")
TEMPEST_NETWORK = "private"  # the network stand-in's shared network
# The lab's service names (lab.json "services") -> service types; the lab's own table first.
SERVICE_TYPES = {
    "keystone": "identity",
    "glance": "image",
    "placement": "placement",
    "nova": "compute",
    "swift": "object-store",
    "cinder": "block-storage",
    "heat": "orchestration",
    "neutron": "network",
}
SCOPE = {"image": "CloudTwo"}
TEST_TIMEOUT = 300  # seconds, any one test (pytest-timeout)
# files of openstacksdk's tree its tests open relative to the current directory
SDK_TREE_FILES = ("openstack/tests/functional/orchestration/v1/hello_world.yaml",)
PEER_MODULES = (
    "pytest_timeout",
    "pytest_reportlog",
    "tempest",
    "stestr",
    "subunit",
    "testtools",
    "fixtures",
    "oslotest",
)


def site_root() -> Path:
    """The directory that holds the installed `openstack` and `openstackclient` packages."""
    spec = importlib.util.find_spec("openstack")
    if spec is None or not spec.origin:
        raise SystemExit("openstacksdk is not installed")
    return Path(spec.origin).parent.parent


def module_path(module: str, root: Path) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise SystemExit(
            f"{module} is not installed; install the peer extra: pip install -e '.[peer]'"
        )
    path = Path(spec.origin)
    path = path.parent if path.name == "__init__.py" else path
    return path.relative_to(root)


def node_ids(
    groups: Sequence[Group], root: Path, services: Collection[str] | None = None
) -> list[str]:
    """pytest node ids of the openstacksdk and python-openstackclient groups, relative to
    `root` (pytest's rootdir for the run); `services`: the service types the lab runs (None:
    every group)."""
    out = []
    for g in runnable(groups, services):
        if g.suite == TEMPEST:
            continue
        path = module_path(g.module, root).as_posix()
        out += [f"{path}::{only}" for only in g.only] if g.only else [path]
    return out


def node_id_of(test_id: str, root: Path) -> str | None:
    """``pkg.mod.Class.test`` -> ``pkg/mod.py::Class::test`` (None when no such file)."""
    parts = test_id.split(".")
    for i in range(len(parts) - 1, 0, -1):
        candidate = "/".join(parts[:i]) + ".py"
        if (root / candidate).is_file():
            return candidate + "::" + "::".join(parts[i:])
    return None


def suite_of(test_id: str) -> str:
    if test_id.startswith("tempest."):
        return TEMPEST
    return OSC if test_id.startswith("openstackclient.") else SDK


def versions() -> str:
    return ", ".join(
        f"{name} {importlib.metadata.version(dist)}"
        for name, dist in ((SDK, "openstacksdk"), (OSC, "python-openstackclient"),
                           (TEMPEST, "tempest"))
    )  # fmt: skip


# --------------------------------------------------------------------------- the lab


class Lab:
    """What the runner reads from a lab directory (`scoperouter lab up` writes it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        clouds_yaml, federation_yaml = root / "clouds.yaml", root / "federation.yaml"
        for f in (clouds_yaml, federation_yaml):
            if not f.is_file():
                raise SystemExit(f"no lab at {root} ({f.name} missing): run `scoperouter lab up`")
        self.clouds_yaml = clouds_yaml
        self.clouds: dict[str, Any] = yaml.safe_load(clouds_yaml.read_text())["clouds"]
        self.federation: dict[str, Any] = yaml.safe_load(federation_yaml.read_text())

    @property
    def service_types(self) -> frozenset[str]:
        """The service types the lab runs, from its state file's ``services`` (only that key
        is read: the file also holds the lab's secrets). The network and block-storage
        stand-ins are in every catalog and are not counted: block-storage is there when cinder
        runs."""
        from scoperouter_lab.layout import DEFAULT_SERVICES, SERVICE_TYPE

        state = self.root / "lab.json"
        names: Sequence[str] = DEFAULT_SERVICES
        if state.is_file():
            names = json.loads(state.read_text()).get("services") or DEFAULT_SERVICES
        table = {**SERVICE_TYPES, **SERVICE_TYPE}
        return frozenset(table[n] for n in names if n in table)

    @property
    def cloud_names(self) -> list[str]:
        """The lab's clouds (not the federation's CloudDown, which has no clouds.yaml entry)."""
        return [c for c in self.federation.get("clouds", {}) if f"{c.lower()}-admin" in self.clouds]

    def connect(self, entry: str, system: bool = False) -> Any:
        """An openstacksdk Connection for an entry of the lab's clouds.yaml (no environment, no
        vendor hook); `system`: the same user with system scope (limits need it)."""
        from openstack import connection

        config = copy.deepcopy(self.clouds[entry])
        if system:
            for key in ("project_name", "project_id", "project_domain_name", "project_domain_id"):
                config["auth"].pop(key, None)
            config["auth"]["system_scope"] = "all"
        return connection.Connection(**config)

    def project_ids(self, cloud: str) -> dict[str, str]:
        """The project id of each of the cloud's clouds.yaml entries (``cloudone-alt`` -> id),
        looked up by its admin."""
        slug = cloud.lower()
        out: dict[str, str] = {}
        with contextlib.closing(self.connect(f"{slug}-admin")) as admin:
            for entry, config in self.clouds.items():
                if not entry.startswith(slug) or not isinstance(config, Mapping):
                    continue
                name = (config.get("auth") or {}).get("project_name")
                if name:
                    out[entry] = admin.identity.find_project(name, ignore_missing=False).id
        return out

    def clean(self, out: TextIO) -> None:
        for cloud in self.cloud_names:
            slug = cloud.lower()
            t = time.monotonic()
            try:
                admin = self.connect(f"{slug}-admin")
                system = self.connect(f"{slug}-admin", system=True)
                with contextlib.closing(admin), contextlib.closing(system):
                    report = cleanup.clean(admin, system)
                line = report.line()
            except Exception as exc:  # cleaning is best effort; the run says what failed
                line = f"FAILED: {type(exc).__name__}: {exc}"[:300]
            out.write(f"  cleanup {cloud}: {line} ({time.monotonic() - t:.0f}s)\n")
            out.flush()


# --------------------------------------------------------------------------- one mode


def mode_env(bin_dir: Path) -> dict[str, str]:
    """The suites' environment: no OS_* settings and no proxies of the caller (only the test
    timeout below); the `openstack` CLI beside this Python (it carries scoperouter's
    --os-scope plugin) first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OS_") and "proxy" not in k.lower() and k != "PYTEST_ADDOPTS"
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["OPENSTACKSDK_IMAGE"] = SDK_IMAGE
    # openstacksdk's test base defaults to 5 s a test (its unit-test budget); its functional
    # tox environment raises it. Waits for a server or an image stop after 120 s.
    env["OS_TEST_TIMEOUT"] = "180"
    env["OPENSTACKSDK_FUNC_TEST_TIMEOUT"] = "120"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def prepare(workdir: Path, mode: str, clouds: Mapping[str, Any]) -> Path:
    """The mode's working directory: clouds.yaml (the suites find it in the current directory:
    python-openstackclient's tests drop every OS_* variable), an empty secure.yaml (so no
    user-level one is merged), an empty pytest.ini, and the files openstacksdk's tests open by a
    path relative to the current directory, as upstream runs them from its tree:
    CONTRIBUTING.rst (the image tests upload it) and the orchestration test's template (a copy
    of the installed one, at its path in the tree: a directory without __init__.py, which never
    shadows the installed package)."""
    d = workdir / mode
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True, mode=0o700)
    _write(d / "clouds.yaml", yaml.safe_dump({"clouds": dict(clouds)}, sort_keys=False), 0o600)
    _write(d / "secure.yaml", "clouds: {}\n", 0o600)
    _write(d / "pytest.ini", "[pytest]\n", 0o644)
    _write(
        d / "CONTRIBUTING.rst", "Contributing: content for the image upload tests.\n" * 20, 0o644
    )
    root = site_root()
    for relative in SDK_TREE_FILES:
        (d / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / relative, d / relative)
    return d


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def run_pytest(
    d: Path,
    ids: Sequence[str],
    root: Path,
    report: Path,
    out: TextIO,
    timeout: float,
    jobs: int = 1,
) -> int:
    """One pytest run over `ids` (node ids, maybe -k) in directory `d`; its output goes to
    `out` and a log beside the report.

    With `jobs` > 1 the tests run in that many pytest-xdist workers, a test module per worker
    at a time (``--dist loadfile``: the suites' class-level fixtures stay in one process), as
    OpenStack's gate runs these suites (stestr, one worker per CPU): they are written to run
    concurrently, and a CLI process per command makes python-openstackclient's suite CPU-bound."""
    # pytest-timeout: no test can hang a run (openstacksdk's own timeout is not always heard)
    deselect = [arg for nid in NOT_RUN for arg in ("--deselect", nid)]  # as pytest ids them
    argv = [sys.executable, "-m", "pytest", "-c", str(d / "pytest.ini"), "--rootdir", str(root)]
    argv += ["-p", "no:cacheprovider", "-q", "-rN", "--report-log", str(report)]
    argv += ["--timeout", str(TEST_TIMEOUT), *deselect, *ids]
    if jobs > 1:
        argv += ["-n", str(jobs), "--dist", "loadfile"]
    log = report.with_suffix(".log")
    with open(log, "w", buffering=1) as logf:
        proc = subprocess.Popen(
            argv,
            cwd=d,
            env=mode_env(Path(sys.executable).parent),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            if _progress(line):
                out.write("    " + line)
                out.flush()
            if time.monotonic() > deadline:
                break
        try:
            return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            proc.wait()
            out.write(f"    timed out after {timeout:.0f}s; see {log}\n")
            return -1


def _progress(line: str) -> bool:
    """pytest -q progress lines (dots and a percentage) and its final summary."""
    s = line.strip()
    return s.endswith("%]") or (s.startswith("=") and s.endswith("=")) or " in " in s[-20:]


# --------------------------------------------------------------------------- all modes


class ModeBroken(RuntimeError):
    """A mode does not do what it says (e.g. the scope hook did not load): its run would
    compare nothing meaningful."""


def preflight(lab: Lab, cloud: str, mode: str, d: Path) -> list[str]:
    """Before a mode's run, check that both clients, configured exactly as the suites are,
    send requests where the mode says: openstacksdk's compute endpoint is the backend (direct)
    or the router (router, scoped), and the image both clients find is the cloud's own or, when
    scoped, the scope's cloud's (openstacksdk turns a vendor hook that fails to import into a
    warning: a silently unscoped run would prove nothing)."""
    from openstack import config as os_config
    from openstack import connection

    problems = []
    fed = lab.federation["clouds"][cloud]["services"]["compute"]["public"]
    want_compute = fed["backend"] if mode == "direct" else fed["url"]
    image_cloud = SCOPE["image"] if mode == "scoped" else cloud
    with contextlib.closing(lab.connect(f"{image_cloud.lower()}-admin")) as owner:
        want_image = owner.image.find_image(SDK_IMAGE, ignore_missing=False).id
    cfg = os_config.OpenStackConfig(
        config_files=[str(d / "clouds.yaml")],
        secure_files=[str(d / "secure.yaml")],
        load_envvars=False,
    )
    with contextlib.closing(connection.Connection(config=cfg.get_one(cloud="devstack"))) as c:
        compute = c.compute.get_endpoint() or ""
        if not compute.startswith(want_compute):
            problems.append(f"openstacksdk's compute endpoint is {compute}, not {want_compute}")
        found = c.image.find_image(SDK_IMAGE, ignore_missing=False).id
        if found != want_image:
            problems.append(f"openstacksdk found image {found}, not {image_cloud}'s {want_image}")
    cli = subprocess.run(
        ["openstack", "--os-cloud", "devstack", "image", "show", SDK_IMAGE,
         "-f", "value", "-c", "id"],
        cwd=d, env=mode_env(Path(sys.executable).parent), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    if cli.stdout.strip() != want_image:
        problems.append(
            f"the openstack CLI found image {cli.stdout.strip() or cli.stderr.strip()[-300:]}, "
            f"not {image_cloud}'s {want_image}"
        )
    return problems


def tempest_site(lab: Lab, cloud: str, mode: str, services: frozenset[str]) -> tempest.Site:
    """What a mode's tempest.conf says about the lab: its auth URL (the backend when direct),
    the admin credentials, the image to boot (the scope's cloud's when scoped: nova then
    fetches it from there) and the flavors, the service types the lab runs."""
    slug = cloud.lower()
    network = "network" in lab.federation["clouds"][cloud]["services"]  # neutron or stand-in
    admin_entry = lab.clouds.get(f"{slug}-admin")
    if not isinstance(admin_entry, Mapping) or "auth" not in admin_entry:
        raise ConfigMissing(f"the lab's clouds.yaml has no entry {slug}-admin")
    auth = {str(k): str(v) for k, v in admin_entry["auth"].items()}
    auth_url = auth["auth_url"]
    if mode == "direct":
        auth_url = backends(lab.federation, cloud).get("identity", auth_url)
    image_cloud = SCOPE["image"] if mode == "scoped" else cloud
    with contextlib.closing(lab.connect(f"{image_cloud.lower()}-admin")) as owner:
        image = owner.image.find_image(SDK_IMAGE, ignore_missing=False).id
        alt = owner.image.find_image(TEMPEST_IMAGE_ALT, ignore_missing=True)
    with contextlib.closing(lab.connect(f"{slug}-admin")) as admin:
        flavors = [admin.compute.find_flavor(f, ignore_missing=False).id for f in TEMPEST_FLAVORS]
    return tempest.Site(
        auth_url=auth_url,
        region=str(admin_entry.get("region_name") or cloud),
        admin=auth,
        image_ref=image,
        image_ref_alt=alt.id if alt is not None else image,
        flavor_ref=flavors[0],
        flavor_ref_alt=flavors[1],
        services=services | ({"network"} if network else set()),
        fixed_network=TEMPEST_NETWORK if network else None,
    )


def tempest_preflight(lab: Lab, cloud: str, mode: str, d: Path, site: tempest.Site) -> list[str]:
    """Before a mode's tempest run: tempest's own clients, made from the mode's tempest.conf in
    the mode's environment, reach the backend (direct) or the router, and, when scoped, list
    the scope's cloud's image (the proof that the hook scoped the requests: unscoped, the
    router would answer with the cloud's own image)."""
    found = tempest.preflight(d, tempest.tempest_env(mode_env(Path(sys.executable).parent), d),
                              SDK_IMAGE)  # fmt: skip
    if "error" in found:
        return [f"tempest's clients failed: {found['error']}"]
    problems = []
    hook = found.get("hook") or {}
    if bool(hook.get("endpoints")) != (mode == "direct"):
        problems.append(f"tempest's endpoint hook installed: {hook.get('endpoints')}")
    if bool(hook.get("scope")) != (mode == "scoped"):
        problems.append(f"tempest's scope hook installed: {hook.get('scope')}")
    fed = lab.federation["clouds"][cloud]["services"]["compute"]["public"]
    want_compute = fed["backend"] if mode == "direct" else fed["url"]
    if not str(found.get("compute", "")).startswith(want_compute):
        problems.append(
            f"tempest's compute client is at {found.get('compute')}, not {want_compute}"
        )
    image_cloud = SCOPE["image"] if mode == "scoped" else cloud
    if found.get("image") != [site.image_ref]:
        problems.append(
            f"tempest's image client found {found.get('image')}, not {image_cloud}'s "
            f"{site.image_ref}"
        )
    return problems


def worst(a: int, b: int) -> int:
    """The exit code of two runs: an aborted run's (neither 0 nor 1) first, else 1 if any test
    failed."""
    for code in (a, b):
        if code not in (0, 1):
            return code
    return max(a, b)


def _count_line(mode: str, results: Results, took: float) -> str:
    s = summarize(results)
    return (
        f"({LETTER[mode]}) {mode}: ran {s.run} tests (passed {s.passed}, failed "
        f"{s.failed}), skipped {s.skipped}, in {took:.0f}s\n"
    )


def run_modes(
    lab: Lab,
    cloud: str,
    modes: Sequence[str],
    ids: Sequence[str],
    workdir: Path,
    out: TextIO,
    timeout: float,
    clean: bool,
    keyword: str | None = None,
    jobs: int = 1,
    tempest_regexes: Sequence[str] = (),
    services: frozenset[str] | None = None,
) -> tuple[dict[str, Results], dict[str, int], dict[str, float]]:
    """Each mode: the pytest suites' node `ids` (openstacksdk, python-openstackclient), then
    Tempest's tests matching `tempest_regexes`; outcomes, exit codes (the worst of both) and
    wall times per mode."""
    root = site_root()
    by_mode: dict[str, Results] = {}
    codes: dict[str, int] = {}
    took: dict[str, float] = {}
    for mode in modes:
        if clean:
            lab.clean(out)
        projects = lab.project_ids(cloud) if mode == "direct" else None
        clouds = suite_clouds(lab.clouds, lab.federation, cloud, mode, SCOPE, projects)
        d = prepare(workdir, mode, clouds)
        problems = preflight(lab, cloud, mode, d) if ids else []
        if tempest_regexes:
            runs = lab.service_types if services is None else services
            site = tempest_site(lab, cloud, mode, runs)
            stand_in = "network" in site.services and "network" not in runs
            hook = tempest.hook_config(
                mode, lab.federation, cloud, SCOPE, site.region, network_stand_in=stand_in
            )
            tempest.write_mode_files(d, site, hook, _write)
            problems += tempest_preflight(lab, cloud, mode, d, site)
        if problems:
            raise ModeBroken(f"({LETTER[mode]}) {mode}: " + "; ".join(problems))
        out.write(f"({LETTER[mode]}) {mode}: checked (openstacksdk, the openstack CLI and "
                  f"tempest reach what the mode says); {len(ids)} selections and "
                  f"{len(tempest_regexes)} tempest patterns, in {d}\n")  # fmt: skip
        out.flush()
        t = time.monotonic()
        results: Results = {}
        code = 0
        if ids:
            report = d / "results.jsonl"
            args = [f"{root}/{i}" for i in ids] + (["-k", keyword] if keyword else [])
            code = run_pytest(d, args, root, report, out, timeout, jobs)
            results = parse_report_log(report) if report.is_file() else {}
            out.write("  openstacksdk, python-openstackclient: " + _count_line(mode, results,
                      time.monotonic() - t))  # fmt: skip
        if tempest_regexes:
            env = tempest.tempest_env(mode_env(Path(sys.executable).parent), d)
            tcode, tresults, ttook = tempest.run_mode(d, tempest_regexes, env, out, timeout, jobs)
            out.write("  tempest: " + _count_line(mode, tresults, ttook))
            results.update(tresults)
            code = worst(code, tcode) if ids else tcode
        codes[mode] = code
        took[mode] = time.monotonic() - t
        by_mode[mode] = results
        out.write(_count_line(mode, results, took[mode]))
        out.flush()
    if clean:
        lab.clean(out)
    return by_mode, codes, took


def rerun(
    lab: Lab,
    cloud: str,
    comp: Comparison,
    by_mode: dict[str, Results],
    workdir: Path,
    out: TextIO,
    timeout: float,
) -> dict[str, list[str]]:
    """Run every regression once more in each mode where it was worse than direct, serially;
    the re-run's outcome replaces the first. Returns test id -> modes where the re-run was as
    good as direct (flaky)."""
    root = site_root()
    flaky: dict[str, list[str]] = {}
    todo: dict[str, list[str]] = {}
    for tid, modes in comp.regressions().items():
        for m in modes:
            todo.setdefault(m, []).append(tid)
    for mode, tids in todo.items():
        d = workdir / mode
        again: Results = {}
        pytest_tids = [t for t in tids if suite_of(t) != TEMPEST]
        tempest_tids = [t for t in tids if suite_of(t) == TEMPEST]
        ids = [f"{root}/{n}" for n in (node_id_of(t, root) for t in pytest_tids) if n]
        if ids:
            out.write(f"({LETTER[mode]}) {mode}: re-running {len(ids)} test(s) worse than in (a)\n")
            report = d / "rerun.jsonl"
            run_pytest(d, ids, root, report, out, timeout)
            again.update(parse_report_log(report) if report.is_file() else {})
        if tempest_tids:
            out.write(f"({LETTER[mode]}) {mode}: re-running {len(tempest_tids)} tempest test(s) "
                      "worse than in (a)\n")  # fmt: skip
            env = tempest.tempest_env(mode_env(Path(sys.executable).parent), d)
            _, tresults, _ = tempest.run_mode(
                d, tempest.rerun_regexes(tempest_tids), env, out, timeout, 1, "tempest-rerun"
            )
            again.update(tresults)
        for tid in tids:
            if tid in again:
                if not worse(by_mode[comp.modes[0]][tid], again[tid]):
                    flaky.setdefault(tid, []).append(mode)
                by_mode[mode][tid] = again[tid]
        # a tempest class whose setUpClass failed the first time and ran this time
        for tid in tempest_tids:
            fixture = tid.rsplit(".", 1)[0] + ".setUpClass"
            if tid in again and fixture not in again:
                by_mode[mode].pop(fixture, None)
    return flaky


def print_report(
    comp: Comparison,
    by_mode: Mapping[str, Results],
    flaky: Mapping[str, list[str]],
    out: TextIO,
) -> None:
    modes = comp.modes
    out.write("\n== tests run per mode\n")
    for m in modes:
        s = summarize(by_mode.get(m, {}))
        per_suite = dict.fromkeys(SUITES, 0)
        for tid, o in by_mode.get(m, {}).items():
            if o.status in (Status.PASSED, Status.FAILED):
                per_suite[suite_of(tid)] += 1
        suites = ", ".join(f"{k} {v}" for k, v in per_suite.items())
        out.write(
            f"  ({LETTER[m]}) {m:<7} ran {s.run:>4} ({suites}): passed {s.passed}, "
            f"failed {s.failed}; skipped {s.skipped}\n"
        )
    diffs = comp.differences()
    out.write(f"\n== differences between modes, test by test ({len(diffs)})\n")
    if diffs:
        width = max(len(t) for t in diffs)
        out.write(f"  {'test':<{width}}  " + "  ".join(f"{m:<7}" for m in modes) + "\n")
        for tid in diffs:
            cells = "  ".join(f"{comp.status(tid, m)!s:<7}" for m in modes)
            out.write(f"  {tid:<{width}}  {cells}\n")
            for m in modes:
                failed = comp.rows[tid].get(m)
                if failed and failed.status is not Status.PASSED and failed.message:
                    out.write(f"      ({LETTER[m]}) {failed.message}\n")
    everywhere = comp.failing_everywhere()
    out.write(
        f"\n== failing in every mode ({len(everywhere)}): the lab's limits, "
        "docs/lab/openstack-suites.md lists them\n"
    )
    for tid in everywhere:
        msg = comp.rows[tid][modes[0]].message
        out.write(f"  {tid}\n      {msg}\n")
    out.write(f"\n== not run ({len(NOT_RUN)}): they wait for what the lab cannot do\n")
    for nid, why in NOT_RUN.items():
        out.write(f"  {nid}\n      {why}\n")
    if flaky:
        out.write(f"\n== passed when re-run ({len(flaky)}): flaky, not counted\n")
        for tid, ms in sorted(flaky.items()):
            out.write(f"  {tid} (first run failed in {', '.join(ms)})\n")


def verdict(
    comp: Comparison, by_mode: Mapping[str, Results], codes: Mapping[str, int], out: TextIO
) -> int:
    problems = []
    for m in comp.modes:
        if summarize(by_mode.get(m, {})).run == 0:
            problems.append(f"mode ({LETTER[m]}) {m} ran no test (pytest exit {codes.get(m)})")
        elif codes.get(m) not in (0, 1):
            problems.append(f"mode ({LETTER[m]}) {m}: pytest exit {codes.get(m)} (aborted?)")
    regressions = comp.regressions()
    for tid, ms in regressions.items():
        where = ", ".join(f"({LETTER[m]}) {m}" for m in ms)
        how = "/".join(sorted({str(comp.status(tid, m)) for m in ms}))
        first = comp.rows[tid][comp.modes[0]]
        was = "passes" if first.status is Status.PASSED else "skipped"
        why = [f"\n      (a) {first.message}"] if first.message else []
        why += [
            f"\n      ({LETTER[m]}) {got.message}"
            for m in ms
            if (got := comp.rows[tid].get(m)) is not None and got.message
        ]
        problems.append(f"{was} in (a) direct, {how} in {where}: {tid}" + "".join(why))
    if problems:
        out.write(f"\nFAILED: {len(problems)} problem(s)\n")
        for p in problems:
            out.write(f"  - {p}\n")
        return 1
    out.write(
        "\nOK: no test passes (or skips) direct and fails, skips (for another reason) or goes "
        "missing through the router\n"
    )
    return 0


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    from scoperouter_lab.layout import default_dir

    p = argparse.ArgumentParser(
        prog="python -m tests.peer",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--selection",
        choices=sorted(SELECTIONS),
        default="ci",
        help="which tests (default: ci; see tests/peer/selection.py)",
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated subset of {','.join(MODES)}, in this order; the "
        "first is the baseline (default: all three)",
    )
    p.add_argument(
        "--suites",
        default=",".join(SUITES),
        help=f"comma-separated subset of {','.join(SUITES)} (default: all three)",
    )
    p.add_argument(
        "-k",
        dest="keyword",
        metavar="EXPR",
        help="pytest's -k for openstacksdk and python-openstackclient: only the tests whose "
        "names match EXPR, e.g. 'test_server or flavor'",
    )
    p.add_argument(
        "--tempest-filter",
        metavar="REGEX",
        help="only the selected tempest tests whose ids REGEX is found in, e.g. 'test_servers'",
    )
    p.add_argument(
        "--services",
        metavar="TYPES",
        help="comma-separated service types the lab runs, e.g. identity,image,compute (default: "
        "what the lab's state says it runs); groups of other services are left out",
    )
    p.add_argument("--cloud", default="CloudOne", help="the lab cloud under test")
    p.add_argument(
        "--lab-dir",
        metavar="PATH",
        help=f"the lab (default: $SCOPEROUTER_LAB_DIR or {default_dir()})",
    )
    p.add_argument(
        "--workdir",
        metavar="PATH",
        help="where each mode's clouds.yaml, logs and JUnit report go (default: <lab dir>/peer)",
    )
    p.add_argument(
        "--timeout", type=float, default=3600, metavar="SECONDS", help="per mode (default: 3600)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="pytest-xdist workers per mode, one test module each at a time (default: the "
        "number of CPUs; 1 runs in one process). A re-run of a difference is always serial",
    )
    p.add_argument("--no-cleanup", action="store_true", help="do not delete what the suites leaked")
    p.add_argument(
        "--cleanup-only",
        action="store_true",
        help="only delete what earlier runs leaked, then exit",
    )
    p.add_argument("--list", action="store_true", help="print the selected node ids and exit")
    return p


def selected(
    selection: str,
    suites: Collection[str],
    services: Collection[str] | None,
    tempest_filter: str | None = None,
) -> tuple[list[str], list[str]]:
    """The pytest node ids and the tempest include regexes of a selection, for the `suites`
    and the service types the lab runs (None: all)."""
    groups = [g for g in runnable(SELECTIONS[selection], services) if g.suite in suites]
    ids = node_ids(groups, site_root())
    regexes = tempest.include_regexes(groups, tempest.read_list()) if TEMPEST in suites else []
    if tempest_filter:  # each include line is anchored (^): the filter looks ahead from there
        regexes = [f"^(?=.*(?:{tempest_filter})){r[1:]}" for r in regexes]
    return ids, regexes


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    from scoperouter_lab.layout import default_dir

    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        out.write(f"unknown mode(s) {', '.join(unknown)}; modes: {', '.join(MODES)}\n")
        return 2
    suites = [x.strip() for x in args.suites.split(",") if x.strip()]
    if not suites or any(x not in SUITES for x in suites):
        out.write(f"unknown suite(s) in {args.suites!r}; suites: {', '.join(SUITES)}\n")
        return 2
    if args.list:  # every group, whatever the lab runs
        ids, regexes = selected(args.selection, suites, None, args.tempest_filter)
        out.write("".join(i + "\n" for i in ids + regexes))
        return 0
    missing = [m for m in PEER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        out.write(f"missing {', '.join(missing)}: install the peer extra, "
                  "pip install -e '.[peer]'\n")  # fmt: skip
        return 2

    lab = Lab(Path(args.lab_dir).expanduser() if args.lab_dir else default_dir())
    if args.cleanup_only:
        lab.clean(out)
        return 0
    services = (
        frozenset(x.strip() for x in args.services.split(",") if x.strip())
        if args.services
        else lab.service_types
    )
    ids, regexes = selected(args.selection, suites, services, args.tempest_filter)
    if not ids and not regexes:
        out.write("no test selected\n")
        return 2
    workdir = Path(args.workdir).expanduser() if args.workdir else lab.root / "peer"
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    shown = ", ".join(f"({LETTER[m]}) {m}" for m in modes)
    out.write(
        f"peer suites ({versions()}) against {args.cloud} of the lab in {lab.root}\n"
        f"the lab runs: {', '.join(sorted(services))}\n"
        f"selection {args.selection}: {len(ids)} node ids, {len(regexes)} tempest tests or "
        f"patterns; modes {shown}; scope of (c): {SCOPE}\n"
    )
    t0 = time.monotonic()
    try:
        by_mode, codes, _ = run_modes(
            lab,
            args.cloud,
            modes,
            ids,
            workdir,
            out,
            args.timeout,
            clean=not args.no_cleanup,
            keyword=args.keyword,
            jobs=args.jobs,
            tempest_regexes=regexes,
            services=services,
        )
    except (ConfigMissing, ModeBroken) as exc:
        out.write(f"the lab cannot run the suites: {exc}\n")
        return 2
    comp = compare(by_mode, modes)
    flaky: dict[str, list[str]] = {}
    if comp.regressions():
        flaky = rerun(lab, args.cloud, comp, by_mode, workdir, out, args.timeout)
        comp = compare(by_mode, modes)
        if not args.no_cleanup:
            lab.clean(out)
    print_report(comp, by_mode, flaky, out)
    out.write(f"\n(total {time.monotonic() - t0:.0f}s; reports and logs in {workdir})\n")
    return verdict(comp, by_mode, codes, out)
