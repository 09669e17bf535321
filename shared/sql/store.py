"""SqlLeaseStore: the lease store on SQLite or PostgreSQL, one conditional statement (or locked transaction) per write.

Lease writes are `UPDATE/DELETE ... WHERE lease_key = :k AND <conditions> RETURNING *`; when no row comes back the
current row is read in the same transaction to say why. Fenced writes first read the coordinator-state row with
`FOR UPDATE` (PostgreSQL; SQLite writers are serialised by `BEGIN IMMEDIATE`) and check the fence in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Delete,
    Update,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.errors import ConfigError, MalformedLease, MalformedWorker, StoreError
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.rounding import round_throughput
from shardherd.shared.sql.engine import insert_for, is_transient, make_engines, unbounded_statements
from shardherd.shared.sql.lease_rows import LEASE_ENTITY, checkpoint_values, decode_lease, lease_values
from shardherd.shared.sql.schema import POSTGRES_MAX_IDENTIFIER, build_schema, overlong_identifiers, version_table
from shardherd.shared.sql.state_documents import decode_document, encode_document
from shardherd.shared.sql.worker_rows import decode_worker, worker_values
from shardherd.shared.state_conditions import check_value, condition_holds
from shardherd.shared.store import (
    Conflict,
    Fence,
    LeaseScan,
    LeaseStore,
    Outcome,
    StateCondition,
    StateValue,
    TableNames,
    WorkerScan,
)
from shardherd.shared.worker import LeaseProgress, WorkerRecord

T = TypeVar("T")

# Key of the PostgreSQL advisory lock that serialises concurrent `ensure_tables` calls.
_DDL_LOCK_KEY = 0x5348_4844  # "SHHD"


class _RowAppeared(Exception):
    """A concurrent transaction inserted the row this one had seen absent; the whole operation is run again."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _RowAppeared) or is_transient(exc)


def _matches(column: Any, value: str | None) -> ColumnElement[bool]:
    """NULL-safe equality with a known value: `IS NULL` for None."""
    result: ColumnElement[bool] = column.is_(None) if value is None else column == value
    return result


