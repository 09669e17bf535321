"""The local stack's example pipeline in local Spark: a batch's rows land as they are, one file per core."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shardherd.agent.spark.schema import schema_ddl
from shardherd.services.local_stack.pipeline import KEY, write_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark]


def test_a_batch_is_written_without_a_shuffle_one_file_per_core_and_hides_no_duplicate(
        spark: SparkSession, tmp_path: Path) -> None:
    import pyarrow.dataset as ds  # type: ignore[import-untyped]

    arrived = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    rows = [(f"shardId-{shard:012d}", str(100 + index), 0, "key", arrived, b"x" * index, "orders")
            for shard in range(8) for index in range(5)]
    rows.append(rows[0])  # a duplicate key inside one batch is a bug upstream: the counts must see it
    batch = spark.createDataFrame(rows, schema_ddl(False)).repartition(8, "shard_id")  # a partition per shard
    target = tmp_path / "records" / "agent-1"

    write_records(target)(batch, 0)

    files = sorted(target.glob("*.parquet"))
    assert 1 <= len(files) <= spark.sparkContext.defaultParallelism  # coalesced: not a file per shard
    table = ds.dataset(target, format="parquet").to_table(columns=[*KEY, "bytes"])
    assert table.num_rows == len(rows)
    assert sorted(zip(*(table.column(name).to_pylist() for name in [*KEY, "bytes"]), strict=True)) == sorted(
        (row[0], row[1], row[2], len(row[5])) for row in rows)
