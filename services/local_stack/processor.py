"""The record processor of `--no-spark` agents: counts records and bytes, keeps their keys, checkpoints per batch.

With `SHARDHERD_UP_RECORDS_DIR` set (the stack sets it), each batch's record keys (sequence and sub-sequence number)
are appended to `<dir>/<worker>/<shard>.keys` and flushed before the checkpoint, like the Spark pipeline's Parquet:
at stop the stack counts distinct keys per shard over every agent's files and compares them with what it produced.
A batch replayed after a kill or a move appends the same keys again, so only distinct keys count.

It rejects (raises `NotAProducerRecord` on the batch) a record whose data is not what the stack's producer writes: a
JSON object with `n`, `key` and `t`. That is the poison record of `scenario poison` (decision 0031): every batch
holding it fails, so the shard worker bisects the batch down to it and blocks on it or quarantines it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from shardherd.agent.consumer import Checkpointer, RecordProcessor
from shardherd.agent.records import Record
from shardherd.shared.errors import ShardherdError

RECORDS_DIR_ENV = "SHARDHERD_UP_RECORDS_DIR"
KEYS_SUFFIX = ".keys"
PRODUCER_FIELDS = frozenset({"n", "key", "t"})


class NotAProducerRecord(ShardherdError, ValueError):
    """A record whose data is not a producer record (a JSON object with n, key and t): the processor rejects it."""


def check_record(record: Record) -> None:
    """NotAProducerRecord unless `record` holds what the stack's producer writes."""
    try:
        body = json.loads(record.data)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not body.keys() >= PRODUCER_FIELDS:
        raise NotAProducerRecord(f"record {record.sequence_number}/{record.sub_sequence_number} of "
                                 f"{record.shard_id} is not a producer record (a JSON object with n, key and t): "
                                 f"{record.data[:40]!r}")


class CountingProcessor(RecordProcessor):
    """A stand-in for real work: the agent's heartbeat already reports records and lag; this makes them durable."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        directory = os.environ.get(RECORDS_DIR_ENV)
        worker = os.environ.get("SHARDHERD_WORKER_ID", str(os.getpid()))
        self._out = Path(directory) / worker if directory else None

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        """Check, count the batch, keep its keys (when asked to) and checkpoint its last record."""
        if not records:
            return
        for record in records:
            check_record(record)
        self.records += len(records)
        self.bytes += sum(len(record.data) for record in records)
        if self._out is not None:
            self._out.mkdir(parents=True, exist_ok=True)
            with open(self._out / f"{records[0].shard_id}{KEYS_SUFFIX}", "a", encoding="ascii") as keys:
                keys.writelines(f"{record.sequence_number} {record.sub_sequence_number}\n" for record in records)
        checkpointer.checkpoint(records[-1])


def distinct_keys(directory: Path) -> dict[str, int]:
    """Distinct records per shard over every agent's key files under `directory` (empty if there is none)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for path in directory.glob(f"*/*{KEYS_SUFFIX}"):
        seen[path.name.removesuffix(KEYS_SUFFIX)].update(path.read_text(encoding="ascii").splitlines())
    return {shard: len(keys) for shard, keys in sorted(seen.items())}