class SqlLeaseStore(LeaseStore):
    """Leases, worker records and coordinator state of one application in a SQLite file or a PostgreSQL database."""

    def __init__(self, url: str, tables: TableNames, retry: RetryPolicy | None = None, pool_size: int = 10,
                 call_timeout: float | None = None, idle: int | None = None, name: str | None = None) -> None:
        self.tables = tables
        self._retry = retry or RetryPolicy()
        self._schema = build_schema(tables)
        self._read_engine, self._write_engine = make_engines(url, pool_size, call_timeout, idle, name)
        self._postgres = self._read_engine.dialect.name == "postgresql"
        if self._postgres and (overlong := overlong_identifiers(self._schema, version_table(tables))):
            self._read_engine.dispose()
            raise ConfigError(f"PostgreSQL names are limited to {POSTGRES_MAX_IDENTIFIER} characters; "
                              f"use a shorter application name than {tables.leases!r} (too long: {overlong})")
        leases = self._schema.leases
        self._is_lease = or_(leases.c.entity_type.is_(None), leases.c.entity_type == LEASE_ENTITY)
        # Statements an agent runs several times a second, built once with bound parameters: building, coercing and
        # keying them per call was about a third of a checkpoint's CPU in the client (`_checkpoint_statement`).
        self._select_lease = select(leases).where(leases.c.lease_key == bindparam("key"), self._is_lease)
        self._select_lease_locked = self._select_lease.with_for_update()
        self._checkpoint_statements: dict[frozenset[str], Update] = {}

    # ---------------------------------------------------------------- plumbing
    def _run(self, operation: Callable[[], T], what: str) -> T:
        """Run with retries of transient errors; other database errors become StoreError."""
        try:
            return self._retry.call(operation, _retryable, what)
        except sa_exc.SQLAlchemyError as exc:
            detail = getattr(exc, "orig", None) or exc
            raise StoreError(f"{what} failed: {type(detail).__name__}: {detail}".strip()) from exc

    def _run_telling_retries(self, operation: Callable[[bool], T], what: str) -> T:
        """`_run`, telling each attempt whether it repeats one: an earlier commit may have landed, its reply lost."""
        attempts = 0

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            return operation(attempts > 1)

        return self._run(attempt, what)

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        with self._read_engine.begin() as conn:
            yield conn

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        with self._write_engine.begin() as conn:
            yield conn

    def _lease_row(self, conn: Connection, lease_key: str, lock: bool = False) -> Any:
        query = self._select_lease_locked if lock else self._select_lease
        return conn.execute(query, {"key": lease_key}).mappings().first()

    def _checkpoint_statement(self, columns: frozenset[str]) -> Update:
        """`UPDATE leases SET <each of columns> = :set_<column>, lease_counter + 1 WHERE lease_key = :key RETURNING *`.

        Built once per set of columns (a checkpoint sets one of a few: with or without progress, handing over or not).
        """
        statement = self._checkpoint_statements.get(columns)
        if statement is None:
            leases = self._schema.leases
            values: dict[str, Any] = {name: bindparam(f"set_{name}", type_=leases.c[name].type) for name in columns}
            statement = update(leases).where(leases.c.lease_key == bindparam("key")).values(
                {**values, "lease_counter": self._bump()}).returning(*leases.c)
            self._checkpoint_statements[columns] = statement
        return statement

    def _read_lease(self, conn: Connection, lease_key: str) -> Lease | None:
        row = self._lease_row(conn, lease_key)
        return None if row is None else decode_lease(row, self.tables.leases)

    def _state_item(self, conn: Connection, key: str) -> dict[str, StateValue] | None:
        """A coordinator-state item, locked for the rest of the transaction (FOR UPDATE on PostgreSQL)."""
        state = self._schema.state
        document = conn.execute(select(state.c.document).where(state.c.key == key).with_for_update()).scalar()
        return None if document is None else decode_document(key, document)

    def _fenced_write(self, what: str, lease_key: str, statement: Update | Delete, conflict: Conflict,
                      fence: Fence | None, own_result: Callable[[Lease], bool] | None = None) -> Outcome:
        """Run one conditional lease statement (with RETURNING) after the fence; classify a miss by re-reading.

        `own_result` recognises the row this very statement produces: when a retry (its first commit's reply was
        lost) misses and the row already looks like that, the first attempt was committed.
        """
        def attempt(retry: bool) -> Outcome:
            with self._writing() as conn:
                if fence is not None and not condition_holds(fence.key, self._state_item(conn, fence.key),
                                                              fence.expect):
                    return Outcome.lost(Conflict.FENCED, self._read_lease(conn, lease_key))
                row = conn.execute(statement.returning(*self._schema.leases.c)).mappings().first()
                if row is not None:
                    return Outcome.ok(decode_lease(row, self.tables.leases))
                current = self._read_lease(conn, lease_key)
                if retry and current is not None and own_result is not None and own_result(current):
                    return Outcome.ok(current)
                return Outcome.lost(Conflict.NOT_FOUND if current is None else conflict, current)

        return self._run_telling_retries(attempt, f"{what} of lease {lease_key!r}")

    def _update(self, what: str, lease_key: str, conditions: Sequence[ColumnElement[bool]],
                values: Mapping[str, Any], fence: Fence | None = None,
                own_result: Callable[[Lease], bool] | None = None) -> Outcome:
        leases = self._schema.leases
        statement = update(leases).where(leases.c.lease_key == lease_key, self._is_lease, *conditions)
        return self._fenced_write(what, lease_key, statement.values(dict(values)), Conflict.OWNERSHIP, fence,
                                  own_result)

    def _bump(self) -> Any:
        return self._schema.leases.c.lease_counter + 1

    def _switch(self) -> Any:
        return func.coalesce(self._schema.leases.c.owner_switches_since_checkpoint, 0) + 1

    # ---------------------------------------------------------------- schema
    def ensure_tables(self) -> None:
        """Create the tables or migrate them to this release's schema (shared/sql/migrate.py).

        Safe to call concurrently: one caller migrates while the others wait on the DDL lock (PostgreSQL's advisory
        lock, SQLite's write lock), then find the head revision. UnknownSchemaRevision if a newer release migrated
        them.
        """
        # Alembic is imported here, not at the top: only the coordinator, `up` and `demo` migrate, and an
        # agent on an SQL store would otherwise hold its 8.5 MiB of modules for good.
        from shardherd.shared.sql.migrate import upgrade

        def migrate() -> None:
            with self._writing() as conn:
                if self._postgres:
                    unbounded_statements(conn)
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
                upgrade(conn, self.tables)

        self._run(migrate, f"migrating tables {self.tables}")

    def close(self) -> None:
        """Close every pooled connection."""
        self._read_engine.dispose()

    # ---------------------------------------------------------------- lease reads
    def get_lease(self, lease_key: str) -> Lease | None:
        """Read one lease; None if absent (or not a lease); MalformedLease if unreadable."""

        def read() -> Lease | None:
            with self._reading() as conn:
                return self._read_lease(conn, lease_key)

        return self._run(read, f"reading lease {lease_key!r}")

    def scan_leases(self, page_size: int = 1000) -> LeaseScan:
        """Every lease in key order, `page_size` rows per query (keyset pagination); bad rows go to `malformed`."""
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise StoreError(f"page_size must be a positive integer, got {page_size!r}")
        leases = self._schema.leases
        result = LeaseScan([], [])
        last_key: str | None = None
        while True:
            query = select(leases).where(self._is_lease).order_by(leases.c.lease_key).limit(page_size)
            if last_key is not None:
                query = query.where(leases.c.lease_key > last_key)

            def page(query: Any = query) -> list[Any]:
                with self._reading() as conn:
                    return list(conn.execute(query).mappings())

            rows = self._run(page, f"scanning leases after {last_key!r}")
            for row in rows:
                try:
                    result.leases.append(decode_lease(row, self.tables.leases))
                except MalformedLease as bad:
                    result.malformed.append(bad)
            if len(rows) < page_size:
                return result
            last_key = rows[-1]["lease_key"]

    def list_owned_keys(self, owner: str) -> list[str]:
        """Keys of the leases `owner` holds, through the lease_owner index."""
        leases = self._schema.leases
        query = select(leases.c.lease_key).where(leases.c.lease_owner == owner, self._is_lease)

        def read() -> list[str]:
            with self._reading() as conn:
                return list(conn.execute(query.order_by(leases.c.lease_key)).scalars())

        return self._run(read, f"listing leases of {owner!r}")

    # ---------------------------------------------------------------- lease writes
    def create_lease(self, lease: Lease) -> Outcome:
        """Insert the lease unless its key exists (ALREADY_EXISTS with the current row, None if unreadable)."""
        leases = self._schema.leases
        statement = (insert_for(self._write_engine, leases).values(lease_values(lease))
                     .on_conflict_do_nothing(index_elements=[leases.c.lease_key]).returning(*leases.c))

        def attempt() -> Outcome:
            with self._writing() as conn:
                row = conn.execute(statement).mappings().first()
                if row is not None:
                    return Outcome.ok(decode_lease(row, self.tables.leases))
                try:
                    current = self._read_lease(conn, lease.lease_key)
                except MalformedLease:  # reported by the decoder; the row stays as it is
                    current = None
                return Outcome.lost(Conflict.ALREADY_EXISTS, current)

        return self._run(attempt, f"creating lease {lease.lease_key!r}")

    def renew(self, lease_key: str, owner: str, expected_counter: int, throughput_kbps: float | None = None,
              during_handoff: bool = False) -> Outcome:
        """Counter+1 if the owner (or, during a handoff, the checkpoint owner) and the counter match."""
        c = self._schema.leases.c
        conditions = [c.lease_counter == expected_counter]
        if during_handoff:
            conditions.append(c.checkpoint_owner == owner)
        else:
            conditions += [c.lease_owner == owner, c.checkpoint_owner.is_(None)]
        values: dict[str, Any] = {"lease_counter": self._bump()}
        if throughput_kbps is not None:
            values["throughput_kbps"] = self._throughput(throughput_kbps)
        return self._update("renewal", lease_key, conditions, values, own_result=lambda current: current.renewed_by(
            owner, expected_counter, during_handoff))

    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Leader assignment conditioned on both owner fields (not the counter)."""
        c = self._schema.leases.c
        values: dict[str, Any] = {"lease_owner": new_owner, "checkpoint_owner": None, "lease_counter": self._bump(),
                                  "last_move": move}
        if (expected_owner is not None and expected_owner != new_owner) or expected_checkpoint_owner == new_owner:
            values["owner_switches_since_checkpoint"] = self._switch()
        conditions = [_matches(c.lease_owner, expected_owner), _matches(c.checkpoint_owner, expected_checkpoint_owner)]
        return self._update("assignment", lease_key, conditions, values, fence)

    def start_handoff(self, lease_key: str, new_owner: str, current_owner: str,
                      fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Make `new_owner` the owner and `current_owner` the checkpoint owner; the counter is untouched."""
        c = self._schema.leases.c
        conditions = [c.lease_owner == current_owner, c.checkpoint_owner.is_(None)]
        values = {"lease_owner": new_owner, "checkpoint_owner": current_owner, "last_move": move}
        return self._update("handoff start", lease_key, conditions, values, fence)

    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        """The old owner ends its handoff: checkpointOwner removed, counter+1, ownerSwitches+1."""
        c = self._schema.leases.c
        values = {"checkpoint_owner": None, "lease_counter": self._bump(),
                  "owner_switches_since_checkpoint": self._switch()}
        return self._update("handoff completion", lease_key, [c.checkpoint_owner == checkpoint_owner], values,
                            own_result=lambda current: current.handed_on_by(checkpoint_owner))

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint,
                   progress: LeaseProgress | None = None, expected: Lease | None = None,
                   hand_over: bool = False) -> Outcome:
        """Lock the row, check owner and monotonicity in Python, write it in the same transaction.

        `expected` is not needed: the row is locked from the read to the write (FOR UPDATE on PostgreSQL, a
        BEGIN IMMEDIATE transaction on SQLite), so concurrent checkpoints queue instead of failing each other.
        """
        return self._run_telling_retries(
            lambda retry: self._checkpoint_locked(lease_key, worker, checkpoint, progress, hand_over, retry),
            f"checkpoint of lease {lease_key!r}")

    def _checkpoint_locked(self, lease_key: str, worker: str, checkpoint: Checkpoint, progress: LeaseProgress | None,
                           hand_over: bool, retry: bool) -> Outcome:
        """One locked read-check-write transaction (a `retry` after a lost commit reply finds a final one written)."""
        with self._writing() as conn:
            row = self._lease_row(conn, lease_key, lock=True)
            if row is None:
                return Outcome.lost(Conflict.NOT_FOUND, None)
            current = decode_lease(row, self.tables.leases)
            if retry and hand_over and current.checkpoint == checkpoint and current.handed_on_by(worker):
                return Outcome.ok(current)  # the first attempt's commit completed the handoff; its reply was lost
            if current.actual_owner != worker:
                return Outcome.lost(Conflict.OWNERSHIP, current)
            if checkpoint.regresses_from(current.checkpoint):
                return Outcome.lost(Conflict.STALE_CHECKPOINT, current)
            values = checkpoint_values(checkpoint, progress)
            if hand_over and current.checkpoint_owner == worker:  # the handoff completes in this write
                values.update(checkpoint_owner=None, owner_switches_since_checkpoint=1)
            parameters = {f"set_{name}": value for name, value in values.items()}
            statement = self._checkpoint_statement(frozenset(values))
            written = conn.execute(statement, {**parameters, "key": lease_key}).mappings().one()
            return Outcome.ok(decode_lease(written, self.tables.leases))

    def release(self, lease_key: str, owner: str) -> Outcome:
        """The owner drops the lease (no handoff running): leaseOwner removed, counter+1."""
        c = self._schema.leases.c
        conditions = [c.lease_owner == owner, c.checkpoint_owner.is_(None)]
        return self._update("release", lease_key, conditions, {"lease_owner": None, "lease_counter": self._bump()},
                            own_result=lambda current: current.released)

    def set_pause(self, lease_key: str, reason: str | None) -> Outcome:
        """Set the pause reason, or clear the pause and its acknowledgement; owners and counter untouched."""
        values = {"paused": None, "paused_by": None} if reason is None else {"paused": reason}
        return self._update("pause", lease_key, [], values)

    def acknowledge_pause(self, lease_key: str, worker: str) -> Outcome:
        """`paused_by := worker` while paused and `worker` is the actual owner."""
        c = self._schema.leases.c
        owner = or_(c.checkpoint_owner == worker, and_(c.checkpoint_owner.is_(None), c.lease_owner == worker))
        return self._update("pause acknowledgement", lease_key, [c.paused.is_not(None), owner],
                            {"paused_by": worker})

    def rewrite_checkpoint(self, lease_key: str, expected: Lease, checkpoint: Checkpoint,
                           fence: Fence | None = None) -> Outcome:
        """Any checkpoint for a paused lease still as `expected` (owners, checkpoint, acknowledgement); counter+1."""
        c = self._schema.leases.c

        def same(column: Any, value: object) -> ColumnElement[bool]:
            return column.is_(None) if value is None else column == value  # type: ignore[no-any-return]

        conditions = [c.paused.is_not(None), same(c.lease_owner, expected.lease_owner),
                      same(c.checkpoint_owner, expected.checkpoint_owner), same(c.paused_by, expected.paused_by),
                      c.checkpoint == expected.checkpoint.sequence_number,
                      func.coalesce(c.checkpoint_sub_sequence_number, 0) == expected.checkpoint.sub_sequence_number]
        values = checkpoint_values(checkpoint)
        del values["owner_switches_since_checkpoint"]
        values["lease_counter"] = self._bump()
        return self._update("checkpoint rewrite", lease_key, conditions, values, fence)

    def delete_lease(self, lease_key: str, expected_checkpoint: Checkpoint | None = None,
                     fence: Fence | None = None) -> Outcome:
        """Delete the row (only while its checkpoint equals `expected_checkpoint`, if given); returns that row."""
        c = self._schema.leases.c
        statement = delete(self._schema.leases).where(c.lease_key == lease_key, self._is_lease)
        if expected_checkpoint is not None:
            statement = statement.where(
                c.checkpoint == expected_checkpoint.sequence_number,
                func.coalesce(c.checkpoint_sub_sequence_number, 0) == expected_checkpoint.sub_sequence_number,
            )
        return self._fenced_write("deletion", lease_key, statement, Conflict.STALE_CHECKPOINT, fence)

    @staticmethod
    def _throughput(value: float) -> float:
        try:
            return round_throughput(value)
        except ValueError as exc:
            raise StoreError(str(exc)) from exc

    # ---------------------------------------------------------------- workers
    def upsert_worker(self, record: WorkerRecord) -> None:
        """Insert or overwrite the worker's own attributes; an operator's drain flag is kept."""
        workers = self._schema.workers
        values = worker_values(record)
        statement = insert_for(self._write_engine, workers).values(values).on_conflict_do_update(
            index_elements=[workers.c.wid], set_={k: v for k, v in values.items() if k != "wid"})

        def write() -> None:
            with self._writing() as conn:
                conn.execute(statement)

        self._run(write, f"writing worker record {record.worker_id!r}")

    def scan_workers(self) -> WorkerScan:
        """Every worker record; unreadable ones go to `malformed`."""
        workers = self._schema.workers

        def read() -> list[Any]:
            with self._reading() as conn:
                return list(conn.execute(select(workers).order_by(workers.c.wid)).mappings())

        result = WorkerScan([], [])
        for row in self._run(read, "scanning worker records"):
            try:
                result.workers.append(decode_worker(row, self.tables.worker_metrics))
            except MalformedWorker as bad:
                result.malformed.append(bad)
        return result

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """The record with this id, or None; MalformedWorker if it cannot be read."""
        workers = self._schema.workers

        def read() -> Any:
            with self._reading() as conn:
                return conn.execute(select(workers).where(workers.c.wid == worker_id)).mappings().first()

        row = self._run(read, f"reading worker record {worker_id!r}")
        return None if row is None else decode_worker(row, self.tables.worker_metrics)

    def set_drain_requested(self, worker_id: str, requested: bool) -> bool:
        """Set the operator's drain flag on an existing record; False if there is none."""
        workers = self._schema.workers
        statement = update(workers).where(workers.c.wid == worker_id).values(drain_requested=requested)
        return self._changes_rows(statement, f"setting drain flag of {worker_id!r}")

    def set_restart(self, worker_id: str, within_ms: int | None) -> bool:
        """Set or clear the restart reservation of an existing record; False if there is none."""
        workers = self._schema.workers
        statement = update(workers).where(workers.c.wid == worker_id).values(restart_within_ms=within_ms)
        return self._changes_rows(statement, f"setting the restart reservation of {worker_id!r}")

    def delete_worker_if_unchanged(self, worker_id: str, last_update: int, heartbeat: int) -> bool:
        """Delete the record only while `lut` and `hb` (absent = 0) are still the values read."""
        c = self._schema.workers.c
        statement = delete(self._schema.workers).where(
            c.wid == worker_id, c.lut == last_update, func.coalesce(c.hb, 0) == heartbeat)
        return self._changes_rows(statement, f"deleting worker record {worker_id!r}")

    def _changes_rows(self, statement: Update | Delete, what: str) -> bool:
        def write() -> bool:
            with self._writing() as conn:
                return conn.execute(statement).rowcount > 0

        return self._run(write, what)

    # ---------------------------------------------------------------- coordinator state
    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        """Read a coordinator-state item without its key; None if absent (SQL reads are always current)."""
        state = self._schema.state

        def read() -> dict[str, StateValue] | None:
            with self._reading() as conn:
                document = conn.execute(select(state.c.document).where(state.c.key == key)).scalar()
            return None if document is None else decode_document(key, document)

        return self._run(read, f"reading coordinator state {key!r}")

    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        """Replace (or create) the whole item if the condition holds on the locked current item."""
        document = encode_document(attributes)
        state = self._schema.state

        def write() -> bool:
            with self._writing() as conn:
                item = self._state_item(conn, key)
                if not condition_holds(key, item, condition):
                    return False
                if item is not None:
                    conn.execute(update(state).where(state.c.key == key).values(document=document))
                    return True
                # RETURNING tells whether the row went in (psycopg reports no rowcount for ON CONFLICT DO NOTHING).
                inserted = conn.execute(insert_for(self._write_engine, state).values(key=key, document=document)
                                        .on_conflict_do_nothing(index_elements=[state.c.key]).returning(state.c.key))
                if inserted.first() is None:
                    raise _RowAppeared(key)
                return True

        return self._run(write, f"writing coordinator state {key!r}")

    def update_state(self, key: str, set_attributes: Mapping[str, StateValue],
                     remove: Sequence[str] = (), condition: StateCondition | None = None) -> bool:
        """Set and remove attributes of an existing item if the condition holds."""
        changes = {name: check_value(name, value) for name, value in set_attributes.items()}
        for name in remove:
            check_value(name, "")
        state = self._schema.state

        def write() -> bool:
            with self._writing() as conn:
                item = self._state_item(conn, key)
                if item is None or not condition_holds(key, item, condition):
                    return False
                item.update(changes)
                for name in remove:
                    item.pop(name, None)
                conn.execute(update(state).where(state.c.key == key).values(document=encode_document(item)))
                return True

        return self._run(write, f"updating coordinator state {key!r}")

    def delete_state(self, key: str, condition: StateCondition | None = None) -> bool:
        """Delete an existing item if the condition holds."""
        state = self._schema.state

        def write() -> bool:
            with self._writing() as conn:
                item = self._state_item(conn, key)
                if item is None or not condition_holds(key, item, condition):
                    return False
                conn.execute(delete(state).where(state.c.key == key))
                return True

        return self._run(write, f"deleting coordinator state {key!r}")
