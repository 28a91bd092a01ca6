"""`scoperouter lab up|status|down`: orchestration of the whole lab."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from scoperouter_lab import api, files, pki
from scoperouter_lab.api import ApiError, Keystone, http_status, port_open, wait_for
from scoperouter_lab.cloud import CloudRunner, Step
from scoperouter_lab.infra import (
    LabError,
    Postgres,
    Rabbit,
    ensure_packages,
    ensure_venv,
    tail,
)
from scoperouter_lab.layout import (
    DATABASES,
    DEFAULT_SERVICES,
    MAX_CLOUDS,
    METRICS_PORT,
    PEER_PORT,
    PROCESSES,
    PROXY_PORT,
    SELECTABLE,
    SERVICE_PORTS,
    STAND_INS,
    CloudSpec,
    LabPaths,
    needs_messaging,
    service_types,
)
from scoperouter_lab.nextsteps import Commands, next_steps
from scoperouter_lab.procs import ProcessTable, fingerprint
from scoperouter_lab.templates import CloudContext, Secrets

ROUTER_CODE = "import sys; from scoperouter.cli import main; sys.exit(main())"
SHARED_PROCESSES = ("postgres", "epmd", "rabbitmq")
# stop order inside one cloud: front to back
STOP_ORDER = ("router", "heat-engine", "heat-api", "nova-compute", "nova-scheduler",
              "nova-conductor", "nova-api", "cinder-volume", "cinder-scheduler", "cinder-api",
              "swift-proxy", "swift-object", "swift-container", "swift-account", "glance",
              "placement", "network", "block-storage", "keystone")  # fmt: skip


class Progress:
    """One line per step: total elapsed time, label, result, step duration."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def line(self, label: str, result: str, duration: float | None = None) -> None:
        took = f" ({duration:.1f}s)" if duration is not None else ""
        with self.lock:
            self.out.write(f"[{self.elapsed():6.1f}s] {label:<48} {result}{took}\n")
            self.out.flush()

    def run(self, label: str, fn: Callable[[], Any]) -> Any:
        t = time.monotonic()
        result = fn()
        self.line(label, str(result) if result is not None else "ok", time.monotonic() - t)
        return result


def _interpreter() -> str:
    """This Python under one name whichever alias started it (a venv's `python` and `python3`
    are the same interpreter): the router's argv is part of its fingerprint, and `scoperouter
    lab up` (the console script's `python3`) followed by the e2e fixture's `python -m
    scoperouter_lab up` must not restart routers that are already right."""
    exe = Path(sys.executable)
    for name in ("python3", "python"):
        alias = exe.with_name(name)
        if alias.exists() and alias.resolve() == exe.resolve():
            return str(alias)
    return str(exe)


def router_argv(config: Path, cloud: CloudSpec) -> list[str]:
    return [_interpreter(), "-O", "-c", ROUTER_CODE, "serve", "--config", str(config),
            "--cloud", cloud.name]  # fmt: skip


