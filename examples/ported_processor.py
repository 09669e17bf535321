"""A KCL record processor ported to shardherd: what each KCL callback becomes (docs/migrate-from-kcl.md).

    shardherd agent --processor examples.ported_processor:PortedProcessor

It appends each record's data as a line to `<EXAMPLE_OUTPUT>/<shard id>.txt` and checkpoints once the lines are
flushed, at most every CHECKPOINT_SECONDS, like KCL's samples; a handoff checkpoints at once. KCL's shardEnded and
leaseLost need no code here: `RecordProcessor` checkpoints SHARD_END at a shard's end by default, and a lost shard
leaves nothing to clean up.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from shardherd import Checkpointer, RecordProcessor
from shardherd.agent.records import Record
from shardherd.shared.checkpoint import Checkpoint

CHECKPOINT_SECONDS = 5.0


class PortedProcessor(RecordProcessor):
    """One instance per shard, called from that shard's thread (as KCL calls its ShardRecordProcessor)."""

    def __init__(self) -> None:
        self.output = Path(os.environ.get("EXAMPLE_OUTPUT", "example-output"))
        self.shard_id = ""
        self.last_checkpoint = 0.0

    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        """KCL: initialize, with InitializationInput: the shard and where it resumes (its checkpoint)."""
        self.shard_id = shard_id
        self.output.mkdir(parents=True, exist_ok=True)

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        """KCL: processRecords(ProcessRecordsInput); records already de-aggregated (KPL), in order."""
        if records:
            with (self.output / f"{self.shard_id}.txt").open("a", encoding="utf-8") as out:
                out.writelines(record.data.decode() + "\n" for record in records)
                out.flush()
                os.fsync(out.fileno())
        if records and time.monotonic() - self.last_checkpoint >= CHECKPOINT_SECONDS:
            checkpointer.checkpoint()  # up to the last record delivered; raises LeaseLost if the shard moved
            self.last_checkpoint = time.monotonic()

    def shutdown_requested(self, shard_id: str, checkpointer: Checkpointer) -> None:
        """KCL: shutdownRequested (graceful handoff or stop): the output is durable, so checkpoint all of it."""
        checkpointer.checkpoint()
