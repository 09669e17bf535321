"""An amazon_kclpy record processor that the Java MultiLangDaemon runs, one process per shard.

It appends every record to the ledger file named by SHARDHERD_TEST_LEDGER with tests/support/file_ledger.py (the
same lines shardherd's test agents write; the daemon's environment puts the repository on PYTHONPATH), then
checkpoints after the
batch's last record, so a crash can only repeat the batch that was being written. It checkpoints again when KCL asks
it to shut down (graceful stop or lease handoff) and at the end of a shard.
"""

from __future__ import annotations

import os
from typing import Any

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

from tests.support.ledger_lines import LEDGER_ENV, append_to_ledger

WORKER_ENV = "KCL_TEST_WORKER_ID"


class LedgerProcessor(processor.RecordProcessorBase):  # type: ignore[misc]
    """Writes each batch to the ledger, then checkpoints at its last record."""

    def __init__(self) -> None:
        self.path = os.environ[LEDGER_ENV]
        self.worker = os.environ.get(WORKER_ENV, "kcl")
        self.shard_id = "?"

    def initialize(self, initialize_input: Any) -> None:
        self.shard_id = initialize_input.shard_id

    def process_records(self, process_records_input: Any) -> None:
        records = process_records_input.records
        if not records:
            return
        append_to_ledger(self.path, self.worker, [
            (self.shard_id, r.sequence_number, r.sub_sequence_number or 0, r.binary_data) for r in records])
        last = records[-1]
        process_records_input.checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)

    def lease_lost(self, lease_lost_input: Any) -> None:
        """Nothing to do: a lost lease cannot be checkpointed any more."""

    def shard_ended(self, shard_ended_input: Any) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        shutdown_requested_input.checkpointer.checkpoint()


if __name__ == "__main__":
    kcl.KCLProcess(LedgerProcessor()).run()
