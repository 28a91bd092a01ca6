"""Tempest's API tests as the runner's third suite: which tests, the tempest.conf of a mode, the
mode's hook, and the run (stestr, a subunit stream the runner compares like pytest's reports).

How each mode reaches where it says, without changing a test:

* ``router``: tempest.conf's ``[identity] uri_v3`` is the lab's auth URL (the router); every
  other service as the keystone catalog advertises it (the routers).
* ``direct``: ``uri_v3`` is keystone's backend, and every base URL tempest takes from the
  catalog is moved from the router onto the backend of the same service (the federation's
  ``url`` -> ``backend`` pairs: same ports and paths, another address). Tempest has no
  per-service endpoint override (its ``endpoint_type`` only picks an interface of the same
  catalog, and every interface of the lab's catalog is on the router), so the hook below
  rewrites ``KeystoneV3AuthProvider.base_url``'s answer: the equivalent of openstacksdk's
  ``<service>_endpoint_override``. The catalog itself is left as keystone sent it (the tests
  that read it see the real one).
* ``scoped``: as ``router``, and every authenticated request's ``X-Auth-Token`` carries the
  scope (``<token>!SCOPE!<json>``, plus ``X-Scope``), completed with the cloud's region for the
  catalog's other service types, as scoperouter's openstacksdk hook does. The hook wraps
  ``KeystoneAuthProvider._decorate_request``, through which tempest's REST clients add the
  token to every request (the alternate credentials of its negative tests included).
  Token requests carry no token: they go unscoped to the cloud's keystone, as with openstacksdk.

The hook (``tests/peer/tempest_hook.py``) is loaded into every Python process of the mode by a
``sitecustomize.py`` on the mode's ``PYTHONPATH`` (stestr's workers inherit it); it reads what
to do from a JSON file named by ``$SCOPEROUTER_PEER_TEMPEST`` (no secret in it). Before each
mode, ``tempest_preflight.py``, run in the same environment, proves it: tempest's own compute
client's base URL is the backend (direct) or the router, and tempest's own image client finds
the image of the scope's cloud (scoped).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO
from urllib.parse import urlsplit

from tests.peer.clouds import ConfigMissing, backends
from tests.peer.results import Results, parse_subunit, tempest_test_id
from tests.peer.selection import INTEROP_LIST, TEMPEST, Group

HOOK_ENV = "SCOPEROUTER_PEER_TEMPEST"
HOOK_FILE = Path(__file__).with_name("tempest_hook.py")
PREFLIGHT_FILE = Path(__file__).with_name("tempest_preflight.py")
# tempest's [service_available] option -> the service type the lab runs it as
SERVICE_OPTIONS = {
    "nova": "compute",
    "glance": "image",
    "swift": "object-store",
    "cinder": "block-storage",
    "heat": "orchestration",
    "neutron": "network",
}
# tempest's own grouping of tests into workers: one test class per worker at a time
GROUP_REGEX = r"([^\.]*\.)*"


# --------------------------------------------------------------------------- which tests


def read_list(path: Path = INTEROP_LIST) -> list[str]:
    """The test ids of a list file (``#`` comments and blank lines skipped)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def idempotent_id(listed: str) -> str | None:
    """``...test_x[id-<uuid>,smoke]`` -> ``id-<uuid>``."""
    m = re.search(r"\bid-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", listed)
    return m.group(0) if m else None


def selected_ids(groups: Sequence[Group], listed: Sequence[str]) -> list[str]:
    """The tempest test ids (without attributes) that `groups` select: for a `listed` group the
    interop list's tests under its module (and its `only` prefixes), else nothing (a group
    that is not `listed` selects by prefix: see `include_regexes`)."""
    out: list[str] = []
    names = [tempest_test_id(line) for line in listed]
    for g in groups:
        if g.suite != TEMPEST or not g.listed:
            continue
        prefixes = [f"{g.module}.{o}." for o in g.only] or [f"{g.module}."]
        out += [n for n in names if any((n + ".").startswith(p) for p in prefixes)]
    return list(dict.fromkeys(out))


def include_regexes(groups: Sequence[Group], listed: Sequence[str]) -> list[str]:
    """stestr's --include-list lines (regexes searched in each test id, attributes included)
    for the tempest `groups`."""
    out = [f"^{re.escape(tid)}(\\[|$)" for tid in selected_ids(groups, listed)]
    for g in groups:
        if g.suite == TEMPEST and not g.listed:
            prefixes = [f"{g.module}.{o}" for o in g.only] or [g.module]
            out += [f"^{re.escape(p)}(\\.|\\[|$)" for p in prefixes]
    return out


def rerun_regexes(test_ids: Sequence[str]) -> list[str]:
    """Regexes for a re-run of `test_ids` (a class's ``setUpClass`` re-runs its class)."""
    out = []
    for tid in test_ids:
        cls, _, last = tid.rpartition(".")
        if last in ("setUpClass", "tearDownClass"):
            out.append(f"^{re.escape(cls)}\\.")
        else:
            out.append(f"^{re.escape(tid)}(\\[|$)")
    return out


# --------------------------------------------------------------------------- tempest.conf


@dataclass(frozen=True)
class Site:
    """What a mode's tempest.conf says about the lab (looked up before the mode runs)."""

    auth_url: str
    region: str
    admin: Mapping[str, str]  # the lab's <cloud>-admin auth: username, password, project ...
    image_ref: str  # the image the suites boot: the scope's cloud's when scoped
    image_ref_alt: str
    flavor_ref: str
    flavor_ref_alt: str
    # service types the lab serves. The block-storage stand-in (an empty cinder that refuses
    # writes) is not counted; the network stand-in is: tempest's compute tests skip every class
    # that boots a server unless neutron is available (nova has had no other network since
    # nova-network), and the stand-in serves what they ask of it (a shared network, ports,
    # a default security group). tempest's network API tests (tempest.api.network) are never
    # selected: they would test the stand-in.
    services: frozenset[str]
    fixed_network: str | None = None  # the network servers boot on (the stand-in's shared one)


def service_available(services: Collection[str]) -> dict[str, bool]:
    """tempest's [service_available] from the service types the lab serves (`Site.services`)."""
    return {opt: stype in services for opt, stype in SERVICE_OPTIONS.items()}


def _oslo(value: object) -> str:
    """A value as oslo.config reads it back: ``$`` starts a substitution, so it is doubled."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("$", "$$")


def tempest_conf(site: Site, d: Path) -> str:
    """The tempest.conf text for a mode whose directory is `d` (holds a password: the caller
    writes it mode 0600 in a 0700 directory and never prints it)."""
    avail = service_available(site.services)
    admin = site.admin
    domain = admin.get("user_domain_name") or "Default"
    sections: dict[str, dict[str, object]] = {
        "DEFAULT": {
            "log_dir": d,
            "log_file": "tempest.log",
            "use_stderr": False,
            "debug": False,
        },
        "oslo_concurrency": {"lock_path": d / "locks"},
        "auth": {
            # a project and users per test class, made with the admin credentials (the gate's
            # way); the cleanup knows their tempest-<Class>-<n> names
            "use_dynamic_credentials": True,
            "create_isolated_networks": False,
            "admin_username": admin["username"],
            "admin_password": admin["password"],
            "admin_project_name": admin["project_name"],
            "admin_domain_name": domain,
            "default_credentials_domain_name": domain,
        },
        "identity": {
            "uri_v3": site.auth_url,
            "region": site.region,
            "v3_endpoint_type": "public",
            "admin_role": "admin",
        },
        "identity-feature-enabled": {"application_credentials": True, "project_tags": True},
        "compute": {
            "region": site.region,
            "endpoint_type": "publicURL",
            "image_ref": site.image_ref,
            "image_ref_alt": site.image_ref_alt,
            "flavor_ref": site.flavor_ref,
            "flavor_ref_alt": site.flavor_ref_alt,
            "build_timeout": 120,
            "max_microversion": "latest",
            "min_compute_nodes": 1,
            **({"fixed_network_name": site.fixed_network} if site.fixed_network else {}),
        },
        "compute-feature-enabled": {
            # nova's fake virt driver: no console but text, no snapshot upload (an image made
            # from a server stays queued), no migration, no neutron ports to attach
            "console_output": True,
            "resize": True,
            "snapshot": False,
            "shelve": False,
            "shelve_migrate": False,
            "live_migration": False,
            "cold_migration": False,
            "vnc_console": False,
            "spice_console": False,
            "serial_console": False,
            "interface_attach": False,
            "attach_encrypted_volume": False,
            "change_password": False,
            "volume_multiattach": False,
            "swap_volume": False,
        },
        "image": {"region": site.region, "endpoint_type": "public"},
        "object-storage": {
            "region": site.region,
            "endpoint_type": "public",
            "operator_role": "member",
            "reseller_admin_role": "ResellerAdmin",
        },
        "object-storage-feature-enabled": {"discoverability": True, "container_sync": False},
        "volume": {
            "region": site.region,
            "endpoint_type": "public",
            "build_timeout": 120,
            "max_microversion": "latest",
            "volume_size": 1,
        },
        "volume-feature-enabled": {"backup": False, "extend_attached_volume": False},
        "validation": {"run_validation": False},
        "service_available": {**avail, "horizon": False},
    }
    lines = [
        "# written by python -m tests.peer for one mode; holds the lab's admin password",
    ]
    for name, options in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{key} = {_oslo(value)}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def hook_config(
    mode: str,
    federation: Mapping[str, Any],
    cloud: str,
    scope: Mapping[str, str],
    region: str,
    network_stand_in: bool = False,
) -> dict[str, Any]:
    """What the mode's hook does (tempest_hook.py reads it): ``endpoints`` (direct: router
    origin -> backend origin, per service) or ``scope`` (scoped); ``network_stand_in`` in
    every mode while the lab's network is scoperouter's stand-in."""
    out = _hook_config(mode, federation, cloud, scope, region)
    return {**out, "network_stand_in": True} if network_stand_in else out


def _hook_config(
    mode: str, federation: Mapping[str, Any], cloud: str, scope: Mapping[str, str], region: str
) -> dict[str, Any]:
    if mode == "direct":
        if "identity" not in backends(federation, cloud):  # names a missing cloud, too
            raise ConfigMissing(f"{cloud} has no identity backend in the lab's federation.yaml")
        moves: dict[str, str] = {}
        for interfaces in federation["clouds"][cloud]["services"].values():
            for iface in interfaces.values() if isinstance(interfaces, Mapping) else ():
                if isinstance(iface, Mapping) and iface.get("url") and iface.get("backend"):
                    moves[_origin(str(iface["url"]))] = _origin(str(iface["backend"]))
        return {"mode": mode, "endpoints": moves}
    if mode == "scoped":
        return {"mode": mode, "scope": json.dumps(dict(scope)), "region": region}
    return {"mode": mode}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def sitecustomize(hook: Path = HOOK_FILE) -> str:
    """The mode's sitecustomize.py: loads the hook by its path (the tests package is not
    importable from tempest's processes) and installs it."""
    return (
        "# written by python -m tests.peer: the tempest suite's hook, in every Python process\n"
        "import importlib.util as _util\n\n"
        f"_spec = _util.spec_from_file_location('scoperouter_peer_tempest_hook', {str(hook)!r})\n"
        "_hook = _util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_hook)\n"
        "_hook.install()\n"
    )


