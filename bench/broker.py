"""``python -m bench.broker``: the broker's polling throughput (run by hand; figures in the
README).

What platforms do most: poll ``last_operation`` (Cloud Foundry every few seconds per operation
in flight) and fetch ``/v2/catalog``. Both read configuration and the database only. The bench
starts a real ``scoperouter broker serve`` (SQLite file by default, no worker threads, access
log off), seeds `--instances` instances each with a provision *in progress* (so every poll is
the realistic answer: state, description and ``Retry-After``), and drives it with wrk (apt
installs it when missing; else the asyncio generator of bench/pyload.py): `--connections`
concurrent keep-alive pollers, each request for the next instance in turn.

Goal (issue 9): >= 1,000 req/s and p99 < 50 ms with 100 pollers on SQLite, on the project's
2-core machine.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.load import LoadResult, LoadTool, _result, ensure_wrk, parse_benchjson, python_tool
from scoperouter.broker import migrate
from scoperouter.broker.secrets import generate_key
from scoperouter.broker.services.base import stable_id
from scoperouter.broker.store import (
    IN_PROGRESS,
    PROVISIONING,
    Instance,
    Operation,
    Store,
    new_operation_id,
    utcnow,
)

ROOT = Path(__file__).resolve().parents[1]
GOAL_RPS, GOAL_P99_MS = 1000.0, 50.0

LUA = r"""
-- written by `python -m bench.broker`: pollers walk through the instances in turn
local paths = {PATHS}
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[(i % #paths) + 1])
end
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


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def seed(url: str, count: int) -> list[str]:
    """`count` instances of openstack-project, each with a provision in progress."""
    store = Store(url)
    service_id = stable_id("openstack-project")
    plan_id = stable_id("openstack-project", "standard")
    ids = []
    now = utcnow()
    with store.write() as session:
        for n in range(count):
            instance_id = f"osb-bench-{n:04d}"
            op = Operation(
                id=new_operation_id("provision"),
                kind="provision",
                instance_id=instance_id,
                state=IN_PROGRESS,
                description="creating the project (bench: nothing runs it)",
                progress={},
                request={},
                request_hash="-",
                not_before=now + timedelta(seconds=3),
                deadline_at=now + timedelta(hours=1),
                attempts=1,
            )
            session.add(
                Instance(
                    id=instance_id,
                    service_id=service_id,
                    plan_id=plan_id,
                    service_name="openstack-project",
                    parameters={},
                    context={},
                    resources={},
                    state=PROVISIONING,
                    request_hash="-",
                    active_operation_id=op.id,
                )
            )
            session.flush()
            session.add(op)
            ids.append(f"/v2/service_instances/{instance_id}/last_operation?operation={op.id}")
    store.dispose()
    return ids


def run_wrk(
    tool: LoadTool,
    base: str,
    paths: list[str],
    connections: int,
    seconds: float,
    headers: dict[str, str],
    workdir: Path,
) -> LoadResult:
    header_args: list[str] = []
    for name, value in headers.items():
        header_args += ["-H", f"{name}: {value}"]
    if tool.kind == "wrk":
        script = workdir / "broker.lua"
        script.write_text(
            LUA.replace("{PATHS}", "{" + ",".join(json.dumps(p) for p in paths) + "}")
        )
        argv = [
            tool.binary or "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "--latency",
            "-s",
            str(script),
            *header_args,
            base,
        ]
    else:  # one path only: pyload has no per-request script
        argv = [
            sys.executable,
            "-m",
            "bench.pyload",
            "--url",
            base + paths[0],
            "-c",
            str(connections),
            "-d",
            str(seconds),
            *header_args,
        ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, cwd=ROOT)
    data = parse_benchjson(proc.stdout)
    if proc.returncode != 0 or data is None:
        raise RuntimeError(f"load generator failed: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return _result(tool.kind, connections, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--connections", type=int, default=100, help="concurrent pollers")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--processes", type=int, default=1, help="serve processes (one port)")
    parser.add_argument("--database", metavar="URL", help="default: a SQLite file in a temp dir")
    parser.add_argument("--no-apt", action="store_true", help="do not apt-get install wrk")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)

    say = lambda text: print(f"bench.broker: {text}", file=sys.stderr, flush=True)  # noqa: E731
    tool = ensure_wrk(not args.no_apt, say) or python_tool()
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        workdir = Path(tmp)
        url = args.database or f"sqlite:///{workdir / 'broker.db'}"
        migrate.upgrade(url)
        paths = seed(url, args.instances)
        port = free_port()
        config = {
            "listen": f"127.0.0.1:{port}",
            "database": {"url": url},
            "worker": {"threads": 0},
            "processes": args.processes,
            "log_level": "WARNING",
            "clouds": {"CloudOne": {"entry": "unused-by-the-bench"}},
            "services": {"openstack-project": {}},
        }
        (workdir / "broker.yaml").write_text(yaml.safe_dump(config))
        password = secrets.token_hex(16)
        env = {
            **os.environ,
            "SCOPEROUTER_BROKER_PASSWORD": password,
            "SCOPEROUTER_BROKER_SECRET_KEYS": generate_key(),
            "PYTHONOPTIMIZE": "1",
        }
        log = (workdir / "broker.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scoperouter.broker",
                "serve",
                "--config",
                str(workdir / "broker.yaml"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        base = f"http://127.0.0.1:{port}"
        auth = base64.b64encode(f"broker:{password}".encode()).decode()
        headers = {"Authorization": f"Basic {auth}", "X-Broker-API-Version": "2.17"}
        try:
            for _ in range(100):
                try:
                    if httpx.get(base + "/v2/catalog", headers=headers).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            check = httpx.get(base + paths[0], headers=headers)
            assert check.status_code == 200 and check.json()["state"] == "in progress", check.text
            assert "retry-after" in check.headers
            results: dict[str, Any] = {"tool": tool.description, "database": url.split(":")[0]}
            for name, targets in (("last_operation", paths), ("catalog", ["/v2/catalog"])):
                run_wrk(tool, base, targets, args.connections, 2, headers, workdir)  # warm-up
                result = run_wrk(
                    tool, base, targets, args.connections, args.seconds, headers, workdir
                )
                results[name] = result.as_dict()
                ok = result.rps >= GOAL_RPS and result.p99_ms < GOAL_P99_MS
                print(
                    f"{name:15} {args.processes} process(es), {args.connections} pollers: "
                    f"{result.rps:8,.0f} req/s  "
                    f"p50 {result.p50_ms:6.1f} ms  p99 {result.p99_ms:6.1f} ms  "
                    f"errors {result.error_count}  "
                    f"goal >= {GOAL_RPS:,.0f} req/s, p99 < {GOAL_P99_MS:.0f} ms: "
                    f"{'pass' if ok else 'FAIL'}"
                )
            if args.json:
                print(json.dumps(results, indent=2))
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
