"""An amazon_kclpy application as users write them, run per shard by `shardherd multilang` (or KCL's daemon).

Environment (set by the tests): MULTILANG_API v2 or v3 (which amazon_kclpy processor base), MULTILANG_CHECKPOINT
`sequence` (checkpoint at the batch's last record, with its sub-sequence) or `bare` (checkpoint() without arguments),
MULTILANG_CRASH_ONCE a record payload at which the process exits once (a marker file next to the ledger remembers
it did), MULTILANG_POISON a record payload at which the process exits every time (a poison record),
MULTILANG_PROBE: also ask for a checkpoint beyond the batch and note the error name in the ledger's side file.
Every record goes to the ledger (tests/support/file_ledger.py) before the checkpoint, so a crash only repeats.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from amazon_kclpy import kcl
from amazon_kclpy.v2 import processor as v2
from amazon_kclpy.v3 import processor as v3

from tests.support.ledger_lines import LEDGER_ENV, append_to_ledger

WORKER = os.environ.get("MULTILANG_WORKER", os.environ.get("SHARDHERD_WORKER_ID", "multilang"))


class Ledger:
    """What both API versions share: the ledger, the checkpoint style, the crash and the probe."""

    def __init__(self) -> None:
        self.path = os.environ[LEDGER_ENV]
        self.shard_id = "?"
        self.bare = os.environ.get("MULTILANG_CHECKPOINT", "sequence") == "bare"
        self.crash_at = os.environ.get("MULTILANG_CRASH_ONCE")
        self.poison = os.environ.get("MULTILANG_POISON")
        self.probe = bool(os.environ.get("MULTILANG_PROBE"))

    def note(self, text: str) -> None:
        with open(self.path + ".notes", "a", encoding="utf-8") as notes:
            notes.write(f"{self.shard_id} {text}\n")

    def started(self, initialize_input: Any) -> None:
        self.shard_id = initialize_input.shard_id
        self.note(f"initialize {initialize_input.sequence_number} {initialize_input.sub_sequence_number}")

    def handle(self, records: list[Any], checkpointer: Any) -> None:
        if not records:
            return
        marker = Path(self.path + ".crashed")
        for record in records:
            if self.crash_at and record.binary_data.decode() == self.crash_at and not marker.exists():
                marker.write_text(self.shard_id)
                sys.stderr.write(f"crashing at {self.crash_at}\n")
                os._exit(3)
            if self.poison and record.binary_data.decode() == self.poison:
                sys.stderr.write(f"cannot process {self.poison}\n")
                os._exit(4)
        append_to_ledger(self.path, WORKER, [
            (self.shard_id, r.sequence_number, r.sub_sequence_number or 0, r.binary_data) for r in records])
        last = records[-1]
        if self.probe:
            try:
                checkpointer.checkpoint(str(int(last.sequence_number) + 1), 0)
            except kcl.CheckpointError as error:
                self.note(f"probe {error.value}")
        if self.bare:
            checkpointer.checkpoint()
        else:
            checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)

    def finish(self, what: str, checkpointer: Any) -> None:
        self.note(what)
        if checkpointer is not None:
            checkpointer.checkpoint()


class Delegating:
    """initialize and process_records, the same in both API versions."""

    def __init__(self) -> None:
        self.ledger = Ledger()

    def initialize(self, initialize_input: Any) -> None:
        self.ledger.started(initialize_input)

    def process_records(self, process_records_input: Any) -> None:
        self.ledger.handle(process_records_input.records, process_records_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        self.ledger.finish("shutdownRequested", shutdown_requested_input.checkpointer)


class V3App(Delegating, v3.RecordProcessorBase):  # type: ignore[misc]
    """The amazon_kclpy v3 interface (leaseLost, shardEnded, shutdownRequested)."""

    def lease_lost(self, lease_lost_input: Any) -> None:
        self.ledger.note("leaseLost")

    def shard_ended(self, shard_ended_input: Any) -> None:
        self.ledger.finish("shardEnded", shard_ended_input.checkpointer)


class V2App(Delegating, v2.RecordProcessorBase):  # type: ignore[misc]
    """The amazon_kclpy v2 interface (shutdown with a reason)."""

    def shutdown(self, shutdown_input: Any) -> None:
        reason = shutdown_input.reason
        self.ledger.finish(f"shutdown {reason}", shutdown_input.checkpointer if reason == "TERMINATE" else None)


if __name__ == "__main__":
    app = V2App() if os.environ.get("MULTILANG_API") == "v2" else V3App()
    kcl.KCLProcess(app).run()
