"""``python -m bench.broker_provision``: N concurrent server provisions across two clouds
through the broker, against the same creates done directly with openstacksdk, in one run.

Needs a running lab (``scoperouter lab up``); run by hand, from the repository root with the
dev venv. Both paths use the same accounts (the lab's admin entries, through the routers), the
same flavor (``m1.tiny``) and each cloud's own ``tiny`` image, and projects whose quotas the
bench lifts, so the difference is what the broker adds: OSB requests, the database, placement
(capacity reads, ``spread``), the worker's passes and the polling of ``last_operation``.

1. **direct**: N threads, each ``create_server`` in CloudOne or CloudTwo (alternately), then
   polled to ACTIVE (openstacksdk's ``wait_for_server``, 2 s interval); then deleted.
2. **broker**: ``scoperouter broker serve`` (SQLite, ``--threads`` workers) with the
   ``openstack-server`` service; N concurrent OSB provisions (``where: {"strategy": "spread"}``)
   from N threads polling ``last_operation`` as a platform does (Retry-After, capped at 2 s);
   every one must end ``succeeded``; then deprovisioned.

The time of a path is from its first request to its last server ACTIVE (resp. ``succeeded``).
Everything carries ``osb-bench-<run>`` and is deleted at the end, also after an error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from bench.procs import free_port
from bench.report import table
from scoperouter.broker.clouds import CloudAccess, FederationClouds
from scoperouter.broker.config import IdentityConfig
from scoperouter.broker.identity import Identity, keystone, space_of
from scoperouter.broker.osbclient import OSBClient
from scoperouter.broker.secrets import generate_key

RUN = uuid.uuid4().hex[:8]
PREFIX = f"osb-bench-{RUN}"
CLOUDS = (("CloudOne", "cloudone-admin"), ("CloudTwo", "cloudtwo-admin"))
POLL = 2.0
T = TypeVar("T")


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def lab_clouds_yaml() -> Path:
    root = os.environ.get("SCOPEROUTER_LAB_DIR") or "~/.local/share/scoperouter/lab"
    return Path(root).expanduser() / "clouds.yaml"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker_provision",
        description="N concurrent server provisions across two clouds: through the broker "
        "vs directly with openstacksdk (needs `scoperouter lab up`).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--servers", type=int, default=20, help="servers per path (N)")
    parser.add_argument("--threads", type=int, default=4, help="the broker's worker threads")
    parser.add_argument(
        "--clouds-yaml",
        type=Path,
        default=lab_clouds_yaml(),
        help="the lab's clouds.yaml ($SCOPEROUTER_LAB_DIR/clouds.yaml)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds (direct, then broker)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------ setup


def context() -> dict[str, str]:
    return {"platform": "cloudfoundry", "organization_guid": PREFIX, "space_guid": "bench"}


def open_quotas(clouds: FederationClouds) -> dict[str, str]:
    """The space project the broker will use in each cloud, made now with no quota limits
    (the default of 10 instances would turn the bench into a quota test)."""
    identity = Identity(IdentityConfig())
    projects = {}
    for cloud in clouds.names():
        admin = clouds.connect(cloud)
        project_id = identity.space_project(admin, space_of(context()))
        admin.set_compute_quotas(project_id, instances=-1, cores=-1, ram=-1)
        projects[cloud] = project_id
    return projects


# ----------------------------------------------------------------------------- direct


def direct(clouds: FederationClouds, projects: dict[str, str], n: int) -> dict[str, Any]:
    """N creates with openstacksdk, alternately in each cloud, N threads; to ACTIVE."""
    names = clouds.names()
    conns = {c: clouds.connect(c, project_id=projects[c]) for c in names}
    setup = {
        c: (conn.compute.find_flavor("m1.tiny", ignore_missing=False).id,
            conn.image.find_image("tiny", ignore_missing=False).id)
        for c, conn in conns.items()
    }  # fmt: skip

    def one(i: int) -> tuple[str, Any, float]:
        cloud = names[i % len(names)]
        flavor, image = setup[cloud]
        conn = conns[cloud]
        server = conn.compute.create_server(
            name=f"{PREFIX}-direct-{i}", flavor_id=flavor, image_id=image, networks="none"
        )
        server = conn.compute.wait_for_server(server, interval=POLL, wait=900)
        return cloud, server, time.monotonic()

    start = time.monotonic()
    results = _parallel(one, n)
    seconds = max(t for _, _, t in results) - start
    say(f"direct: {n} servers ACTIVE in {seconds:.1f} s; deleting")
    for cloud, server, _ in results:
        conns[cloud].compute.delete_server(server)
    for cloud, server, _ in results:
        conns[cloud].compute.wait_for_delete(server, wait=600)
    return {
        "seconds": seconds,
        "per_cloud": {c: sum(1 for r in results if r[0] == c) for c in names},
        "completions": _completions(results, start),
    }


# ----------------------------------------------------------------------------- broker


def broker(clouds_yaml: Path, workdir: Path, n: int, threads: int) -> dict[str, Any]:
    port = free_port("127.0.0.1")
    config = {
        "listen": f"127.0.0.1:{port}",
        "database": {"url": f"sqlite:///{workdir / 'broker.db'}"},
        "clouds_yaml": [str(clouds_yaml)],
        "clouds": {name: {"entry": entry} for name, entry in CLOUDS},
        "worker": {"threads": threads, "poll_seconds": 0.2},
        "log_level": "WARNING",
        "services": {
            "openstack-server": {
                "networks": "none",
                "plans": [{"name": "tiny", "flavor": "m1.tiny"}],
            }
        },
    }
    (workdir / "broker.yaml").write_text(yaml.safe_dump(config))
    password = generate_key()[:24]
    env = {
        **os.environ,
        "SCOPEROUTER_BROKER_PASSWORD": password,
        "SCOPEROUTER_BROKER_SECRET_KEYS": generate_key(),
    }
    argv = [sys.executable, "-m", "scoperouter.broker", "serve", "--config",
            str(workdir / "broker.yaml")]  # fmt: skip
    with open(workdir / "broker.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        osb = OSBClient(f"http://127.0.0.1:{port}", "broker", password, context=context())
        _wait_started(osb, proc, workdir / "broker.log")
        [service] = [s for s in osb.catalog().body["services"] if s["name"] == "openstack-server"]
        service_id, plan_id = service["id"], service["plans"][0]["id"]
        ids = [f"{PREFIX}-osb-{i}" for i in range(n)]

        def one(i: int) -> tuple[str, str, float]:
            params = {"image": "tiny", "where": {"strategy": "spread"}}
            answer = _retrying(lambda: osb.provision(ids[i], service_id, plan_id, params))
            if answer.status not in (200, 202):
                raise RuntimeError(f"provision {ids[i]}: {answer.status} {answer.body}")
            last = _retrying(
                lambda: osb.wait(ids[i], answer.operation, timeout=900, max_interval=POLL)
            )
            done = time.monotonic()
            if last.body.get("state") != "succeeded":
                raise RuntimeError(f"{ids[i]}: {last.body}")
            got = _retrying(lambda: osb.get_instance(ids[i])).body["metadata"]["attributes"]
            return str(got["cloud"]), str(last.body["description"]), done

        start = time.monotonic()
        results = _parallel(one, n)
        seconds = max(t for _, _, t in results) - start
        say(f"broker: {n} provisions succeeded in {seconds:.1f} s; deprovisioning")
        refused = [d for _, d, _ in results if "refused it" in d]

        def gone(i: int) -> None:
            answer = _retrying(lambda: osb.deprovision(ids[i], service_id, plan_id))
            last = _retrying(
                lambda: osb.wait(ids[i], answer.operation, timeout=900, max_interval=POLL)
            )
            if last.status != 410:
                raise RuntimeError(f"deprovision {ids[i]}: {last.status} {last.body}")

        _parallel(gone, n)
        return {
            "seconds": seconds,
            "per_cloud": {c: sum(1 for r in results if r[0] == c) for c, _ in CLOUDS},
            "completions": _completions(results, start),
            "refused": refused,
            "worker_threads": threads,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_started(osb: OSBClient, proc: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if osb.catalog().status == 200:
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("the broker did not start in 60 s")


# ---------------------------------------------------------------------------- helpers


def _retrying(call: Callable[[], T], attempts: int = 5) -> T:
    """`call`, again after a transport error: a keep-alive connection the server closes just as
    a client reuses it is reset (uvicorn closes idle ones after 5 s); platforms retry too, and
    OSB requests are idempotent."""
    for attempt in range(attempts):
        try:
            return call()
        except httpx.TransportError as exc:
            if attempt == attempts - 1:
                raise
            say(f"retrying after {type(exc).__name__}: {exc}")
            time.sleep(1)
    raise AssertionError("unreachable")


def _parallel(fn: Callable[[int], Any], n: int) -> list[Any]:
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(fn, range(n)))


def _completions(results: list[tuple[str, Any, float]], start: float) -> dict[str, float]:
    times = sorted(t - start for _, _, t in results)
    return {"first": times[0], "median": statistics.median(times), "last": times[-1]}


def sweep(clouds: FederationClouds) -> None:
    """Delete whatever this run left: servers by name, then the space's projects by tag. A
    cloud that cannot be reached is reported with what to delete by hand."""
    for cloud in clouds.names():
        try:
            admin = clouds.connect(cloud)
            servers = admin.compute.servers(all_projects=True)
            left = [s for s in servers if PREFIX in (s.name or "")]
            for server in left:
                admin.compute.delete_server(server.id, ignore_missing=True)
            for server in left:
                admin.compute.wait_for_delete(server, wait=600)
            for project in keystone(admin).projects(tags=space_of(context()).tag):
                keystone(admin).delete_project(project.id, ignore_missing=True)
        except Exception as exc:
            say(
                f"cannot clean up {cloud} ({type(exc).__name__}: {exc}): delete its servers "
                f"named {PREFIX}-* and projects tagged {space_of(context()).tag} by hand"
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.clouds_yaml.exists():
        say(f"no {args.clouds_yaml}: run `scoperouter lab up` first")
        return 2
    clouds = FederationClouds(
        [CloudAccess(name=n, entry=e) for n, e in CLOUDS], config_files=[args.clouds_yaml]
    )
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="osb-bench-") as tmp:
        try:
            projects = open_quotas(clouds)
            for r in range(args.repeat):
                load = os.getloadavg()[0]
                say(f"round {r + 1}: direct, {args.servers} concurrent creates (openstacksdk)")
                d = direct(clouds, projects, args.servers)
                say(f"round {r + 1}: broker, {args.servers} concurrent OSB provisions (spread)")
                workdir = Path(tmp) / f"round-{r + 1}"
                workdir.mkdir()
                b = broker(args.clouds_yaml, workdir, args.servers, args.threads)
                rounds.append({"direct": d, "broker": b, "load_before": load})
        finally:
            sweep(clouds)
    print(report(rounds, args.servers))
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=2))
    return 0


def report(rounds: list[dict[str, Any]], servers: int) -> str:
    rows = []
    for index, r in enumerate(rounds, 1):
        d, b = r["direct"], r["broker"]
        for label, x in (("direct (openstacksdk)", d), ("through the broker", b)):
            per = ", ".join(f"{c} {k}" for c, k in x["per_cloud"].items())
            c = x["completions"]
            ratio = x["seconds"] / d["seconds"]
            rows.append([str(index), label, str(servers), f"{x['seconds']:.1f}",
                         f"{c['first']:.1f}", f"{c['median']:.1f}", per, f"{ratio:.2f}",
                         f"{r['load_before']:.1f}"])  # fmt: skip
    text = table(
        ["round", "path", "servers", "all done s", "first s", "median s", "clouds", "x direct",
         "load"], rows,
    )  # fmt: skip
    ratios = [r["broker"]["seconds"] / r["direct"]["seconds"] for r in rounds]
    text += f"\nbroker / direct, median of {len(rounds)} round(s): {statistics.median(ratios):.2f}"
    refused = sum(len(r["broker"]["refused"]) for r in rounds)
    if refused:
        text += f"\n{refused} provision(s) moved on after a refusal"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
