"""The per-shard limits model on a fake clock: each AWS limit throttles exactly where AWS documents it."""

from __future__ import annotations

import hashlib

import pytest

from shardherd.services.emulators.hash_routing import NoShardForKey, ShardMap, hash_key
from shardherd.services.emulators.throttle_model import (
    GET_RECORDS,
    MIB,
    READ_THROTTLED,
    WRITE_THROTTLED,
    ShardKey,
    ThrottleModel,
)
from shardherd.shared.clock import ManualClock

SHARD = ShardKey("orders", "shardId-000000000000")
OTHER = ShardKey("orders", "shardId-000000000001")


def test_five_get_records_calls_per_second_shared_by_every_caller() -> None:
    clock = ManualClock()
    model = ThrottleModel(clock)
    admitted = [model.admit_read(SHARD, caller) for caller in ("spark", "kcl", "spark", "kcl", "spark", "kcl")]
    assert admitted == [True] * 5 + [False]
    assert model.admit_read(OTHER, "kcl")  # another shard has its own budget
    clock.advance(0.999)
    assert not model.admit_read(SHARD, "spark")
    clock.advance(0.002)
    assert model.admit_read(SHARD, "spark")
    snapshot = model.snapshot()
    assert snapshot["callers"]["kcl"][READ_THROTTLED] == 1  # type: ignore[index]
    assert snapshot["callers"]["spark"][READ_THROTTLED] == 1  # type: ignore[index]
    assert snapshot["shards"][str(SHARD)][GET_RECORDS] == 6  # type: ignore[index]


def test_a_10_mib_answer_throttles_the_next_five_seconds() -> None:
    clock = ManualClock()
    model = ThrottleModel(clock)
    assert model.admit_read(SHARD, "a")
    model.served(SHARD, "a", 10_000, 10 * MIB)
    for _ in range(49):
        clock.advance(0.1)
        assert not model.admit_read(SHARD, "b")
    clock.advance(0.11)
    assert model.admit_read(SHARD, "b")


def test_two_mib_per_second_is_averaged_over_five_seconds() -> None:
    clock = ManualClock()
    model = ThrottleModel(clock)
    for _ in range(25):  # 1.9 MiB/s in 5 calls/s of 0.38 MiB: always admitted
        assert model.admit_read(SHARD, "a")
        model.served(SHARD, "a", 100, int(0.38 * MIB))
        clock.advance(0.2)
    for _ in range(25):  # 2.5 MiB/s: throttled once 10 MiB were read in the last 5 s
        if model.admit_read(SHARD, "a"):
            model.served(SHARD, "a", 100, MIB // 2)
        clock.advance(0.2)
    throttled = model.snapshot()["shards"][str(SHARD)][READ_THROTTLED]  # type: ignore[index]
    assert 3 <= throttled <= 8


def test_writes_are_limited_to_one_mib_and_a_thousand_records_per_second() -> None:
    clock = ManualClock()
    model = ThrottleModel(clock)
    assert all(model.admit_write(SHARD, "p", 10) for _ in range(1000))
    assert not model.admit_write(SHARD, "p", 10)
    clock.advance(1.0)
    assert model.admit_write(SHARD, "p", MIB - 10)
    assert model.admit_write(SHARD, "p", 10)
    assert not model.admit_write(SHARD, "p", 1)  # 1 MiB written in the last second
    assert model.admit_write(OTHER, "p", MIB)
    assert model.snapshot()["callers"]["p"][WRITE_THROTTLED] == 2  # type: ignore[index]


def test_get_shard_iterator_has_its_own_five_per_second() -> None:
    clock = ManualClock()
    model = ThrottleModel(clock)
    assert [model.admit_iterator(SHARD, "a") for _ in range(6)] == [True] * 5 + [False]
    assert model.admit_read(SHARD, "a")  # GetRecords' budget is separate
    clock.advance(1.0)
    assert model.admit_iterator(SHARD, "a")


def test_records_are_routed_by_md5_of_the_partition_key_or_the_explicit_hash_key() -> None:
    half = 2**127
    shards = [
        {"ShardId": "shardId-000000000001",
         "HashKeyRange": {"StartingHashKey": str(half), "EndingHashKey": str(2**128 - 1)},
         "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "shardId-000000000000", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(half - 1)},
         "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "shardId-000000000009", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)},
         "SequenceNumberRange": {"StartingSequenceNumber": "1", "EndingSequenceNumber": "2"}},  # closed: ignored
    ]
    shard_map = ShardMap.from_list_shards(shards)
    for key in ("a", "b", "user-17", "zzz"):
        expected = "shardId-000000000000" if int(hashlib.md5(key.encode()).hexdigest(), 16) < half \
            else "shardId-000000000001"
        assert shard_map.shard_for(hash_key(key)) == expected
    assert shard_map.shard_for(hash_key("a", str(half))) == "shardId-000000000001"
    assert shard_map.shard_for(hash_key("a", "0")) == "shardId-000000000000"
    with pytest.raises(NoShardForKey):
        ShardMap.from_list_shards(shards[:1]).shard_for(0)
