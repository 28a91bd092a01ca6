"""Start, find and stop the lab's long-running processes.

Every process is started in a new session (so it leads its own process group) with its output
appended to a log file, and recorded in a PID file (JSON) that also holds the kernel start time
of the process: a PID that was reused by an unrelated process never matches, so ``down`` only
ever signals what ``up`` started. Stopping signals the recorded process group.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses
    return text[text.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _proc_stat(pid)
    if fields is None:
        return None
    return int(fields[19])


def is_zombie(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is None or fields[0] in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _proc_stat(int(entry))
        if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def fingerprint(*parts: object) -> str:
    """A short hash of what defines a process (argv, env, config file contents)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            try:
                h.update(part.read_bytes())
            except OSError:
                h.update(b"<missing>")
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


@dataclass
class Record:
    name: str
    pid: int
    pgid: int
    started: int  # kernel start time, ticks
    argv: list[str]
    log: str
    fingerprint: str
    when: float

    def alive(self) -> bool:
        return start_time(self.pid) == self.started and not is_zombie(self.pid)

    def members(self) -> list[int]:
        if not self.alive():
            return []
        return group_members(self.pgid) or [self.pid]

    def rss(self) -> int:
        return sum(rss_bytes(p) for p in self.members())


class ProcessTable:
    """The PID files of one lab (``<dir>/run/<name>.pid``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def path(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def get(self, name: str) -> Record | None:
        try:
            data = json.loads(self.path(name).read_text())
            return Record(**data)
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[Record]:
        if not self.run_dir.is_dir():
            return []
        out = []
        for p in sorted(self.run_dir.glob("*.pid")):
            rec = self.get(p.stem)
            if rec is not None:
                out.append(rec)
        return out

    def running(self, name: str, fp: str | None = None) -> Record | None:
        """The record of `name` when its process is alive (and, given `fp`, unchanged)."""
        rec = self.get(name)
        if rec is None or not rec.alive():
            return None
        if fp is not None and rec.fingerprint != fp:
            return None
        return rec

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        fp: str = "",
        user: str | None = None,
    ) -> Record:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(
                f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}: "
                f"{' '.join(argv)}\n".encode()
            )
            out.flush()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=str(cwd) if cwd else None,
                start_new_session=True,
                close_fds=True,
                user=user,
            )
        started = None
        for _ in range(50):
            started = start_time(proc.pid)
            if started is not None:
                break
            time.sleep(0.01)
        rec = Record(
            name=name,
            pid=proc.pid,
            pgid=proc.pid,
            started=started or 0,
            argv=list(argv),
            log=str(log),
            fingerprint=fp,
            when=time.time(),
        )
        tmp = self.path(name).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec.__dict__, indent=1))
        tmp.replace(self.path(name))
        # The Popen object is dropped: the process outlives us. Python would otherwise warn.
        proc.returncode = 0
        return rec

    def stop(self, name: str, timeout: float = 15.0, sig: int = signal.SIGTERM) -> bool:
        """Stop the process group recorded for `name`; True when something was stopped."""
        rec = self.get(name)
        if rec is None:
            return False
        stopped = False
        if rec.alive():
            stopped = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pgid, sig)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and group_members(rec.pgid):
                _reap(rec.pid)
                time.sleep(0.1)
            if group_members(rec.pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rec.pgid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and group_members(rec.pgid):
                    _reap(rec.pid)
                    time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError):
            self.path(name).unlink()
        return stopped


def _reap(pid: int) -> None:
    """Collect `pid` if it is our own child (a process started by this same command)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
