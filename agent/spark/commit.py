"""Checkpointing after the sink: the lease table advances only after a batch was written, to what it wrote.

The user's foreachBatch function is wrapped; checkpoints are computed from the batch's own rows, fenced by ownership.

Order per batch: persist (the source is read once) -> per-shard summary (last record, count, bytes) -> drop rows of
shards this driver no longer holds -> the user's write -> one fenced checkpoint per shard -> unpersist. A lost lease
turns that shard's checkpoint into a logged no-op; the query keeps running for the other shards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from shared.checkpoint import Checkpoint
from shared.errors import ShardherdError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

BatchFunction = Callable[["DataFrame", int], None]


class BadBatchSummary(ShardherdError, ValueError):
    """A batch summary row does not describe a valid position (missing shard, bad sequence number...)."""


@dataclass(frozen=True, slots=True)
class ShardProgress:
    """What one batch did for one shard: the last record (as a checkpoint), how many records and bytes."""

    shard_id: str
    checkpoint: Checkpoint
    records: int
    bytes: int
    last_arrival: float | None


def progress_from_summary(rows: Iterable[Sequence[Any]]) -> list[ShardProgress]:
    """Turn summary rows (shard, last sequence, last sub-sequence, last arrival, records, bytes) into progress.

    Raises BadBatchSummary for a row without a shard or with an impossible position.
    """
    progress = []
    for row in rows:
        shard, sequence, sub, arrival, records, size = row
        if not shard or sequence is None or sub is None:
            raise BadBatchSummary(f"summary row {tuple(row)!r} lacks a shard or a position")
        try:
            checkpoint = Checkpoint.at(str(sequence), int(sub))
        except ValueError as exc:
            raise BadBatchSummary(f"summary row for {shard}: {exc}") from exc
        stamp = arrival.timestamp() if isinstance(arrival, datetime) else None
        progress.append(ShardProgress(str(shard), checkpoint, int(records), int(size or 0), stamp))
    return progress


class ProgressCommitter(Protocol):
    """The driver side the sink reports to (the Spark agent)."""

    def held_shards(self) -> set[str]:
        """Shards whose rows may be written now."""

    def commit_progress(self, batch_id: int, progress: list[ShardProgress]) -> None:
        """Checkpoint each shard's progress, fenced by ownership; never raises for a lost lease."""


def batch_summary(df: DataFrame) -> list[ShardProgress]:
    """Per shard: the greatest (sequence, sub-sequence) by numeric order, the record count and data bytes."""
    from pyspark.sql import functions as F  # noqa: N812

    # Sequence numbers have no leading zeros, so (length, string) orders them numerically.
    last = F.max(F.struct(F.length("sequence_number"), F.col("sequence_number"), F.col("sub_sequence_number"),
                          F.col("arrival_timestamp"))).alias("last")
    rows = (df.groupBy("shard_id")
            .agg(last, F.count(F.lit(1)).alias("records"), F.sum(F.length("data")).alias("bytes"))
            .collect())
    return progress_from_summary(
        (row["shard_id"], row["last"][1], row["last"][2], row["last"][3], row["records"], row["bytes"])
        for row in rows
    )


class CheckpointingSink:
    """A foreachBatch function: runs the user's write on the held shards' rows, then checkpoints what it wrote."""

    def __init__(self, committer: ProgressCommitter, write: BatchFunction) -> None:
        self._committer = committer
        self._write = write

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Process one micro-batch (Spark calls this in the driver process)."""
        from pyspark.sql import functions as F  # noqa: N812

        persisted = df.persist()
        try:
            progress = batch_summary(persisted)
            held = self._committer.held_shards()
            dropped = [item for item in progress if item.shard_id not in held]
            if dropped:
                log.warning("batch %d: not writing %d records of shards no longer held: %s", batch_id,
                            sum(item.records for item in dropped), sorted(item.shard_id for item in dropped))
                persisted_held = persisted.filter(F.col("shard_id").isin(sorted(held)))
            else:
                persisted_held = persisted
            self._write(persisted_held, batch_id)
            self._committer.commit_progress(batch_id, [item for item in progress if item.shard_id in held])
        finally:
            persisted.unpersist()
