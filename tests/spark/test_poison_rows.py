"""Poison rows of a Spark job (agent/spark/poison_rows.py): rows the job's check rejects are quarantined once and kept
out of its sink, every other row is written once; under `block`, or with too many, the batch fails naming them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardherd.agent.progress import PoisonRecord
from shardherd.agent.quarantine import open_destination
from shardherd.agent.spark.offsets import Caps
from shardherd.agent.spark.poison_rows import MAX_POISON_ROWS, POISON_COLUMN, PoisonRouting, PoisonRowsFailed
from tests.spark.conftest import SparkStack
from tests.support.waiting import wait_for


def reject_poison(data: bytes) -> None:
    """The job's check: a payload it cannot take."""
    if data.startswith(b"poison"):
        raise ValueError(f"cannot parse {data[:20]!r}")


def test_poison_rows_are_quarantined_once_and_every_other_row_written_once(spark_stack: SparkStack,
                                                                           tmp_path: Path) -> None:
    stack = spark_stack
    dead_letters = tmp_path / "dlq"
    dead_letters.mkdir()
    driver = stack.agent("driver-1", caps=Caps(50), poison_policy="quarantine",
                         poison_destination=f"file://{dead_letters}")
    wait_for(lambda: set(stack.owners().values()) == {"driver-1"}, 30, "driver-1 owns every shard")
    stack.produce(60, "plain")
    stack.produce(2, "poison")
    stack.produce(60, "after")
    good = [data for data in stack.produced if not data.startswith(b"poison")]
    query = driver.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp"),
                             processing_time="300 milliseconds", poison_check=reject_poison)
    wait_for(lambda: set(stack.sink.payloads()) >= set(good) and sum(driver.progress.quarantined().values()) == 2,
             120, "every good row written and both poison rows quarantined")
    query.stop()
    counts = stack.sink.payloads()
    assert set(counts) == set(good) and max(counts.values()) == 1  # no poison row in the sink, no good row twice
    destination = open_destination(f"file://{dead_letters}", "us-east-1")
    stored = [destination.get(name) for name in destination.names()]
    assert sorted(record.payload for record in stored) == [b"poison-0", b"poison-1"]
    assert all(record.error.startswith("ValueError: cannot parse") and record.stream == stack.app for record in stored)
    assert set(driver.progress.quarantined()) <= set(stack.owners())  # counted against the shards' leases


def _row(index: int) -> dict[str, object]:
    return {"stream_name": "s", "shard_id": "shardId-0", "sequence_number": str(100 + index), "sub_sequence_number": 0,
            "partition_key": "k", "data": b"poison", "arrival_timestamp": datetime.now(UTC),
            POISON_COLUMN: "ValueError: no"}


def test_block_and_too_many_poison_rows_fail_the_batch_with_nothing_quarantined(tmp_path: Path) -> None:
    counted: list[PoisonRecord] = []
    destination = open_destination(f"file://{tmp_path}", "us-east-1")

    def routing(with_destination: bool) -> PoisonRouting:
        return PoisonRouting(lambda df, batch: None, reject_poison, destination if with_destination else None, "w",
                             lambda stream, shard, record, url: counted.append(record))

    with pytest.raises(PoisonRowsFailed, match=r"1 poison row\(s\) under poison_policy block \(first: shardId-0 100/0"):
        routing(False)._set_apart([_row(0)], 7)  # type: ignore[list-item]
    with pytest.raises(PoisonRowsFailed, match=f"more than {MAX_POISON_ROWS} rows fail"):
        routing(True)._set_apart([_row(index) for index in range(MAX_POISON_ROWS + 1)], 8)  # type: ignore[misc]
    assert counted == [] and list(destination.names()) == []
    routing(True)._set_apart([_row(0)], 9)  # type: ignore[list-item]
    assert counted == [PoisonRecord("100", 0)] and len(list(destination.names())) == 1
