"""StoreMeter prices store calls in DynamoDB capacity units by DynamoDB's rules, per caller, table and operation."""

from __future__ import annotations

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import Fence, TableNames
from shardherd.shared.store_meter import (
    INDEX_TABLE,
    StoreMeter,
    acting_as,
    item_size,
    lease_size,
    paged_read_units,
    read_units,
    usage_total,
    worker_size,
    write_units,
)
from shardherd.shared.worker import WorkerRecord


def _meter(consistent: bool = True) -> StoreMeter:
    return StoreMeter(MemoryLeaseStore(TableNames.for_application("meter")), consistent_reads=consistent)


def test_item_sizes_follow_dynamodb_rules() -> None:
    assert item_size({"id": {"S": "abc"}}) == 2 + 3
    assert item_size({"n": {"N": "123"}}) == 1 + 3  # 3 significant digits: ceil(3/2) + 1
    assert item_size({"n": {"N": "1000000"}}) == 1 + 2  # trailing zeros are free
    assert item_size({"n": {"N": "0.001500"}}) == 1 + 2
    assert item_size({"b": {"BOOL": True}}) == 2
    assert item_size({"l": {"L": [{"S": "ab"}, {"N": "7"}]}}) == 1 + 3 + (1 + 2) + (1 + 2)
    assert item_size({"m": {"M": {"k": {"S": "v"}}}}) == 1 + 3 + (1 + 1 + 1)
    assert item_size({"ss": {"SS": ["a", "bc"]}}) == 2 + 3


def test_units_round_up_per_kib_and_per_4_kib() -> None:
    assert write_units(1) == 1 and write_units(1024) == 1 and write_units(1025) == 2
    assert write_units(1025, transactional=True) == 4
    assert read_units(0, True) == 1 and read_units(4097, True) == 2 and read_units(4097, False) == 1
    pages, units = paged_read_units([1000] * 10, 4, consistent=True)  # pages of 4000, 4000, 2000 bytes
    assert (pages, units) == (3, 3.0)


def test_owner_changes_write_the_owner_index_and_fenced_writes_are_doubled() -> None:
    meter = _meter()
    meter.put_state("leader", {"ownerName": "c1", "recordVersionNumber": "x" * 36})
    lease = Lease(lease_key="shardId-000000000001", checkpoint=Checkpoint.at(49))
    with acting_as("leader"):
        meter.create_lease(lease)
        fence = Fence("leader", {"ownerName": "c1"})
        assert meter.assign(lease.lease_key, "w1", None, None, fence=fence).applied
        assert meter.start_handoff(lease.lease_key, "w2", "w1", fence=fence).applied
    with acting_as("agent"):
        assert meter.complete_handoff(lease.lease_key, "w1").applied
        assert meter.checkpoint(lease.lease_key, "w2", Checkpoint.at(50)).applied
        lost = meter.checkpoint(lease.lease_key, "w9", Checkpoint.at(51))
    assert not lost.applied
    rows = meter.rows()
    index = {row.operation: row.write_units for row in rows if row.table == INDEX_TABLE}
    assert index == {"assign": 2.0, "handoff_start": 4.0}  # 1 new entry; 2 (delete + put), both transactional
    assign = usage_total(rows, caller="leader", table=meter.tables.leases, operation="assign")
    assert assign.write_units == 2 + 2 and assign.read_units == 1  # transaction: lease + lock check; re-read
    agent = usage_total(rows, caller="agent", table=meter.tables.leases, operation="checkpoint")
    assert (agent.requests, agent.write_units) == (2, 2.0)  # the lost conditional write is billed too
    assert set(meter.by_caller()) == {"other", "leader", "agent"}


def test_reads_are_half_price_when_eventually_consistent_and_big_items_cost_more() -> None:
    meter = _meter(consistent=False)
    record = WorkerRecord("w1", 1, lease_throughput={f"shardId-{i:012d}": 1.5 for i in range(200)})
    meter.upsert_worker(record)
    for index in range(30):
        meter.create_lease(Lease(lease_key=f"shardId-{index:012d}", lease_owner="w1", checkpoint=Checkpoint.at(1)))
    meter.reset()
    meter.scan_leases()
    meter.list_owned_keys("w1")
    meter.get_state("absent", consistent=False)
    meter.upsert_worker(record)
    rows = meter.rows()
    scan = usage_total(rows, operation="scan", table=meter.tables.leases)
    expected = paged_read_units([lease_size(Lease(lease_key=f"shardId-{i:012d}", lease_owner="w1",
                                                  checkpoint=Checkpoint.at(1))) for i in range(30)], 1000, False)
    assert (scan.requests, scan.read_units) == expected
    assert usage_total(rows, table=INDEX_TABLE).read_units == 0.5
    assert usage_total(rows, operation="get absent").read_units == 0.5
    heartbeat = usage_total(rows, operation="heartbeat")
    # 200 map entries of 1 + 20 + 2 bytes: a heartbeat of this worker costs five write units, not one
    assert heartbeat.write_units == write_units(worker_size(record)) == 5
