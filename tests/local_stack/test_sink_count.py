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


def test_the_control_scenarios_count_spark_parquet_rows_per_record_and_see_a_redelivery(tmp_path: Path) -> None:
    """`scenario rewind` and `pause` on a Spark stack count the pipeline's Parquet rows (before: their counts were
    skipped and a rewind there reported every record as never delivered)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from shardherd.services.local_stack.control_scenarios import RedeliveryWatch, sink_counts

    def batch(driver: str, name: str, sequences: list[str]) -> None:
        (tmp_path / driver).mkdir(exist_ok=True)
        pq.write_table(pa.table({"shard_id": ["shardId-1"] * len(sequences), "sequence_number": sequences,
                                 "sub_sequence_number": [0] * len(sequences)}), tmp_path / driver / name)

    batch("agent-1", "part-0.parquet", ["10", "11"])
    watch = RedeliveryWatch(tmp_path)
    batch("agent-2", "part-0.parquet", ["12"])
    assert watch.first == {}
    watch._read(record=True)
    assert watch.first == {}  # a record not delivered before is no redelivery
    batch("agent-2", "part-1.parquet", ["11"])
    (tmp_path / "agent-2" / "_temporary").mkdir()  # a batch being written is not counted yet
    watch._read(record=True)
    assert set(watch.first) == {"shardId-1"}
    assert sink_counts(tmp_path) == {("shardId-1", "10 0"): 1, ("shardId-1", "11 0"): 2, ("shardId-1", "12 0"): 1}


def test_a_rewinds_counts_tell_once_more_from_missing_thrice_early_and_never() -> None:
    from collections import Counter

    from shardherd.services.local_stack.control_scenarios import RewindCounts

    def key(n: int) -> tuple[str, str]:
        return ("shardId-1", f"{n} 0")

    held = {key(n): float(n) for n in range(10)}  # record n arrived at time n; the rewind goes to 4, asked at 8
    before = Counter({key(n): 1 for n in range(8)})  # 0-7 delivered before the command; 8 and 9 arrived later
    after = Counter({key(n): 1 for n in range(10)})
    after.update([key(3)])  # before the time, yet delivered again
    after.update([key(4), key(5), key(6)])  # once more
    after.update([key(5)])  # ... and once more again: three times in all
    counts = RewindCounts.of(held, before, after, to=4.0, asked=8.0)
    assert counts == RewindCounts(window=4, once_more=2, short=1, thrice=1, earlier=1, skipped=0)  # 7: not again
    del after[key(0)]
    assert RewindCounts.of(held, before, after, to=4.0, asked=8.0).skipped == 1
