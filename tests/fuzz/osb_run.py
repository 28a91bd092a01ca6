"""The ``osb`` family's processes and run: the broker started, the inputs sent, the
operations waited for, the invariants of :mod:`tests.fuzz.osb` checked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from scoperouter.broker.parent import preexec_die_with_parent
from scoperouter.broker.secrets import generate_key
from tests.broker.ansible_harness import NAME, make_pack
from tests.fuzz import osb
from tests.fuzz.families import Family
from tests.integration.routers import free_port

PASSWORD = "fuzz-broker-password"
HEADERS = {"X-Broker-API-Version": "2.17"}
OPERATION_TIMEOUT = 90.0  # an Ansible run on a loaded machine, queued behind others
PRIME_INPUTS = 500  # looked at for the first runs, at most
MIN_RUNS = 3  # a family that started fewer Ansible runs proved nothing about templates


class OsbFamily:
    def __init__(self, work: Path, seed: int, runs: int, concurrency: int) -> None:
        self.work = work / "broker"
        self.work.mkdir()
        self.seed, self.max_runs, self.concurrency = seed, runs, concurrency
        # in the one folder a run may write to (a sandboxed run could not reach /tmp's)
        self.canary = str(self.work / "cloud" / "c")
        self.home = str(self.work / f"home-{seed}-marker")
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.ids: dict[str, str] = {}
        self.known: list[str] = []
        self.operations: list[tuple[int, str, osb.OsbInput]] = []  # (n, poll path, input)
        self.products: dict[str, int] = {}  # a template's result that must never appear: input
        self.statuses: dict[str, int] = {}
        self.primed: set[int] = set()
        self.expected: dict[str, tuple[int, str]] = {}  # instance: (input, content) last written
        self.states: dict[int, str] = {}  # input: how its operation ended

    def start(self) -> None:
        """Start the broker (returns at once: :meth:`ready` waits for it)."""
        make_pack(self.work)
        Path(self.home).mkdir()
        port = free_port("127.0.0.1")
        config = self.work / "broker.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "listen": f"127.0.0.1:{port}",
                    "database": {"url": f"sqlite:///{self.work / 'broker.db'}"},
                    "worker": {"threads": 3, "poll_seconds": 0.05, "lease_seconds": 30},
                    "services": {
                        NAME: {
                            "type": "ansible",
                            "pack": str(self.work / "pack"),
                            "work_dir": str(self.work / "runs"),
                            "synchronous_seconds": 0,
                            # where the pack writes, for a broker that sandboxes its runs
                            "sandbox_writable": [str(self.work / "cloud")],
                        }
                    },
                    "log_level": "INFO",
                }
            )
        )
        env = {
            **os.environ,
            "HOME": self.home,
            "SCOPEROUTER_BROKER_PASSWORD": PASSWORD,
            "SCOPEROUTER_BROKER_SECRET_KEYS": generate_key(),
        }
        root = Path(__file__).resolve().parents[2]
        env["PYTHONPATH"] = str(root)
        with (self.work / "broker.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fuzz.broker", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
                start_new_session=True,
                preexec_fn=preexec_die_with_parent(signal.SIGKILL),
            )
        self.url = f"http://127.0.0.1:{port}"

    def ready(self, timeout: float = 60) -> None:
        assert self.proc is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited:\n{self.log()[-3000:]}")
            try:
                r = httpx.get(self.url + "/v2/catalog", auth=("broker", PASSWORD), headers=HEADERS)
                if r.status_code == 200:
                    service = r.json()["services"][0]
                    self.ids = {"service_id": service["id"], "plan_id": service["plans"][0]["id"]}
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"broker did not start in {timeout:.0f} s:\n{self.log()[-3000:]}")

    def stop(self) -> int | None:
        """SIGTERM its group (by its PID), SIGKILL after 15 s; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what its runs left, if anything
        return self.proc.returncode

    def log(self) -> str:
        return (self.work / "broker.log").read_text(errors="replace")

    # -- the run

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, auth=("broker", PASSWORD), headers=HEADERS, timeout=30
        )

    async def prime(self, family: Family) -> None:
        """Send the first provisions that run the playbooks now (two thirds of the runs): the
        broker's worker threads run them while the router families run, so that the family's
        own time is not spent waiting for Ansible. They are the family's inputs all the same."""
        self.ready()
        async with self.client() as client:
            n = 0
            limit = min(family.quota, PRIME_INPUTS)
            while len(self.operations) < self.max_runs * 2 // 3 and n < limit:
                item = osb.generate(self.seed, n, self.ids, self.canary, self.known)
                if item.run:
                    self.primed.add(n)
                    await self._one(client, family, item, False)
                n += 1

    async def run(self, family: Family, only: int | None, show: bool) -> None:
        self.ready()
        started = time.monotonic()
        semaphore = asyncio.Semaphore(self.concurrency)
        async with self.client() as client:

            async def one(item: osb.OsbInput) -> None:
                async with semaphore:
                    await self._one(client, family, item, show)

            if only is not None:
                await one(osb.generate(self.seed, only, self.ids, self.canary, self.known))
            else:
                tasks: set[asyncio.Task[None]] = set()
                n = 0
                # the quota counts inputs sent: those skipped (sent by prime(), or runs past
                # --osb-runs) are made up by the next ones, within 4x the quota of draws
                while (
                    family.inputs + len(tasks) < family.quota
                    and n < 4 * family.quota
                    and time.monotonic() - started < family.seconds
                ):
                    item = osb.generate(self.seed, n, self.ids, self.canary, self.known)
                    if (item.run and len(self.operations) >= self.max_runs) or n in self.primed:
                        n += 1
                        continue  # sent already, or enough runs: what is refused without one
                    task = asyncio.create_task(one(item))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    while len(tasks) >= self.concurrency:
                        await asyncio.sleep(0.005)
                    n += 1
                await asyncio.gather(*tasks)
            family.elapsed = time.monotonic() - started
            await self._wait_operations(client, family)
        self.check(family)
        least = min(MIN_RUNS, self.max_runs)
        if only is None and len(self.operations) < least:
            family.violation(
                self.seed, None, f"{len(self.operations)} Ansible runs, fewer than {least}"
            )
        family.figures.update(
            {
                "ansible_runs": len(self.operations),
                "answers": dict(sorted(self.statuses.items())),
                "seconds_with_runs": round(time.monotonic() - started, 1),
            }
        )

    async def _one(
        self, client: httpx.AsyncClient, family: Family, item: osb.OsbInput, show: bool
    ) -> None:
        n = item.n
        self.products.update(dict.fromkeys(item.products, n))
        raw = item.body if isinstance(item.body, bytes) else None
        try:
            response = await client.request(
                item.method,
                item.path,
                json=None if raw is not None else item.body,
                content=raw,
                headers={"Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            family.violation(self.seed, n, f"{item.method} {item.path[:60]}: no answer ({exc!r})")
            return
        family.inputs += 1
        status, text = response.status_code, response.text
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        if show:
            print(f"input {n} (osb): {item.method} {item.path} {str(item.body)[:2000]}")
            print(f"broker: {status} {text[:2000]}")
        if problem := osb.check_answer(status, text):
            family.violation(self.seed, n, f"{item.method} {item.path[:60]}: {problem}")
        if problem := osb.evaluated(text, item.products, self.home):
            family.violation(self.seed, n, f"the answer holds {problem}: {text[:200]!r}")
        if status == 202 and item.content is not None:
            # the last accepted write of an instance's file (one at a time: 422 otherwise)
            instance = item.path.split("/")[3].partition("?")[0]
            self.known += [instance] if item.method == "PUT" else []
            self.expected[instance] = (n, item.content)
        if status == 202:
            poll = item.path.partition("?")[0] + "/last_operation"
            self.operations.append((n, poll, item))

    async def _wait_operations(self, client: httpx.AsyncClient, family: Family) -> None:
        pending = list(self.operations)
        timeout = OPERATION_TIMEOUT + 10 * len(pending)  # a long run queues many
        end = time.monotonic() + timeout
        while pending and time.monotonic() < end:
            still = []
            for n, poll, item in pending:
                r = await client.get(poll)
                if r.status_code == 200 and r.json().get("state") == "in progress":
                    still.append((n, poll, item))
                    continue
                text = r.text
                if problem := osb.evaluated(text, item.products, self.home):
                    family.violation(self.seed, n, f"its operation says {problem}: {text[:300]!r}")
                self.states[n] = str(r.json().get("state")) if r.status_code == 200 else text
            pending = still
            if pending:
                await asyncio.sleep(0.5)
        for n, _, _ in pending:
            family.violation(self.seed, n, f"its operation still in progress after {timeout:g} s")

    def _check_files(self, family: Family) -> None:
        """Each instance's file holds the content of its last write, when that succeeded."""
        for instance, (n, content) in self.expected.items():
            if self.states.get(n) != "succeeded":
                continue
            path = self.work / "cloud" / f"osb-{instance}"
            got = path.read_text(errors="replace") if path.exists() else "(no file)"
            if got != content:
                family.violation(
                    self.seed, n, f"the instance's file holds {got[:120]!r}, not {content[:120]!r}"
                )

    def check(self, family: Family) -> None:
        """After every operation: the canary, evaluated results in the pack's files, the log."""
        self._check_files(family)
        for canary in sorted(Path(self.canary).parent.glob(Path(self.canary).name + "*")):
            number = canary.name.removeprefix(Path(self.canary).name)
            n = int(number) if number.isdigit() else None
            family.violation(self.seed, n, f"the canary {canary} exists: its command ran")
            canary.unlink()
        for path in sorted((self.work / "cloud").glob("*")):
            text = path.read_text(errors="replace")
            if problem := osb.evaluated(text, list(self.products), self.home):
                n = next((self.products[p] for p in self.products if p in text), None)
                family.violation(self.seed, n, f"{path.name} holds {problem}")
        log = self.log()
        if "Traceback" in log:
            line = next(x for x in log.splitlines() if "Traceback" in x)
            family.violation(self.seed, None, f"the broker's log has a traceback: {line[:300]}")


def figures(family: Family) -> dict[str, Any]:
    return family.figures
