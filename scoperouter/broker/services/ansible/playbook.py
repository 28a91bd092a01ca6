"""One playbook run with ansible-runner, as the broker needs it.

- **A private data directory per run** (``<work_dir>/<run>``): the inventory (``localhost``,
  connection local, the broker's Python), the extra vars and the run's clouds.yaml (files 0600,
  the run's user's, never on a command line), ansible-runner's artifacts. It is removed when
  the run ends, whatever the outcome; one a killed broker left is removed before the
  operation's next run.
- **Data, never templates**: the extra vars (parameters, context, kept metadata and secrets,
  plan vars, the broker's own values) are written as YAML under ansible's ``!unsafe`` tag
  (:func:`untrusted_yaml`), so nothing in them is ever rendered, keys and nested values
  included.
- **Least privilege** (:mod:`.sandbox`): the launcher becomes the run's user (``run_as``)
  before it execs ``ansible-playbook``, inside bubblewrap when the host has it.
- **The modules' interpreter**: the broker's Python, through a wrapper that puts a
  ``sitecustomize`` on its path giving ``openstack.version`` back to openstack.cloud 2.5.0,
  which reads it in every module (openstacksdk 4.15 removed it).
- **The environment**: an allowlist of the broker's (:data:`RUN_ENV_KEPT`: the path, the
  locale, the time zone, proxies and CA bundles; nothing else of whoever started it: no
  ``OS_*``, no ``SCOPEROUTER_BROKER_*``, no ``PGPASSWORD`` or cloud provider keys), plus what
  ansible-runner sets for its callbacks, plus the service's configured ``env``;
  ``OS_CLIENT_CONFIG_FILE`` and ``OS_CLOUD=osb`` name the run's clouds.yaml, so
  ``openstack.cloud`` modules need no ``cloud:``.
- **Tied to the broker's life**: ``ansible-playbook`` is started through a launcher that asks
  the kernel to SIGKILL it when the broker dies (``PR_SET_PDEATHSIG``; pexpect, which
  ansible-runner uses, makes it ignore the SIGHUP that would otherwise end it), and every
  process of a run carries ``SCOPEROUTER_BROKER_RUN=<marker>``: before a run, whatever a dead
  run of the same instance left on this host (a module still running) is killed
  (:func:`reap`). The operation's re-run then finds what the dead run built, by name.
- **Bounded and stoppable**: ansible-runner's timeout is the operation's deadline; a cancel
  callback, asked every second, stops the run when a DELETE arrived or the lease was lost.
- **Results**: the ``set_stats`` data (``per_host: false``, ansible's default) of the run;
  the first task that failed (not ignored, not rescued), with its message.
- **Secrets**: events are read in memory and never written to disk nor logged whole; what is
  logged or put in a description (task names, a failed task's message) goes through a
  :class:`Scrubber` that replaces every known secret value (the run's token, the parameters
  the pack marks secret, the instance's kept secrets) and ``key: value`` pairs whose key says
  password, secret, token or private key. ``no_log: true`` tasks: Ansible censors their
  results itself, and nothing of them reaches the broker but the task's name.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import re
import shlex
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scoperouter.broker.services.ansible.sandbox import (
    RunAs,
    Sandbox,
    bwrap_command,
    chown_tree,
    python_paths,
)

log = logging.getLogger("scoperouter.broker.ansible")

MARKER_ENV = "SCOPEROUTER_BROKER_RUN"
# What a run keeps of the broker's own environment, by name (and every LC_*): what a playbook
# needs to find programs, speak the locale, reach the clouds through a proxy and trust their
# CAs. Anything else a run needs goes in the service's `env` (config), named there.
RUN_ENV_KEPT = frozenset(
    {
        "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "VIRTUAL_ENV", "PYTHONPATH",
        "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
        "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
    }
)  # fmt: skip
UNSAFE_TAG = "!unsafe"  # ansible's YAML tag for data that is never a template
CLOUD_NAME = "osb"  # the run's clouds.yaml entry (OS_CLOUD)
HIDDEN = "********"
CANCEL_CHECK_SECONDS = 1  # how often a running playbook asks whether to stop
MIN_SECRET = 4  # shorter values are not scrubbed (they would mangle every text)
# what of a task's name and of a failure's message reaches a description (the platform user's
# eyes): a short excerpt, one line
TASK_NAME_LIMIT = 80
MESSAGE_LIMIT = 200
NO_LOG_TEXT = "the output has been hidden due to the fact that 'no_log: true'"

# Run with the broker's Python (argv: uid gid parent ansible-playbook args...): become the run's
# user (uid -1: stay), no_new_privs, PR_SET_PDEATHSIG (after the switch: a change of user
# clears it), then exec ansible-playbook (same pid, so pexpect's child is ansible-playbook
# itself, or bwrap's); it dies at once if the broker already did (parent 0: bwrap's
# --die-with-parent does that).
LAUNCHER = """\
import ctypes, os, signal, sys
uid, gid, parent = (int(a) for a in sys.argv[1:4])
if uid >= 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        sys.exit("could not become the run's user")
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_NO_NEW_PRIVS) failed")
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_PDEATHSIG) failed")
if parent and os.getppid() != parent:
    sys.exit("the broker is gone")
