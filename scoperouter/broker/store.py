"""The broker's durable state: tables and the few queries (the only module that writes SQL).

One code path for SQLite and PostgreSQL (SQLAlchemy 2). What differs is confined to
:func:`~scoperouter.broker.engine.make_engine`:

- SQLite: WAL journal, a busy timeout, and write transactions that start with ``BEGIN
  IMMEDIATE``. Why: in WAL mode a deferred transaction that read first and then writes fails at
  once with SQLITE_BUSY when another connection committed meanwhile (no busy wait); taking the
  write lock up front makes writers queue instead. Reads stay deferred and never block.
- PostgreSQL: ``FOR UPDATE SKIP LOCKED`` when claiming operations, so replicas polling together
  do not queue on one row. SQLite ignores it; there the claim is serialised by the write lock.

The claim itself is the same statement on both: a guarded ``UPDATE ... WHERE id = :id AND
(lease free or expired)`` whose rowcount says whether this worker won. Every later write of a
pass is guarded by ``lease_owner = :me`` too, so a worker that lost its lease cannot overwrite
the new owner's work (:class:`LeaseLost`).

Times are naive UTC datetimes computed by the broker (``utcnow()``); replicas need synchronised
clocks (NTP), as leases are compared across processes.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, aliased, sessionmaker
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.compiler import SQLCompiler

from scoperouter.broker.contract import LeaseLost
from scoperouter.broker.engine import is_sqlite, make_engine
from scoperouter.broker.tables import (
    BINDING,
    DEPROVISIONING,
    GONE,
    IN_PROGRESS,
    PROVISIONING,
    SUCCEEDED,
    UNBINDING,
    UPDATING,
    Base,
    Binding,
    Instance,
    Operation,
    utcnow,
)


class Status(NamedTuple):
    """What last_operation answers from."""

    id: str
    kind: str
    state: str
    description: str
    not_before: datetime


# A result column's conversion of a driver value (SQLAlchemy's processor; None: none needed).
_Processor = Callable[[object], object] | None
# The arguments of a DB-API execute: positional (qmark, format) or named (pyformat).
_DBArgs = Sequence[object] | Mapping[str, object]
_Row = tuple[object, ...]  # what a DB-API cursor fetches (sqlite3 and psycopg: a tuple)


class _Prepared(NamedTuple):
    sql: str
    compiled: SQLCompiler
    positions: list[str]
    processors: Sequence[_Processor]
    defaults: dict[str, object] | None


# ------------------------------------------------------------------------------- engine


def _one_row(connection: PoolProxiedConnection, sql: str, args: _DBArgs) -> _Row | None:
    cursor = connection.cursor()
    cursor.execute(sql, args)
    row = cursor.fetchone()
    cursor.close()
    return row


class Store:
    """Sessions on one database: `read()` for queries, `write()` for changes (committed when
    the block ends without an exception)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = is_sqlite(url)
        self.engine = make_engine(url, immediate=True)
        self._read_engine = make_engine(url) if self.sqlite else self.engine
        # the polling path's one-statement reads (status): no transaction at all on SQLite
        self._poll_engine = make_engine(url, immediate=None) if self.sqlite else self.engine
        self._poll_local = threading.local()
        self._write = sessionmaker(self.engine, expire_on_commit=False)
        self._read = sessionmaker(self._read_engine, expire_on_commit=False)

    def dispose(self) -> None:
        self.engine.dispose()
        if self._read_engine is not self.engine:
            self._read_engine.dispose()
            self._poll_engine.dispose()

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        with self._write() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    def ping(self) -> None:
        """One trivial query on the broker's own table: raises when the database does not
        answer or has no schema (`/healthz`)."""
        with self._read_engine.connect() as conn:
            conn.execute(select(Operation.id).limit(1)).all()

    def create_all(self) -> None:
        """Tables without migrations: for tests only (``broker db upgrade`` in real use)."""
        Base.metadata.create_all(self.engine)

    # --------------------------------------------------------------------------- lookups

    @staticmethod
    def instance(session: Session, instance_id: str) -> Instance | None:
        return session.get(Instance, instance_id)

    @staticmethod
    def binding(session: Session, binding_id: str) -> Binding | None:
        return session.get(Binding, binding_id)

    @staticmethod
    def operation(session: Session, operation_id: str) -> Operation | None:
        return session.scalars(select(Operation).where(Operation.id == operation_id)).first()

    @staticmethod
    def last_operation(
        session: Session, instance_id: str, binding_id: str | None = None
    ) -> Operation | None:
        query = select(Operation).where(Operation.instance_id == instance_id)
        if binding_id is None:
            query = query.where(Operation.kind.in_(("provision", "update", "deprovision")))
        else:
            query = query.where(Operation.binding_id == binding_id)
        return session.scalars(query.order_by(Operation.seq.desc()).limit(1)).first()

    # the polling path (last_operation): one prepared Core query, no ORM session
    @staticmethod
    @functools.cache
    def _status_query(by_operation: bool, of_binding: bool) -> Select[str, str, str, str, datetime]:
        query = select(
            Operation.id,
            Operation.kind,
            Operation.state,
            Operation.description,
            Operation.not_before,
        ).where(Operation.instance_id == bindparam("instance_id"))
        if by_operation:
            query = query.where(Operation.id == bindparam("operation_id"))
        if of_binding:
            query = query.where(Operation.binding_id == bindparam("binding_id"))
        else:  # instance operations are the ones without a binding
            query = query.where(Operation.binding_id.is_(None))
        return query.order_by(Operation.seq.desc()).limit(1)

    def status(
        self, instance_id: str, binding_id: str | None, operation_id: str | None
    ) -> Status | None:
        """The row last_operation answers from: the named operation if it belongs to this
        instance (binding), else the latest one of the instance (binding); None if none.

        Why through the DBAPI cursor: this is the one statement that runs at polling rates,
        and SQLAlchemy's per-execution work costs several times the query itself. The SQL is
        still SQLAlchemy's (the Core query compiled once for the engine's dialect) and so are
        the result conversions (the column types' result processors): one code path for
        SQLite and PostgreSQL."""
        prepared = self._prepared(bool(operation_id), binding_id is not None)
        params: dict[str, str] = {"instance_id": instance_id}
        if operation_id:
            params["operation_id"] = operation_id
        if binding_id is not None:
            params["binding_id"] = binding_id
        if prepared.defaults is not None:  # no bind processors: the constants, then ours
            bound: Mapping[str, object] = {**prepared.defaults, **params}
        else:
            bound = prepared.compiled.construct_params(params)
        args: _DBArgs = (
            [bound[name] for name in prepared.positions] if prepared.positions else bound
        )
        row = self._fetch_one(prepared.sql, args)
        if row is None:
            return None
        values = [
            p(v) if p is not None else v for p, v in zip(prepared.processors, row, strict=True)
        ]
        return Status._make(values)

    def _fetch_one(self, sql: str, args: _DBArgs) -> _Row | None:
        """One row of a polling read. SQLite: on this thread's own connection, kept (it is in
        autocommit: no transaction, no snapshot held between statements). PostgreSQL: a pooled
        connection for the statement, given back at once (an idle one would sit in a
        transaction). The driver's OperationalError (the database down, restarting, locked)
        is raised as SQLAlchemy's, as every other read raises it: the API answers it with a
        503 (this path works on raw DBAPI connections, whose errors SQLAlchemy does not wrap)."""
        dbapi_error = self._poll_engine.dialect.loaded_dbapi.OperationalError
        try:
            return self._fetch_one_raw(sql, args)
        except dbapi_error as exc:
            raise OperationalError(sql, args, exc) from exc

    def _fetch_one_raw(self, sql: str, args: _DBArgs) -> _Row | None:
        if not self.sqlite:
            raw = self._poll_engine.raw_connection()
            try:
                return _one_row(raw, sql, args)
            finally:
                raw.close()
        kept: PoolProxiedConnection | None = getattr(self._poll_local, "connection", None)
        if kept is None:
            kept = self._poll_local.connection = self._poll_engine.raw_connection()
        try:
            return _one_row(kept, sql, args)
        except Exception:
            self._poll_local.connection = None  # a fresh one next time
            kept.invalidate()
            raise

    @functools.cache  # noqa: B019 - one Store per process; the cache lives as long
    def _prepared(self, by_operation: bool, of_binding: bool) -> _Prepared:
        query = self._status_query(by_operation, of_binding)
        dialect = self._poll_engine.dialect
        compiled = query.compile(dialect=dialect)
        if not isinstance(compiled, SQLCompiler):  # a SELECT compiles to SQL, on any dialect
            raise TypeError(f"unexpected compiler {type(compiled).__name__}")
        processors = [
            column.type._cached_result_processor(dialect, None) for column in query.selected_columns
        ]
        positions = list(compiled.positiontup) if compiled.positiontup else []
        # the statement's constants (the LIMIT) once; per call only the ids are filled in,
        # unless a parameter type converts values (then SQLAlchemy does it every time)
        defaults = (
            None
            if compiled._bind_processors
            else {
                name: bind.effective_value
                for name, bind in compiled.binds.items()
                if not bind.required
            }
        )
        return _Prepared(str(compiled), compiled, positions, processors, defaults)

    @staticmethod
    def operations(session: Session, instance_id: str) -> Sequence[Operation]:
        query = select(Operation).where(Operation.instance_id == instance_id)
        return session.scalars(query.order_by(Operation.seq)).all()

    @staticmethod
    def instances(session: Session) -> Sequence[Instance]:
        return session.scalars(select(Instance).order_by(Instance.created_at)).all()

    @staticmethod
    def bindings_of(session: Session, instance_id: str) -> Sequence[Binding]:
        query = select(Binding).where(Binding.instance_id == instance_id)
        return session.scalars(query.order_by(Binding.created_at)).all()

    @staticmethod
    def active_operations(session: Session) -> Sequence[Operation]:
        query = select(Operation).where(Operation.state == IN_PROGRESS)
        return session.scalars(query.order_by(Operation.seq)).all()

    # ------------------------------------------------------------------ request-side writes

    @staticmethod
    def add(session: Session, *rows: Instance | Binding | Operation) -> None:
        """Insert rows now (flush), so a concurrent insert of the same id fails here with
        IntegrityError, inside the caller's transaction."""
        session.add_all(rows)
        session.flush()

    @staticmethod
    def claim_instance(session: Session, instance: Instance, operation_id: str) -> bool:
        """Make `operation_id` the instance's active operation if it has none. Guarded UPDATE:
        False when a concurrent request got there first."""
        result = session.execute(
            update(Instance)
            .where(Instance.id == instance.id, Instance.active_operation_id.is_(None))
            .values(active_operation_id=operation_id, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        session.refresh(instance)
        return bool(result.rowcount)  # type: ignore[attr-defined]

    @staticmethod
    def replace_active(session: Session, instance: Instance, old: str, new: str) -> bool:
        result = session.execute(
            update(Instance)
            .where(Instance.id == instance.id, Instance.active_operation_id == old)
            .values(active_operation_id=new, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        session.refresh(instance)
        return bool(result.rowcount)  # type: ignore[attr-defined]

    @staticmethod
    def request_cancel(session: Session, operation_id: str) -> None:
        session.execute(
            update(Operation)
            .where(Operation.id == operation_id, Operation.state == IN_PROGRESS)
            .values(cancel_requested=True, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )

    # ---------------------------------------------------------------------- worker writes

    def claim(self, owner: str, lease: timedelta, kinds: Sequence[str] | None = None) -> str | None:
        """Take one due operation for `owner`: in progress, due (`not_before`), lease free or
        expired, and the oldest in-progress operation of its instance (so a deprovision waits
        until the provision it cancelled has stopped). Returns its id, or None."""
        now = utcnow()
        cand = aliased(Operation, name="candidate")
        older = (
            select(Operation.seq)
            .where(
                Operation.instance_id == cand.instance_id,
                Operation.state == IN_PROGRESS,
                Operation.seq < cand.seq,
            )
            .exists()
        )
        free = or_(cand.lease_expires_at.is_(None), cand.lease_expires_at < now)
        query = (
            select(cand.seq, cand.id)
            .where(cand.state == IN_PROGRESS, cand.not_before <= now, free, ~older)
            .order_by(cand.not_before, cand.seq)
            .limit(5)
            .with_for_update(skip_locked=True, of=cand)
        )
        if kinds:
            query = query.where(cand.kind.in_(list(kinds)))
        with self.write() as session:
            for seq, op_id in session.execute(query).all():
                won = session.execute(
                    update(Operation)
                    .where(
                        Operation.seq == seq,
                        Operation.state == IN_PROGRESS,
                        or_(Operation.lease_expires_at.is_(None), Operation.lease_expires_at < now),
                    )
                    .values(
                        lease_owner=owner,
                        lease_expires_at=now + lease,
                        attempts=Operation.attempts + 1,
                        updated_at=now,
                    )
                    .execution_options(synchronize_session=False)
                )
                if won.rowcount:  # type: ignore[attr-defined]
                    return str(op_id)
        return None

    def take(self, operation_id: str, owner: str, lease: timedelta) -> bool:
        """Take the lease of one operation (the API running a synchronous bind inline)."""
        now = utcnow()
        with self.write() as session:
            result = session.execute(
                update(Operation)
                .where(
                    Operation.id == operation_id,
                    Operation.state == IN_PROGRESS,
                    or_(
                        Operation.lease_owner == owner,
                        Operation.lease_expires_at.is_(None),
                        Operation.lease_expires_at < now,
                    ),
                )
                .values(
                    lease_owner=owner,
                    lease_expires_at=now + lease,
                    attempts=Operation.attempts + 1,
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount)  # type: ignore[attr-defined]

    def renew(self, operation_id: str, owner: str, lease: timedelta) -> bool:
        """Extend the lease; False when another worker owns the operation now."""
        now = utcnow()
        with self.write() as session:
            result = session.execute(
                update(Operation)
                .where(_mine(operation_id, owner))
                .values(lease_expires_at=now + lease)
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount)  # type: ignore[attr-defined]

    @staticmethod
    def owned(session: Session, operation_id: str, owner: str) -> Operation:
        """The operation, locked for this transaction, if `owner` still holds its lease; else
        LeaseLost."""
        op = session.scalars(
            select(Operation).where(_mine(operation_id, owner)).with_for_update()
        ).first()
        if op is None:
            raise LeaseLost(f"operation {operation_id} is no longer leased by {owner}")
        return op

    def release(
        self, operation_id: str, owner: str, *, not_before: datetime, description: str
    ) -> None:
        """Give the operation back for a later pass (any worker)."""
        with self.write() as session:
            op = self.owned(session, operation_id, owner)
            op.not_before = not_before
            op.description = description
            op.lease_owner = None
            op.lease_expires_at = None

    def next_due(self) -> datetime | None:
        """When the next operation with a free lease becomes due (None: none is waiting)."""
        with self.read() as session:
            value = session.scalar(
                select(func.min(Operation.not_before)).where(
                    Operation.state == IN_PROGRESS, Operation.lease_owner.is_(None)
                )
            )
            return value if isinstance(value, datetime) else None

    # ----------------------------------------------------------------------- maintenance

    def redrive(self, operation_id: str, deadline: timedelta) -> str:
        """`broker repair --redrive`: make an in-progress operation due now with a free lease
        and a new deadline, or restart a failed one (the latest of its instance, which must
        have no other active operation). Returns what was done, for the operator."""
        now = utcnow()
        with self.write() as session:
            op = self.operation(session, operation_id)
            if op is None:
                return "no such operation"
            instance = self.instance(session, op.instance_id)
            if op.state == IN_PROGRESS:
                op.lease_owner = None
                op.lease_expires_at = None
                op.not_before = now
                op.deadline_at = now + deadline
                return f"due now, new deadline {op.deadline_at.isoformat(timespec='seconds')}Z"
            if op.state == SUCCEEDED:
                return "already succeeded: nothing to re-drive"
            latest = self.last_operation(session, op.instance_id, op.binding_id)
            if instance is None or latest is None or latest.id != op.id:
                return "not the latest operation of its instance: nothing done"
            if instance.active_operation_id is not None:
                return f"instance has an active operation {instance.active_operation_id}"
            op.state = IN_PROGRESS
            op.finished_at = None
            op.cancel_requested = False
            op.not_before = now
            op.deadline_at = now + deadline
            op.lease_owner = None
            op.lease_expires_at = None
            op.description = "re-driven by an operator"
            instance.active_operation_id = op.id
            states = {"provision": PROVISIONING, "update": UPDATING, "deprovision": DEPROVISIONING}
            if op.kind in states:
                instance.state = states[op.kind]
            elif op.binding_id is not None:
                binding = self.binding(session, op.binding_id)
                if binding is not None:
                    binding.state = BINDING if op.kind == "bind" else UNBINDING
            return f"restarted, deadline {op.deadline_at.isoformat(timespec='seconds')}Z"

    def rotate_secrets(self, rotate: Callable[[str], str]) -> int:
        """Re-encrypt every stored secret with `rotate` (secrets.Secrets.rotate), in one
        transaction: all or nothing."""
        count = 0
        with self.write() as session:
            rows = session.scalars(select(Binding).where(Binding.credentials.is_not(None)))
            for binding in rows:
                assert binding.credentials is not None
                binding.credentials = rotate(binding.credentials)
                count += 1
            kept = session.scalars(select(Instance).where(Instance.secrets.is_not(None)))
            for instance in kept:
                assert instance.secrets is not None
                instance.secrets = rotate(instance.secrets)
                count += 1
        return count

    def forget_instance(self, instance_id: str) -> bool:
        with self.write() as session:
            session.execute(delete(Operation).where(Operation.instance_id == instance_id))
            session.execute(delete(Binding).where(Binding.instance_id == instance_id))
            result = session.execute(delete(Instance).where(Instance.id == instance_id))
            return bool(result.rowcount)  # type: ignore[attr-defined]

    def gone_before(self, when: datetime) -> list[str]:
        with self.read() as session:
            query = select(Instance.id).where(Instance.state == GONE, Instance.updated_at < when)
            return list(session.scalars(query).all())

    def snapshot(self) -> dict[str, list[tuple[object, ...]]]:
        """Every row of every table (tests compare snapshots around 4xx answers)."""
        out: dict[str, list[tuple[object, ...]]] = {}
        with self.read() as session:
            for table in Base.metadata.sorted_tables:
                rows = session.execute(select(table)).all()
                out[table.name] = sorted((tuple(r) for r in rows), key=repr)
        return out

    def in_progress(self, now: datetime) -> list[tuple[str, str, int, int]]:
        """(service, kind, operations in progress, of which stuck: past their deadline, or
        with a lease that expired at `now`) for the metrics; the index on state serves it."""
        stuck = or_(
            Operation.deadline_at < now,
            and_(Operation.lease_owner.is_not(None), Operation.lease_expires_at < now),
        )
        query = (
            select(
                Instance.service_name,
                Operation.kind,
                func.count(),
                func.sum(case((stuck, 1), else_=0)),
            )
            .join(Instance, Instance.id == Operation.instance_id)
            .where(Operation.state == IN_PROGRESS)
            .group_by(Instance.service_name, Operation.kind)
        )
        with self.read() as session:
            rows = session.execute(query).all()
        return [(str(s), str(k), int(n or 0), int(x or 0)) for s, k, n, x in rows]

    def operation_totals(self) -> dict[tuple[str, str, str], int]:
        """Every operation kept, by (service, kind, state): `broker status` (a full scan)."""
        query = (
            select(Instance.service_name, Operation.kind, Operation.state, func.count())
            .join(Instance, Instance.id == Operation.instance_id)
            .group_by(Instance.service_name, Operation.kind, Operation.state)
        )
        with self.read() as session:
            return {(str(s), str(k), str(t)): int(n) for s, k, t, n in session.execute(query)}

    def count(self, model: type[Base]) -> int:
        with self.read() as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)


def _mine(operation_id: str, owner: str) -> ColumnElement[bool]:
    return and_(
        Operation.id == operation_id,
        Operation.lease_owner == owner,
        Operation.state == IN_PROGRESS,
    )


def is_duplicate(exc: IntegrityError) -> bool:
    """An insert lost a race with an identical id (unique/primary key violation)."""
    text = str(exc.orig).lower()
    return "unique" in text or "duplicate" in text or "primary key" in text
