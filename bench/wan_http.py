"""``bench.wan``'s HTTP ends: the server in B (the direct floor, plain and TLS, and the clouds'
backends: ``python -m bench.wan serve``) and the load client in A (``python -m bench.wan load``)."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import statistics
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from bench import wan_clouds

# --- the server in B: direct floor (plain and TLS) and CloudTwo's backend -------------------


class _Server(asyncio.Protocol):
    """A minimal keep-alive HTTP/1.1 server for GETs: a small JSON body, like a tiny API."""

    def __init__(self, name: str, body: str | None = None) -> None:
        self.body = body or json.dumps(
            {"images": [{"id": "4b7ca3b4", "name": "cirros"}], "at": name}
        )
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            close = b"connection: close" in head.lower()
            body = self.body.encode()
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n".encode()
                + (b"Connection: close\r\n" if close else b"")
                + b"\r\n"
                + body
            )
            if close:
                self.transport.close()
                return


async def _serve(listeners: list[str], cert: str | None, key: str | None) -> None:
    loop = asyncio.get_running_loop()
    for spec in listeners:
        host, port, *flags = spec.split(":")
        context = None
        if "tls" in flags:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            assert cert and key
            context.load_cert_chain(cert, key)
        # glance=<cloud>: that cloud's image list (bench.wan --clouds), else a tiny body
        body = next(
            (json.dumps(wan_clouds.glance_list(f[7:])) for f in flags if f.startswith("glance=")),
            None,
        )
        await loop.create_server(
            lambda spec=spec, body=body: _Server(spec, body),
            host,
            int(port),
            ssl=context,
            backlog=512,
        )
    print("ready", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


# --- the client in A ------------------------------------------------------------------------


async def _load(
    url: str,
    concurrency: int,
    requests: int,
    new_connections: bool,
    cafile: str | None,
    headers: dict[str, str],
    keep_body: bool = False,
    warmup: int = 0,
    spread: float = 0.0,
    on_warm: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """`requests` measured after `warmup` not measured, sent by the same clients without a
    pause; with a warm-up, the clients' first requests are spread over `spread` seconds.

    The steady state of `concurrency` independent clients: started in the same millisecond
    (a point of their own after a warm-up that ended with all of them idle) they send in step,
    every request of a round in one burst, and stay so for rounds (each waits for the same
    answers); spread over one round trip and warmed up, the measured requests arrive as the
    requests of independent clients do. `on_warm` is called as the first measured request
    starts (the caller's counters, e.g. CPU time, from there)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    context = ssl.create_default_context(cafile=cafile) if parts.scheme == "https" else None
    head = f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (head + ("Connection: close\r\n" if new_connections else "") + "\r\n").encode()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []
    warm_latencies: list[float] = []
    warm_errors: list[str] = []
    started = [0]
    total = warmup + requests
    last_body = [b""]

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(request)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        if keep_body:
            last_body[0] = body
        return int(status_line.split()[1])

    async def worker(
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None, delay: float
    ) -> None:
        if delay:
            await asyncio.sleep(delay)
        while started[0] < total:
            measured = started[0] >= warmup
            if started[0] == warmup and warmup and on_warm is not None:
                on_warm()
            started[0] += 1
            start = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port, ssl=context)
                status = await asyncio.wait_for(exchange(*conn), 30)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                (errors if measured else warm_errors).append(type(exc).__name__)
                conn = None
                continue
            (latencies if measured else warm_latencies).append((time.perf_counter() - start) * 1000)
            if measured:
                statuses[status] = statuses.get(status, 0) + 1
            if new_connections:
                conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    # An open connection's point starts with its connections open (the floor is one round trip).
    opened = (
        [None] * concurrency
        if new_connections
        else await asyncio.gather(
            *(asyncio.open_connection(host, port, ssl=context) for _ in range(concurrency))
        )
    )
    step = spread / concurrency if warmup else 0.0  # a ramp is never measured
    await asyncio.gather(*(worker(conn, i * step) for i, conn in enumerate(opened)))
    result = {
        **_figures(latencies, errors),
        "error_kinds": sorted(set(errors)),
        "statuses": statuses,
        "mean_ms": statistics.fmean(latencies) if latencies else None,
    }
    if warmup:
        result["warmup"] = _figures(warm_latencies, warm_errors)
    if keep_body:  # the last answer's body (the sanity check of a merged list)
        result["body"] = last_body[0].decode("utf-8", "replace")
    return result


def _figures(latencies: list[float], errors: list[str]) -> dict[str, Any]:
    """Requests answered, errors, p50 and p99 (ms) of a run's requests."""
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "errors": len(errors),
        "p50_ms": _percentile(ordered, 0.50),
        "p99_ms": _percentile(ordered, 0.99),
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]
