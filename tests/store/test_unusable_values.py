"""Rows the codecs accept never fail a consumer: values no consumer can use are repaired or the row is rejected.

Each case plants a row as another writer could (raw DynamoDB calls on moto server, raw SQL on SQLite and the real
PostgreSQL), then drives the real leader loop, the API and the agent's throughput recorder over it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, update

from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.coordinator.snapshot import LeaseView
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import Lease
from shardherd.shared.row_checks import MAX_THROUGHPUT_KBPS, InvalidRowValue
from shardherd.shared.sql.schema import LEASE_ATTRIBUTES, build_schema
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import LeaseProgress, WorkerRecord
from tests.services.harness import Replica
from tests.store.conftest import expect_applied
from tests.support.stores import make_store, worker_record

BACKENDS = ("dynamodb", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres))


class Planted:
    """A store plus raw access to its tables, to write rows the way a foreign or buggy writer would."""

    def __init__(self, backend: str, store: LeaseStore, url: str) -> None:
        self.backend = backend
        self.store = store
        self.url = url

    def set_lease_throughput(self, key: str, value: float) -> None:
        """Overwrite a lease's stored throughput with `value`, bypassing the codec."""
        self.set_lease_number(key, "throughput_kbps", value)

    def set_lease_number(self, key: str, column: str, value: float) -> None:
        """Overwrite a numeric lease attribute (named by its SQL column) with `value`, bypassing the codec."""
        if self.backend == "dynamodb":
            make_client("dynamodb", "us-east-1", self.url).update_item(
                TableName=self.store.tables.leases, Key={"leaseKey": {"S": key}},
                UpdateExpression="SET #a = :v", ExpressionAttributeNames={"#a": LEASE_ATTRIBUTES[column]},
                ExpressionAttributeValues={":v": {"N": repr(value)}})
            return
        leases = build_schema(self.store.tables).leases
        engine = create_engine(self.url)
        with engine.begin() as conn:
            conn.execute(update(leases).where(leases.c.lease_key == key).values({column: value}))
        engine.dispose()

    def put_worker(self, worker: str, lut: int, throughput: dict[str, float], progress: dict[str, Any]) -> None:
        """Write a worker row with raw lease throughput and progress figures."""
        if self.backend == "dynamodb":
            item = {"wid": {"S": worker}, "lut": {"N": str(lut)}, "hb": {"N": str(lut)},
                    "leaseThroughput": {"M": {k: {"N": repr(v)} for k, v in throughput.items()}},
                    "leaseProgress": {"M": {k: {"M": {f: {"N": str(n)} for f, n in p.items()}}
                                            for k, p in progress.items()}}}
            make_client("dynamodb", "us-east-1", self.url).put_item(
                TableName=self.store.tables.worker_metrics, Item=item)
            return
        workers = build_schema(self.store.tables).workers
        engine = create_engine(self.url)
        with engine.begin() as conn:
            conn.execute(workers.delete().where(workers.c.wid == worker))
            conn.execute(insert(workers).values(wid=worker, lut=lut, hb=lut, lease_throughput=json.dumps(throughput),
                                                lease_progress=json.dumps(progress)))
        engine.dispose()

    def raw_lease(self, key: str) -> dict[str, Any]:
        """The stored lease row as the backend holds it."""
        if self.backend == "dynamodb":
            item: dict[str, Any] = make_client("dynamodb", "us-east-1", self.url).get_item(
                TableName=self.store.tables.leases, Key={"leaseKey": {"S": key}}, ConsistentRead=True)["Item"]
            return item
        leases = build_schema(self.store.tables).leases
        engine = create_engine(self.url)
        with engine.begin() as conn:
            row = dict(conn.execute(leases.select().where(leases.c.lease_key == key)).mappings().one())
        engine.dispose()
        return row

    def put_unreadable_lease(self, key: str) -> None:
        """A lease row whose checkpoint no reader can parse."""
        if self.backend == "dynamodb":
            make_client("dynamodb", "us-east-1", self.url).put_item(TableName=self.store.tables.leases, Item={
                "leaseKey": {"S": key}, "leaseCounter": {"N": "3"}, "checkpoint": {"S": "12ab"},
                "leaseOwner": {"S": "w-1"}})
            return
        leases = build_schema(self.store.tables).leases
        engine = create_engine(self.url)
        with engine.begin() as conn:
            conn.execute(insert(leases).values(lease_key=key, lease_counter=3, checkpoint="12ab", lease_owner="w-1"))
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def planted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Planted]:
    backend: str = request.param
    if backend == "dynamodb":
        url = request.getfixturevalue("moto_server").endpoint_url
        store = make_store(backend, moto_url=url)
    elif backend == "postgres":
        url = request.getfixturevalue("postgres_server").url
        store = make_store(backend, postgres_url=url)
    else:
        url = f"sqlite:///{tmp_path / 'leases.db'}"
        store = make_store(backend, sqlite_path=str(tmp_path / "leases.db"))
    yield Planted(backend, store, url)
    store.close()


def _settled(planted: Planted) -> Replica:
    replica = Replica(planted.store, shards=4, api_token="s3cret-token-0123456789")
    replica.join("w-1")
    replica.join("w-2")
    replica.step(3)
    assert set(replica.owners().values()) == {"w-1", "w-2"}
    return replica


