"""The soak's traffic (``python -m bench.soak``): the scope mix, what each request must get back,
and the open-loop generator that sends it.

    python -m bench.soak_traffic SPEC.json OUT.jsonl   # one generator (bench.soak starts them)

**Open loop.** Request ``i`` of a generator is due at ``start + (i + phase) / rate``, whatever
the earlier requests are doing: a slow router makes requests overlap (more connections), never
fewer requests. Each is sent when due (or, when the generator itself is late, as soon as it can:
it counts how late), with a deadline (``deadline``): an answer that does not come by then is a
hang. Several generator processes share a rate with different phases when one process cannot
hold it.

**The mix** (:data:`MIX`): local, cross-cloud, ``&`` (lists merged), ``|`` (including one whose
first cloud is down, a cloud of the config whose router never runs), scopes the router must
refuse (400) and a ``&`` read that more than one cloud answers (409), on three frontends and
both routers; each request on a pooled keep-alive connection, or on a new one (closed by the
client after the answer, or asking ``Connection: close``). :func:`check` says what is wrong with
an answer: the status, the clouds whose backends answered, and for every error the router's
OpenStack JSON (:func:`error_problem`).

**What it writes**: one JSON line per interval of ``interval`` seconds (by the time requests
were due), once every request of the interval has ended: requests due and sent, answered as
they must be, a latency histogram (:func:`bucket`; mergeable across processes and intervals),
how many were sent late, problems by category with the first examples; and each request due
within ``reload_margin`` seconds of a reload (``reloads_at``, seconds from the start) on its own,
``[due_s, ms]`` (``ms`` null when it got no answer) in ``around_reloads``
(:mod:`bench.soak_reloads` judges them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools

from bench.run import TOKEN, scoped_headers

# ---------------------------------------------------------------------------- the mix

ENTRY_CLOUDS = ("CloudOne", "CloudTwo")  # the routers requests enter at
DOWN_CLOUD = "CloudDown"  # in the config, its router never runs: connections are refused
IMAGE_ID = "4b7ca3b4-96d4-4f34-b0c4-1ea3b1d4a0c1"  # the id in the small backend's answer
SMALL_PUT_BYTES = 1024

# Connection modes: a pooled keep-alive connection; a new one the client closes after the
# answer (the openstack CLI's pattern); a new one asking Connection: close.
KEEP_ALIVE, NEW, NEW_CLOSE = "keep-alive", "new", "new+close"
MODES: tuple[tuple[str, int], ...] = ((KEEP_ALIVE, 80), (NEW, 15), (NEW_CLOSE, 5))

# Problem categories of an answer (see check()); the verdict names them.
HANG = "hang"  # no complete answer within the deadline
UNANSWERED = "unanswered"  # the connection failed or closed before a complete answer
WRONG = "wrong answer"  # a well-formed answer, not the one the request deserves
NON_JSON = "non-JSON error"  # an error status without the router's OpenStack JSON
CATEGORIES = (HANG, UNANSWERED, WRONG, NON_JSON)


@dataclass(frozen=True)
class Kind:
    """One kind of request of the mix and the answer it deserves."""

    name: str
    entry: str  # the cloud whose router it enters at
    service: str  # the frontend: image, identity or object-store
    method: str
    path: str
    scope: str | None  # the scope's JSON text; None: a plain token (unscoped)
    status: int  # the status it deserves
    clouds: tuple[str, ...] = ()  # for a 2xx: the clouds whose backends answered, in the body
    weight: int = 1
    body_bytes: int = 0

    def headers(self) -> dict[str, str]:
        if self.scope is None:
            return {"X-Auth-Token": TOKEN, "Accept": "application/json"}
        headers = scoped_headers({})
        headers["X-Auth-Token"] = f"{TOKEN}!SCOPE!{self.scope}"
        headers["X-Scope"] = self.scope
        return headers


def _kind(
    name: str,
    weight: int,
    entry: str,
    expression: str | None,
    status: int,
    clouds: str = "",
    *,
    service: str = "image",
    method: str = "GET",
    path: str = "/v2/images",
    body_bytes: int = 0,
    scope_text: str | None = None,
) -> Kind:
    """A kind whose scope names `expression` for its service (None: a plain token), or is
    `scope_text` as it is."""
    scope = scope_text or (json.dumps({service: expression}) if expression is not None else None)
    return Kind(
        name, entry, service, method, path, scope, status, tuple(clouds.split()), weight, body_bytes
    )


AB, BOTH = "CloudOne & CloudTwo", "CloudOne CloudTwo"
MIX: tuple[Kind, ...] = (
    # name, weight, entry router, expression, status deserved, clouds whose backends answer
    _kind("local", 18, "CloudOne", "CloudOne", 200, "CloudOne"),
    _kind("local at B", 6, "CloudTwo", "CloudTwo", 200, "CloudTwo"),
    _kind("cross-cloud", 18, "CloudOne", "CloudTwo", 200, "CloudTwo"),
    _kind("cross-cloud from B", 8, "CloudTwo", "CloudOne", 200, "CloudOne"),
    _kind("A & B list", 10, "CloudOne", AB, 200, BOTH),
    _kind("B & A list at B", 4, "CloudTwo", "CloudTwo & CloudOne", 200, BOTH),
    _kind("Down | B", 10, "CloudOne", f"{DOWN_CLOUD} | CloudTwo", 200, "CloudTwo"),
    _kind("A | B", 5, "CloudOne", "CloudOne | CloudTwo", 200, "CloudOne"),
    _kind("(Down | A) & B", 3, "CloudOne", f"({DOWN_CLOUD} | CloudOne) & CloudTwo", 200, BOTH),
    _kind("unscoped", 3, "CloudOne", None, 200, "CloudOne"),
    _kind("identity (local)", 3, "CloudOne", "CloudOne", 200, "CloudOne", service="identity",
          path="/v3/projects"),
    _kind("small PUT (cross-cloud)", 3, "CloudOne", "CloudTwo", 200, "CloudTwo",
          service="object-store", method="PUT", path="/v1/AUTH_soak/c/o",
          body_bytes=SMALL_PUT_BYTES),
    # what the router must refuse, each with its JSON error
    _kind("A & B one image in both (409)", 2, "CloudOne", AB, 409, path=f"/v2/images/{IMAGE_ID}"),
    _kind("bad expression (400)", 2, "CloudOne", "CloudOne |", 400),
    _kind("unknown cloud (400)", 1, "CloudOne", "CloudNine", 400),
    _kind("bad scope JSON (400)", 1, "CloudOne", None, 400, scope_text='{"image": '),
    _kind("A & B write (400)", 1, "CloudOne", AB, 400, method="POST", body_bytes=64),
)  # fmt: skip


def plan(seed: int, mix: tuple[Kind, ...] = MIX) -> Iterator[tuple[Kind, str]]:
    """The endless sequence of (kind, connection mode), drawn by their weights: the same seed,
    the same sequence."""
    rng = random.Random(seed)
    kinds, kind_weights = list(mix), [k.weight for k in mix]
    modes, mode_weights = [m for m, _ in MODES], [w for _, w in MODES]
    while True:
        yield rng.choices(kinds, kind_weights)[0], rng.choices(modes, mode_weights)[0]


def expected_share(mix: tuple[Kind, ...] = MIX) -> dict[str, float]:
    total = sum(k.weight for k in mix)
    return {k.name: k.weight / total for k in mix}


# ---------------------------------------------------------------------------- answers


def error_problem(status: int, content_type: str, body: bytes) -> str | None:
    """What is wrong with an error answer (status >= 400), or None: it must be the router's
    OpenStack JSON, ``{"error": {"code": STATUS, "title": ..., "message": ...}}``."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        return f"{status} with Content-Type {content_type or 'none'!r}: {body[:120]!r}"
    try:
        error = json.loads(body)["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        return f"{status} whose body is not an OpenStack error: {body[:120]!r}"
    if code != status:
        return f"{status} whose error says code {code!r}"
    if not isinstance(message, str) or not message:
        return f"{status} without a message: {body[:120]!r}"
    return None


def clouds_in(value: Any) -> set[str]:
    """The values of every "cloud" key in a JSON document (the backends sign their answers)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "cloud" and isinstance(item, str):
                found.add(item)
            else:
                found |= clouds_in(item)
    elif isinstance(value, list):
        for item in value:
            found |= clouds_in(item)
    return found


def check(kind: Kind, status: int, content_type: str, body: bytes) -> tuple[str, str] | None:
    """(category, detail) of what is wrong with an answer to `kind`, or None when it is the
    answer the request deserves."""
    if status >= 400:
        problem = error_problem(status, content_type, body)
        if problem is not None:
            return NON_JSON, f"{kind.name}: {problem}"
    if status != kind.status:
        return WRONG, f"{kind.name}: {status} (expected {kind.status}): {body[:200]!r}"
    if status >= 400:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return WRONG, f"{kind.name}: {status} whose body is not JSON: {body[:200]!r}"
    clouds = clouds_in(document)
    if clouds != set(kind.clouds):
        return WRONG, f"{kind.name}: answered by {sorted(clouds)}, expected {list(kind.clouds)}"
    if kind.body_bytes and document.get("body_bytes") != kind.body_bytes:
        return WRONG, f"{kind.name}: the backend got {document.get('body_bytes')} body bytes"
    return None


# ---------------------------------------------------------------------------- histograms

HIST_BASE_MS = 0.05  # bucket 0 holds everything up to this
HIST_RATIO = 1.05  # each bucket 5 % wider than the one before: percentiles within 5 %


def bucket(ms: float) -> int:
    """The histogram bucket of a latency: bucket ``b`` holds (upper(b-1), upper(b)]."""
    if ms <= HIST_BASE_MS:
        return 0
    return math.ceil(math.log(ms / HIST_BASE_MS, HIST_RATIO) - 1e-9)


def upper(index: int) -> float:
    """The upper bound of a bucket, ms."""
    return HIST_BASE_MS * HIST_RATIO**index


def percentile(hist: Mapping[int, int], q: float) -> float | None:
    """The q-th percentile (0-100) of a histogram, as its bucket's upper bound; None if empty."""
    total = sum(hist.values())
    if not total:
        return None
    rank = max(1, math.ceil(q / 100 * total))
    seen = 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            return upper(index)
    return upper(max(hist))  # not reached


def merge(hists: list[Mapping[int, int]]) -> Counter[int]:
    out: Counter[int] = Counter()
    for hist in hists:
        out.update(hist)
    return out


# ---------------------------------------------------------------------------- intervals


@dataclass
class Interval:
    """What the requests due in one interval got (one JSON line)."""

    index: int
    due: int = 0  # requests due in the interval
    pending: int = 0  # sent, not ended yet
    ok: int = 0  # answered as they deserve
    late: int = 0  # sent more than late_ms after they were due
    late_max_ms: float = 0.0
    hist: Counter[int] = field(default_factory=Counter)  # latency of every answered request
    problems: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    modes: Counter[str] = field(default_factory=Counter)
    new_connections: int = 0
    examples: list[str] = field(default_factory=list)
    around_reloads: list[list[float | None]] = field(default_factory=list)  # [due_s, ms]

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "due": self.due,
            "ok": self.ok,
            "late": self.late,
            "late_max_ms": round(self.late_max_ms, 1),
            "hist": {str(k): v for k, v in sorted(self.hist.items())},
            "problems": dict(self.problems),
            "kinds": dict(self.kinds),
            "modes": dict(self.modes),
            "new_connections": self.new_connections,
            "examples": self.examples,
            "around_reloads": self.around_reloads,
        }


