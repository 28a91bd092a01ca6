"""``python -m tests.fuzz``: fuzzed requests at routers, HAProxy and a broker; invariants checked.

    python -m tests.fuzz --seconds 100                   # the CI-sized run (.ci/run)
    python -m tests.fuzz --inputs 1000000 --json f.json  # the long run, by hand
    python -m tests.fuzz --family scope --seed 7 --only 42 --show  # one input again

Four families (``--family raw,tunnel,scope,osb``, all by default; :mod:`tests.fuzz.families`),
one after the other, each with its share of ``--seconds`` and ``--inputs`` and a minimum number
of inputs it must send (fewer fails the run): ``raw`` (below), ``tunnel`` (the raw inputs inside
intercepted TLS tunnels, :mod:`tests.fuzz.tunnel`), ``scope`` (``&``/``|`` scopes on list reads,
:mod:`tests.fuzz.scopes`), ``osb`` (hostile parameters at a broker running an Ansible pack,
:mod:`tests.fuzz.osb`).

Starts CloudOne's and CloudTwo's routers (2 workers each, loopback, short limits so that every
deadline is reached quickly), recording backends behind them, and HAProxy (Debian's ``haproxy``,
when installed) in front of a recording backend of its own; sends every input to the router
(its image frontend, or its forward proxy for absolute-form targets) and the frontend inputs to
HAProxy too; then checks the invariants (see :mod:`tests.fuzz`) and prints the figures. Exit
status 1 when an invariant broke (each broken one is shown with the input that broke it).
Everything it starts is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import psutil

from scoperouter import pki
from tests.fuzz import families as fam
from tests.fuzz import osb_run, routed, scopes, tunnel
from tests.fuzz.inputs import CANARY_BODY, CANARY_TRAILER, Input, generate
from tests.fuzz.stalls import SETTLE_EVERY, StallWatch
from tests.integration.backends import Received, RecordingBackend
from tests.integration.routers import (
    Router,
    cloud_entry,
    free_port,
    start_all,
    stop_all,
    write_config,
)

ONE, TWO, HAPROXY = "127.0.0.64", "127.0.0.65", "127.0.0.66"
LIMITS = {"header_timeout": 1.0, "body_timeout": 1.0, "idle_timeout": 2.0}
RESPONSE_TIMEOUT = 2.0
# Every connection ends within: a head (1 s) or a body (1 s) that stops, an upstream's answer
# (2 s), and margins for a loaded machine.
DEADLINE = LIMITS["header_timeout"] + LIMITS["body_timeout"] + RESPONSE_TIMEOUT + 4.0


@dataclass
class Answers:
    statuses: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # answers that are not what they must be
    seconds: float | None = None  # from the last byte sent to the close; None: still open


@dataclass
class Report:
    seed: int
    inputs: int = 0
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    families: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    differential: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[int]] = field(default_factory=dict)
    slowest_close: float = 0.0
    rss_mb: dict[str, list[float]] = field(default_factory=dict)
    backend_requests: int = 0
    haproxy: str = "not installed"
    per_family: dict[str, dict[str, Any]] = field(default_factory=dict)
    harness: dict[str, Any] = field(default_factory=dict)  # its own stalls (tests.fuzz.stalls)


class _Responses:
    """Parses what a connection answered (llhttp), answer by answer."""

    def __init__(self) -> None:
        self.found: list[tuple[int, dict[bytes, bytes], bytes]] = []
        self._fields: dict[bytes, bytes] = {}
        self._body = b""
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.found.append((self.parser.get_status_code(), self._fields, self._body))
        self._fields, self._body = {}, b""


def check_answers(data: bytes, method_head: bool) -> Answers:
    """The statuses a connection got, and what is wrong with them: every answer parses, and
    every answer the router made itself is OpenStack JSON carrying its status."""
    answers = Answers()
    responses = _Responses()
    try:
        responses.parser.feed_data(data)
    except httptools.HttpParserError as exc:
        if not method_head:  # a HEAD's answer has no body whatever its length says
            answers.problems.append(f"unparsable answer ({exc}): {data[:200]!r}")
    for status, fields, body in responses.found:
        answers.statuses.append(status)
        if status < 400 or method_head:
            continue
        if fields.get(b"content-type") != b"application/json":
            answers.problems.append(f"{status} without JSON: {data[:200]!r}")
            continue
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            answers.problems.append(f"{status} body is not an OpenStack error: {body[:200]!r}")
            continue
        if error.get("code") != status:
            answers.problems.append(f"{status} says code {error.get('code')}")
    return answers


async def send(address: tuple[str, int], item: Input) -> tuple[bytes, float | None]:
    """The input on a new connection; what came back, and how long the connection lived
    after the last byte was sent (None: not closed within the deadline)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 5)
    except (OSError, TimeoutError) as exc:
        return f"<connect failed: {exc}>".encode(), 0.0
    got = bytearray()
    try:
        writer.write(item.data)
        await writer.drain()
    except OSError:
        pass
    sent = time.monotonic()
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), DEADLINE):
            got += chunk
            if time.monotonic() - sent > DEADLINE:
                return bytes(got), None
    except TimeoutError:
        return bytes(got), None
    except OSError:
        pass
    finally:
        writer.close()
    return bytes(got), time.monotonic() - sent