def _metric(text: str, name: str, table: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(f'{name}{{table="{table}"}}'))
    return float(line.split()[-1])


@pytest.mark.parametrize("bad", [-5.0, 2e12])
def test_a_lease_with_an_unusable_throughput_is_planned_and_reported(planted: Planted, bad: float,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    replica = _settled(planted)
    key = "shardId-000000000001"
    with caplog.at_level(logging.WARNING, logger="shardherd.shared.row_checks"):
        planted.set_lease_throughput(key, bad)
        victim = replica.owners()[key]
        assert victim is not None
        replica.leave(victim)  # its leases, the bad one included, must fail over
        summaries = replica.step(12)

    assert [s.error for s in summaries if s is not None and s.error] == []
    survivor = ({"w-1", "w-2"} - {victim}).pop()
    assert set(replica.owners().values()) == {survivor}
    lease = planted.store.get_lease(key)
    assert lease is not None and lease.throughput_kbps is None and "throughputKBps" in lease.repairs[0]
    LeaseView.from_lease(lease)  # what failed every leader run before
    ThroughputRecorder(ManualClock(), 1.0).seed(key, lease.throughput_kbps or 0.0)
    reports = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(reports) == 1 and "repaired" in reports[0]  # logged once, not once per scan

    page = replica.client.get("/v1/assignments").json()
    assert [row["key"] for row in page["repaired"]] == [key]
    assert key in {item["lease_key"] for item in page["items"]}
    assert _metric(replica.client.get("/metrics").text, "shardherd_repaired_rows", "leases") == 1.0


def test_a_lease_with_negative_progress_figures_is_read_without_them_and_reported(planted: Planted) -> None:
    key = "shardId-000000000009"
    planted.store.create_lease(Lease(key))
    expect_applied(planted.store.assign(key, "w-1", None, None))
    expect_applied(planted.store.checkpoint(key, "w-1", Checkpoint.at("5"), progress=LeaseProgress(700, 3, 4)))
    planted.set_lease_number(key, "records_processed", -3)
    lease = planted.store.get_lease(key)
    assert lease is not None and lease.checkpoint == Checkpoint.at("5")
    assert (lease.millis_behind_latest, lease.records_processed, lease.bytes_processed) == (700, None, 4)
    assert lease.repairs == ("recordsProcessed -3 is not an integer >= 0: ignored",)


def test_a_worker_row_with_negative_lease_figures_is_planned_and_reported(planted: Planted) -> None:
    replica = _settled(planted)
    key = "shardId-000000000002"
    owner = replica.owners()[key]
    assert owner is not None
    replica.leave(owner)  # the row below is now all the leader hears from it
    planted.put_worker(owner, int(replica.clock.time()), {key: -3.0, "other": 4.0},
                       {key: {"records": -1, "bytes": 10}})

    record = worker_record(planted.store, owner)
    assert record is not None
    assert record.lease_throughput == {"other": 4.0} and record.lease_progress == {}
    assert len(record.repairs) == 2

    summaries = replica.step(12)
    assert [s.error for s in summaries if s is not None and s.error] == []
    assert owner not in replica.owners().values()  # its leases failed over
    body = replica.client.get("/v1/workers").json()
    assert [row["key"] for row in body["repaired"]] == [owner]
    assert _metric(replica.client.get("/metrics").text, "shardherd_repaired_rows", "workers") == 1.0


def test_an_unreadable_lease_is_reported_never_overwritten_and_the_rest_is_planned(planted: Planted) -> None:
    replica = _settled(planted)
    key = "shardId-000000000002"
    planted.store.delete_lease(key)
    planted.put_unreadable_lease(key)  # shard sync would create this lease if it took the row for missing
    before = planted.raw_lease(key)
    replica.leave("w-1")

    summaries = replica.step(12)

    assert [s.error for s in summaries if s is not None and s.error] == []
    assert planted.raw_lease(key) == before
    assert all(owner == "w-2" for lease_key, owner in replica.owners().items() if lease_key != key)
    page = replica.client.get("/v1/assignments").json()
    assert [row["key"] for row in page["malformed"]] == [key]
    assert _metric(replica.client.get("/metrics").text, "shardherd_malformed_rows", "leases") == 1.0


@pytest.mark.parametrize("value", [-0.5, math.inf, math.nan, MAX_THROUGHPUT_KBPS * 2])
def test_no_lease_or_worker_record_can_hold_an_unusable_throughput(value: float) -> None:
    with pytest.raises(InvalidRowValue):
        Lease("shardId-1", throughput_kbps=value)
    with pytest.raises(InvalidRowValue):
        WorkerRecord("w", 1, lease_throughput={"shardId-1": value})


def test_no_record_can_hold_negative_progress_or_non_finite_metrics() -> None:
    with pytest.raises(InvalidRowValue):
        LeaseProgress(records=-1)
    with pytest.raises(InvalidRowValue):
        LeaseProgress(millis_behind_latest=-5)
    with pytest.raises(InvalidRowValue):
        LeaseProgress(records_behind=-1)
    with pytest.raises(InvalidRowValue):
        WorkerRecord("w", 1, metric_stats={"C": (math.nan,)})
    with pytest.raises(InvalidRowValue):
        Lease("")
