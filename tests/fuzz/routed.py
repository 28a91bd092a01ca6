"""The ``tunnel`` and ``scope`` families' runs, on the routers and backends of the harness
(:mod:`tests.fuzz.__main__`), and their invariants that need the backends' records."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from tests.fuzz import scopes, tunnel
from tests.fuzz.families import Family, amplification, distinct_clouds, rss_back
from tests.fuzz.inputs import Input
from tests.fuzz.stalls import SETTLE_EVERY, StallWatch

RSS_SLACK = 16.0  # MB a worker may keep after a family, as the raw family allows


async def drive(
    family: Family,
    only: int | None,
    concurrency: int,
    one: Callable[[int], Awaitable[None]],
    stalls: StallWatch | None = None,
) -> None:
    """Inputs 0, 1, ... of `family` (or the one `only`) until its quota or its time is up,
    `concurrency` at a time; the heap settled every SETTLE_EVERY inputs (`stalls`)."""
    started = time.monotonic()
    semaphore = asyncio.Semaphore(concurrency)

    async def bounded(n: int) -> None:
        async with semaphore:
            await one(n)
            family.inputs += 1

    if only is not None:
        await bounded(only)
    else:
        tasks: set[asyncio.Task[None]] = set()
        n = 0
        while n < family.quota and time.monotonic() - started < family.seconds:
            task = asyncio.create_task(bounded(n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            while len(tasks) >= concurrency * 2:
                await asyncio.sleep(0.001)
            n += 1
            if stalls is not None and n % SETTLE_EVERY == 0:
                await asyncio.gather(*tasks)
                stalls.settle()
        await asyncio.gather(*tasks)
    family.elapsed = time.monotonic() - started


async def run_tunnel(harness: Any, family: Family) -> None:
    args, seed = harness.args, harness.args.seed
    context = tunnel.client_context(str(harness.proxy_ca))
    targets = harness.tunnel_targets
    statuses: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    stalls: StallWatch = harness.stalls

    async def one(n: int) -> None:
        item = tunnel.tunnel_input(seed, n, targets)
        kinds[item.family] += 1
        for attempt in (1, 2):
            started = time.monotonic()
            connect, data, seconds, failed = await tunnel.exchange(
                harness.addresses["proxy"], item, context, harness.deadline
            )
            stalled = stalls.longest_during(started, time.monotonic())
            if attempt == 1 and failed and stalled >= harness.stall_limit:
                # the harness stopped (stalls.py) for as long as the router's deadline: the
                # router closing on a client that went quiet is right; the input again, once
                statuses["retried_after_harness_stall"] += 1
                continue
            break
        if args.show:
            print(
                f"input {n} (tunnel {item.family}, CONNECT {item.target.decode()}, "
                f"{'clear' if item.cleartext else 'TLS'}): {item.data!r}"
            )
            print(f"router: {connect!r} then {data!r}")
        if failed:
            family.violation(seed, n, failed)
        if seconds is None:
            family.violation(seed, n, f"not answered nor closed in {harness.deadline:g}s")
        if not connect.startswith(b"HTTP/1.1 200"):
            statuses["CONNECT refused"] += 1
            if connect:
                family.violation(seed, n, f"CONNECT to a catalog destination: {connect[:200]!r}")
            return
        answers = harness.check_answers(data, item.data.startswith(b"HEAD "))
        for status in answers.statuses or [0]:
            statuses[f"{status // 100}xx" if status else "closed"] += 1
        for problem in answers.problems:
            family.violation(seed, n, problem)

    await drive(family, args.only, args.concurrency, one, harness.stalls)
    family.figures.update({"answers": dict(statuses), "kinds": dict(kinds)})


async def run_scope(harness: Any, family: Family) -> None:
    args, seed = harness.args, harness.args.seed
    front = harness.addresses["frontend"]
    authority = f"{front[0]}:{front[1]}".encode()
    named: dict[int, int] = {}
    statuses: Counter[str] = Counter()
    before = harness.rss()
    peak: dict[str, float] = {}

    async def sample() -> None:
        while True:
            for worker, mb in harness.rss().items():
                peak[worker] = max(peak.get(worker, 0.0), mb)
            await asyncio.sleep(0.2)

    async def one(n: int) -> None:
        data, text = scopes.request(seed, n, authority)
        named[n] = distinct_clouds(text)
        got, seconds = await harness.send(front, Input(n, data, "frontend", False, "scope"))
        answers = harness.check_answers(got, False)
        if args.show:
            print(f"input {n} (scope): {text!r}")
            print(f"router: {got[:3000]!r}")
        if seconds is None:
            family.violation(seed, n, f"not answered nor closed in {harness.deadline:g}s")
        for problem in answers.problems:
            family.violation(seed, n, problem)
        for status in answers.statuses or [0]:
            statuses[str(status)] += 1
            if status not in scopes.SANE:
                family.violation(seed, n, f"status {status or 'none'} for {text[:80]!r}")

    sampler = asyncio.create_task(sample())
    try:
        await drive(family, args.only, args.concurrency, one, harness.stalls)
    finally:
        sampler.cancel()
    await asyncio.sleep(harness.idle + 0.5)  # idle connections close, buffers go
    after = harness.rss()
    received: Counter[int] = Counter()
    for name in ("one", "two"):
        for request in harness.backends[name].requests:
            n = scopes.input_of(request)
            if n is not None and request.method:
                received[n] += 1
    found = amplification(named, received)
    for n, why in found[:20]:
        family.violation(seed, n, f"{why}: {scopes.expression(seed, n)[:80]!r}...")
    if len(found) > 20:
        family.violation(seed, None, f"... and {len(found) - 20} more amplified inputs")
    if args.only is None:
        for line in rss_back(before, after, RSS_SLACK):
            family.violation(seed, None, f"after the family, {line}")
    family.figures.update(
        {
            "answers": dict(sorted(statuses.items())),
            "backend_requests": sum(received.values()),
            "most_backend_requests_for_one": max(received.values(), default=0),
            "rss_mb_before_peak_after": {
                w: [round(before.get(w, 0), 1), round(peak.get(w, 0), 1), round(after[w], 1)]
                for w in sorted(after)
            },
        }
    )
