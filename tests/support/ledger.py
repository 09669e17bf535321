"""A record processor that writes every record it handles to a thread-safe ledger, for loss and duplicate checks."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

from shardherd.agent.consumer import Checkpointer, RecordProcessor
from shardherd.agent.records import Record
from shardherd.shared.checkpoint import Checkpoint


@dataclass
class Ledger:
    """(shard, sequence, sub-sequence, data) per worker, in processing order."""

    entries: list[tuple[str, str, int, bytes, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, worker: str, records: list[Record]) -> None:
        with self.lock:
            for record in records:
                self.entries.append((record.shard_id, record.sequence_number, record.sub_sequence_number,
                                     record.data, worker))

    def payloads(self) -> list[bytes]:
        with self.lock:
            return [entry[3] for entry in self.entries]

    def by_shard(self) -> dict[str, list[tuple[int, int]]]:
        shards: dict[str, list[tuple[int, int]]] = defaultdict(list)
        with self.lock:
            for shard, sequence, sub, _, _ in self.entries:
                shards[shard].append((int(sequence), sub))
        return shards

    def workers_of(self, shard: str) -> list[str]:
        with self.lock:
            return [entry[4] for entry in self.entries if entry[0] == shard]


class LedgerProcessor(RecordProcessor):
    """Appends each batch to the ledger, then checkpoints it (so its output is 'durable' before the checkpoint)."""

    def __init__(self, ledger: Ledger, worker: str) -> None:
        self.ledger = ledger
        self.worker = worker
        self.started_at: Checkpoint | None = None

    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        self.started_at = start

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if records:
            self.ledger.add(self.worker, records)
            checkpointer.checkpoint(records[-1])
