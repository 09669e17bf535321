"""A record processor for agent subprocesses: appends every record to the file named by SHARDHERD_TEST_LEDGER."""

from __future__ import annotations

import os

from shardherd.agent.consumer import Checkpointer, RecordProcessor
from shardherd.agent.records import Record
from tests.support.ledger_lines import LEDGER_ENV, append_to_ledger, read_ledger

__all__ = ["LEDGER_ENV", "FileLedgerProcessor", "append_to_ledger", "read_ledger"]


class FileLedgerProcessor(RecordProcessor):
    """Writes `shard sequence sub worker time data` lines (flushed) before checkpointing each batch."""

    def __init__(self) -> None:
        self.path = os.environ[LEDGER_ENV]
        self.worker = os.environ.get("SHARDHERD_WORKER_ID", "?")

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if not records:
            return
        append_to_ledger(self.path, self.worker,
                         [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.data) for r in records])
        checkpointer.checkpoint(records[-1])
