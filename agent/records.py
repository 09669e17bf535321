"""Records as the consumer sees them: one per user record, KPL aggregates expanded, with their checkpoint."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shardherd.agent.kpl import BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_aggregate
from shardherd.shared.checkpoint import Checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Record:
    """One user record read from a shard; for a KPL aggregate, `sub_sequence_number` is its index in the aggregate.

    `sub_record_count` is how many user records its Kinesis record holds (1 unless aggregated), so a reader knows
    whether a checkpoint at this record covers the whole Kinesis record.
    """

    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    explicit_hash_key: str | None
    approximate_arrival_timestamp: datetime | None
    data: bytes
    aggregated: bool
    sub_record_count: int = 1

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint meaning "processed up to and including this record"."""
        return Checkpoint(self.sequence_number, self.sub_sequence_number)

    @property
    def completes_kinesis_record(self) -> bool:
        """True if this is the last user record of its Kinesis record (always, when not aggregated)."""
        return self.sub_sequence_number == self.sub_record_count - 1


class DeaggregationCounters:
    """Counts aggregates that could not be decoded (each was delivered as one raw record); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._broken = 0

    @property
    def broken_aggregates(self) -> int:
        """Aggregates delivered raw because they were broken."""
        with self._lock:
            return self._broken

    def count_broken(self) -> None:
        """Note one more broken aggregate."""
        with self._lock:
            self._broken += 1


def records_from_kinesis(shard_id: str, raw: Mapping[str, Any], counters: DeaggregationCounters) -> list[Record]:
    """The user records of one GetRecords item: the aggregate's records, or the item itself when not aggregated.

    A broken aggregate is delivered as one raw record (sub-sequence 0, `aggregated` False), logged and counted.
    """
    data: bytes = raw["Data"]
    sequence = str(raw["SequenceNumber"])
    partition_key = str(raw["PartitionKey"])
    arrival: datetime | None = raw.get("ApproximateArrivalTimestamp")
    if is_aggregate(data):
        try:
            users = decode_aggregate(data)
        except BrokenAggregate as exc:
            counters.count_broken()
            log.warning("shard %s record %s: broken KPL aggregate delivered as one raw record: %s",
                        shard_id, sequence, exc)
        else:
            count = len(users)
            return [
                Record(shard_id, sequence, index, user.partition_key, user.explicit_hash_key, arrival, user.data,
                       True, count)
                for index, user in enumerate(users)
            ]
    return [Record(shard_id, sequence, 0, partition_key, None, arrival, data, False)]
