"""Conformance: worker records (WorkerMetricStats) and coordinator-state items with their conditions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardherd.shared.store import LeaseStore, StateValue
from shardherd.shared.worker import (
    CPU_METRIC,
    FAILED_SAMPLE,
    THROUGHPUT_METRIC,
    LeaseProgress,
    WorkerRecord,
    WorkerState,
)
from tests.support.stores import worker_record


def record(worker_id: str = "worker-a", last_update: int = 1_700_000_000, heartbeat: int = 3,
           cpu: tuple[float, ...] = (12.5, FAILED_SAMPLE, 40.25)) -> WorkerRecord:
    """A worker record with every attribute filled in."""
    return WorkerRecord(
        worker_id=worker_id,
        last_update=last_update,
        metric_stats={CPU_METRIC: cpu, THROUGHPUT_METRIC: (1024.0,)},
        operating_range={CPU_METRIC: (80.0,)},
        heartbeat=heartbeat,
        state=WorkerState.DRAINING,
        lease_throughput={"shardId-000000000001": 512.5, "shardId-000000000002": 0.0},
        lease_progress={"shardId-000000000001": LeaseProgress(1_250, 40_000, 2**40, records_behind=321),
                        "shardId-000000000002": LeaseProgress(None, 0, 0),
                        # a stalled, throttled lease (decision 0039): both written only when set
                        "shardId-000000000003": LeaseProgress(None, 5, 9, throttled=4, stalled=True)},
    )


# ------------------------------------------------------------------------------------------------ workers
def test_upsert_then_scan_round_trips_every_attribute(store: LeaseStore) -> None:
    written = record()
    store.upsert_worker(written)
    assert worker_record(store, "worker-a") == written


def test_minimal_worker_record_round_trips(store: LeaseStore) -> None:
    written = WorkerRecord(worker_id="worker-b", last_update=5)
    store.upsert_worker(written)
    assert worker_record(store, "worker-b") == written


def test_scan_finds_no_record_of_an_unknown_worker(store: LeaseStore) -> None:
    assert worker_record(store, "nobody") is None


def test_upsert_replaces_the_worker_attributes(store: LeaseStore) -> None:
    store.upsert_worker(record())
    newer = WorkerRecord(worker_id="worker-a", last_update=1_700_000_030, heartbeat=4,
                         metric_stats={CPU_METRIC: (55.0,)}, operating_range={CPU_METRIC: (90.0,)})
    store.upsert_worker(newer)
    assert worker_record(store, "worker-a") == newer


def test_scan_workers_lists_every_record(store: LeaseStore) -> None:
    written = [record(f"worker-{index}", heartbeat=index) for index in range(5)]
    for worker in written:
        store.upsert_worker(worker)
    scan = store.scan_workers()
    assert scan.malformed == []
    assert sorted(scan.workers, key=lambda worker: worker.worker_id) == written


def test_get_worker_reads_one_record_with_its_operator_flags(store: LeaseStore) -> None:
    assert store.get_worker("worker-a") is None
    written = record("worker-a", heartbeat=3)
    store.upsert_worker(written)
    store.upsert_worker(record("worker-b", heartbeat=4))
    assert store.get_worker("worker-a") == written
    assert store.set_restart("worker-a", 60_000) and store.set_drain_requested("worker-a", True)
    assert store.get_worker("worker-a") == replace(written, restart_within_ms=60_000, drain_requested=True)
    assert store.get_worker("worker-c") is None


def test_drain_flag_is_set_only_on_existing_records_and_survives_upserts(store: LeaseStore) -> None:
    assert store.set_drain_requested("worker-a", True) is False
    assert worker_record(store, "worker-a") is None

    store.upsert_worker(record())
    assert store.set_drain_requested("worker-a", True) is True
    drained = worker_record(store, "worker-a")
    assert drained is not None and drained.drain_requested

    store.upsert_worker(record(heartbeat=9))
    after_upsert = worker_record(store, "worker-a")
    assert after_upsert is not None
    assert after_upsert.drain_requested and after_upsert.heartbeat == 9

    assert store.set_drain_requested("worker-a", False) is True
    cleared = worker_record(store, "worker-a")
    assert cleared is not None and not cleared.drain_requested


def test_restart_reservation_is_set_only_on_existing_records_survives_upserts_and_clears(store: LeaseStore) -> None:
    assert store.set_restart("worker-a", 60_000) is False
    assert worker_record(store, "worker-a") is None

    store.upsert_worker(record())
    assert store.set_restart("worker-a", 60_000) is True
    store.upsert_worker(record(heartbeat=9))  # a heartbeat (the stopping worker's last ones) keeps it
    reserved = worker_record(store, "worker-a")
    assert reserved is not None and reserved.restart_within_ms == 60_000 and reserved.heartbeat == 9

    assert store.set_restart("worker-a", None) is True
    cleared = worker_record(store, "worker-a")
    assert cleared is not None and cleared.restart_within_ms is None
    assert store.set_restart("worker-a", None) is True  # clearing again (a worker's every start) is harmless


def test_upsert_never_writes_the_drain_flag(store: LeaseStore) -> None:
    store.upsert_worker(WorkerRecord(worker_id="worker-a", last_update=1, drain_requested=True,
                                     restart_within_ms=5_000))
    stored = worker_record(store, "worker-a")
    assert stored is not None and stored.drain_requested is False and stored.restart_within_ms is None


@pytest.mark.parametrize(("last_update", "heartbeat"), [(1_699_999_999, 3), (1_700_000_000, 4)])
def test_delete_worker_with_changed_record_is_refused(store: LeaseStore, last_update: int,
                                                      heartbeat: int) -> None:
    store.upsert_worker(record())
    assert store.delete_worker_if_unchanged("worker-a", last_update, heartbeat) is False
    assert worker_record(store, "worker-a") == record()


def test_delete_unchanged_worker(store: LeaseStore) -> None:
    store.upsert_worker(record())
    store.upsert_worker(record("worker-b"))
    assert store.delete_worker_if_unchanged("worker-a", 1_700_000_000, 3) is True
    assert worker_record(store, "worker-a") is None
    assert [worker.worker_id for worker in store.scan_workers().workers] == ["worker-b"]


def test_delete_missing_worker_is_false(store: LeaseStore) -> None:
    assert store.delete_worker_if_unchanged("nobody", 1, 0) is False


# ------------------------------------------------------------------------------------------------ coordinator state
LOCK = "leader"
VALUES: dict[str, StateValue] = {
    "ownerName": "worker-a",
    "recordVersionNumber": "6a1d3f6c-0000-4000-8000-000000000001",
    "leaseDuration": 8_000,
    "epoch": 1_700_000_000_123,
    "data": b"\x00\xff\x10opaque",
}


def test_get_missing_state_is_none(store: LeaseStore) -> None:
    assert store.get_state(LOCK) is None


def test_put_state_round_trips_str_int_and_bytes(store: LeaseStore) -> None:
    assert store.put_state(LOCK, VALUES) is True
    read = store.get_state(LOCK)
    assert read == VALUES
    assert read is not None
    assert [type(read[name]) for name in VALUES] == [str, str, int, int, bytes]


def test_put_state_only_if_absent(store: LeaseStore) -> None:
    assert store.put_state(LOCK, {"ownerName": "worker-a"}, condition={"key": None}) is True
    assert store.put_state(LOCK, {"ownerName": "worker-b"}, condition={"key": None}) is False
    assert store.get_state(LOCK) == {"ownerName": "worker-a"}


def test_put_state_replaces_the_whole_item(store: LeaseStore) -> None:
    assert store.put_state(LOCK, VALUES)
    assert store.put_state(LOCK, {"ownerName": "worker-b", "epoch": 2})
    assert store.get_state(LOCK) == {"ownerName": "worker-b", "epoch": 2}


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        ({"ownerName": "worker-a"}, True),
        ({"ownerName": "worker-b"}, False),
        ({"ownerName": "worker-a", "epoch": 1_700_000_000_123}, True),
        ({"ownerName": "worker-a", "epoch": 1_700_000_000_124}, False),
        ({"epoch": "1700000000123"}, False),  # values are typed: a string never equals a number
        ({"data": b"\x00\xff\x10opaque"}, True),
        ({"data": b"\x00\xff\x10other"}, False),
        ({"released": None}, True),
        ({"ownerName": None}, False),
        ({"key": None}, False),
    ],
)
def test_put_state_conditions(store: LeaseStore, condition: dict[str, StateValue | None], holds: bool) -> None:
    assert store.put_state(LOCK, VALUES)
    replacement: dict[str, StateValue] = {"ownerName": "worker-c", "epoch": 9}
    assert store.put_state(LOCK, replacement, condition=condition) is holds
    assert store.get_state(LOCK) == (replacement if holds else VALUES)


def test_conditions_on_an_absent_item(store: LeaseStore) -> None:
    assert store.put_state(LOCK, {"ownerName": "worker-a"}, condition={"ownerName": "worker-a"}) is False
    assert store.get_state(LOCK) is None
    assert store.put_state(LOCK, {"ownerName": "worker-a"}, condition={"ownerName": None}) is True
    assert store.get_state(LOCK) == {"ownerName": "worker-a"}


def test_update_state_sets_and_removes_attributes(store: LeaseStore) -> None:
    assert store.put_state(LOCK, VALUES)
    assert store.update_state(LOCK, {"epoch": 2, "ownerName": "worker-b", "extra": b"\x01"},
                              remove=["data", "leaseDuration"]) is True
    assert store.get_state(LOCK) == {"ownerName": "worker-b", "recordVersionNumber": VALUES["recordVersionNumber"],
                                     "epoch": 2, "extra": b"\x01"}


@pytest.mark.parametrize(("condition", "holds"), [
    ({"ownerName": "worker-a", "leaseDuration": 8_000}, True),
    ({"ownerName": "worker-a", "leaseDuration": 8_001}, False),
    ({"released": None}, True),
    ({"data": None}, False),
])
def test_update_state_conditions(store: LeaseStore, condition: dict[str, StateValue | None],
                                 holds: bool) -> None:
    assert store.put_state(LOCK, VALUES)
    assert store.update_state(LOCK, {"ownerName": "worker-z"}, condition=condition) is holds
    assert store.get_state(LOCK) == ({**VALUES, "ownerName": "worker-z"} if holds else VALUES)


def test_update_state_of_absent_item_is_false_and_creates_nothing(store: LeaseStore) -> None:
    assert store.update_state(LOCK, {"ownerName": "worker-a"}) is False
    assert store.update_state(LOCK, {"ownerName": "worker-a"}, condition={"ownerName": None}) is False
    assert store.get_state(LOCK) is None


def test_delete_state(store: LeaseStore) -> None:
    assert store.put_state(LOCK, VALUES)
    assert store.put_state("other", {"v": 1})
    assert store.delete_state(LOCK, condition={"ownerName": "worker-b"}) is False
    assert store.get_state(LOCK) == VALUES
    assert store.delete_state(LOCK, condition={"ownerName": "worker-a", "released": None}) is True
    assert store.get_state(LOCK) is None
    assert store.get_state("other") == {"v": 1}
    assert store.delete_state("other") is True
    assert store.get_state("other") is None


def test_delete_absent_state_is_false(store: LeaseStore) -> None:
    assert store.delete_state(LOCK) is False
    assert store.delete_state(LOCK, condition={"ownerName": None}) is False