os.execv(sys.argv[4], sys.argv[4:])
"""

# The modules' interpreter: the broker's Python with COMPAT on its path (a shell script, so
# only module processes load it, not ansible-playbook itself).
INTERPRETER = """\
#!/bin/sh
PYTHONPATH={compat}${{PYTHONPATH:+:$PYTHONPATH}} exec {python} "$@"
"""
# openstack.cloud 2.5.0 (the collection of the community package ansible 12.3.0, the last for
# Python 3.11) reads `openstack.version.__version__` in every module, a module openstacksdk
# 4.15 removed: each failed with "module 'openstack' has no attribute 'version'". Python
# imports sitecustomize at start: it gives the attribute back, with the installed version.
COMPAT = """\
\"\"\"openstack.version for openstack.cloud 2.5.0's modules (scoperouter broker).\"\"\"
try:
    import openstack
except ImportError:
    openstack = None
if openstack is not None and not hasattr(openstack, "version"):
    import importlib.metadata
    import sys
    import types

    _version = types.ModuleType("openstack.version")
    _version.__version__ = importlib.metadata.version("openstacksdk")
    openstack.version = _version
    sys.modules.setdefault("openstack.version", _version)
"""

_KEYED_SECRET = re.compile(
    r"""(?ix)
    ((?:password|passwd|secret|token|private[_ ]?key|credential)[\w-]*["']?\s*[:=]\s*["']?)
    ([^\s"',}]+)
    """
)
_PEM = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S
)


class Scrubber:
    """Replaces secrets in text meant for logs and descriptions."""

    def __init__(self, secrets: Iterable[object] = ()) -> None:
        values: set[str] = set()
        for value in secrets:
            values.update(_leaves(value))
        # longest first, so a secret containing another is replaced whole
        self._values = sorted((v for v in values if len(v) >= MIN_SECRET), key=len, reverse=True)

    def add(self, *secrets: object) -> None:
        values = set(self._values)
        for value in secrets:
            values.update(v for v in _leaves(value) if len(v) >= MIN_SECRET)
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, HIDDEN)
        text = _PEM.sub(HIDDEN, text)
        return _KEYED_SECRET.sub(lambda m: m.group(1) + HIDDEN, text)


def _leaves(value: object) -> Iterator[str]:
    """Every string (and number as text) inside a JSON-like value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple | set):
        for item in value:
            yield from _leaves(item)


@dataclass
class RunResult:
    """What a run did: ansible-runner's status (``successful``, ``failed``, ``timeout``,
    ``canceled``), the ``set_stats`` data, the first failed task (scrubbed), task counts."""

    status: str
    rc: int | None
    stats: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None
    tasks: int = 0
    changed: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "successful"


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run: `run_id` names its directory, `marker` the instance (reaping)."""

    run_id: str
    marker: str
    project_dir: Path
    playbook: str
    extravars: Mapping[str, Any]
    clouds_yaml: Mapping[str, Any]
    timeout: float
    scrub: Scrubber
    cancelled: Callable[[], bool] = lambda: False
    on_task: Callable[[str], None] = lambda _name: None


_RUNNER_IMPORT = threading.Lock()


def import_runner() -> None:
    """Import ansible-runner (on first use: a broker without Ansible packs never loads it), one
    thread at a time: the broker's worker threads start their first runs together, and two
    threads importing ansible-runner's modules at once (they import each other) saw one partially
    initialised ("cannot import name 'Runner' from partially initialized module
    'ansible_runner.runner'"), and every later run of the process failed ("'module' object is not
    iterable"): seen in the fuzz step's OSB family under load. Once it returns, its modules are
    whole: importing names from them only reads ``sys.modules``."""
    with _RUNNER_IMPORT:
        for module in ("ansible_runner.config.runner", "ansible_runner.runner"):
            importlib.import_module(module)


class Playbooks:
    """Runs playbooks with ansible-runner (one object per service; thread-safe)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        ansible_playbook: str | None = None,
        collections_path: str | None = None,
        env: Mapping[str, str] | None = None,
        run_as: RunAs | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.ansible_playbook = ansible_playbook
        self.collections_path = collections_path
        self.env = dict(env or {})
        self.run_as = run_as
        self.sandbox = sandbox

    def binary(self) -> str:
        """ansible-playbook beside the broker's Python (its virtualenv), else on PATH."""
        if self.ansible_playbook:
            return self.ansible_playbook
        beside = Path(sys.executable).parent / "ansible-playbook"
        if beside.exists():
            return str(beside)
        found = shutil.which("ansible-playbook")
        if found is None:
            raise RuntimeError(
                "ansible-playbook not found: install scoperouter[broker-ansible] in the "
                "broker's environment (or set ansible_playbook in the service's config)"
            )
        return found

    def _prepare(self, spec: RunSpec) -> Path:
        """The run's private data directory. Folders are the broker's (0755 when the run is
        another user's: inside a sandbox nobody else sees them; else the work dir, 0711,
        cannot be listed); the files the run reads and the folders it writes are the run's
        user's, 0600/0700."""
        shared = 0o755 if self.run_as else 0o700
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.work_dir, 0o711 if self.run_as and not self.sandbox else 0o700)
        pdd = self.work_dir / spec.run_id
        shutil.rmtree(pdd, ignore_errors=True)  # a dead run's, with its secrets
        for folder in (pdd, pdd / "inventory", pdd / "env", pdd / "compat"):
            folder.mkdir(mode=0o700)
            os.chmod(folder, shared)
        for folder in (pdd / "tmp", pdd / "home"):
            folder.mkdir(mode=0o700)
            self._give(folder)
        interpreter = pdd / "python"
        files = {
            pdd / "compat" / "sitecustomize.py": COMPAT,
            interpreter: INTERPRETER.format(
                compat=shlex.quote(str(pdd / "compat")), python=shlex.quote(sys.executable)
            ),
            pdd / "inventory" / "hosts": (
                f"localhost ansible_connection=local ansible_python_interpreter={interpreter}\n"
            ),
            pdd / "env" / "extravars": untrusted_yaml(spec.extravars),
            pdd / "clouds.yaml": yaml.safe_dump(dict(spec.clouds_yaml)),
        }
        for path, text in files.items():
            _write(path, text)
            self._give(path)
        _write(pdd / "launch.py", LAUNCHER)  # read by the broker's user only (it starts as it)
        os.chmod(interpreter, stat.S_IRWXU)
        return pdd

    def _give(self, path: Path) -> None:
        if self.run_as is not None:
            chown_tree(path, self.run_as)

    def _environment(
        self,
        base: Mapping[str, str],
        spec: RunSpec,
        pdd: Path,
        broker: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """ansible-runner's environment `base` (the broker's, plus its callback settings)
        reduced to :data:`RUN_ENV_KEPT` of the `broker`'s own and what ansible-runner added or
        changed, plus the run's."""
        broker = os.environ if broker is None else broker
        env = {
            k: v
            for k, v in base.items()
            if (k in RUN_ENV_KEPT or k.startswith("LC_") or broker.get(k) != v)
            and not k.startswith(("OS_", "SCOPEROUTER_BROKER_"))
        }
        env.update(
            {
                "OS_CLIENT_CONFIG_FILE": str(pdd / "clouds.yaml"),
                "OS_CLOUD": CLOUD_NAME,
                "HOME": str(pdd / "home"),
                "TMPDIR": str(pdd / "tmp"),
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0",
                "ANSIBLE_LOCAL_TEMP": str(pdd / "tmp"),
                "ANSIBLE_REMOTE_TEMP": str(pdd / "tmp"),
                "ANSIBLE_DEPRECATION_WARNINGS": "0",
                MARKER_ENV: spec.marker,
            }
        )
        if self.run_as is not None:
            env["USER"] = env["LOGNAME"] = self.run_as.name
        if self.collections_path:
            env["ANSIBLE_COLLECTIONS_PATH"] = self.collections_path
        env.update(self.env)
        return env

    def _command(self, spec: RunSpec, pdd: Path, command: list[str]) -> list[str]:
        """The launcher (as the run's user), in the sandbox when there is one, then
        ansible-playbook with ansible-runner's arguments."""
        uid, gid = (self.run_as.uid, self.run_as.gid) if self.run_as else (-1, -1)
        parent = 0 if self.sandbox else os.getpid()
        launch = [sys.executable, str(pdd / "launch.py"), str(uid), str(gid), str(parent)]
        launch += [self.binary(), *command[1:]]
        if self.sandbox is None:
            return launch
        readable = [*python_paths(), str(spec.project_dir), os.path.dirname(self.binary())]
        readable += [p for p in (self.collections_path or "").split(":") if p]
        return [
            *bwrap_command(
                self.sandbox,
                pdd=pdd,
                readable=readable,
                chdir=str(spec.project_dir),
                drop=self.run_as is not None,
            ),
            *launch,
        ]

    def run(self, spec: RunSpec) -> RunResult:
        import_runner()
        from ansible_runner.config.runner import RunnerConfig  # type: ignore[import-untyped]
        from ansible_runner.runner import Runner  # type: ignore[import-untyped]

        reap(spec.marker)
        pdd = self._prepare(spec)
        events = _Events(spec)
        try:
            config = RunnerConfig(
                private_data_dir=str(pdd),
                project_dir=str(spec.project_dir),
                playbook=spec.playbook,
                timeout=max(1, int(spec.timeout)),
                quiet=True,
                settings={
                    "pexpect_timeout": CANCEL_CHECK_SECONDS,
                    "suppress_output_file": True,
                    "suppress_ansible_output": True,
                },
            )
            config.prepare()
            config.env = self._environment(config.env, spec, pdd)
            config.command = self._command(spec, pdd, list(config.command))
            # what the run writes in ansible-runner's artifacts: the callback's partial
            # events (the rest of the folder stays the broker's)
            for folder in ("job_events", "fact_cache"):
                path = Path(config.artifact_dir) / folder
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._give(path)
            if self.run_as is not None:
                for path in (pdd / "artifacts", Path(config.artifact_dir)):
                    os.chmod(path, 0o755)
            runner = Runner(
                config=config,
                event_handler=events.handle,
                cancel_callback=events.cancel,
            )
            runner.run()
            status, rc = str(runner.status), runner.rc
        finally:
            reap(spec.marker)
            shutil.rmtree(pdd, ignore_errors=True)
        return RunResult(
            status=status,
            rc=rc,
            stats=events.stats,
            failure=events.failure or (events.error() if status != "successful" else None),
            tasks=events.tasks,
            changed=events.changed,
        )


class _Untrusted(dict):  # type: ignore[type-arg]
    """A mapping written with YAML's ``!unsafe`` tag."""


class _UntrustedDumper(yaml.SafeDumper):
    pass


def _represent_untrusted(dumper: yaml.SafeDumper, data: _Untrusted) -> yaml.Node:
    node = dumper.represent_dict(dict(data))
    node.tag = UNSAFE_TAG
    return node


_UntrustedDumper.add_representer(_Untrusted, _represent_untrusted)


def untrusted_yaml(variables: Mapping[str, Any]) -> str:
    """The run's extra vars as YAML whose top mapping is tagged ``!unsafe``: ansible-core
    (2.19: ``AnsibleConstructor.construct_yaml_unsafe``) builds everything under the tag, keys
    and nested values included, as data never trusted as a template, although it loads an
    ``-e @file`` as trusted. A value that looks like ``{{ ... }}`` or ``{% ... %}`` reaches the
    playbook as that literal text."""
    return yaml.dump(
        _Untrusted(variables),
        Dumper=_UntrustedDumper,
        default_flow_style=False,
        allow_unicode=False,
        sort_keys=False,
    )


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class _Events:
    """The run's events, read in memory (never written to disk: the handler says so)."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.stats: dict[str, Any] = {}
        self.failure: str | None = None
        self.tasks = 0
        self.changed = 0
        self._last_check = 0.0
        self._stop = False
        self._said: list[str] = []  # the last lines ansible printed outside tasks

    def error(self) -> str | None:
        """What ansible said when it failed outside any task (a playbook that does not
        parse, a missing collection), scrubbed: its first error line, else its last line."""
        if not self._said:
            return None
        errors = [line for line in self._said if "ERROR" in line]
        return _short(self.spec.scrub(errors[0] if errors else self._said[-1]))

    def handle(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event")
        data = event.get("event_data") or {}
        scrub = self.spec.scrub
        if kind in ("verbose", "error", "warning"):  # ansible's own messages (no task)
            for line in str(event.get("stdout") or "").splitlines():
                if line.strip():
                    self._said.append(line.strip())
            del self._said[:-20]
        if kind == "playbook_on_task_start":
            self.tasks += 1
            name = _short(scrub(str(data.get("task") or data.get("task_action") or "task")),
                          TASK_NAME_LIMIT)  # fmt: skip
            log.debug("%s: TASK [%s]", self.spec.run_id, name)
            with contextlib.suppress(Exception):
                self.spec.on_task(name)
        elif kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
            self.changed += 1
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get(
            "ignore_errors"
        ):
            if self.failure is None:
                self.failure = self._failure(data)
        elif kind == "playbook_on_stats":
            artifact = data.get("artifact_data")
            if isinstance(artifact, Mapping):
                self.stats = dict(artifact)
        return False  # never written to the artifacts directory

    def _failure(self, data: Mapping[str, Any]) -> str:
        scrub = self.spec.scrub
        task = _short(scrub(str(data.get("task") or "a task")), TASK_NAME_LIMIT)
        res = data.get("res") or {}
        if not isinstance(res, Mapping):
            res = {}
        if res.get("censored") or NO_LOG_TEXT in str(res.get("censored", "")):
            message = "its output is hidden (no_log)"
        else:
            message = str(res.get("msg") or "").strip()
            if not message:
                tail = str(res.get("stderr") or res.get("module_stderr") or "").strip()
                message = tail.splitlines()[-1] if tail else "failed"
        return f"task {task!r} failed: {_short(scrub(message))}"

    def cancel(self) -> bool:
        """ansible-runner asks about every second: stop when told to."""
        now = time.monotonic()
        if self._stop or now - self._last_check < CANCEL_CHECK_SECONDS / 2:
            return self._stop
        self._last_check = now
        try:
            self._stop = bool(self.spec.cancelled())
        except Exception as exc:  # the lease is lost, the database is gone: stop
            log.warning("%s: stopping the run: %s", self.spec.run_id, type(exc).__name__)
            self._stop = True
        return self._stop


def _short(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def marker(instance_id: str) -> str:
    """The value of ``SCOPEROUTER_BROKER_RUN`` for the runs of an instance."""
    return hashlib.sha256(instance_id.encode()).hexdigest()[:32]


def reap(run_marker: str) -> int:
    """SIGKILL every process on this host whose environment carries
    ``SCOPEROUTER_BROKER_RUN=<run_marker>``: what a run killed with its broker left (a module
    still talking to a cloud). Only this broker's runs carry it; its own live run of the
    instance, if any, is the caller's (one operation per instance at a time). Returns how many."""
    needle = f"{MARKER_ENV}={run_marker}".encode()
    killed = 0
    me = os.getpid()
    proc = Path("/proc")
    if not proc.is_dir():
        return 0
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    if killed:
        log.warning("killed %d process(es) a previous run of this instance left", killed)
    return killed