def router_available() -> tuple[bool, str]:
    """Whether `scoperouter serve` exists in this installation."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", ROUTER_CODE, "serve", "--help"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if proc.returncode == 0:
        return True, ""
    err = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
    return False, err[-1] if err else f"exit {proc.returncode}"


class Lab:
    def __init__(
        self,
        root: Path,
        n_clouds: int | None = None,
        services: tuple[str, ...] | None = None,
        router: str = "auto",
        out: TextIO | None = None,
        tls: bool | None = None,
    ) -> None:
        self.paths = LabPaths(root)
        self.procs = ProcessTable(self.paths.run)
        self.progress = Progress(out)
        self.state = self._load_state()
        self.n_clouds = n_clouds or self.state.get("clouds") or 2
        if not 1 <= self.n_clouds <= MAX_CLOUDS:
            raise LabError(f"--clouds must be between 1 and {MAX_CLOUDS}")
        # A state written by another version of the lab may name services this one does not
        # run: they are left out (their processes, if any, are stopped as unwanted).
        self.services = (
            services
            or tuple(s for s in self.state.get("services") or DEFAULT_SERVICES if s in SELECTABLE)
            or DEFAULT_SERVICES
        )
        self.router_mode = router
        # `lab up --data-path` is retired with settings.data_path (the router has one data
        # path): a state an older lab wrote may still remember it; it is dropped, not applied
        self.state.pop("data_path", None)
        self.routed = bool(self.state.get("routed", False))
        # every endpoint in https (`lab up --tls`; None: what the lab had, else plain)
        self.tls = bool(self.state.get("tls", False)) if tls is None else tls
        self.clouds = [CloudSpec(i, tls=self.tls) for i in range(1, self.n_clouds + 1)]
        if self.tls:
            api.trust(self.paths.ca_cert)  # the lab's own calls verify its services and routers

    # ------------------------------------------------------------------ state

    def _load_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.paths.state_file.read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        tmp = self.paths.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.chmod(0o600)
        tmp.replace(self.paths.state_file)

    def secrets(self, cloud: CloudSpec | None = None) -> Secrets:
        """The secrets of `cloud` (without: of the first cloud; db and rabbit are shared).
        Each cloud has its own admin, demo, service and router passwords."""
        cloud = cloud or self.clouds[0]
        shared = self.state.setdefault("secrets", {})
        for key in ("db", "rabbit"):
            shared.setdefault(key, secrets.token_urlsafe(12))
        own = self.state.setdefault("cloud_secrets", {}).setdefault(cloud.slug, {})
        keys = [f.name for f in dataclasses.fields(Secrets) if f.name not in shared]
        for key in keys:
            own.setdefault(key, secrets.token_urlsafe(12))
        # only the keys this version knows (a state written by another version may hold more:
        # they stay in the state for it)
        return Secrets(db=shared["db"], rabbit=shared["rabbit"], **{k: own[k] for k in keys})

    def secrets_by_cloud(self) -> dict[CloudSpec, Secrets]:
        return {c: self.secrets(c) for c in self.clouds}

    def runner(self, cloud: CloudSpec, step: Step) -> CloudRunner:
        ctx = CloudContext(cloud, self.paths, self.secrets(cloud), self.routed)
        return CloudRunner(ctx, self.services, self.procs, step, proxy_env=self.routed)

    # ------------------------------------------------------------------ up

    def up(self) -> int:
        p = self.progress
        need_rabbit = needs_messaging(self.services)
        p.line(
            "scoperouter lab up",
            f"{self.n_clouds} clouds, {','.join(self.services)}"
            + (", TLS" if self.tls else "")
            + f", dir {self.paths.root}",
        )
        try:
            self.paths.root.mkdir(parents=True, exist_ok=True)
            self.paths.logs.mkdir(parents=True, exist_ok=True)
            sec = self.secrets()
            self.state.update(clouds=self.n_clouds, services=list(self.services), tls=self.tls)
            self._save_state()
            p.run("Debian packages (postgresql"
                  + (", rabbitmq-server)" if need_rabbit else ")"),
                  lambda: ensure_packages(self.paths, need_rabbit))  # fmt: skip
            p.run("OpenStack venv (pinned, <dir>/venv)", lambda: ensure_venv(self.paths))
            if self.tls:
                p.run("TLS: the lab's CA, each cloud's certificates (<dir>/pki)",
                      lambda: pki.tls_files(self.paths, self.clouds))  # fmt: skip
            self._decide_router()
            self._stop_unwanted()
            pg = Postgres(self.paths, self.procs)
            self.state["postgres_base"] = str(pg.base)
            self._save_state()
            p.run("PostgreSQL on 127.0.0.1:5432", lambda: pg.ensure(sec.db))
            names = [
                c.db_name(db) for c in self.clouds for s in self.services for db in DATABASES[s]
            ]
            p.run(
                "databases",
                lambda: (lambda made: f"{len(made)} created, {len(names) - len(made)} present")(
                    pg.ensure_databases(sec.db, names)
                ),
            )
            if need_rabbit:
                rabbit = Rabbit(self.paths, self.procs)
                p.run("RabbitMQ on 127.0.0.1:5672 (vhost per cloud)",
                      lambda: rabbit.ensure(self.clouds, sec.rabbit))  # fmt: skip
            step = Step(report=lambda label, result, d: p.line(label, result, d))
            runners = [self.runner(c, step) for c in self.clouds]
            for r in runners:
                r.write_configs()
            self._phase_keystone(runners)
            p.run("federation.yaml + clouds.yaml from live catalogs",
                  lambda: self._write_files(runners))  # fmt: skip
            if self.routed:
                self._phase_routers()
            self._phase_services(runners)
            p.run("check: token issue through every cloud's catalog URL", self._final_check)
        except (LabError, TimeoutError, ApiError, RuntimeError, OSError) as exc:
            p.line("FAILED", "")
            sys.stdout.flush()
            print(f"\nlab up failed: {exc}", file=sys.stderr)
            print(f"logs: {self.paths.logs}  (stop with: scoperouter lab down)", file=sys.stderr)
            return 1
        p.line("lab is up", f"in {p.elapsed():.1f}s")
        self._print_next_steps()
        return 0

    def _decide_router(self) -> None:
        p = self.progress
        if self.router_mode == "no":
            self.routed = False
            p.line("router", "not used (--no-router): catalogs point at the services")
        else:
            ok, why = router_available()
            if ok:
                self.routed = True
                p.line("router", "`scoperouter serve` available: catalogs point at the routers")
            elif self.router_mode == "yes":
                raise LabError(f"`scoperouter serve` is not usable: {why}")
            else:
                self.routed = False
                p.line("router", f"NOT AVAILABLE ({why}); catalogs point at the services")
        self.state["routed"] = self.routed
        self._save_state()

    def _desired(self) -> set[str]:
        want = {"postgres"}
        if needs_messaging(self.services):
            want |= {"epmd", "rabbitmq"}
        for c in self.clouds:
            r = self.runner(c, Step(lambda *a: None))
            want |= {r.pname(n) for n in r.process_names()}
            if self.routed:
                want.add(r.pname("router"))
        return want

    def _stop_unwanted(self) -> None:
        want = self._desired()
        extra = [rec.name for rec in self.procs.all() if rec.name not in want]
        if extra:

            def stop() -> str:
                self._stop_many(extra)
                return ", ".join(extra)

            self.progress.run("stopping processes no longer wanted", stop)

    def _parallel(self, tasks: Iterable[Callable[[], Any]], workers: int = 4) -> list[Any]:
        tasks = list(tasks)
        errors: list[BaseException] = []
        results: list[Any] = []
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks)))) as pool:
            futures = [pool.submit(t) for t in tasks]
            for f in futures:
                try:
                    results.append(f.result())
                except BaseException as exc:  # report every failure, raise the first
                    errors.append(exc)
        if errors:
            if len(errors) > 1:
                msgs = "\n".join(f"  - {e}" for e in errors[1:])
                text = f"{errors[0]}\nand also:\n{msgs}"
                try:
                    combined = type(errors[0])(text)
                except TypeError:  # an exception class with other arguments (ApiError)
                    combined = RuntimeError(text)
                raise combined from errors[0]
            raise errors[0]
        return results

    def _phase_keystone(self, runners: list[CloudRunner]) -> None:
        """Databases of every service, then keystone up and seeded, all clouds in parallel."""

        def keystone_chain(r: CloudRunner) -> Callable[[], None]:
            def go() -> None:
                r.keystone_setup()
                r.step.timed(r.label("keystone (uWSGI)"), r.start_keystone)
                r.step.timed(r.label("keystone users, projects, endpoints"), r.seed_keystone)

            return go

        tasks: list[Callable[[], Any]] = [keystone_chain(r) for r in runners]
        for r in runners:
            setups = {"nova": r.nova_setup, "cinder": r.cinder_setup, "heat": r.heat_setup,
                      "glance": r.glance_setup, "placement": r.placement_setup,
                      "swift": r.swift_setup}  # fmt: skip
            tasks += [setup for service, setup in setups.items() if service in r.services]
        self._parallel(tasks, workers=4)

    def _write_files(self, runners: list[CloudRunner]) -> str:
        rows = {r.cloud: r.endpoint_rows() for r in runners}
        sec = self.secrets_by_cloud()
        # Every hop from one router to another over TLS, verified with the lab's own CA.
        fed = files.federation_config(rows, paths=self.paths)
        fed = pki.peer_links(fed, self.paths.pki)
        header = (
            "# Generated by `scoperouter lab up` from the live keystone catalogs of the lab;\n"
            "# rewritten on every `lab up`.\n"
        )
        self._write(self.paths.federation_yaml, files.dump(fed, header))
        self._check_federation()
        cacert = self.paths.ca_cert if self.tls else None
        clouds = files.clouds_config(self.clouds, sec, self.routed, cacert)
        self._write(self.paths.clouds_yaml, files.dump(clouds, header), mode=0o600)
        for cloud in self.clouds:
            others = [c for c in self.clouds if c != cloud]
            router_clouds, router_secure = files.router_clouds_config(
                others, sec, self.routed, cacert
            )
            config, secure = self._router_files(cloud)
            config.parent.mkdir(parents=True, exist_ok=True)
            self._write(config, files.dump(router_clouds, header), mode=0o600)
            self._write(secure, files.dump(router_secure, header), mode=0o600)
        n = sum(len(v) for v in rows.values())
        return f"{n} endpoints"

    def _check_federation(self) -> None:
        """The router's own loader must accept what the lab generated (the contract)."""
        try:
            from scoperouter.config import load_catalog
            from scoperouter.errors import ConfigError
        except ImportError:  # a trimmed install without the router core
            return
        try:
            load_catalog(self.paths.federation_yaml)
        except ConfigError as exc:
            path = self.paths.federation_yaml
            raise LabError(f"the generated {path} is invalid: {exc}") from None

    @staticmethod
    def _write(path: Path, text: str, mode: int = 0o644) -> None:
        if path.exists() and path.read_text() == text:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.replace(path)

    def _phase_routers(self) -> None:
        def start(cloud: CloudSpec) -> Callable[[], None]:
            def go() -> None:
                t = time.monotonic()
                result = self._ensure_router(cloud)
                self.progress.line(f"{cloud.name}: router (scoperouter serve)", result,
                                   time.monotonic() - t)  # fmt: skip

            return go

        self._parallel([start(c) for c in self.clouds], workers=len(self.clouds))

    def router_listens(self, cloud: CloudSpec) -> list[tuple[str, int]]:
        types = service_types(self.services)
        return [(cloud.front_ip, SERVICE_PORTS[t][0]) for t in types] + [
            (cloud.front_ip, PROXY_PORT),
            (cloud.front_ip, PEER_PORT),
            (cloud.front_ip, METRICS_PORT),
        ]

    def _router_files(self, cloud: CloudSpec) -> tuple[Path, Path]:
        """The router's own clouds.yaml and secure.yaml (its credentials in the other clouds)."""
        where = self.paths.cloud_etc(cloud, "router")
        return where / "clouds.yaml", where / "secure.yaml"

    def _ensure_router(self, cloud: CloudSpec) -> str:
        name = f"{cloud.slug}-router"
        argv = router_argv(self.paths.federation_yaml, cloud)
        config, secure = self._router_files(cloud)
        fp = fingerprint(argv, self.paths.federation_yaml, config, secure, _router_code())
        listens = self.router_listens(cloud)
        if self.procs.running(name, fp) and all(port_open(h, p) for h, p in listens):
            return "running"
        stopped = self.procs.stop(name)
        busy = [f"{h}:{p}" for h, p in listens if port_open(h, p)]
        if busy:
            raise LabError(
                f"{cloud.name}: {', '.join(busy)} already in use by a process this lab did not "
                "start; stop it and run again"
            )
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        # the router's credentials in the other clouds: entries <cloud>-router of its own
        # clouds.yaml, passwords in the secure.yaml beside it (not the lab user's clouds.yaml,
        # which holds every cloud's admin password)
        env["OS_CLIENT_CONFIG_FILE"] = str(config)
        env["OS_CLIENT_SECURE_FILE"] = str(secure)
        log = self.paths.log(cloud, "router")
        rec = self.procs.start(name, argv, log=log, env=env, fp=fp, cwd=self.paths.root)
        wait_for(
            f"{cloud.name}: router listening on {cloud.front_ip}",
            lambda: all(port_open(h, p) for h, p in listens),
            60,
            on_fail=lambda: (
                None if rec.alive() else f"the router exited; last lines of {log}:\n{tail(log)}"
            ),
        )
        # A router just started may answer its first request slowly on a busy machine (its
        # workers still warming up): ask again for a while before calling it broken.
        identity = cloud.endpoint_url("identity", True)
        try:
            wait_for(
                f"{cloud.name}: keystone through the router",
                lambda: http_status(identity) == 200,
                60,
            )
        except TimeoutError:
            raise LabError(
                f"{cloud.name}: GET {identity} through the router answered "
                f"{http_status(identity)} (expected 200 from keystone); see {log}"
            ) from None
        return "restarted (changed)" if stopped else "started"

    def _phase_services(self, runners: list[CloudRunner]) -> None:
        def chain(r: CloudRunner) -> Callable[[], None]:
            def go() -> None:
                names = [n for n in r.process_names() if n != "keystone"]
                r.step.timed(r.label(f"start {len(names)} processes"), r.start_services)
                r.step.timed(r.label("services healthy"), r.wait_services)
                r.step.timed(r.label("seed data"), r.seed_resources)

            return go

        self._parallel([chain(r) for r in runners], workers=len(runners))

    def _final_check(self) -> str:
        for cloud in self.clouds:
            demo = self.secrets(cloud).demo
            Keystone(cloud.endpoint_url("identity", self.routed), "demo", demo, "demo").login()
        return f"ok ({'through the routers' if self.routed else 'direct'})"

    def _print_next_steps(self) -> None:
        commands = Commands.find(Path(sys.executable).parent, self.paths)
        print(next_steps(self.clouds, self.services, self.paths, self.routed, commands))

    # ------------------------------------------------------------------ status

    def status(self) -> int:
        if not self.paths.state_file.exists():
            print(f"no lab at {self.paths.root} (start one with: scoperouter lab up)")
            return 1
        print(
            f"lab {self.paths.root}: {self.n_clouds} clouds, {','.join(self.services)}, "
            f"{'routed' if self.routed else 'NOT routed (no router)'}"
            + (", TLS (every endpoint https, the lab's CA <dir>/pki/ca.crt)" if self.tls else "")
        )
        recs = {r.name: r for r in self.procs.all()}
        want = sorted(self._desired(), key=self._display_key)
        bad = 0
        total = 0
        # per service (all clouds): processes running, processes wanted, RSS
        by_service: dict[str, list[int]] = {}
        print(f"\n{'PROCESS':<26} {'PID':>7}  {'STATE':<8} {'RSS':>9}  LOG")
        for name in want:
            rec = recs.get(name)
            alive = rec is not None and rec.alive()
            rss = rec.rss() if rec is not None and alive else 0
            tally = by_service.setdefault(self._service_of(name), [0, 0, 0])
            tally[0] += int(alive)
            tally[1] += 1
            tally[2] += rss
            if rec is None:
                print(f"{name:<26} {'-':>7}  {'absent':<8} {'':>9}")
                bad += 1
                continue
            total += rss
            bad += 0 if alive else 1
            print(f"{name:<26} {rec.pid:>7}  {'running' if alive else 'DEAD':<8} "
                  f"{rss / 2**20:>7.0f}MB  {rec.log}")  # fmt: skip
        for name in sorted(set(recs) - set(want)):
            rec = recs[name]
            print(f"{name:<26} {rec.pid:>7}  {'extra' if rec.alive() else 'DEAD':<8}")
        print(f"\n{'ENDPOINT':<28} {'URL':<46} {'CATALOG':>7} {'BACKEND':>7}")
        for cloud in self.clouds:
            r = self.runner(cloud, Step(lambda *a: None))
            for stype in r.service_types():
                url = cloud.endpoint_url(stype, self.routed)
                front = http_status(_root(url))
                back = http_status(cloud.backend_url(stype) + "/")
                ok = front is not None and front < 500 and back is not None and back < 500
                bad += 0 if ok else 1
                print(f"{cloud.name + ' ' + stype:<28} {url:<46} {_s(front):>7} {_s(back):>7}")
        print(f"\n{'SERVICE':<26} {'RUNNING':>9} {'RSS':>9}  (every cloud)")
        for service, (running, wanted, rss) in by_service.items():
            state = f"{running}/{wanted}"
            print(f"{service:<26} {state:>9} {rss / 2**20:>7.0f}MB")
        print(f"\ntotal RSS of the lab's processes: {total / 2**30:.2f} GiB")
        print("healthy" if bad == 0 else f"{bad} problem(s)")
        return 0 if bad == 0 else 1

    def _display_key(self, name: str) -> tuple[int, int, str]:
        """Shared processes first, then cloud by cloud, front (keystone) to back (router)."""
        if name in SHARED_PROCESSES:
            return (0, SHARED_PROCESSES.index(name), name)
        for c in self.clouds:
            if name.startswith(c.slug + "-"):
                rank = len(STOP_ORDER) - _order_key(name)[0]
                return (c.index, rank, name)
        return (99, 0, name)

    def _service_of(self, process: str) -> str:
        """The service a process belongs to (`cloudone-cinder-volume` -> cinder), for the
        status's summary; the routers, the stand-ins and the shared processes by name."""
        if process in SHARED_PROCESSES:
            return "postgres" if process == "postgres" else "rabbitmq"
        what = process.split("-", 1)[1] if "-" in process else process
        if what == "router" or what in STAND_INS:
            return what if what == "router" else f"{what} (stand-in)"
        return next((s for s, names in PROCESSES.items() if what in names), what)

    def memory(self) -> int:
        return sum(r.rss() for r in self.procs.all())

    # ------------------------------------------------------------------ restart

    def restart(self, names: list[str]) -> int:
        """Restart the named processes of a running lab whose definition changed (config
        files, the environment of their drop-ins), as `up` would, and wait until they serve;
        nothing else is touched (no seeding: the catalog stays as it is). The lab's stand-in
        for `systemctl try-restart` after a drop-in changed."""
        step = Step(report=lambda label, result, d: self.progress.line(label, result, d))
        known: dict[str, tuple[CloudRunner, str]] = {}
        for cloud in self.clouds:
            r = self.runner(cloud, step)
            known.update({r.pname(what): (r, what) for what in r.process_names()})
        # systemd unit names are accepted too (cloudone-glance.service): what a playbook's
        # restart command receives
        names = [n.removesuffix(".service") for n in names]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise LabError(
                f"not a process of this lab: {', '.join(unknown)} (its processes: "
                f"{', '.join(sorted(known))})"
            )
        restarted = []
        for name in names:
            runner, what = known[name]
            result = runner.step.timed(name, functools.partial(runner._start, what))
            if result != "running":
                restarted.append((runner, what))
        for runner, what in restarted:
            runner.wait_ready(what)
        return 0

    # ------------------------------------------------------------------ down

    def down(self, purge: bool = False, purge_venv: bool = False) -> int:
        recs = self.procs.all()
        cloud_recs = [r.name for r in recs if r.name not in SHARED_PROCESSES]
        t = time.monotonic()
        # the routers first (no new requests), then every service at once, then the shared ones
        routers = [n for n in cloud_recs if n.endswith("-router")]
        self._stop_many(routers)
        self._stop_many([n for n in cloud_recs if n not in routers])
        for name in ("rabbitmq", "epmd", "postgres"):
            if self.procs.get(name):
                self._stop_many([name])
        self.progress.line("stopped", f"{len(recs)} processes", time.monotonic() - t)
        if purge:
            base = self.state.get("postgres_base")
            if base and Path(base).name.startswith("scoperouter-lab") and Path(base).exists():
                shutil.rmtree(base)
            dropins = self.paths.root / "systemd"  # drop-ins a playbook left (CloudRunner.env)
            paths = self.paths
            for p in (paths.etc, paths.data, paths.run, paths.logs, paths.pki, dropins):
                if p.exists():
                    shutil.rmtree(p)
            for f in (self.paths.clouds_yaml, self.paths.federation_yaml, self.paths.state_file):
                f.unlink(missing_ok=True)
            if purge_venv and self.paths.venv.exists():
                shutil.rmtree(self.paths.venv)
            self.progress.line("purged", str(self.paths.root) + ("" if purge_venv else
                               " (kept the venv)"))  # fmt: skip
        return 0

    def _stop_many(self, names: list[str]) -> None:
        def stop(name: str) -> None:
            sig = 2 if name == "postgres" else 15  # SIGINT: PostgreSQL's fast shutdown
            self.procs.stop(name, timeout=20, sig=sig)

        if not names:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(names))) as pool:
            list(pool.map(stop, names))


def _router_code() -> str:
    """A hash of the installed router's source (the scoperouter package): new code, new
    router."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("scoperouter")
    if spec is None or not spec.origin:
        return ""
    pkg = Path(spec.origin).resolve().parent
    h = hashlib.sha256()
    for path in sorted(pkg.rglob("*.py")):
        h.update(str(path.relative_to(pkg)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _root(url: str) -> str:
    """``http://h:p/v3`` -> ``http://h:p/``."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/"


def _s(status: int | None) -> str:
    return "-" if status is None else str(status)


def _order_key(name: str) -> tuple[int, str]:
    if name in SHARED_PROCESSES:
        return (100 + SHARED_PROCESSES.index(name), name)
    for i, suffix in enumerate(STOP_ORDER):
        if name.endswith("-" + suffix):
            return (i, name)
    return (50, name)
