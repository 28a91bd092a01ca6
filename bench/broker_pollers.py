"""``python -m bench.broker_pollers``: open-loop pollers, the way platforms poll a broker.

A platform does not send its next ``last_operation`` the moment the previous answer arrives
(that is wrk: a closed loop, whose latency is only the queue it builds itself, p50 ~ pollers /
throughput by Little's law); each operation in flight is polled on an interval (Cloud Foundry:
every few seconds, ``Retry-After`` permitting). So here each of ``-c`` pollers owns one
keep-alive connection and sends on a fixed schedule, ``--rate`` requests per second in all,
the pollers' phases spread evenly over the interval. Latency runs from the *scheduled* send time
to the end of the answer, so a server that falls behind is charged for the wait too (no
coordinated omission). Connections are opened and used once before the measured window: the
figures are the steady state, not the connection ramp.

Prints one line ``BENCHJSON {...}`` with the figures ``bench.load`` reads, plus ``offered``.
Paths come from ``--paths FILE`` (JSON list; poller *i* walks them from *i*); headers from
``-H``. One process on one core: fine up to a few thousand req/s.
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


def _request(path: str, host: str, headers: list[str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", *headers, "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, int]:
    writer.write(request)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await asyncio.wait_for(reader.readexactly(length), 10) if length else b""
    return int(head[9:12]), len(head) + len(body)


class Schedule:
    """When the measured window starts and ends: known once every poller is connected and
    warm (the last one to get there sets it)."""

    def __init__(self, pollers: int, seconds: float) -> None:
        self.pollers = pollers
        self.seconds = seconds
        self.warm = 0
        self.ready = asyncio.Event()
        self.start = 0.0
        self.stop = 0.0

    def one_warm(self) -> None:
        self.warm += 1
        if self.warm == self.pollers:
            self.start = time.perf_counter() + 0.2
            self.stop = self.start + self.seconds
            self.ready.set()


async def _poller(
    index: int,
    host: str,
    port: int,
    requests: list[bytes],
    interval: float,
    schedule: Schedule,
    stats: Stats,
) -> None:
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        await _exchange(reader, writer, requests[index % len(requests)])  # warm, not measured
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        stats.errors["connect"] += 1
        if writer is not None:
            writer.close()
        return
    finally:
        schedule.one_warm()
    await schedule.ready.wait()
    n = index
    due = schedule.start + interval * index / schedule.pollers  # phases spread evenly
    try:
        while due < schedule.stop:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                status, size = await _exchange(reader, writer, requests[n % len(requests)])
            except TimeoutError:
                stats.errors["timeout"] += 1
                return
            stats.latencies_ns.append(int((time.perf_counter() - due) * 1e9))
            stats.bytes += size
            if status >= 400:
                stats.errors["status"] += 1
            n += 1
            due += interval
    except (asyncio.IncompleteReadError, ConnectionError):
        stats.errors["read"] += 1
    finally:
        writer.close()


async def run(
    url: str, paths: list[str], headers: list[str], pollers: int, rate: float, seconds: float
) -> dict[str, float]:
    """Poll `url` + `paths` with `pollers` connections at `rate` req/s in all; the figures."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [_request(p, parts.netloc, headers) for p in paths]
    stats = Stats()
    schedule = Schedule(pollers, seconds)
    interval = pollers / rate
    await asyncio.gather(
        *(_poller(i, host, port, requests, interval, schedule, stats) for i in range(pollers))
    )
    lat = sorted(stats.latencies_ns)

    def pct(p: float) -> int:
        return lat[min(len(lat) - 1, int(len(lat) * p / 100))] // 1000 if lat else 0

    return {
        "requests": len(lat),
        "duration_us": int(seconds * 1e6),
        "bytes": stats.bytes,
        **stats.errors,
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": lat[-1] // 1000 if lat else 0,
        "mean": (sum(lat) / len(lat) / 1000) if lat else 0.0,
        "offered": rate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_pollers", description=__doc__)
    parser.add_argument("--url", required=True, help="http://HOST:PORT")
    parser.add_argument("--paths", required=True, help="JSON file: a list of paths")
    parser.add_argument("-c", "--pollers", type=int, default=100)
    parser.add_argument("-r", "--rate", type=float, default=1000.0, help="req/s offered in all")
    parser.add_argument("-d", "--seconds", type=float, default=10.0)
    parser.add_argument("-H", "--header", action="append", default=[])
    args = parser.parse_args(argv)
    with open(args.paths) as f:
        paths = json.load(f)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        runner = asyncio.run
    result = runner(run(args.url, paths, args.header, args.pollers, args.rate, args.seconds))
    print("BENCHJSON " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
