"""SQL backend: schema creation, row encoding, malformed rows, scan pagination and coordinator-state documents."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, inspect, select, text

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.errors import ConfigError, MalformedLease, StoreError
from shardherd.shared.lease import Lease
from shardherd.shared.sql.store import SqlLeaseStore
from shardherd.shared.store import StateValue, TableNames
from shardherd.shared.worker import WorkerRecord
from tests.store.sql_support import SQL_BACKENDS, backend_url, open_store, raw_access, start_up_together
from tests.support.stores import unique_app


@pytest.fixture(params=SQL_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, tmp_path)


@pytest.fixture
def store(url: str) -> Iterator[SqlLeaseStore]:
    with open_store(url) as opened:
        yield opened


# ------------------------------------------------------------------ schema
def test_ensure_tables_is_idempotent_and_creates_the_owner_index(url: str) -> None:
    app = unique_app("schema")
    with open_store(url, app) as store:
        store.ensure_tables()
        assert store.create_lease(Lease("shardId-1", lease_owner="w")).applied
        store.ensure_tables()  # must not drop or recreate anything
        assert store.list_owned_keys("w") == ["shardId-1"]
    with raw_access(url, TableNames.for_application(app)) as (engine, schema):
        inspector = inspect(engine)
        assert {app, f"{app}-WorkerMetricStats", f"{app}-CoordinatorState"} <= set(inspector.get_table_names())
        indexed = [index["column_names"] for index in inspector.get_indexes(app)]
        assert ["lease_owner"] in indexed
        assert schema.owner_index.name in {index["name"] for index in inspector.get_indexes(app)}


def test_ensure_tables_adds_the_owner_index_to_an_existing_table(url: str) -> None:
    app = unique_app("legacy")
    tables = TableNames.for_application(app)
    with raw_access(url, tables) as (engine, schema):
        schema.leases.create(engine)
        schema.owner_index.drop(engine)  # as a table from before the index existed
        assert inspect(engine).get_indexes(app) == []
        with open_store(url, app):
            pass
        assert [index["column_names"] for index in inspect(engine).get_indexes(app)] == [["lease_owner"]]


def test_concurrent_ensure_tables_all_succeed(url: str) -> None:
    app = unique_app("together")
    assert start_up_together(url, TableNames.for_application(app)) == []
    with open_store(url, app) as store:
        assert store.scan_leases().leases == []


@pytest.mark.parametrize("bad_url", ["sqlite://", "sqlite:///:memory:", "mysql://u@127.0.0.1/db"])
def test_unusable_urls_are_rejected_clearly(bad_url: str) -> None:
    with pytest.raises(ConfigError, match=r"SQLite|unsupported"):
        SqlLeaseStore(bad_url, TableNames.for_application("x"))


def test_application_names_too_long_for_postgres_are_a_config_error(url: str) -> None:
    app = "a" * 50  # "<app>-WorkerMetricStats" is 70 characters; PostgreSQL identifiers stop at 63
    if url.startswith("postgresql"):
        with pytest.raises(ConfigError, match="63 characters"):
            SqlLeaseStore(url, TableNames.for_application(app))
        return
    with open_store(url, app) as store:  # SQLite has no limit
        assert store.create_lease(Lease("k", lease_owner="w")).applied
        assert store.list_owned_keys("w") == ["k"]


# ------------------------------------------------------------------ row encoding
def test_every_lease_field_round_trips(store: SqlLeaseStore) -> None:
    lease = Lease(
        lease_key="acct:stream:1:shardId-000000000007",
        lease_owner="w-1",
        checkpoint=Checkpoint.at("9" * 129, 2**62),
        owner_switches_since_checkpoint=3,
        pending_checkpoint=Checkpoint.at("9" * 129, 2**62 + 1),
        pending_checkpoint_state=bytes(range(256)),
        parent_shard_ids=frozenset({"shardId-000000000002", "shardId-000000000001"}),
        child_shard_ids=frozenset({"shardId-000000000009"}),
        starting_hash_key="0",
        ending_hash_key=str(2**128 - 1),
        throughput_kbps=12.5,
        checkpoint_owner="w-0",
        stream_name="acct:stream:1",
        shard_id="shardId-000000000007",
    )
    created = store.create_lease(lease)
    assert created.applied
    assert store.get_lease(lease.lease_key) == lease  # counter starts at 0 either way
    with raw_access(str(store._read_engine.url), store.tables) as (engine, schema), engine.connect() as conn:
        row = conn.execute(select(schema.leases)).mappings().one()
    assert json.loads(row["parent_shard_id"]) == ["shardId-000000000001", "shardId-000000000002"]
    assert row["entity_type"] == "LEASE"


@pytest.mark.parametrize(("given", "stored"), [(0.0000005, 0.000001), (1.2345674999, 1.234567), (3.0, 3.0)])
def test_throughput_is_rounded_half_up_to_six_decimals(store: SqlLeaseStore, given: float, stored: float) -> None:
    store.create_lease(Lease("k"))
    assert store.assign("k", "w", None, None).applied
    renewed = store.renew("k", "w", 1, throughput_kbps=given)
    assert renewed.lease is not None
    assert renewed.lease.throughput_kbps == stored


def test_non_finite_throughput_is_rejected(store: SqlLeaseStore) -> None:
    store.create_lease(Lease("k", lease_owner="w"))
    with pytest.raises(StoreError, match="finite"):
        store.renew("k", "w", 0, throughput_kbps=math.nan)
    lease = store.get_lease("k")
    assert lease is not None
    assert lease.lease_counter == 0


# ------------------------------------------------------------------ malformed rows
def _plant(engine: Engine, table: Any, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        for row in rows:
            conn.execute(table.insert().values(row))


def _raw_rows(engine: Engine, table: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(select(table).order_by(table.c[table.primary_key.columns.keys()[0]]))
                .mappings()]


def test_malformed_rows_are_reported_with_their_key_and_left_untouched(store: SqlLeaseStore, url: str) -> None:
    assert store.create_lease(Lease("good", lease_owner="w")).applied
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "bad-checkpoint": ({"checkpoint": "12ab"}, "neither a sentinel"),
        "bad-parents": ({"checkpoint": "5", "parent_shard_id": "{not json"}, "parentShardId"),
        "parents-not-strings": ({"checkpoint": "5", "parent_shard_id": "[1, 2]"}, "parentShardId"),
        "no-checkpoint": ({"checkpoint": None}, "checkpoint must be a string"),
        "negative-sub": ({"checkpoint": "5", "checkpoint_sub_sequence_number": -1}, "sub-sequence"),
        "sentinel-with-sub": ({"checkpoint": "LATEST", "checkpoint_sub_sequence_number": 4}, "sentinel"),
    }
    if url.startswith("sqlite"):  # only SQLite lets a column hold the wrong type
        bad["text-counter"] = ({"checkpoint": "5", "lease_counter": "many"}, "leaseCounter")
    with raw_access(url, store.tables) as (engine, schema):
        _plant(engine, schema.leases, [{"lease_key": key, "lease_counter": 0, **columns}
                                       for key, (columns, _) in bad.items()])
        _plant(engine, schema.leases, [{"lease_key": "leader-lock", "lease_counter": 0, "entity_type": "LOCK"}])
        if url.startswith("sqlite"):  # text in the BLOB column, which SQLAlchemy's LargeBinary would refuse to bind
            _plant(engine, schema.leases, [{"lease_key": "text-state", "lease_counter": 0, "checkpoint": "5"}])
            with engine.begin() as conn:
                conn.execute(text(f'UPDATE "{store.tables.leases}" SET pending_checkpoint_state = \'text\' '
                                  "WHERE lease_key = 'text-state'"))
            bad["text-state"] = ({}, "pendingCheckpointState")
        before = _raw_rows(engine, schema.leases)

        for key, (_, reason) in bad.items():
            with pytest.raises(MalformedLease, match=reason) as caught:
                store.get_lease(key)
            assert caught.value.lease_key == key
        scan = store.scan_leases(page_size=3)
        assert [lease.lease_key for lease in scan.leases] == ["good"]
        assert sorted(error.lease_key or "" for error in scan.malformed) == sorted(bad)
        assert store.get_lease("leader-lock") is None  # other entity types are not leases
        assert store.list_owned_keys("w") == ["good"]

        assert _raw_rows(engine, schema.leases) == before


def test_malformed_worker_rows_are_reported(store: SqlLeaseStore, url: str) -> None:
    store.upsert_worker(WorkerRecord("ok", last_update=100, metric_stats={"C": (10.0, -1.0)}))
    with raw_access(url, store.tables) as (engine, schema):
        _plant(engine, schema.workers, [
            {"wid": "bad-sts", "lut": 1, "sts": "{"},
            {"wid": "bad-opr", "lut": 1, "opr": json.dumps({"C": ["high"]})},
            {"wid": "bad-state", "lut": 1, "worker_state": "ASLEEP"},
            {"wid": "bad-poison", "lut": 1, "lease_progress": json.dumps({"s-1": {"poison": {"quarantined": "2"}}})},
        ])
    scan = store.scan_workers()
    assert [worker.worker_id for worker in scan.workers] == ["ok"]
    assert scan.workers[0].metric_stats == {"C": (10.0, -1.0)}
    assert sorted(error.worker_id or "" for error in scan.malformed) == ["bad-opr", "bad-poison", "bad-state",
                                                                         "bad-sts"]
    assert "poison.quarantined must be an integer" in str(
        next(error for error in scan.malformed if error.worker_id == "bad-poison"))
    assert "sts" in str(next(error for error in scan.malformed if error.worker_id == "bad-sts"))


# ------------------------------------------------------------------ pagination
@pytest.mark.parametrize("page_size", [1, 5, 7, 25, 1000])
def test_scan_reads_every_row_once_in_pages_of_page_size(store: SqlLeaseStore, page_size: int) -> None:
    keys = [f"shardId-{i:012d}" for i in range(25)]
    for key in keys:
        assert store.create_lease(Lease(key)).applied
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and store.tables.leases in statement:
            statements.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        scan = store.scan_leases(page_size=page_size)
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert [lease.lease_key for lease in scan.leases] == keys
    full_pages, rest = divmod(len(keys), page_size)
    assert len(statements) == full_pages + 1  # the page after the last full one is short or empty
    assert rest < page_size


@pytest.mark.parametrize("page_size", [0, -1])
def test_scan_rejects_a_page_size_below_one(store: SqlLeaseStore, page_size: int) -> None:
    with pytest.raises(StoreError, match="page_size"):
        store.scan_leases(page_size=page_size)


# ------------------------------------------------------------------ coordinator state documents
def test_state_values_keep_their_types(store: SqlLeaseStore, url: str) -> None:
    attributes: dict[str, StateValue] = {"text": "leader ü", "empty": "", "big": 2**80, "negative": -7,
                                         "blob": bytes(range(256)), "zero-bytes": b""}
    assert store.put_state("lock", attributes, {"key": None})
    assert store.get_state("lock") == attributes
    assert {type(value) for value in (store.get_state("lock") or {}).values()} == {str, int, bytes}
    # a condition compares types too: the number 5 is not the string "5"
    assert store.update_state("lock", {"epoch": 5})
    assert not store.update_state("lock", {"x": "y"}, condition={"epoch": "5"})
    assert store.update_state("lock", {"x": "y"}, remove=["blob"], condition={"epoch": 5})
    state = store.get_state("lock")
    assert state is not None
    assert "blob" not in state
    assert state["x"] == "y"
    with raw_access(url, store.tables) as (engine, schema), engine.connect() as conn:
        document = json.loads(conn.execute(select(schema.state.c.document)).scalar_one())
    assert document["big"] == {"N": str(2**80)}
    assert document["text"] == {"S": "leader ü"}
    assert set(document["zero-bytes"]) == {"B"}


@pytest.mark.parametrize("value", [1.5, True, None, ["list"]])
def test_state_rejects_values_of_other_types(store: SqlLeaseStore, value: Any) -> None:
    with pytest.raises(StoreError, match="str, int or bytes"):
        store.put_state("lock", {"attr": value})
    assert store.get_state("lock") is None


def test_state_rejects_the_hash_key_as_an_attribute(store: SqlLeaseStore) -> None:
    with pytest.raises(StoreError, match="hash key"):
        store.put_state("lock", {"key": "other"})


def test_an_unreadable_state_document_is_a_clear_error(store: SqlLeaseStore, url: str) -> None:
    with raw_access(url, store.tables) as (engine, schema):
        _plant(engine, schema.state, [{"key": "lock", "document": '{"a": {"X": "1"}}'}])
    with pytest.raises(StoreError, match="'lock' is unreadable"):
        store.get_state("lock")


def test_a_missing_table_is_a_store_error_not_a_retry(url: str) -> None:
    store = SqlLeaseStore(url, TableNames.for_application(unique_app("missing")))
    try:
        with pytest.raises(StoreError, match="reading lease"):
            store.get_lease("k")
    finally:
        store.close()


def test_raw_sql_sanity_of_the_test_helper(url: str) -> None:
    with raw_access(url, TableNames.for_application("x")) as (engine, _), engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
