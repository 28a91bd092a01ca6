"""`scoperouter broker ...`: serve the OSB API and operate the broker's state.

`scoperouter/cli.py` calls :func:`register`; ``python -m scoperouter.broker`` runs it
standalone. The operator commands read and write the database the config names; only
``serve`` and ``repair`` (drift) reach the clouds, through their routers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from scoperouter.broker.config import BrokerConfig, BrokerConfigError, load_config
from scoperouter.broker.parent import die_with_parent

log = logging.getLogger("scoperouter.broker")

DESCRIPTION = """\
The Open Service Broker (OSB 2.17) of the federation: platforms (Cloud Foundry, Kubernetes,
OpenShift) provision OpenStack resources through it; it places them in the clouds and reaches
every cloud through its router. State lives in a database (SQLite file, or PostgreSQL for
several replicas); secrets in it are encrypted (MultiFernet).
"""

SERVE_HELP = """\
Run the OSB HTTP API and the workers that carry out operations. Loopback by default
(`listen` in the config). Needs the basic-auth password ($SCOPEROUTER_BROKER_PASSWORD or
auth.password_file) and the secrets keys ($SCOPEROUTER_BROKER_SECRET_KEYS or
secrets.keys_file). An out-of-date database schema is upgraded first unless
database.auto_upgrade is false. Any number of `serve` processes may share one PostgreSQL
database: each operation is run by one worker at a time (leases).
"""

REPAIR_HELP = """\
Reconcile the database with the clouds. Without options: list what every service finds in
the clouds tagged as this broker's (projects, servers, images, application credentials) and
report drift both ways: resources no live instance/binding owns (orphans), and live
instances/bindings whose resources are missing. Each service reads each cloud on its own: a
cloud that cannot be read is reported as `unchecked` (nothing is claimed missing there, and
repair never acts on it). Exit 1 when there is drift (or a service failed); else 3 when some
cloud could not be checked; 0 when every cloud was read and matches.
With --redrive ID (an operation, or an instance's latest operation): make a stuck operation
due now with a fresh lease and deadline, or restart a failed one.
"""


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Config errors as one line on stderr and exit 2, not a traceback."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except BrokerConfigError as exc:
            print(f"scoperouter broker: {exc}", file=sys.stderr)
            return 2

    return guarded


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="broker config (YAML)")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add `broker` and its subcommands to a parent parser's subcommands."""
    broker = subparsers.add_parser(
        "broker",
        help="the Open Service Broker of the federation (serve, operate)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = broker.add_subparsers(dest="broker_command", metavar="COMMAND")
    sub.required = True

    serve = sub.add_parser(
        "serve",
        help="run the OSB API and its workers",
        description=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_arg(serve)
    serve.add_argument("--listen", metavar="HOST:PORT", help="override the config's listen")
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker threads per process (override; 0: API only)",
    )
    serve.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="processes sharing the listening socket (override of `processes`; each has its own "
        "workers: leases keep them from running one operation twice)",
    )
    serve.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="override"
    )
    serve.set_defaults(func=_guard(cmd_serve))

    lst = sub.add_parser(
        "list",
        help="every instance with its state and latest operation",
        description="List the instances in the database (gone ones with --all), with their "
        "service, plan, cloud, state and latest operation. Secrets are never shown.",
    )
    _config_arg(lst)
    lst.add_argument("--all", action="store_true", help="include deprovisioned instances")
    lst.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    lst.set_defaults(func=_guard(cmd_list))

    show = sub.add_parser(
        "show",
        help="one instance: bindings, operations, leases",
        description="Show one instance (or the instance of a binding or operation id): its "
        "parameters, context, cloud and OpenStack ids, its bindings (without credentials) and "
        "every operation with its state, attempts, lease, deadline and originating identity.",
    )
    _config_arg(show)
    show.add_argument("id", metavar="ID", help="instance, binding or operation id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_guard(cmd_show))

    repair = sub.add_parser(
        "repair",
        help="report drift between the database and the clouds; re-drive an operation",
        description=REPAIR_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_arg(repair)
    repair.add_argument("--redrive", metavar="ID", help="operation or instance id")
    repair.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="with --redrive: the new deadline from now (default: the service's for the kind)",
    )
    repair.add_argument("--json", action="store_true", help="the drift report as JSON")
    repair.set_defaults(func=_guard(cmd_repair))

    purge = sub.add_parser(
        "purge",
        help="forget deprovisioned instances (database only)",
        description="Delete the records of instances deprovisioned more than --older-than "
        "days ago (their operations and bindings too), or of one instance (--instance; "
        "--force for one that is not gone: its cloud resources are NOT removed, deprovision "
        "it first). A purged id can be provisioned again.",
    )
    _config_arg(purge)
    purge.add_argument("--older-than", type=float, default=7.0, metavar="DAYS")
    purge.add_argument("--instance", metavar="ID")
    purge.add_argument("--force", action="store_true")
    purge.set_defaults(func=_guard(cmd_purge))

    db = sub.add_parser("db", help="database schema (Alembic migrations)")
    db_sub = db.add_subparsers(dest="db_command", metavar="COMMAND")
    db_sub.required = True
    upgrade = db_sub.add_parser(
        "upgrade",
        help="create or upgrade the schema",
        description="Create or upgrade the database schema to this release's (Alembic "
        "head). Safe to run any number of times, and from several replicas at once "
        "(PostgreSQL: serialised by an advisory lock).",
    )
    _config_arg(upgrade)
    upgrade.set_defaults(func=_guard(cmd_db_upgrade))

    rotate = sub.add_parser(
        "rotate-key",
        help="re-encrypt every stored secret with the newest key",
        description="Re-encrypt every stored secret with the first (newest) of the configured "
        "keys. Rotation: put a new key first ($SCOPEROUTER_BROKER_SECRET_KEYS=new,old or the "
        "keys file), restart the replicas, run rotate-key, then remove the old key. "
        "--generate prints a new key and touches nothing.",
    )
    rotate.add_argument("--config", metavar="FILE", help="broker config (YAML)")
    rotate.add_argument("--generate", action="store_true", help="print a new key and exit")
    rotate.set_defaults(func=_guard(cmd_rotate_key))
    parser: argparse.ArgumentParser = broker
    return parser


def _load(args: argparse.Namespace) -> BrokerConfig:
    return load_config(args.config)


def _store(config: BrokerConfig) -> Any:
    from scoperouter.broker import migrate
    from scoperouter.broker.store import Store

    url = config.database_url()
    if not migrate.is_current(url):
        raise BrokerConfigError(
            "the database schema is not current: run `scoperouter broker db upgrade --config "
            "FILE` first"
        )
    return Store(url)


# ----------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    from scoperouter.broker import logs, migrate

    config = _load(args)
    logs.setup_logging(args.log_level or config.log_level)
    password = config.password()
    config.secret_keys()
    url = config.database_url()
    if not migrate.is_current(url):
        if not config.database.auto_upgrade:
            raise BrokerConfigError(
                "the database schema is not current and database.auto_upgrade is false: "
                "run `scoperouter broker db upgrade`"
            )
        before, after = migrate.upgrade(url)
        log.info("database schema upgraded from %s to %s", before or "(empty)", after)
    host, port = config.listen_address
    if args.listen:
        host, _, port_text = args.listen.rpartition(":")
        port = int(port_text)
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        log.warning("listening on %s: not loopback; put TLS in front of the broker", host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    processes = args.processes if args.processes is not None else config.processes
    workers = config.worker.threads if args.workers is None else args.workers
    if processes <= 1:
        return _serve_process(config, password, sock, workers, host, port)
    # One listening socket, several processes accepting on it (the GIL makes one process use
    # one core); each builds its own engines and threads after the fork.
    children: list[int] = []
    parent = os.getpid()
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child exits here
            code = 1
            try:
                # a parent that dies (even SIGKILLed) takes its children along: none keeps
                # answering on the port that a restarted broker must bind again
                die_with_parent(signal.SIGTERM, parent)
                code = _serve_process(config, password, sock, workers, host, port)
            finally:
                os._exit(code)
        children.append(pid)
    sock.close()

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while children:
        pid, _status = os.wait()
        if pid in children:
            children.remove(pid)
    return 0


def _serve_process(
    config: BrokerConfig, password: str, sock: socket.socket, workers: int, host: str, port: int
) -> int:
    import uvicorn

    from scoperouter.broker.api import create_app
    from scoperouter.broker.runtime import Broker
    from scoperouter.broker.worker import Worker

    broker = Broker(config)
    worker = Worker(broker)
    worker.start(workers)
    app = create_app(broker, worker=worker, password=password)
    log.info(
        "broker serving http://%s:%d (services: %s; database %s; %d worker thread(s); pid %d)",
        host,
        port,
        ", ".join(broker.services) or "none",
        broker.store.engine.url.render_as_string(hide_password=True),
        workers,
        os.getpid(),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
            # nothing here reads the client address, and no "server: uvicorn" on answers:
            # both cost per request on the polling routes
            proxy_headers=False,
            server_header=False,
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        broker.close()
    return 0


# ---------------------------------------------------------------------- list / show


def cmd_list(args: argparse.Namespace) -> int:
    from scoperouter.broker.store import GONE

    store = _store(_load(args))
    rows = []
    with store.read() as session:
        for instance in store.instances(session):
            if instance.state == GONE and not args.all:
                continue
            op = store.last_operation(session, instance.id)
            rows.append(
                {
                    "id": instance.id,
                    "service": instance.service_name,
                    "plan_id": instance.plan_id,
                    "cloud": instance.cloud,
                    "state": instance.state,
                    "operation": op.id if op else None,
                    "operation_state": op.state if op else None,
                    "description": op.description if op else None,
                    "bindings": len(
                        [b for b in store.bindings_of(session, instance.id) if b.state != GONE]
                    ),
                }
            )
    store.dispose()
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print("no instances")
        return 0
    header = ("INSTANCE", "SERVICE", "CLOUD", "STATE", "BINDINGS", "LAST OPERATION")
    table = [
        (
            r["id"],
            r["service"],
            r["cloud"] or "-",
            r["state"],
            str(r["bindings"]),
            f"{r['operation_state']}: {r['description']}"[:70],
        )
        for r in rows
    ]
    _print_table(header, table)
    return 0


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())


def _when(value: Any) -> str | None:
    return value.isoformat(timespec="seconds") + "Z" if value is not None else None


def describe_instance(store: Any, ident: str) -> dict[str, Any] | None:
    """Everything the database knows about an instance (found by instance, binding or
    operation id); never the credentials."""
    with store.read() as session:
        instance = store.instance(session, ident)
        if instance is None:
            binding = store.binding(session, ident)
            op = store.operation(session, ident)
            owner = binding.instance_id if binding else op.instance_id if op else None
            instance = store.instance(session, owner) if owner else None
        if instance is None:
            return None
        return {
            "id": instance.id,
            "service": instance.service_name,
            "service_id": instance.service_id,
            "plan_id": instance.plan_id,
            "state": instance.state,
            "cloud": instance.cloud,
            "resources": instance.resources,
            "parameters": instance.parameters,
            "context": instance.context,
            "maintenance_version": instance.maintenance_version,
            "active_operation": instance.active_operation_id,
            "created_at": _when(instance.created_at),
            "updated_at": _when(instance.updated_at),
            "bindings": [
                {
                    "id": b.id,
                    "state": b.state,
                    "resources": b.resources,
                    "parameters": b.parameters,
                    "predecessor_binding_id": b.predecessor_binding_id,
                    "expires_at": _when(b.expires_at),
                    "renew_before": _when(b.renew_before),
                    "has_credentials": b.credentials is not None,
                }
                for b in store.bindings_of(session, instance.id)
            ],
            "operations": [
                {
                    "id": o.id,
                    "kind": o.kind,
                    "binding_id": o.binding_id,
                    "state": o.state,
                    "description": o.description,
                    "attempts": o.attempts,
                    "cancel_requested": o.cancel_requested,
                    "lease_owner": o.lease_owner,
                    "lease_expires_at": _when(o.lease_expires_at),
                    "not_before": _when(o.not_before),
                    "deadline_at": _when(o.deadline_at),
                    "progress": o.progress,
                    "originating_identity": o.originating_identity,
                    "request_identity": o.request_identity,
                    "created_at": _when(o.created_at),
                    "finished_at": _when(o.finished_at),
                }
                for o in store.operations(session, instance.id)
            ],
        }


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(_load(args))
    data = describe_instance(store, args.id)
    store.dispose()
    if data is None:
        print(f"scoperouter broker: no instance, binding or operation {args.id!r}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    print(f"instance {data['id']}  ({data['service']}, plan {data['plan_id']})")
    for key in ("state", "cloud", "resources", "parameters", "context", "active_operation"):
        value = data[key] if isinstance(data[key], str) else json.dumps(data[key])
        print(f"  {key + ':':18} {value}")
    print(f"  {'created/updated:':18} {data['created_at']} / {data['updated_at']}")
    for b in data["bindings"]:
        print(
            f"  binding {b['id']}: {b['state']} resources={json.dumps(b['resources'])}"
            + (f" expires {b['expires_at']}" if b["expires_at"] else "")
        )
    for o in data["operations"]:
        lease = (
            f" lease {o['lease_owner']} until {o['lease_expires_at']}" if o["lease_owner"] else ""
        )
        who = o["originating_identity"]
        by = f" by {who['platform']} {json.dumps(who['value'])}" if who else ""
        print(
            f"  {o['kind']:11} {o['id']}: {o['state']} ({o['attempts']} pass(es), deadline "
            f"{o['deadline_at']}){lease}{by}\n      {o['description']}"
        )
    return 0


# --------------------------------------------------------------------------- repair


def cmd_repair(args: argparse.Namespace) -> int:
    config = _load(args)
    if args.redrive:
        store = _store(config)
        try:
            return _redrive(store, config, args.redrive, args.deadline)
        finally:
            store.dispose()
    from scoperouter.broker.runtime import Broker

    _store(config).dispose()
    broker = Broker(config)
    try:
        report = drift(broker)
    finally:
        broker.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for line in report["lines"]:
            print(line)
    if report["orphans"] or report["missing"] or report["errors"]:
        return 1
    return 3 if report["unchecked"] else 0


def _redrive(store: Any, config: BrokerConfig, ident: str, deadline: float | None) -> int:
    from scoperouter.broker.config import DEFAULT_DEADLINES

    with store.read() as session:
        op = store.operation(session, ident)
        if op is None:
            instance = store.instance(session, ident)
            op = store.last_operation(session, ident) if instance else None
    if op is None:
        print(f"scoperouter broker: no operation or instance {ident!r}", file=sys.stderr)
        return 1
    service = config.services.get(_service_name(store, op.instance_id) or "")
    seconds = deadline or (service.deadline(op.kind) if service else DEFAULT_DEADLINES[op.kind])
    result = store.redrive(op.id, timedelta(seconds=seconds))
    print(f"{op.kind} {op.id}: {result}")
    return 0


def _service_name(store: Any, instance_id: str) -> str | None:
    with store.read() as session:
        instance = store.instance(session, instance_id)
        return str(instance.service_name) if instance else None


def drift(broker: Any) -> dict[str, Any]:
    """Compare what the services find in the clouds with the database (both ways)."""
    from scoperouter.broker.store import GONE

    store = broker.store
    with store.read() as session:
        instances = {i.id: i for i in store.instances(session)}
        bindings = {b.id: b for i in instances for b in store.bindings_of(session, i)}
    lines: list[str] = []
    orphans: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    errors: list[str] = []
    unchecked: list[dict[str, str]] = []
    seen_instances: set[str] = set()
    seen_bindings: set[str] = set()
    checked: set[tuple[str, str]] = set()  # (service, cloud) read in full
    seen_resources: set[tuple[str, str, str]] = set()  # (cloud, kind, id) the services found
    for name, service in broker.services.items():
        try:
            clouds = service.inventory_clouds()
        except Exception as exc:
            errors.append(f"{name}: inventory failed: {exc}")
            continue
        found = []
        for cloud in clouds:
            try:
                found.extend(service.inventory(cloud))
            except Exception as exc:  # never "no drift" for what could not be read
                reason = f"{type(exc).__name__}: {exc}"
                unchecked.append({"service": name, "cloud": cloud, "error": reason})
                continue
            checked.add((name, cloud))
        for item in found:
            seen_resources.add((item.cloud, item.kind, item.id))
            record = {
                "service": name,
                "cloud": item.cloud,
                "kind": item.kind,
                "id": item.id,
                "name": item.name,
                "instance_id": item.instance_id,
                "binding_id": item.binding_id,
            }
            if item.binding_id is not None:
                binding = bindings.get(item.binding_id)
                seen_bindings.add(item.binding_id)
                if binding is None or binding.state == GONE:
                    orphans.append(record)
            elif item.instance_id is not None:
                instance = instances.get(item.instance_id)
                seen_instances.add(item.instance_id)
                if instance is None or instance.state == GONE:
                    orphans.append(record)
    inventoried = {i.service_name for i in instances.values()} & set(broker.services)
    compared = {"instances": 0, "bindings": 0, "resources": len(seen_resources)}
    for instance in instances.values():
        if instance.service_name not in inventoried or instance.state != "provisioned":
            continue
        if (instance.service_name, instance.cloud) not in checked:
            continue  # its cloud could not be read: unknown, not missing
        compared["instances"] += 1
        if instance.id not in seen_instances:
            missing.append({"instance_id": instance.id, "cloud": instance.cloud})
        for binding in bindings.values():
            live = binding.instance_id == instance.id and binding.state == "bound"
            if live:
                compared["bindings"] += 1
            if live and binding.id not in seen_bindings:
                missing.append({"binding_id": binding.id, "cloud": instance.cloud})
    for o in orphans:
        owner = f"binding {o['binding_id']}" if o["binding_id"] else f"instance {o['instance_id']}"
        lines.append(
            f"orphan: {o['cloud']} {o['kind']} {o['id']} ({o['name'] or '-'}) of {owner}, "
            "which the broker does not hold (or deprovisioned)"
        )
    for m in missing:
        what = f"binding {m['binding_id']}" if "binding_id" in m else f"instance {m['instance_id']}"
        lines.append(
            f"missing: {what} is live in the database but nothing of it is in {m['cloud']}"
        )
    lines.extend(f"error: {e}" for e in errors)
    lines.extend(
        f"unchecked: {u['service']} in {u['cloud']}: could not be read ({u['error']}); "
        "drift there is unknown"
        for u in unchecked
    )
    clouds = sorted({cloud for _, cloud in checked})
    if not lines:
        # what was compared: live records whose cloud was read, and what the clouds hold
        # (never the deprovisioned rows the database keeps until `purge`)
        lines.append(
            f"no drift: {compared['instances']} live instance(s) and {compared['bindings']} "
            f"binding(s) match the {compared['resources']} tagged resource(s) found in "
            f"{len(clouds)} cloud(s) ({', '.join(clouds) or 'none'})"
        )
    elif not (orphans or missing or errors):
        lines.append("no drift in the clouds that could be read")
    return {
        "orphans": orphans,
        "missing": missing,
        "errors": errors,
        "unchecked": unchecked,
        "checked": {**compared, "clouds": clouds},
        "lines": lines,
    }


# ------------------------------------------------------------------------------ purge


def cmd_purge(args: argparse.Namespace) -> int:
    from scoperouter.broker.store import FAILED, GONE, utcnow

    store = _store(_load(args))
    try:
        if args.instance:
            with store.read() as session:
                instance = store.instance(session, args.instance)
            if instance is None:
                print(f"no instance {args.instance!r}")
                return 1
            if instance.state not in (GONE, FAILED) and not args.force:
                print(
                    f"instance {args.instance} is {instance.state}: deprovision it first, or "
                    "--force to forget it (its cloud resources stay)",
                    file=sys.stderr,
                )
                return 1
            store.forget_instance(args.instance)
            print(f"forgot instance {args.instance}")
            return 0
        ids = store.gone_before(utcnow() - timedelta(days=args.older_than))
        for ident in ids:
            store.forget_instance(ident)
        print(
            f"forgot {len(ids)} instance(s) deprovisioned more than {args.older_than:g} day(s) ago"
        )
        return 0
    finally:
        store.dispose()


# -------------------------------------------------------------------- db / rotate-key


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from scoperouter.broker import migrate

    config = _load(args)
    before, after = migrate.upgrade(config.database_url())
    if before == after:
        print(f"database schema already current ({after})")
    else:
        print(f"database schema upgraded: {before or '(empty)'} -> {after}")
    return 0


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from scoperouter.broker.secrets import Secrets, generate_key

    if args.generate:
        print(generate_key())
        return 0
    if not args.config:
        raise BrokerConfigError("--config is required (or --generate)")
    config = _load(args)
    secrets = Secrets(config.secret_keys())
    store = _store(config)
    try:
        count = store.rotate_secrets(secrets.rotate)
    finally:
        store.dispose()
    print(f"re-encrypted {count} secret(s) with the newest key")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scoperouter")
    sub = parser.add_subparsers()
    register(sub)
    args = parser.parse_args(["broker", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
