"""Checkpointing after the sink: the lease table advances only after a batch was written, to its recorded end.

The user's foreachBatch function is wrapped. A batch's plan (Spark's offset log entry for the batch) fixes each
shard's start; its first read records where it stopped (agent/spark/batch_ends.py) before any row leaves, and every
read of the plan gives the same rows, so the checkpoint a written batch earns is that recorded end: known without
looking at the data, so the user's write is the batch's only Spark job (no persist, no summary job, no cached block
whose loss could let a checkpoint pass records never written).

Order per batch: mark the planned shards held under the plan's tenure and not handing off as being written -> drop
rows of the others -> the user's write -> each shard still held under that tenure moves on to its recorded end in
the driver's book (the next plan starts there) -> one fenced checkpoint per shard, stored in the background
(shards under handoff first), each shard unmarked right after its own checkpoint was stored, which completes its
handoff if one waited for it. A handoff requested before the write started excludes the shard from it, so it
completes at once, never waiting for a batch. A lost lease turns that shard's checkpoint into a logged no-op; the
query keeps running for the other shards. A failed write checkpoints nothing and reaches Spark as
a `BatchWriteFailed` with a bounded message (agent/spark/write_errors.py).

Stopping: `close()` lets the batch being written finish and makes later batches return without writing, so the
query's stop interrupts no write (which would leave the sink's `_temporary` directory behind). A batch not written is
not checkpointed: the shard's next owner reads it from the lease's checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from shardherd.agent.spark.offsets import BatchOffset, InvalidOffset, ShardPlan
from shardherd.agent.spark.write_errors import BatchWriteFailed, is_interruption, summary
from shardherd.shared.streams import read_target

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

BatchFunction = Callable[["DataFrame", int], None]


class ProgressCommitter(Protocol):
    """The driver side the sink reports to (the Spark agent)."""

    def begin_write(self, plans: list[ShardPlan]) -> list[ShardPlan]:
        """The plans whose rows may be written (held under the plan's tenure, not handing off), now in flight."""

    def commit_progress(self, batch_id: int, plans: list[ShardPlan]) -> None:
        """Move each written plan's shard to its end; store the checkpoints (fenced) and end each plan's write after.

        The checkpoints may be stored after this returns; each plan's write ends once its own checkpoint is stored,
        so a handoff waiting for a shard completes right then. It never raises for a lost lease.
        """

    def end_write(self, plans: list[ShardPlan]) -> None:
        """The write of `plans` ended (checkpointed or failed): handoffs waiting for it complete now."""


def offset_log_entry(text: str) -> BatchOffset:
    """The source offset in one Spark offset log file ("v1", metadata, then one line per source: ours is first)."""
    lines = text.splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise InvalidOffset(f"not a Spark offset log entry: {text[:120]!r}")
    return BatchOffset.from_json(lines[2])


def logged_end_offset(spark: SparkSession, checkpoint_location: str, batch_id: int) -> BatchOffset:
    """The end offset Spark logged for `batch_id` before running it (read through Hadoop FS: any checkpoint store)."""
    jvm = spark._jvm  # the Hadoop FileSystem is reached through the session's JVM
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint_location.rstrip('/')}/offsets/{batch_id}")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    stream = fs.open(path)
    try:
        text = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
    return offset_log_entry(text)


class CheckpointingSink:
    """A foreachBatch function: runs the user's write on the held shards' rows, then checkpoints the plan's ends."""

    def __init__(self, committer: ProgressCommitter, write: BatchFunction, checkpoint_location: str) -> None:
        self._committer = committer
        self._write = write
        self._location = checkpoint_location
        self._idle = threading.Condition()
        self._in_flight = 0
        self._closing = False

    def close(self, timeout: float) -> bool:
        """Write no further batch; wait up to `timeout` s for the one being written. False if it still runs."""
        with self._idle:
            self._closing = True
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Process one micro-batch (Spark calls this in the driver process); none once the sink is closed."""
        with self._idle:
            if self._closing:
                log.info("batch %d: not written, the query is stopping (not checkpointed)", batch_id)
                return
            self._in_flight += 1
        try:
            self._process(df, batch_id)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def _process(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        began = time.monotonic()
        end = logged_end_offset(df.sparkSession, self._location, batch_id)
        held = self._committer.begin_write(list(end.shards.values()))
        try:
            if len(held) < len(end.shards):
                gone = sorted(set(end.shards) - {plan.shard_id for plan in held})
                log.info("batch %d: not writing rows of shards no longer held or handing off: %s", batch_id, gone)
                targets = [read_target(plan.shard_id, "") for plan in held]
                if all(stream == "" for stream, _ in targets):  # single-stream: shard ids are unique
                    df = df.filter(F.col("shard_id").isin([shard for _, shard in targets]))
                else:
                    df = df.filter(F.concat_ws("/", "stream_name", "shard_id").isin(
                        [f"{stream}/{shard}" for stream, shard in targets]))
            self._write(df, batch_id)
        except Exception as exc:
            # Spark gets a short copy (write_errors explains why); the whole error stays in this log.
            if is_interruption(exc):
                log.info("batch %d: the write was interrupted (the query is stopping); not checkpointed", batch_id)
            else:
                log.error("batch %d: the write failed; not checkpointed", batch_id, exc_info=exc)
            self._committer.end_write(held)
            raise BatchWriteFailed(f"batch {batch_id} not written: {summary(exc)}") from None
        written = time.monotonic()
        self._committer.commit_progress(batch_id, held)
        log.debug("batch %d: shards %s read and written in %.3f s, checkpointed in %.3f s", batch_id,
                  ",".join(plan.shard_id for plan in held), written - began, time.monotonic() - written)
