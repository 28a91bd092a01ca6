"""Who a pack's playbook runs as, and what it sees (docs/broker/ansible-packs.md, "What a
run can do").

- **The run's user** (``run_as``: a user name or uid): a broker running as root starts every
  playbook as this user (default ``nobody``; the deploy role's broker is not root); the
  launcher drops to it (no supplementary groups, ``no_new_privs``) before it execs
  ``ansible-playbook``, so neither the playbook nor its modules hold any of root's rights. A
  broker that is not root runs packs as itself; a ``run_as`` naming another user is a config
  error at start (it could not switch). ``root`` is refused.
- **The sandbox** (``isolation``: ``auto``, the default, ``bwrap`` or ``none``): with
  bubblewrap (``bwrap``, Debian's ``bubblewrap``), the run gets a fresh root holding only what it
  needs, read-only: ``/usr`` (and the ``/bin``, ``/lib``... links into it), a short list of
  ``/etc`` entries (users, name resolution, CA certificates, time zone, the loader's cache),
  the broker's Python (its virtualenv and the interpreter it was made from), the pack, the
  collections path, and what ``sandbox_readable`` adds; read-write: its private data directory
  and what ``sandbox_writable`` adds; its own ``/tmp``, ``/dev`` and ``/proc`` (a PID
  namespace: no other process is visible). The broker's config, secret-key files, clouds.yaml
  and database are not in it. Networking is the host's (modules talk to the clouds).
  ``auto`` without bwrap on the host runs unsandboxed (a warning at start): the run's user then
  reads whatever that user may read on the host.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scoperouter.broker.config import BrokerConfigError

log = logging.getLogger("scoperouter.broker.ansible")

DEFAULT_RUN_AS = "nobody"
ISOLATIONS = ("auto", "bwrap", "none")
# /etc entries a run may read: users and groups (ansible looks its user up), name resolution,
# CA certificates (openstacksdk's TLS), the time zone, the dynamic loader
ETC = (
    "passwd", "group", "nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf",
    "services", "protocols", "ssl", "ca-certificates", "ca-certificates.conf", "pki",
    "crypto-policies", "localtime", "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "alternatives", "mime.types", "os-release",
)  # fmt: skip
TOP_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class RunAs:
    """The user a run switches to (None: the broker's own user, no switch)."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Sandbox:
    """bubblewrap, and the paths a run sees besides the standard ones."""

    bwrap: str
    readable: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()


def run_as(setting: object, where: str) -> RunAs | None:
    """The ``run_as`` setting checked against who the broker is."""
    me = os.geteuid()
    if setting in (None, ""):
        if me != 0:
            return None  # the broker's own user
        setting = DEFAULT_RUN_AS
    try:
        name = str(setting)
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise BrokerConfigError(
            f"{where}.run_as: no user {str(setting)[:64]!r} on this host (create it, or name "
            "another unprivileged user)"
        ) from None
    if entry.pw_uid == 0:
        raise BrokerConfigError(
            f"{where}.run_as: packs never run as root; name an unprivileged user"
        )
    if me != 0:
        if entry.pw_uid != me:
            raise BrokerConfigError(
                f"{where}.run_as: {entry.pw_name}: the broker runs as uid {me}, not root, so it "
                "cannot start playbooks as another user; run the broker as root or as "
                f"{entry.pw_name}, or leave run_as out (packs then run as the broker's user)"
            )
        return None
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def sandbox(settings: Mapping[str, Any], where: str) -> Sandbox | None:
    """The ``isolation`` setting: bubblewrap, or None (no sandbox)."""
    isolation = str(settings.get("isolation") or "auto")
    if isolation not in ISOLATIONS:
        raise BrokerConfigError(f"{where}.isolation: one of {', '.join(ISOLATIONS)}")
    readable = _paths(settings.get("sandbox_readable"), f"{where}.sandbox_readable")
    writable = _paths(settings.get("sandbox_writable"), f"{where}.sandbox_writable")
    if isolation == "none":
        return None
    found = str(settings.get("bwrap") or "") or shutil.which("bwrap")
    why: str | None = "bwrap not found (install bubblewrap"
    if found and os.access(found, os.X_OK):
        why = _probe(found)
    if why is None:
        return Sandbox(str(found), readable, writable)
    if isolation == "bwrap":
        raise BrokerConfigError(f"{where}.isolation: {why}, or set isolation: none)")
    log.warning(
        "%s: %s): playbooks run without a sandbox, reading what their user may read on this host",
        where,
        why,
    )
    return None


def _probe(bwrap: str) -> str | None:
    """Whether bwrap can make a sandbox here (a service manager may forbid namespaces or
    mounts): None, or why not."""
    try:
        done = subprocess.run(
            [bwrap, "--unshare-pid", "--unshare-ipc", "--ro-bind", "/", "/", "--proc", "/proc",
             "--", "true"],
            capture_output=True,
            timeout=30,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap cannot start ({type(exc).__name__}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bwrap cannot make a sandbox here ({said[-1][:200] if said else done.returncode}"
    return None


def _paths(value: object, where: str) -> tuple[str, ...]:
    if value in (None, ""):
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise BrokerConfigError(f"{where}: a list of absolute paths")
    paths = tuple(str(v) for v in value)
    for path in paths:
        if not os.path.isabs(path):
            raise BrokerConfigError(f"{where}: {path[:200]!r} is not an absolute path")
    return paths


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def run_env(value: object, where: str) -> dict[str, str]:
    """A service's ``env``: variables every run of it gets beside the allowlisted ones of the
    broker (``{NAME: value}``; not ``OS_*`` nor ``SCOPEROUTER_BROKER_*``, which the broker sets
    or keeps out)."""
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping):
        raise BrokerConfigError(f"{where}: a mapping of variable names to values")
    env: dict[str, str] = {}
    for name, val in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise BrokerConfigError(f"{where}: {str(name)[:64]!r} is not a variable name")
        if name.startswith(("OS_", "SCOPEROUTER_BROKER_")):
            raise BrokerConfigError(
                f"{where}.{name}: OS_* and SCOPEROUTER_BROKER_* are the broker's"
            )
        if not isinstance(val, str | int | float) or isinstance(val, bool):
            raise BrokerConfigError(f"{where}.{name}: a string or a number")
        env[name] = str(val)
    return env


def python_paths() -> list[str]:
    """The broker's Python as a run needs it: the virtualenv and the interpreter's prefix."""
    out = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix,
                                         sys.base_exec_prefix)}  # fmt: skip
    out.add(os.path.realpath(os.path.dirname(os.path.realpath(sys.executable))))
    # the venv's own bin (sys.executable may be a link into the base interpreter)
    out.add(os.path.dirname(os.path.abspath(sys.executable)))
    # scoperouter itself (a scoped run's clouds.yaml names scoperouter.client:connection_hook),
    # wherever it is installed (an editable install: the checkout's package folder alone)
    out.add(os.path.realpath(Path(__file__).resolve().parents[3]))
    return sorted(out)


def bwrap_command(
    box: Sandbox,
    *,
    pdd: Path,
    readable: Iterable[str],
    chdir: str,
    drop: bool,
) -> list[str]:
    """The bwrap arguments that start a run in a fresh root (the command follows them)."""
    args = [
        box.bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--dev", "/dev",
        "--perms", "1777", "--tmpfs", "/dev/shm",  # ansible's multiprocessing
        "--proc", "/proc",
        "--perms", "1777", "--tmpfs", "/tmp",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for name in TOP_LINKS:
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    for name in ETC:
        entry = Path("/etc") / name
        if entry.exists():
            args += ["--ro-bind", os.path.realpath(entry), str(entry)]
    binds: list[tuple[str, str, str]] = []  # (option, source, destination)
    for path in [*readable, *box.readable]:
        real = os.path.realpath(path)
        if os.path.exists(real):
            binds.append(("--ro-bind", real, real))
    for path in [str(pdd), *box.writable]:
        real = os.path.realpath(path)
        if os.path.exists(real):
            binds.append(("--bind", real, real))
    made = {"/", "/usr", "/etc", "/tmp", "/dev", "/proc"}
    bound: list[str] = ["/usr"]
    for option, source, dest in sorted(binds, key=lambda b: (b[2].count("/"), b[0] == "--bind")):
        if option == "--ro-bind" and any(_under(dest, top) for top in bound):
            continue  # already visible through a folder above it
        # the folders above it, 0755 (bwrap would make them 0700: the run's user could not
        # go through them)
        for parent in reversed(Path(dest).parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += [option, source, dest]
        made.add(dest)
        bound.append(dest)
    if drop:
        # root inside keeps only what the launcher needs to become the run's user
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += ["--chdir", os.path.realpath(chdir), "--"]
    return args


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def chown_tree(path: Path, who: RunAs) -> None:
    """Give `path` (a run's file or folder) to the run's user."""
    os.chown(path, who.uid, who.gid, follow_symlinks=False)
