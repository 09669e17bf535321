"""Read-ahead of one batch against kinesalite: the same batches in the same order, errors in their place, stop."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shardherd.agent.prefetch import Prefetcher
from shardherd.agent.read_spec import ReadLimits, StartPosition
from shardherd.agent.reader import ShardNotFound, ShardReader
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import SystemClock
from tests.agent.test_reader import new_stream
from tests.coordinator.conftest import kinesis_client

LIMITS = ReadLimits(records_per_call=7, min_call_interval=0.0, idle_backoff=0.05)


def reader(kinesis: Any, stream: str, shard: str) -> ShardReader:
    return ShardReader(kinesis, stream, shard, StartPosition.after(TRIM_HORIZON), LIMITS, SystemClock())


def test_batches_come_out_as_the_reader_makes_them_and_stop_ends_the_thread(kinesalite: NodeEmulator) -> None:
    kinesis = kinesis_client(kinesalite.endpoint_url)
    stream, shards = new_stream(kinesis, 1)
    kinesis.put_records(StreamName=stream, Records=[{"Data": f"d{i}".encode(), "PartitionKey": "k"}
                                                    for i in range(30)])
    ahead = Prefetcher(reader(kinesis, stream, shards[0]["ShardId"]), "prefetch-test")
    data: list[bytes] = []
    while len(data) < 30:
        batch = ahead.read_batch()
        assert len(batch.records) <= 7
        data.extend(record.data for record in batch.records)
    assert data == [f"d{i}".encode() for i in range(30)]
    ahead.stop()
    assert ahead.read_batch().records == []  # at once, without a call
    deadline = time.monotonic() + 2
    while any(t.name == "prefetch-test" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "prefetch-test" for t in threading.enumerate())


def test_a_read_error_is_raised_by_read_batch(kinesalite: NodeEmulator) -> None:
    kinesis = kinesis_client(kinesalite.endpoint_url)
    stream, _ = new_stream(kinesis, 1)
    ahead = Prefetcher(reader(kinesis, stream, "shardId-000000000099"), "prefetch-missing")
    with pytest.raises(ShardNotFound):
        ahead.read_batch()
    ahead.stop()
