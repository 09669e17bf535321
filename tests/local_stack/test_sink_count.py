"""`up`'s live count of the records in the agents' output: read incrementally, equal to the distinct count."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardherd.services.local_stack.pipeline import distinct_records
from shardherd.services.local_stack.processor import distinct_keys
from shardherd.services.local_stack.status import SinkCount


def test_key_files_are_counted_as_they_grow_and_a_line_being_written_waits(tmp_path: Path) -> None:
    count = SinkCount(tmp_path, parquet=False)
    assert count.total() == 0
    (tmp_path / "agent-1").mkdir()
    (tmp_path / "agent-2").mkdir()
    first = tmp_path / "agent-1" / "shardId-0.keys"
    first.write_text("1:0\n2:0\n")
    (tmp_path / "agent-2" / "shardId-1.keys").write_text("9:0\n")
    assert count.total() == 3 == sum(distinct_keys(tmp_path).values())
    with first.open("a") as keys:
        keys.write("3:0\n4:")  # the agent is in the middle of a line
    assert count.total() == 4
    with first.open("a") as keys:
        keys.write("0\n")
    assert count.total() == 5 == sum(distinct_keys(tmp_path).values())


def test_committed_parquet_files_are_counted_once(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")

    def write(path: Path, shard: str, sequences: list[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"shard_id": [shard] * len(sequences), "sequence_number": sequences,
                                 "sub_sequence_number": [0] * len(sequences)}), path)

    count = SinkCount(tmp_path, parquet=True)
    write(tmp_path / "agent-1" / "part-0.parquet", "shardId-0", ["1", "2", "3"])
    assert count.total() == 3
    write(tmp_path / "agent-2" / "part-0.parquet", "shardId-1", ["7", "8"])
    write(tmp_path / "agent-2" / "_temporary" / "0" / "part-1.parquet", "shardId-1", ["9"])  # not committed yet
    assert count.total() == 5 == sum(distinct_records(tmp_path).values())
