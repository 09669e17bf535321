"""The example pipeline's Spark-free count: distinct records per shard across drivers' Parquet directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardherd.services.local_stack.pipeline import distinct_records, records_dir

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(path: Path, rows: list[tuple[str, str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    shard, sequence, sub = zip(*rows, strict=True)
    table = pa.table({"shard_id": list(shard), "sequence_number": list(sequence),
                      "sub_sequence_number": pa.array(sub, pa.int64()),
                      "bytes": pa.array([10] * len(rows), pa.int32())})
    pq.write_table(table, path)


def test_a_replayed_batch_on_another_driver_counts_once(tmp_path: Path) -> None:
    out = tmp_path / "shard-counts"
    # agent-1 wrote a batch, died before its checkpoint; agent-2 read the same records again, then more.
    write(records_dir(out, "agent-1") / "part-0.parquet", [("s-0", "100", 0), ("s-0", "100", 1), ("s-1", "7", 0)])
    write(records_dir(out, "agent-2") / "part-0.parquet", [("s-0", "100", 0), ("s-0", "100", 1), ("s-0", "101", 0)])
    # A write in flight is not a record yet.
    write(records_dir(out, "agent-2") / "_temporary" / "0" / "part-1.parquet", [("s-1", "8", 0)])
    assert distinct_records(out / "records") == {"s-0": 3, "s-1": 1}
    assert distinct_records(records_dir(out, "agent-2")) == {"s-0": 3}


def test_no_records_yet_is_an_empty_count(tmp_path: Path) -> None:
    out = tmp_path / "shard-counts"
    assert distinct_records(out / "records") == {}
    # a stack stopped during its drivers' first batch: directories, and a write in flight, but no Parquet yet
    write(records_dir(out, "agent-1") / "_temporary" / "0" / "part-0.parquet", [("s-0", "1", 0)])
    records_dir(out, "agent-2").mkdir(parents=True)
    assert distinct_records(out / "records") == {}
