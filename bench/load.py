"""The load generator: wrk when it can be had (apt-get installs it), else ``bench.pyload``.

Both are closed-loop keep-alive generators: each connection sends a request, waits for the whole
answer, sends the next. Both report through one line ``BENCHJSON {...}`` (wrk through a Lua
``done`` hook, so the percentiles are exact microseconds rather than wrk's rounded text); the
text summary of wrk is parsed too, as a cross-check and for a wrk run without the script.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.machine import apt_install
from bench.procs import BenchError

WRK_SCRIPT = r"""
-- written by `python -m bench`: one JSON line with exact figures at the end of the run
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCHJSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d,\"connect\":%d,\"read\":%d," ..
    "\"write\":%d,\"status\":%d,\"timeout\":%d,\"p50\":%d,\"p90\":%d,\"p99\":%d,\"max\":%d," ..
    "\"mean\":%.1f}\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""


@dataclass
class LoadResult:
    tool: str
    connections: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoadTool:
    kind: str  # "wrk" | "python"
    description: str
    binary: str | None = None


def ensure_wrk(allow_apt: bool, say) -> LoadTool | None:
    """wrk on the PATH; else `apt-get install wrk` (root, apt available); else None."""
    path = shutil.which("wrk")
    if path is None and allow_apt and apt_install("wrk", say):
        path = shutil.which("wrk")
    if path is None:
        return None
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"wrk\s+(\S+)", version)
    return LoadTool("wrk", f"wrk {match.group(1) if match else '?'} ({path}), 1 thread", path)


def python_tool() -> LoadTool:
    return LoadTool(
        "python",
        "bench/pyload.py (asyncio keep-alive, 1 process; direct figures are bounded by "
        "this generator, not by the backend)",
    )


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text.strip())
    if not match:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk_text(text: str) -> dict[str, float]:
    """The figures of wrk's text summary (run with --latency): requests, seconds, rps,
    p50/p75/p90/p99 and mean/max latency in ms, and error counts."""
    out: dict[str, float] = {}
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    if m:
        out["requests"] = int(m.group(1))
        out["seconds"] = _ms(m.group(2) + m.group(3)) / 1000
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if m:
        out["rps"] = float(m.group(1))
    m = re.search(r"^\s+Latency\s+(\S+)\s+(\S+)\s+(\S+)", text, re.M)
    if m:
        out["mean_ms"] = _ms(m.group(1))
        out["max_ms"] = _ms(m.group(3))
    for pct, value in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", text, re.M):
        out[f"p{pct}_ms"] = _ms(value)
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        for key, value in zip(("connect", "read", "write", "timeout"), m.groups(), strict=True):
            out[f"err_{key}"] = int(value)
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        out["err_status"] = int(m.group(1))
    return out


def parse_benchjson(text: str) -> dict | None:
    for line in text.splitlines():
        if line.startswith("BENCHJSON "):
            return json.loads(line[len("BENCHJSON ") :])
    return None


def _result(tool: str, connections: int, data: dict) -> LoadResult:
    seconds = data["duration_us"] / 1e6
    errors = {k: int(data[k]) for k in ("connect", "read", "write", "status", "timeout")}
    return LoadResult(
        tool=tool,
        connections=connections,
        requests=int(data["requests"]),
        seconds=seconds,
        rps=data["requests"] / seconds if seconds else 0.0,
        p50_ms=data["p50"] / 1000,
        p90_ms=data["p90"] / 1000,
        p99_ms=data["p99"] / 1000,
        max_ms=data["max"] / 1000,
        mean_ms=data["mean"] / 1000,
        errors={k: v for k, v in errors.items() if v},
    )


def run_load(
    tool: LoadTool,
    url: str,
    connections: int,
    duration: float,
    headers: dict[str, str],
    workdir: Path,
    env: dict[str, str] | None = None,
    threads: int = 1,
) -> LoadResult:
    """One closed-loop run; raises BenchError when the generator fails. `threads`: wrk's
    threads (at most one per connection; the Python generator is one process whatever)."""
    header_args: list[str] = []
    for name, value in headers.items():
        header_args += ["-H", f"{name}: {value}"]
    timeout = duration + 60
    if tool.kind == "wrk":
        script = workdir / "bench.lua"
        if not script.exists():
            script.write_text(WRK_SCRIPT)
        argv = [
            tool.binary or "wrk",
            f"-t{max(1, min(threads, connections))}",
            f"-c{connections}",
            f"-d{max(1, round(duration))}s",
            "--timeout",
            "10s",
            "--latency",
            "-s",
            str(script),
            *header_args,
            url,
        ]
    else:
        argv = [
            sys.executable,
            "-m",
            "bench.pyload",
            "--url",
            url,
            "-c",
            str(connections),
            "-d",
            str(duration),
            *header_args,
        ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"load generator did not finish in {timeout:.0f} s: {argv}") from exc
    data = parse_benchjson(proc.stdout)
    if proc.returncode != 0 or data is None:
        raise BenchError(
            f"load generator failed (status {proc.returncode}): {' '.join(argv)}\n"
            f"{proc.stdout[-800:]}{proc.stderr[-800:]}"
        )
    result = _result(tool.kind, connections, data)
    if tool.kind == "wrk":
        text = parse_wrk_text(proc.stdout)
        if text.get("err_status"):
            result.errors["status"] = int(text["err_status"])
    return result
