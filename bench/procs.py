"""The bench's own processes: started in their own session, stopped by PID, always.

:class:`Processes` records every process it starts (and, before stopping one, the children that
process has spawned, e.g. nginx workers) and stops them in reverse order with SIGTERM, then
SIGKILL after a grace period. ``__main__`` calls :meth:`Processes.stop_all` in a ``finally``
block and from an ``atexit`` hook, and turns SIGTERM/SIGHUP into an exception, so an error or a
Ctrl-C never leaves a router or a backend behind. Nothing else is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, so a bench stopped by its
    caller (CI's timeout, a closed terminal) runs its cleanup and stops what it started."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)


class BenchError(RuntimeError):
    """A setup step failed; the message says which and shows the process log when useful."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    children: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Processes:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,  # not the caller's: `python -m` puts the cwd first on sys.path
                start_new_session=True,  # a Ctrl-C in the terminal reaches the bench only
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def remember_children(self, proc: Proc) -> None:
        """Note the PIDs of `proc`'s children (to stop them too if `proc` dies first)."""
        with contextlib.suppress(psutil.Error):
            proc.children.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))

    def stop(self, proc: Proc, grace: float = 5.0) -> None:
        self.remember_children(proc)
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(grace)
        # Children that outlived their parent (they were ours: same session, recorded PIDs).
        leftovers = []
        for pid in proc.children:
            with contextlib.suppress(psutil.Error, OSError):
                child = psutil.Process(pid)
                if child.status() != psutil.STATUS_ZOMBIE and os.getsid(pid) == proc.pid:
                    child.kill()
                    leftovers.append(child)
        psutil.wait_procs(leftovers, timeout=grace)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            with contextlib.suppress(Exception):
                self.stop(proc)


def free_port(host: str) -> int:
    """A TCP port free on `host` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_listening(host: str, port: int, proc: Proc, timeout: float = 30.0) -> None:
    """Until something accepts TCP connections on host:port; fails fast if `proc` exits."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise BenchError(
                f"{proc.name} (pid {proc.pid}) exited with status {proc.popen.returncode} "
                f"before listening on {host}:{port}; its log:\n{proc.log_tail()}"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(
                f"{proc.name} (pid {proc.pid}) is not listening on {host}:{port} after "
                f"{timeout:.0f} s; its log:\n{proc.log_tail()}"
            )
        time.sleep(0.05)


@dataclass
class CpuSample:
    """CPU seconds (user + system) of some processes, and of the whole machine."""

    per_process: dict[str, float]
    machine_busy: float
    machine_total: float
    wall: float
    softirq: float = 0.0  # kernel network processing (loopback TCP), charged to no process


def cpu_sample(procs: dict[str, int]) -> CpuSample:
    per: dict[str, float] = {}
    for name, pid in procs.items():
        try:
            proc = psutil.Process(pid)
            t = proc.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            for child in proc.children(recursive=True):  # live workers (nginx)
                with contextlib.suppress(psutil.Error):
                    c = child.cpu_times()
                    total += c.user + c.system
            per[name] = total
        except psutil.Error:
            per[name] = float("nan")
    machine = psutil.cpu_times()
    idle = machine.idle + getattr(machine, "iowait", 0.0)
    total = sum(machine)
    # guest time is already counted in user on Linux
    total -= getattr(machine, "guest", 0.0) + getattr(machine, "guest_nice", 0.0)
    softirq = getattr(machine, "softirq", 0.0)
    return CpuSample(per, total - idle, total, time.monotonic(), softirq)


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, MiB."""
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total / 2**20
    except psutil.Error:
        return float("nan")


def rss_max_mb(pid: int) -> float:
    """The largest resident memory among a process and its children (one router process), MiB."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return float("nan")
    sizes = []
    for proc in procs:
        try:
            sizes.append(proc.memory_info().rss)
        except psutil.Error:
            continue
    return max(sizes, default=0) / 2**20


def start_instruction_count(pids: tuple[int, ...], seconds: float) -> subprocess.Popen[str] | None:
    """``perf stat`` counting the user-space instructions of `pids` (all their threads, and
    a router's workers) for about as long as the load runs. Unlike CPU time, a count of
    instructions does not grow when other processes compete for the cores, so it compares
    proxies on a busy machine. None without perf (or without pids: direct)."""
    perf = shutil.which("perf")
    if perf is None or not pids:
        return None
    every = sorted({pid for root in pids for pid in _with_children(root)})
    argv = [perf, "stat", "-x", ",", "-e", "instructions:u", "-p", ",".join(map(str, every))]
    argv += ["--", "sleep", f"{seconds:g}"]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish_instruction_count(counter: subprocess.Popen[str] | None) -> float | None:
    if counter is None:
        return None
    _, err = counter.communicate(timeout=60)
    for line in err.splitlines():
        value, _, rest = line.partition(",")
        if "instructions" in rest and value.strip().isdigit():
            return float(value)
    return None


def _with_children(pid: int) -> list[int]:
    try:
        proc = psutil.Process(pid)
        return [pid, *(child.pid for child in proc.children(recursive=True))]
    except psutil.Error:
        return [pid]