def stestr_conf(site_packages: Path) -> str:
    return (
        "[DEFAULT]\n"
        f"test_path={site_packages / 'tempest' / 'test_discover'}\n"
        f"top_dir={site_packages}\n"
        f"group_regex={GROUP_REGEX}\n"
    )


def site_packages() -> Path:
    spec = importlib.util.find_spec("tempest")
    if spec is None or not spec.origin:
        raise SystemExit("tempest is not installed: pip install -e '.[peer]'")
    return Path(spec.origin).parent.parent


def tempest_env(base: Mapping[str, str], d: Path) -> dict[str, str]:
    """The mode's environment for tempest: its tempest.conf, its hook."""
    env = dict(base)
    env["TEMPEST_CONFIG_DIR"] = str(d)
    env["TEMPEST_CONFIG"] = "tempest.conf"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(d / "site"), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env[HOOK_ENV] = str(d / "tempest-hook.json")
    return env


def write_mode_files(
    d: Path, site: Site, hook: Mapping[str, Any], write: Callable[[Path, str, int], None]
) -> None:
    """tempest.conf (0600), the hook's config and sitecustomize.py, stestr's config, in `d`
    (the mode's 0700 directory)."""
    write(d / "tempest.conf", tempest_conf(site, d), 0o600)
    write(d / "tempest-hook.json", json.dumps(dict(hook), indent=1) + "\n", 0o600)
    (d / "site").mkdir(mode=0o700, exist_ok=True)
    (d / "locks").mkdir(mode=0o700, exist_ok=True)
    write(d / "site" / "sitecustomize.py", sitecustomize(), 0o644)
    write(d / ".stestr.conf", stestr_conf(site_packages()), 0o644)


