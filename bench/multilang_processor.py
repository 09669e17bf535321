"""The record processor bench/multilang.py runs under both daemons: amazon_kclpy v3 and the standard library only.

Each batch is appended to the file named by SHARDHERD_TEST_LEDGER in tests/support/file_ledger.py's line format
(`shard sequence sub worker time data`, flushed, not fsynced: the daemons, not the disk, should be the bottleneck),
then checkpointed at its last record; shutdownRequested and shardEnded checkpoint too.
"""

from __future__ import annotations

import os
import time
from typing import Any

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


class LedgerLines(processor.RecordProcessorBase):  # type: ignore[misc]
    """Appends each batch to the ledger, then checkpoints at its last record."""

    def __init__(self) -> None:
        self.ledger = open(os.environ["SHARDHERD_TEST_LEDGER"], "a", encoding="utf-8")  # noqa: SIM115
        self.worker = os.environ.get("KCL_TEST_WORKER_ID", "?")
        self.shard_id = "?"

    def initialize(self, initialize_input: Any) -> None:
        self.shard_id = initialize_input.shard_id

    def process_records(self, process_records_input: Any) -> None:
        records = process_records_input.records
        if not records:
            return
        now = f"{time.time():.3f}"
        self.ledger.write("".join(
            f"{self.shard_id} {r.sequence_number} {r.sub_sequence_number or 0} {self.worker} {now} "
            f"{r.binary_data.decode()}\n" for r in records))
        self.ledger.flush()
        last = records[-1]
        process_records_input.checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)

    def lease_lost(self, lease_lost_input: Any) -> None:
        """Nothing to checkpoint once the lease is gone."""

    def shard_ended(self, shard_ended_input: Any) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        shutdown_requested_input.checkpointer.checkpoint()


if __name__ == "__main__":
    kcl.KCLProcess(LedgerLines()).run()
