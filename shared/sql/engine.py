"""Engines for SQLite and PostgreSQL with the transaction behaviour the store relies on, and error classification.

SQLite: pysqlite's own BEGIN handling is switched off so SQLAlchemy's `begin` event can issue `BEGIN IMMEDIATE` for
writes (writers queue on the busy timeout instead of failing on lock upgrade) and a plain deferred `BEGIN` for reads;
files run in WAL mode so readers never block the writer. PostgreSQL: psycopg 3, READ COMMITTED, no pre-ping (it
would double the round trips): a pooled connection found dead is a transient error, retried on a fresh one.
A process loads only its own backend's dialect and driver (a PostgreSQL store's agent has no sqlite3, 1.4 MB less).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import ConnectionPoolEntry

from shardherd.shared.errors import ConfigError

if TYPE_CHECKING:
    import sqlite3

    from sqlalchemy.dialects import postgresql, sqlite

# Seconds a SQLite writer waits for the write lock before "database is locked" (URL `?timeout=` overrides).
SQLITE_BUSY_TIMEOUT = 30.0
MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE/DELETE ... RETURNING
_BEGIN_OPTION = "shardherd_begin"

# PostgreSQL SQLSTATEs worth retrying: serialization failure, deadlock, lock not available, server shutting down or
# starting, too many connections, a statement cancelled (its timeout), a full disk or out of memory; plus the whole
# connection-exception class 08. A full disk is an outage of the shared store, not a fault of one caller: made
# permanent, it ended every heartbeat and lock keeper at once (docs/failure-model.md), where an outage fences and
# waits for the space to come back.
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53100", "53200",
                                  "53300"})
# SQLite: the file is locked by another writer, the disk is full, or an I/O error (SQLITE_IOERR_* included).
_TRANSIENT_SQLITE_ERRORS = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR")


def make_engines(url: str, pool_size: int, call_timeout: float | None = None, idle: int | None = None,
                 name: str | None = None) -> tuple[Engine, Engine]:
    """(read engine, write engine) sharing one pool; on SQLite the write engine's transactions begin IMMEDIATE.

    At most `pool_size` connections at once, of which `idle` (default all) stay open between calls: the rest close
    when returned. On PostgreSQL `name` is the connections' `application_name` (pg_stat_activity shows which
    shardherd process holds them).

    `call_timeout` (seconds) bounds one call: SQLite's busy wait (unless the URL sets `timeout`); PostgreSQL's connect
    timeout, TCP user timeout (sent data unacknowledged: a dead network), the wait for a pooled connection, and the
    statement timeout (a statement waiting on a row lock another session holds, or a server that stalls: SQLSTATE
    57014, transient). A migration lifts the statement timeout in its own transaction (`unbounded_statements`): it
    waits on the DDL lock for as long as another process migrates.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    kept = pool_size if idle is None else max(1, min(idle, pool_size))
    pool: dict[str, Any] = {"pool_size": kept, "max_overflow": 2 * pool_size - kept}  # at most 2 x pool_size
    if backend == "sqlite":
        import sqlite3  # a PostgreSQL store's process loads neither it nor SQLAlchemy's SQLite dialect

        database = parsed.database or ""
        if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
            raise ConfigError(f"in-memory SQLite ({url}) is private to one connection; use a file path: sqlite:///path")
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise ConfigError(f"SQLite {sqlite3.sqlite_version} is too old; shardherd needs 3.35 or newer (RETURNING)")
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if "timeout" not in parsed.query:
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT if call_timeout is None else call_timeout
        engine = create_engine(parsed, connect_args=connect_args, **pool)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine, engine.execution_options(**{_BEGIN_OPTION: "BEGIN IMMEDIATE"})
    if backend == "postgresql":
        connect: dict[str, Any] = {} if name is None or "application_name" in parsed.query else {
            "application_name": name}
        if call_timeout is not None:
            millis = int(call_timeout * 1000)
            pool["pool_timeout"] = call_timeout
            connect.update(connect_timeout=max(1, round(call_timeout)), tcp_user_timeout=millis,
                           options=f"-c statement_timeout={millis}")
        engine = create_engine(parsed, connect_args=connect, **pool)
        return engine, engine
    raise ConfigError(f"unsupported SQL URL {parsed.render_as_string(hide_password=True)}: "
                      "use sqlite:///<file> or postgresql+psycopg://...")


def unbounded_statements(conn: Connection) -> None:
    """Lift PostgreSQL's statement timeout for the rest of `conn`'s transaction (a migration's DDL lock wait)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL statement_timeout = 0"))


def _sqlite_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    """Hand transaction control to the `begin` event; WAL journal; fsync at checkpoints only (WAL keeps it safe)."""
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA journal_mode=WAL")
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


def _sqlite_begin(connection: Connection) -> None:
    """Start the transaction the engine asks for (deferred for reads, IMMEDIATE for writes)."""
    connection.exec_driver_sql(connection.get_execution_options().get(_BEGIN_OPTION, "BEGIN"))


def insert_for(engine: Engine, table: Any) -> postgresql.Insert | sqlite.Insert:
    """An INSERT with ON CONFLICT support in the engine's dialect (loaded with the engine: the import is a lookup)."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry cures: lost connections, conflicts, deadlocks, a busy file, a full disk (an outage)."""
    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    sqlite3 = sys.modules.get("sqlite3")  # absent unless this process made a SQLite engine: orig is not its error
    if sqlite3 is not None and isinstance(orig, sqlite3.Error):
        return getattr(orig, "sqlite_errorname", "").startswith(_TRANSIENT_SQLITE_ERRORS)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is None:
        # psycopg reports connection-level failures (refused, reset, closed) without a SQLSTATE.
        return isinstance(exc, sa_exc.OperationalError)
    return sqlstate in _TRANSIENT_SQLSTATES or str(sqlstate).startswith("08")
