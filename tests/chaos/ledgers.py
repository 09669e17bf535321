"""The chaos run's ledgers: deliveries (FileLedgerProcessor's format), checkpoints written, and records produced.

Every agent incarnation writes its own delivery file (so a kill -9 can only tear that file's last line) and, beside
it, a `.ckpt` file with one line per checkpoint the store accepted. The producer writes one line per record Kinesis
acknowledged. Times are wall-clock seconds of the writing process; the analysis corrects a skewed agent's times.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from shardherd.agent.consumer import Checkpointer
from shardherd.agent.records import Record
from tests.support.file_ledger import LEDGER_ENV, FileLedgerProcessor, read_ledger

CHECKPOINT_SUFFIX = ".ckpt"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One record handed to a processor."""

    shard: str
    sequence: int
    sub: int
    worker: str
    time: float
    data: str

    @property
    def position(self) -> tuple[int, int]:
        """(sequence, sub-sequence): the record's order within its shard."""
        return self.sequence, self.sub


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    """A checkpoint the store accepted, as the processor saw it return."""

    shard: str
    sequence: int
    sub: int
    worker: str
    time: float


@dataclass(frozen=True, slots=True)
class Produced:
    """A record Kinesis acknowledged."""

    data: str
    shard: str
    sequence: int
    time: float


def _append(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as ledger:
        ledger.write(text)
        ledger.flush()
        os.fsync(ledger.fileno())


class CheckpointLedgerProcessor(FileLedgerProcessor):
    """FileLedgerProcessor that also notes each accepted checkpoint, so duplicates can be judged against them."""

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        """Ledger the batch and checkpoint it (as the parent does), then note the checkpoint."""
        super().process_records(records, checkpointer, millis_behind_latest)
        if records:
            last = records[-1]
            _append(os.environ[LEDGER_ENV] + CHECKPOINT_SUFFIX,
                    f"{last.shard_id} {last.sequence_number} {last.sub_sequence_number} {self.worker} "
                    f"{time.time():.3f}\n")


def read_deliveries(directory: Path) -> list[Delivery]:
    """Every delivery in every `*.ledger` file of `directory` (torn last lines ignored)."""
    found = []
    for path in sorted(directory.glob("*.ledger")):
        for shard, sequence, sub, worker, at, data in read_ledger(str(path)):
            found.append(Delivery(shard, int(sequence), sub, worker, at, data))
    return found


def read_checkpoints(directory: Path) -> list[CheckpointMark]:
    """Every checkpoint mark in `directory` (torn last lines ignored)."""
    found = []
    for path in sorted(directory.glob("*.ledger" + CHECKPOINT_SUFFIX)):
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            parts = line.split()
            if len(parts) == 5 and line.endswith("\n"):
                found.append(CheckpointMark(parts[0], int(parts[1]), int(parts[2]), parts[3], float(parts[4])))
    return found


class ProducerLedger:
    """Appends every acknowledged put to a file (thread-safe) and reads it back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def add(self, records: list[Produced]) -> None:
        """Append acknowledged records."""
        text = "".join(f"{r.data} {r.shard} {r.sequence} {r.time:.3f}\n" for r in records)
        with self._lock:
            _append(str(self.path), text)

    def read(self) -> list[Produced]:
        """Every record written so far."""
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            data, shard, sequence, at = line.split()
            rows.append(Produced(data, shard, int(sequence), float(at)))
        return rows