class Harness:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.report = Report(seed=args.seed)
        self.backends: dict[str, RecordingBackend] = {}
        self.routers: list[Router] = []
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.addresses: dict[str, tuple[str, int]] = {}
        self.compared: list[int] = []  # frontend inputs HAProxy got too (no stall)
        self.done = 0
        self.families = fam.plan(
            fam.select(args.family), args.seconds, args.inputs, args.only is not None
        )
        self.osb = (
            osb_run.OsbFamily(work, args.seed, args.osb_runs, min(args.concurrency, 2))
            if "osb" in self.families
            else None
        )
        self.proxy_ca = work / "proxy-ca.crt"
        self.tunnel_targets: list[bytes] = []
        self.deadline, self.idle = DEADLINE, LIMITS["idle_timeout"]
        self.check_answers, self.send = check_answers, send
        self.stalls = StallWatch()
        # an exchange that overlapped a stall of the harness this long is sent again once
        self.stall_limit = LIMITS["header_timeout"] / 2

    # -- processes

    def start(self) -> None:
        if self.osb is not None:
            self.osb.start()  # it gets ready while the routers start and the raw family runs
        one = self.backends["one"] = RecordingBackend(
            "127.0.1.64", "CloudOne", keep_body=64, early=scopes.early("CloudOne")
        )
        two = self.backends["two"] = RecordingBackend(
            "127.0.1.65", "CloudTwo", keep_body=64, early=scopes.early("CloudTwo")
        )
        one.start()
        two.start()
        front_one, front_two, proxy = free_port(ONE), free_port(TWO), free_port(ONE)
        # CloudOne's forward proxy intercepts TLS with a CA of its own (the tunnel family).
        ca_cert, ca_key = pki.make_ca(self.work, "proxy-ca")
        cloud_one = cloud_entry(ONE, {"image": (front_one, "", one.url)}, proxy)
        cloud_one["proxy"].update(ca=str(ca_cert), ca_key=str(ca_key))
        self.tunnel_targets = [
            b"%s:%d" % (ONE.encode(), front_one),
            b"%s:%d" % (one.host.encode(), one.port),
        ]
        config = write_config(
            self.work / "federation.yaml",
            {
                "CloudOne": cloud_one,
                "CloudTwo": cloud_entry(TWO, {"image": (front_two, "", two.url)}),
            },
            connect_timeout=1.0,
            response_timeout=RESPONSE_TIMEOUT,
            limits=LIMITS,
            breaker={"failures": 1_000_000},
        )
        self.routers = [
            Router("CloudOne", config, self.work / "one.log", [(ONE, front_one)], workers=2),
            Router("CloudTwo", config, self.work / "two.log", [(TWO, front_two)], workers=2),
        ]
        start_all(self.routers)
        self.addresses = {"frontend": (ONE, front_one), "proxy": (ONE, proxy)}
        if not self.args.no_haproxy and (path := _which("haproxy")):
            self._start_haproxy(path)

    def _start_haproxy(self, path: str) -> None:
        backend = RecordingBackend("127.0.1.66", "HAProxy", keep_body=64).start()
        self.backends["haproxy"] = backend
        port = free_port(HAPROXY)
        config = self.work / "haproxy.cfg"
        config.write_text(
            "global\n  maxconn 4096\n"
            "defaults\n  mode http\n  timeout connect 1s\n  timeout client 1s\n"
            "  timeout server 2s\n  timeout http-request 1s\n"
            f"frontend f\n  bind {HAPROXY}:{port}\n  default_backend b\n"
            f"backend b\n  server s {backend.host}:{backend.port}\n"
        )
        self.haproxy = subprocess.Popen(
            [path, "-db", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=(self.work / "haproxy.log").open("wb"),
        )
        self.addresses["haproxy"] = (HAPROXY, port)
        version = subprocess.run([path, "-v"], capture_output=True, text=True).stdout
        self.report.haproxy = version.splitlines()[0] if version else path
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import socket

                socket.create_connection((HAPROXY, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("HAProxy did not start (see haproxy.log)")

    def stop(self) -> dict[str, int | None]:
        codes = stop_all(self.routers)
        if self.osb is not None:
            code = self.osb.stop()  # uvicorn ends on SIGTERM by raising it again: -15
            codes["broker"] = 0 if code == -signal.SIGTERM else code
        if self.haproxy is not None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
        for backend in self.backends.values():
            backend.stop()
        return codes

    def rss(self) -> dict[str, float]:
        """Each router worker's RSS (MB)."""
        found = {}
        for router in self.routers:
            for child in psutil.Process(router.pid).children():
                found[f"{router.cloud}/{child.pid}"] = child.memory_info().rss / 1e6
        return found

    # -- the run

    async def run(self) -> None:
        """Each selected family in turn (the osb family's first Ansible runs started first)."""
        self.stalls.start()
        if self.osb is not None and self.args.only is None:
            await self.osb.prime(self.families["osb"])
        for name, family in self.families.items():
            self.stalls.settle()  # nothing in flight between two families
            if name == "raw":
                await self.run_raw(family)
            elif name == "tunnel":
                await routed.run_tunnel(self, family)
            elif name == "scope":
                await routed.run_scope(self, family)
            else:
                assert self.osb is not None
                await self.osb.run(family, self.args.only, self.args.show)
        await self.stalls.stop()
        self.report.harness = self.stalls.figures()

    async def run_raw(self, family: fam.Family) -> None:
        args = self.args
        one = self.backends["one"]
        front = f"{ONE}:{self.addresses['frontend'][1]}".encode()
        backend = f"{one.host}:{one.port}".encode()
        numbers = [args.only] if args.only is not None else None
        limit = family.quota if numbers is None else 1
        semaphore = asyncio.Semaphore(args.concurrency)
        started = time.monotonic()
        warm = min(200, limit // 10)
        before: dict[str, float] = {}

        async def one_input(n: int) -> None:
            async with semaphore:
                item = generate(args.seed, n, front, backend)
                head = item.data.startswith(b"HEAD ")
                data, seconds = await send(self.addresses[item.where], item)
                self._record(n, item, check_answers(data, head), seconds)
                if "haproxy" in self.addresses and item.where == "frontend" and not item.stall:
                    await send(self.addresses["haproxy"], item)
                    self.compared.append(n)
                if args.show:
                    print(f"input {n} ({item.family}, {item.where}): {item.data!r}")
                    print(f"router: {data!r}")

        n = numbers[0] if numbers else 0
        pending: set[asyncio.Task[None]] = set()
        while (numbers is None and n < limit) or (numbers is not None and not self.done):
            if time.monotonic() - started > family.seconds:
                break
            if n == warm and not before:
                await asyncio.gather(*pending)
                pending.clear()
                before = self.rss()
            elif n and n % SETTLE_EVERY == 0:
                await asyncio.gather(*pending)
                self.stalls.settle()
            task = asyncio.create_task(one_input(n))
            pending.add(task)
            task.add_done_callback(pending.discard)
            while len(pending) >= args.concurrency * 2:
                await asyncio.sleep(0.001)
            n += 1
            if numbers is not None:
                break
        await asyncio.gather(*pending)
        family.elapsed = time.monotonic() - started
        family.inputs = self.done
        await asyncio.sleep(LIMITS["idle_timeout"] + 0.5)  # idle connections close
        after = self.rss()
        self.report.rss_mb = {
            k: [round(before.get(k, 0), 1), round(v, 1)] for k, v in after.items()
        }

    # -- the invariants

    def _record(self, n: int, item: Input, router: Answers, seconds: float | None) -> None:
        """One input's answers, checked as they come (nothing of it is kept but counts)."""
        report = self.report
        self.done += 1
        report.families[item.family] += 1
        for status in router.statuses or [0]:
            report.statuses[f"{status // 100}xx" if status else "closed"] += 1
        for problem in router.problems:
            report.violations.append(f"input {n}: {problem}")
        if seconds is None:
            report.violations.append(f"input {n}: not answered nor closed in {DEADLINE:g}s")
        else:
            report.slowest_close = max(report.slowest_close, seconds)

    def check(self) -> None:
        report = self.report
        if "haproxy" in self.backends:
            ours = _forwarded(self.backends["one"]) + _forwarded(self.backends["two"])
            theirs = _forwarded(self.backends["haproxy"])
            for n in self.compared:
                self._compare(n, ours[b"fz%d" % n] > 0, theirs[b"fz%d" % n] > 0)
        logs = {r.cloud: r for r in self.routers}
        for name, cloud in (("one", "CloudOne"), ("two", "CloudTwo")):
            # by request id: a mutated input may carry another's id, so an id may have lines
            access: dict[Any, list[dict[str, Any]]] = {}
            for entry in logs[cloud].access():
                access.setdefault(entry.get("request_id"), []).append(entry)
            for received in self.backends[name].requests:
                report.backend_requests += 1
                n = tunnel.owner(received)
                if n is None:
                    report.violations += self._check_received(received, access, cloud)
                    continue
                # from a tunnel: the same invariants, and its target and Host as logged
                family = self.families.get("tunnel")
                problems = self._check_received(received, access, cloud)
                if not problems and received.method:
                    problem = tunnel.check_received(received, access)
                    problems = [f"{cloud}'s {problem}"] if problem else []
                for problem in problems:
                    if family is not None:
                        family.violation(self.args.seed, n, problem)
            text = logs[cloud].log_text()
            if "Traceback" in text or '"level":"ERROR"' in text:
                line = next(
                    x for x in text.splitlines() if "Traceback" in x or '"level":"ERROR"' in x
                )
                report.violations.append(f"{cloud}'s log has an error: {line[:600]}")
        for worker, (before, after) in report.rss_mb.items():
            if before and after - before > 16:
                report.violations.append(f"{worker}: RSS {before} -> {after} MB")

    def finish(self) -> None:
        """The families' counts, broken invariants and minimum gates into the report."""
        report = self.report
        gates = []
        for name, family in self.families.items():
            gate = None if self.args.only is not None else fam.minimum_gate(family)
            gates += [gate] if gate else []
            report.violations += family.violations
            report.inputs += family.inputs
            report.seconds += family.elapsed
            report.per_family[name] = {
                "inputs": family.inputs,
                "minimum": family.minimum,
                "seconds": round(family.elapsed, 1),
                "share_seconds": round(family.seconds, 1) if family.seconds < 1e9 else None,
                "violations": len(family.violations) + (1 if gate else 0),
                "first_broken_input": family.first_broken,
                **family.figures,
            }
        report.violations[:0] = gates  # first: they say the run proved nothing

    def _check_received(
        self, received: Received, access: dict[Any, list[dict[str, Any]]], cloud: str
    ) -> list[str]:
        """What is wrong with a request a backend received."""
        found: list[str] = []
        if not received.method:
            return found  # a head that never ended (its connection was cut): no request
        what = f"{cloud}'s backend got {received.method} {received.target[:120]!r}"
        ids = received.values(b"x-scope-request-id")
        canaries = received.values(CANARY_TRAILER) + received.values(CANARY_BODY)
        if ids and ids[0] in canaries:
            # A trailer's (or a body's) field in the head of the very request it came with. (In
            # another request's head it was parsed as a head: the access log check below.)
            found.append(f"{what} with a field of its own trailer or body")
        if received.trailers:
            found.append(f"{what} with trailer fields {received.trailers}")
        hosts = received.values(b"host")
        if len(hosts) != 1 or len(ids) != 1:
            found.append(f"{what} with Host {hosts} and request id {ids}")
            return found
        path = received.target.partition(b"?")[0].decode("latin-1")
        if not any(
            entry.get("method") == received.method and str(entry.get("path", "")).endswith(path)
            for entry in access.get(ids[0].decode("latin-1"), ())
        ):
            found.append(f"{what} that its router's access log does not show")
        return found

    def _compare(self, n: int, ours: bool, theirs: bool) -> None:
        key = {
            (True, True): "forwarded by both",
            (False, False): "refused by both",
            (False, True): "refused by the router only",
            (True, False): "forwarded by the router only",
        }[(ours, theirs)]
        self.report.differential[key] += 1
        examples = self.report.examples.setdefault(key, [])
        if len(examples) < 5 and key not in ("forwarded by both", "refused by both"):
            examples.append(n)


def _forwarded(backend: RecordingBackend) -> Counter[bytes]:
    """How many complete requests `backend` received per request id."""
    found: Counter[bytes] = Counter()
    for received in backend.requests:
        if received.complete:
            for value in received.values(b"x-scope-request-id"):
                found[value] += 1
    return found


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name) or (
        f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
    )


def print_report(report: Report) -> None:
    rate = report.inputs / report.seconds if report.seconds else 0
    print(
        f"fuzz: {report.inputs:,} inputs in {report.seconds:.0f} s ({rate:,.0f}/s), "
        f"seed {report.seed}"
    )
    for name, figures in report.per_family.items():
        print(f"  {name}: {json.dumps(figures, default=str)}")
    print(f"  raw kinds: {dict(sorted(report.families.items()))}")
    print(f"  raw: router answers: {dict(sorted(report.statuses.items()))}")
    print(f"  requests the backends received: {report.backend_requests:,}")
    print(
        f"  slowest close after the last byte: {report.slowest_close:.2f} s "
        f"(deadline {DEADLINE:g} s)"
    )
    print(f"  worker RSS MB (after warm-up -> after the run): {report.rss_mb}")
    print(f"  the harness's own loop: {report.harness}")
    print(f"  raw beside {report.haproxy}: {dict(report.differential)}")
    for key, numbers in report.examples.items():
        print(f"    {key}, e.g. inputs {numbers} (--family raw --only N --show)")
    print(f"  invariants broken: {len(report.violations)}")
    shown: Counter[str] = Counter()  # at most 12 lines of each family
    for line in report.violations:
        family = line[1:].partition("]")[0] if line.startswith("[") else "raw"
        shown[family] += 1
        if shown[family] <= 12:
            print(f"    {line}")
    for family, count in shown.items():
        if count > 12:
            print(f"    [{family}] ... and {count - 12} more (--json F has them all)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=float("inf"), help="stop sending after")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--only", type=int, help="run this one input (with --seed)")
    parser.add_argument("--show", action="store_true", help="print each input and its answer")
    parser.add_argument("--no-haproxy", action="store_true")
    parser.add_argument("--json", help="write the report there")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument(
        "--family",
        default="all",
        help=f"families to run, comma-separated ({','.join(fam.FAMILIES)}; default all)",
    )
    parser.add_argument(
        "--osb-runs", type=int, default=6, help="Ansible runs the osb family may start"
    )
    args = parser.parse_args(argv)
    try:
        fam.select(args.family)
    except ValueError as exc:
        parser.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="scoperouter-fuzz-"))
    harness = Harness(args, work)
    try:
        harness.start()
        asyncio.run(harness.run())
    finally:
        codes = harness.stop()
    harness.check()
    harness.finish()
    if set(codes.values()) != {0}:
        harness.report.violations.append(f"routers (or the broker) exited with {codes}")
    print_report(harness.report)
    if args.json:
        report = {
            f.name: getattr(harness.report, f.name) for f in dataclasses.fields(harness.report)
        }
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    if args.keep or harness.report.violations:
        print(f"  logs: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 1 if harness.report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
