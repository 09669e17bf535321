"""The record processor of `--no-spark` agents: counts records and bytes, checkpoints after every batch."""

from __future__ import annotations

from agent.consumer import Checkpointer, RecordProcessor
from agent.records import Record


class CountingProcessor(RecordProcessor):
    """A stand-in for real work: the agent's heartbeat already reports records and lag; this makes them durable."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        """Count the batch and checkpoint its last record."""
        if not records:
            return
        self.records += len(records)
        self.bytes += sum(len(record.data) for record in records)
        checkpointer.checkpoint(records[-1])
