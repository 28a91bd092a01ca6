"""What the machine is and what else it is doing (the figures depend on it)."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]


def apt_install(package: str, say: Callable[[str], None]) -> bool:
    """`apt-get install -y PACKAGE` (Debian's package), as root with apt-get there; it waits
    for dpkg's lock (another apt on the machine) and runs `apt-get update` once when the first
    try fails. True when the install succeeded."""
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return False
    say(f"{package} not found: installing it with `apt-get install -y {package}` (Debian package)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    cmd = [*apt, "install", "-y", "-q", "--no-install-recommends", package]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        say("apt-get install failed; running apt-get update once and retrying")
        subprocess.run([*apt, "update", "-q"], capture_output=True, env=env, timeout=900)
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        say(f"could not install {package}: {result.stderr.strip()[-300:]}")
    return result.returncode == 0


def machine_context() -> dict[str, Any]:
    """What else the machine was doing when the bench started (figures depend on it)."""
    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
    busy = psutil.cpu_percent(interval=1.0)
    others = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            pct = p.cpu_percent(None)
            if pct >= 5 and p.pid != os.getpid():
                cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:80]
                others.append({"pid": p.pid, "cpu_pct": pct, "cmd": cmd})
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    try:
        from mitmproxy.version import VERSION as mitm_version
    except ImportError:
        mitm_version = "?"
    import scoperouter
    from scoperouter import __version__

    return {
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "interpreter": interpreter(),
        "mitmproxy": mitm_version,
        "scoperouter": __version__,
        "commit": commit,
        "scoperouter_path": str(Path(scoperouter.__file__).resolve().parent),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "busy_pct_before": busy,
        "busy_processes_before": sorted(others, key=lambda o: -o["cpu_pct"])[:5],
    }


def interpreter() -> str:
    """The interpreter the bench (and its routers: the same ``sys.executable``) runs on: its
    version, real path (a virtualenv's ``python`` resolved) and compiler. Its build counts for
    the router's CPU: on the second kind of machine (docs/benchmarks.md), pyenv's default build
    (no ``--enable-optimizations``) costs the router more per request than Debian's python3
    (PGO and LTO), the one the deployment role's venv uses."""
    version, build = platform.python_version(), platform.python_build()
    return (
        f"Python {version} {os.path.realpath(sys.executable)} "
        f"({platform.python_compiler()}, built {build[1]})"
    )


def prime_processes() -> list[psutil.Process]:
    """Start measuring every process's CPU (see busy_others)."""
    procs = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
            procs.append(p)
    return procs


def busy_others(procs: list[psutil.Process], ours: set[int], limit: int = 3) -> list[dict]:
    """The busiest processes since prime_processes() that are not the bench's."""
    out = []
    for p in procs:
        if p.pid in ours:
            continue
        with contextlib.suppress(psutil.Error):
            pct = p.cpu_percent(None)
            if pct >= 10:
                cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:60]
                out.append({"pid": p.pid, "cpu_pct": round(pct), "cmd": cmd})
    return sorted(out, key=lambda o: -o["cpu_pct"])[:limit]