# --------------------------------------------------------------------------- the run


def preflight(d: Path, env: Mapping[str, str], image_name: str) -> dict[str, Any]:
    """Run tempest_preflight.py in the mode's environment: what tempest's own clients reach."""
    proc = subprocess.run(
        [sys.executable, str(PREFLIGHT_FILE), image_name],
        cwd=d, env=dict(env), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    try:
        found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    return found


class Progress:
    """Prints a tempest run's progress: every failure as it comes and a count now and then."""

    def __init__(self, out: TextIO, every: int = 25) -> None:
        self.out, self.every = out, every
        self.done = self.failed = 0

    def test(self, test: Mapping[str, Any]) -> None:
        status = test.get("status")
        if status not in ("success", "fail", "skip", "xfail", "uxsuccess"):
            return
        self.done += 1
        if status in ("fail", "uxsuccess"):
            self.failed += 1
            self.out.write(f"    FAIL {tempest_test_id(str(test.get('id')))}\n")
        if self.done % self.every == 0:
            self.out.write(f"    {self.done} tests done, {self.failed} failed\n")
        self.out.flush()


class _Tee:
    """A binary reader that copies what it reads to a file (the stream is parsed live and kept
    whole for the report)."""

    def __init__(self, source: IO[bytes], copy: IO[bytes]) -> None:
        self.source, self.copy = source, copy

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n)
        self.copy.write(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data = self.source.readline(*args)
        self.copy.write(data)
        return data


def run_stestr(
    d: Path,
    regexes: Sequence[str],
    env: Mapping[str, str],
    stream: Path,
    out: TextIO,
    timeout: float,
    jobs: int = 1,
) -> int:
    """One stestr run of the tests whose ids match `regexes`, in `d`; the subunit stream goes
    to `stream`, stestr's own messages to a log beside it."""
    import subunit
    import testtools

    include = stream.with_suffix(".include")
    include.write_text("".join(r + "\n" for r in regexes))
    stestr = [sys.executable, "-m", "stestr"]
    if not (d / ".stestr").is_dir():
        subprocess.run([*stestr, "init"], cwd=d, env=dict(env), capture_output=True, check=True)
    argv = [*stestr, "run", "--subunit", "--include-list", str(include)]
    argv += ["--concurrency", str(max(1, jobs))] if jobs > 1 else ["--serial"]
    progress = Progress(out)
    log = stream.with_suffix(".log")
    with open(log, "wb") as logf, open(stream, "wb") as copy:
        proc = subprocess.Popen(
            argv,
            cwd=d,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=logf,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        timed_out = threading.Event()

        def stop() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            assert proc.stdout is not None
            result = testtools.StreamToDict(progress.test)
            result.startTestRun()
            try:
                subunit.ByteStreamToStreamResult(
                    _Tee(proc.stdout, copy), non_subunit_name="stdout"
                ).run(result)
            finally:
                result.stopTestRun()
            code = proc.wait()
        finally:
            timer.cancel()
    if timed_out.is_set():
        out.write(f"    timed out after {timeout:.0f}s; see {log}\n")
        return -1
    # with --subunit stestr exits 0 whatever the tests did: 1 when one failed, as pytest does
    return 1 if code == 0 and progress.failed else code


def run_mode(
    d: Path,
    regexes: Sequence[str],
    env: Mapping[str, str],
    out: TextIO,
    timeout: float,
    jobs: int,
    name: str = "tempest",
) -> tuple[int, Results, float]:
    """A mode's tempest run: (stestr's exit code, the outcomes, seconds)."""
    t = time.monotonic()
    stream = d / f"{name}.subunit"
    code = run_stestr(d, regexes, env, stream, out, timeout, jobs)
    results = parse_subunit(stream) if stream.is_file() else {}
    return code, results, time.monotonic() - t
