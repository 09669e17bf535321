"""DynamoDB codecs: KCL's exact item format in and out, malformed rows reported untouched, non-lease items skipped."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from shardherd.shared.checkpoint import LATEST, SHARD_END, Checkpoint
from shardherd.shared.dynamo.lease_codec import decode_lease, encode_lease, is_lease_item
from shardherd.shared.dynamo.state_codec import decode_state, encode_state, encode_value
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.dynamo.worker_codec import decode_worker
from shardherd.shared.errors import MalformedLease, MalformedWorker, StoreError
from shardherd.shared.lease import Lease
from shardherd.shared.store import StateValue, TableNames
from shardherd.shared.worker import WorkerRecord, WorkerState
from tests.support.stores import unique_app

LONG_SEQUENCE = "9" * 128 + "7"  # 129 digits, beyond any 64-bit or double representation

# A lease as KCL 3.x (before 3.5: no entityType) stores it, attribute types as KCL's serializer writes them.
KCL_ITEM: dict[str, Any] = {
    "leaseKey": {"S": "shardId-000000000042"},
    "leaseOwner": {"S": "worker-a"},
    "leaseCounter": {"N": "17"},
    "ownerSwitchesSinceCheckpoint": {"N": "2"},
    "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
    "checkpointSubSequenceNumber": {"N": "3"},
    "parentShardId": {"SS": ["shardId-000000000007", "shardId-000000000008"]},
    "startingHashKey": {"S": "0"},
    "endingHashKey": {"S": "170141183460469231731687303715884105727"},
    "throughputKBps": {"N": "1024.5"},
}


def full_lease() -> Lease:
    return Lease(
        lease_key="acct:stream:1700000000:shardId-000000000001",
        lease_owner="worker-b",
        lease_counter=123456789012,
        checkpoint=Checkpoint.at(LONG_SEQUENCE, 5),
        owner_switches_since_checkpoint=4,
        pending_checkpoint=Checkpoint.at(LONG_SEQUENCE, 9),
        pending_checkpoint_state=b"\x00\xffstate\n",
        parent_shard_ids=frozenset({"shardId-000000000000"}),
        child_shard_ids=frozenset({"shardId-000000000002", "shardId-000000000003"}),
        starting_hash_key="0",
        ending_hash_key="340282366920938463463374607431768211455",
        throughput_kbps=12.345678,
        checkpoint_owner="worker-a",
        stream_name="acct:stream:1700000000",
        shard_id="shardId-000000000001",
    )


# ------------------------------------------------------------------------------------------ pure lease codec
def test_every_attribute_round_trips() -> None:
    lease = full_lease()
    item = encode_lease(lease)
    assert decode_lease(item) == lease
    assert item["checkpoint"] == {"S": LONG_SEQUENCE}
    assert item["pendingCheckpointState"] == {"B": b"\x00\xffstate\n"}
    assert item["childShardIds"] == {"SS": ["shardId-000000000002", "shardId-000000000003"]}
    assert item["parentShardId"] == {"SS": ["shardId-000000000000"]}


def test_kcl_item_is_read_and_written_back_unchanged() -> None:
    lease = decode_lease(KCL_ITEM)
    assert lease.lease_counter == 17
    assert lease.checkpoint == Checkpoint.at("49590338271490256608559692538361571095921575989136588898", 3)
    assert lease.parent_shard_ids == {"shardId-000000000007", "shardId-000000000008"}
    assert lease.throughput_kbps == 1024.5
    assert lease.checkpoint_owner is None and lease.pending_checkpoint is None
    assert encode_lease(lease) == KCL_ITEM


def test_empty_fields_are_omitted_like_kcl() -> None:
    item = encode_lease(Lease("shardId-1", checkpoint=LATEST))
    assert set(item) == {"leaseKey", "leaseCounter", "checkpoint", "checkpointSubSequenceNumber",
                         "ownerSwitchesSinceCheckpoint"}


@pytest.mark.parametrize(("value", "stored"), [
    (1.0000005, "1.000001"),  # HALF_UP at the 7th decimal
    (12.3456784, "12.345678"),
    (0.00000025, "0"),
    (3.0, "3"),
    (1e-6, "0.000001"),  # never exponent notation
])
def test_throughput_is_rounded_half_up_to_six_decimals(value: float, stored: str) -> None:
    assert encode_lease(Lease("k", throughput_kbps=value))["throughputKBps"] == {"N": stored}


def test_non_finite_throughput_is_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        encode_lease(Lease("k", throughput_kbps=float("nan")))


@seed(20240601)
@settings(max_examples=200, deadline=None)
@given(digits=st.text(alphabet="0123456789", min_size=1, max_size=129), sub=st.integers(0, 2**63 - 1),
       pending=st.booleans())
def test_sequence_numbers_round_trip_exactly(digits: str, sub: int, pending: bool) -> None:
    checkpoint = Checkpoint.at(digits, sub)
    lease = Lease("k", checkpoint=checkpoint, pending_checkpoint=checkpoint if pending else None)
    decoded = decode_lease(encode_lease(lease))
    assert decoded.checkpoint.sequence_number == digits  # leading zeros and all 129 digits kept as stored
    assert decoded == lease


@pytest.mark.parametrize(("change", "key", "reason"), [
    ({"leaseKey": None}, None, "leaseKey is missing"),
    ({"leaseKey": {"N": "5"}}, None, "leaseKey is missing"),
    ({"leaseCounter": {"S": "17"}}, "shardId-000000000042", "leaseCounter must be of type N"),
    ({"leaseCounter": {"N": "1.5"}}, "shardId-000000000042", "leaseCounter must be an integer"),
    ({"checkpoint": {"S": "12ab"}}, "shardId-000000000042", "neither a sentinel"),
    ({"checkpoint": None}, "shardId-000000000042", "checkpoint is missing"),
    ({"checkpoint": {"S": "SHARD_END"}}, "shardId-000000000042", "cannot carry sub-sequence"),
    ({"checkpointSubSequenceNumber": {"N": "-1"}}, "shardId-000000000042", "non-negative"),
    ({"parentShardId": {"S": "shardId-000000000007"}}, "shardId-000000000042", "parentShardId must be of type SS"),
    ({"pendingCheckpointSubSequenceNumber": {"N": "1"}}, "shardId-000000000042", "pendingCheckpoint is missing"),
    ({"throughputKBps": {"N": "NaN"}}, "shardId-000000000042", "throughputKBps"),
    ({"pendingCheckpointState": {"S": "text"}}, "shardId-000000000042", "must be of type B"),
])
def test_malformed_items_name_the_key_and_the_reason(change: dict[str, Any], key: str | None,
                                                       reason: str) -> None:
    item = {**KCL_ITEM, **change}
    item = {name: value for name, value in item.items() if value is not None}
    with pytest.raises(MalformedLease) as raised:
        decode_lease(item)
    assert raised.value.lease_key == key
    assert reason in raised.value.reason


def test_entity_type_tells_leases_from_other_single_table_items() -> None:
    assert is_lease_item(KCL_ITEM)
    assert is_lease_item({**KCL_ITEM, "entityType": {"S": "LEASE"}})
    assert not is_lease_item({"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"}})
    assert not is_lease_item({"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}})


# ------------------------------------------------------------------------------------------ worker and state codecs
def test_kcl_worker_item_reads_with_shardherd_defaults() -> None:
    item: dict[str, Any] = {"wid": {"S": "w1"}, "lut": {"N": "1700000000"},
            "sts": {"M": {"C": {"L": [{"N": "12.5"}, {"N": "-1"}, {"N": "40"}]}}},
            "opr": {"M": {"C": {"L": [{"N": "100"}]}}}}
    record = decode_worker(item)
    assert record == WorkerRecord("w1", 1700000000, {"C": (12.5, -1.0, 40.0)}, {"C": (100.0,)})
    assert record.heartbeat == 0 and record.state is WorkerState.ACTIVE and not record.drain_requested


@pytest.mark.parametrize(("item", "worker_id", "reason"), [
    ({"wid": {"S": "w1"}, "lut": {"S": "1700000000"}}, "w1", "lut must be of type N"),
    ({"lut": {"N": "1"}}, None, "wid is missing"),
    ({"wid": {"S": "w1"}, "lut": {"N": "1"}, "sts": {"M": {"C": {"N": "1"}}}}, "w1", "sts.C must be of type L"),
    ({"wid": {"S": "w1"}, "lut": {"N": "1"}, "workerState": {"S": "GONE"}}, "w1", "workerState 'GONE'"),
    ({"wid": {"S": "w1"}, "lut": {"N": "1"}, "leaseProgress": {"M": {"s-1": {"M": {"poison": {"M": {
        "blocked": {"N": "7"}}}}}}}}, "w1", "leaseProgress.s-1.poison.blocked must be of type S"),
])
def test_malformed_worker_items_name_the_worker(item: dict[str, Any], worker_id: str | None, reason: str) -> None:
    with pytest.raises(MalformedWorker) as raised:
        decode_worker(item)
    assert raised.value.worker_id == worker_id
    assert reason in raised.value.reason


def test_state_values_round_trip_with_their_types() -> None:
    attributes: dict[str, StateValue] = {"ownerName": "w1", "leaseDuration": "120000", "epoch": 2**70,
                                         "data": b"\x01\x02"}
    item = encode_state("Leader", attributes)
    assert item["epoch"] == {"N": str(2**70)} and item["data"] == {"B": b"\x01\x02"}
    assert decode_state(item) == attributes


def test_state_codec_rejects_what_it_cannot_represent() -> None:
    with pytest.raises(TypeError):
        encode_value(True)
    with pytest.raises(ValueError, match="hash key"):
        encode_state("Leader", {"key": "other"})
    with pytest.raises(StoreError, match="unsupported type"):
        decode_state({"key": {"S": "Migration3.0"}, "h": {"L": []}})
    with pytest.raises(StoreError, match="must be an integer"):
        decode_state({"key": {"S": "x"}, "n": {"N": "1.5"}})


# ------------------------------------------------------------------------------------------ against moto
@pytest.fixture
def dynamo_store(dynamodb_client: Any) -> Any:
    store = DynamoLeaseStore(dynamodb_client, TableNames.for_application(unique_app("codec")))
    store.ensure_tables()
    yield store
    store.close()


def raw_item(client: Any, table: str, key: str) -> dict[str, Any]:
    item: dict[str, Any] = client.get_item(TableName=table, Key={"leaseKey": {"S": key}},
                                           ConsistentRead=True)["Item"]
    return item


def test_kcl_written_lease_is_continued_keeping_its_format(dynamo_store: DynamoLeaseStore,
                                                           dynamodb_client: Any) -> None:
    table = dynamo_store.tables.leases
    written = {**KCL_ITEM, "someFutureKclAttribute": {"S": "keep me"}}
    dynamodb_client.put_item(TableName=table, Item=written)
    lease = dynamo_store.get_lease("shardId-000000000042")
    assert lease == decode_lease(KCL_ITEM)

    renewed = dynamo_store.renew(lease.lease_key, "worker-a", 17)
    assert renewed.applied
    later = Checkpoint.at("49590338271490256608559692538361571095921575989136588899")
    assert dynamo_store.checkpoint(lease.lease_key, "worker-a", later).applied

    after = raw_item(dynamodb_client, table, lease.lease_key)
    expected = {**written, "leaseCounter": {"N": "19"}, "ownerSwitchesSinceCheckpoint": {"N": "0"},
                "checkpoint": {"S": later.sequence_number}, "checkpointSubSequenceNumber": {"N": "0"}}
    assert after == expected  # same types (parentShardId still SS), unknown attributes kept, nothing else added


def test_malformed_rows_are_listed_by_scan_and_left_untouched(dynamo_store: DynamoLeaseStore,
                                                              dynamodb_client: Any) -> None:
    table = dynamo_store.tables.leases
    malformed = {
        "bad-counter": {**KCL_ITEM, "leaseKey": {"S": "bad-counter"}, "leaseCounter": {"S": "17"}},
        "bad-checkpoint": {**KCL_ITEM, "leaseKey": {"S": "bad-checkpoint"}, "checkpoint": {"S": "12ab"}},
        "bad-parents": {**KCL_ITEM, "leaseKey": {"S": "bad-parents"}, "parentShardId": {"N": "7"}},
    }
    other_entities = {
        "worker-1": {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"},
                     "lut": {"N": "1"}},
        "Leader": {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "ownerName": {"S": "w"}},
    }
    for item in [*malformed.values(), *other_entities.values()]:
        dynamodb_client.put_item(TableName=table, Item=item)
    for index in range(3):
        assert dynamo_store.create_lease(Lease(f"shardId-{index}")).applied

    scan = dynamo_store.scan_leases(page_size=2)

    assert sorted(lease.lease_key for lease in scan.leases) == ["shardId-0", "shardId-1", "shardId-2"]
    assert sorted(str(error.lease_key) for error in scan.malformed) == sorted(malformed)
    for key, item in {**malformed, **other_entities}.items():
        assert raw_item(dynamodb_client, table, key) == item
    with pytest.raises(MalformedLease) as raised:
        dynamo_store.get_lease("bad-checkpoint")
    assert raised.value.lease_key == "bad-checkpoint"
    assert dynamo_store.get_lease("worker-1") is None
    assert dynamo_store.get_lease("Leader") is None


def test_lease_writes_never_touch_other_single_table_entities(dynamo_store: DynamoLeaseStore,
                                                              dynamodb_client: Any) -> None:
    table = dynamo_store.tables.leases
    worker = {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"}, "lut": {"N": "1"}}
    dynamodb_client.put_item(TableName=table, Item=worker)
    outcome = dynamo_store.assign("worker-1", "w", None, None)
    assert not outcome.applied and outcome.conflict.name == "NOT_FOUND"
    assert not dynamo_store.create_lease(Lease("worker-1")).applied
    assert raw_item(dynamodb_client, table, "worker-1") == worker


def test_a_kcl_rows_pending_checkpoint_keeps_its_types_until_a_checkpoint(dynamo_store: DynamoLeaseStore,
                                                                          dynamodb_client: Any) -> None:
    table = dynamo_store.tables.leases
    pending = {"pendingCheckpoint": {"S": LONG_SEQUENCE}, "pendingCheckpointSubSequenceNumber": {"N": "4"},
               "pendingCheckpointState": {"B": b"\x00state"}}
    dynamodb_client.put_item(TableName=table, Item={
        "leaseKey": {"S": "shardId-1"}, "leaseOwner": {"S": "w"}, "leaseCounter": {"N": "3"},
        "checkpoint": {"S": "TRIM_HORIZON"}, "checkpointSubSequenceNumber": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"}, **pending})
    read = dynamo_store.get_lease("shardId-1")
    assert read is not None and read.pending_checkpoint == Checkpoint.at(LONG_SEQUENCE, 4)
    assert dynamo_store.renew("shardId-1", "w", 3, throughput_kbps=1.0).applied
    assert dynamo_store.assign("shardId-1", "w2", "w", None).applied
    item = raw_item(dynamodb_client, table, "shardId-1")
    assert {name: item[name] for name in pending} == pending  # byte for byte, in KCL's types
    assert dynamo_store.checkpoint("shardId-1", "w2", SHARD_END).applied
    item = raw_item(dynamodb_client, table, "shardId-1")
    assert not set(pending) & set(item)