# ---------------------------------------------------------------------------- the client


class ConnectionFailed(Exception):
    """The connection closed, was reset or sent an unparsable answer before a complete one."""


class Connection(asyncio.Protocol):
    """One client connection: a request at a time, the answer parsed with llhttp."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, str, bytes, bool]] | None = None
        self.content_type = ""
        self.body = bytearray()
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"unparsable answer ({exc}): {data[:120]!r}")
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        answer = (
            self.parser.get_status_code(),
            self.content_type,
            bytes(self.body),
            self.parser.should_keep_alive(),
        )
        self.content_type, self.body = "", bytearray()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(f"connection closed ({exc or 'end of file'})")

    def _fail(self, why: str) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionFailed(why))

    async def exchange(self, request: bytes) -> tuple[int, str, bytes, bool]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            return await self.waiter
        finally:
            self.waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


@dataclass(frozen=True)
class Target:
    """A prepared request: where it goes and its bytes."""

    kind: Kind
    address: tuple[str, int]
    keep_alive: bytes
    close: bytes


def build(kind: Kind, address: tuple[str, int]) -> Target:
    host, port = address
    body = b"x" * kind.body_bytes
    headers = {"Host": f"{host}:{port}", **kind.headers()}
    if body:
        headers["Content-Type"] = "application/octet-stream"
        headers["Content-Length"] = str(len(body))

    def request(extra: dict[str, str]) -> bytes:
        lines = [f"{kind.method} {kind.path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in {**headers, **extra}.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    return Target(kind, address, request({}), request({"Connection": "close"}))


IDLE_MAX = 20.0  # seconds a pooled connection may stay idle (the router's idle_timeout: 60)


class Generator:
    """One generator process: `rate` requests a second from `start` (a monotonic time) for
    `duration` seconds, request i due at start + (i + phase) / rate."""

    def __init__(self, spec: Mapping[str, Any], out: Path) -> None:
        self.rate = float(spec["rate"])
        self.phase = float(spec.get("phase", 0.0))
        self.duration = float(spec["duration"])
        self.interval = float(spec.get("interval", 10.0))
        self.deadline = float(spec.get("deadline", 10.0))
        self.late_s = float(spec.get("late_ms", 100.0)) / 1000
        self.seed = int(spec.get("seed", 0))
        self.reloads = [float(t) for t in spec.get("reloads_at", [])]
        self.reload_margin = float(spec.get("reload_margin", 2.0))
        names = spec.get("kinds") or [k.name for k in MIX]
        self.mix = tuple(k for k in MIX if k.name in names)  # a part of it: to bisect a finding
        wall_start = float(spec["start_at"])
        self.start = time.monotonic() + (wall_start - time.time())
        addresses: dict[str, dict[str, list[Any]]] = spec["addresses"]
        self.targets: dict[str, Target] = {}
        for kind in MIX:
            host, port = addresses[kind.entry][kind.service]
            self.targets[kind.name] = build(kind, (str(host), int(port)))
        self.out = out
        self.pool: dict[tuple[str, int], list[Connection]] = {}
        self.intervals: dict[int, Interval] = {}
        self.next_flush = 0
        self.sending_done = False
        self.sending_index = 0  # the interval of the request sent last

    # -- connections

    async def _connect(self, address: tuple[str, int]) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(Connection, *address)
        return conn

    def _pooled(self, address: tuple[str, int], now: float) -> Connection | None:
        idle = self.pool.get(address)
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_MAX:
                return conn
            conn.close()
        return None

    # -- one request

    async def _one(self, target: Target, mode: str, due: float, slot: Interval) -> None:
        at = due - self.start  # recorded on its own when a reload is near
        near = any(abs(at - t) <= self.reload_margin for t in self.reloads)
        try:
            ms = await self._exchange(target, mode, due, slot)
            if near:
                slot.around_reloads.append([round(at, 3), None if ms is None else round(ms, 2)])
        finally:
            slot.pending -= 1
            self._flush()

    async def _exchange(
        self, target: Target, mode: str, due: float, slot: Interval
    ) -> float | None:
        """Send one request; its latency (ms), or None when it got no answer."""
        started = time.monotonic()
        late = started - due
        if late > self.late_s:
            slot.late += 1
        slot.late_max_ms = max(slot.late_max_ms, late * 1000)
        what = f"{target.kind.name} ({mode})"
        conn: Connection | None = None
        try:
            async with asyncio.timeout(self.deadline):
                if mode == KEEP_ALIVE:
                    conn = self._pooled(target.address, started)
                if conn is None:
                    slot.new_connections += 1
                    conn = await self._connect(target.address)
                request = target.close if mode == NEW_CLOSE else target.keep_alive
                status, ctype, body, keep = await conn.exchange(request)
        except TimeoutError:
            self._problem(slot, HANG, f"{what}: no answer in {self.deadline:g} s")
            if conn is not None:
                conn.close()
            return None
        except (OSError, ConnectionFailed) as exc:
            self._problem(slot, UNANSWERED, f"{what}: {exc}")
            if conn is not None:
                conn.close()
            return None
        ms = (time.monotonic() - started) * 1000
        slot.hist[bucket(ms)] += 1
        wrong = check(target.kind, status, ctype, body)
        if wrong is None:
            slot.ok += 1
        else:
            self._problem(slot, *wrong)
        if mode == KEEP_ALIVE and keep and not conn.closed:
            conn.idle_since = time.monotonic()
            self.pool.setdefault(target.address, []).append(conn)
        else:
            conn.close()
        return ms

    @staticmethod
    def _problem(slot: Interval, category: str, detail: str) -> None:
        slot.problems[category] += 1
        if len(slot.examples) < 5:
            slot.examples.append(f"{category}: {detail}")

    # -- intervals

    def _slot(self, index: int) -> Interval:
        slot = self.intervals.get(index)
        if slot is None:
            slot = self.intervals[index] = Interval(index)
        return slot

    def _flush(self) -> None:
        """Write the intervals whose requests have all been sent and have all ended, in order.
        Requests are sent in the order they are due: once one of a later interval is sent, no
        more of this one will be (the clock would not say so when the generator is late)."""
        lines = []
        while True:
            index = self.next_flush
            over = self.sending_done or index < self.sending_index
            slot = self.intervals.get(index)
            if not over or (slot is not None and slot.pending):
                break
            if slot is None and not self.sending_done:
                slot = Interval(index)  # nothing was due (a rate below one per interval)
            if slot is None:
                break
            lines.append(json.dumps(slot.as_dict()))
            self.intervals.pop(index, None)
            self.next_flush += 1
        if lines:
            with self.out.open("a") as out:
                out.write("\n".join(lines) + "\n")

    # -- the loop

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        total = int(self.duration * self.rate - self.phase) + 1
        sequence = plan(self.seed, self.mix)
        for i in range(total):
            due = self.start + (i + self.phase) / self.rate
            if due >= self.start + self.duration:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            elif i % 32 == 0:  # behind: still let the requests in flight run
                await asyncio.sleep(0)
            kind, mode = next(sequence)
            self.sending_index = int((due - self.start) / self.interval)
            slot = self._slot(self.sending_index)
            slot.due += 1
            slot.pending += 1
            slot.kinds[kind.name] += 1
            slot.modes[mode] += 1
            task = loop.create_task(self._one(self.targets[kind.name], mode, due, slot))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)
        self.sending_done = True
        self._flush()
        for idle in self.pool.values():
            for conn in idle:
                conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_traffic")
    parser.add_argument("spec", type=Path, help="the generator's JSON spec (bench.soak writes it)")
    parser.add_argument("out", type=Path, help="JSON lines, one per interval")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    asyncio.run(Generator(spec, args.out).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
