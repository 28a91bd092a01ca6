"""Fallback load generator (when wrk cannot be had): asyncio, raw sockets, keep-alive.

    python -m bench.pyload --url http://127.0.0.2:8001/v2/images -c 50 -d 8 -H 'X-Scope: {...}'

Each of the ``-c`` connections sends one GET, reads the whole response, sends the next, for
``-d`` seconds (closed loop, like wrk). Prints one JSON line with the figures ``bench.load``
expects. One process, one core: past ~10-15k req/s it measures itself, not the server (direct
figures then say more about this generator than about the backend; router figures are fine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


class Stats:
    def __init__(self) -> None:
        self.latencies_ns: list[int] = []
        self.errors = {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}
        self.bytes = 0


async def _connection(host, port, request: bytes, stop_at: float, stats: Stats, warm: float):
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        stats.errors["connect"] += 1
        return
    try:
        while time.monotonic() < stop_at:
            start = time.perf_counter_ns()
            writer.write(request)
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            except TimeoutError:
                stats.errors["timeout"] += 1
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                stats.errors["read"] += 1
                return
            length = 0
            status = int(head[9:12])
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length) if length else b""
            now = time.perf_counter_ns()
            if time.monotonic() >= warm:
                stats.latencies_ns.append(now - start)
                stats.bytes += len(head) + len(body)
                if status >= 400:
                    stats.errors["status"] += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        stats.errors["read"] += 1
    finally:
        writer.close()


def percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


async def run(url: str, connections: int, duration: float, headers: list[str]) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"GET {path} HTTP/1.1", f"Host: {parts.netloc}", *headers]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    stats = Stats()
    start = time.monotonic()
    warm = start  # no warm-up inside: bench.load runs a short warm-up pass first
    stop_at = start + duration
    await asyncio.gather(
        *(_connection(host, port, request, stop_at, stats, warm) for _ in range(connections))
    )
    elapsed = time.monotonic() - start
    lat = sorted(stats.latencies_ns)
    us = [x / 1000 for x in lat]
    return {
        "requests": len(lat),
        "duration_us": int(elapsed * 1e6),
        "bytes": stats.bytes,
        **stats.errors,
        "p50": percentile(lat, 50) / 1000,
        "p90": percentile(lat, 90) / 1000,
        "p99": percentile(lat, 99) / 1000,
        "max": (lat[-1] / 1000) if lat else 0,
        "mean": (sum(us) / len(us)) if us else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pyload")
    parser.add_argument("--url", required=True)
    parser.add_argument("-c", "--connections", type=int, default=1)
    parser.add_argument("-d", "--duration", type=float, default=5.0)
    parser.add_argument("-H", "--header", action="append", default=[])
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.url, args.connections, args.duration, args.header))
    print("BENCHJSON " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
