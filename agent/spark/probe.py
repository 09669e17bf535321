"""Driver-side probes: whether a held shard has records after its checkpoint, or has ended there.

Kinesis has no cheap "latest sequence number", so the agent asks GetRecords from the checkpoint, keeping one reader
per (shard, checkpoint) so that an idle shard costs one GetRecords per probe and no new iterator. A probe that finds
records stops there; the records themselves are read again by an executor (at most `records_per_call` extra).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.read_spec import ReadLimits, StartPosition
from agent.reader import ShardReader, ShardReadError

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

log = logging.getLogger(__name__)

PROBE_LIMITS = ReadLimits(records_per_call=10, min_call_interval=0.0, idle_backoff=0.0, max_records=1,
                          retry_attempts=3)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What a probe saw after a position: a waiting record (with its arrival time), the shard's end, or nothing."""

    has_records: bool
    next_arrival: float | None = None
    ended: bool = False


class Prober:
    """Probes held shards from their checkpoints; not thread-safe (one probing thread)."""

    def __init__(self, kinesis: KinesisClient, stream_name: str) -> None:
        self._kinesis = kinesis
        self._stream = stream_name
        self._readers: dict[str, tuple[StartPosition, ShardReader]] = {}

    def probe(self, shard_id: str, position: StartPosition) -> ProbeResult:
        """One GetRecords (plus an iterator when the position changed) after `position`."""
        kept = self._readers.get(shard_id)
        if kept is None or kept[0] != position:
            kept = (position, ShardReader(self._kinesis, self._stream, shard_id, position, PROBE_LIMITS))
            self._readers[shard_id] = kept
        reader = kept[1]
        try:
            batch = reader.read_batch()
        except ShardReadError as exc:
            log.warning("probe of %s failed: %s", shard_id, exc)
            self._readers.pop(shard_id, None)
            return ProbeResult(False)
        if batch.records:
            self._readers.pop(shard_id, None)  # the next probe starts from the next checkpoint
            arrival = batch.records[0].approximate_arrival_timestamp
            return ProbeResult(True, arrival.timestamp() if arrival is not None else None)
        if batch.shard_ended:
            self._readers.pop(shard_id, None)
            return ProbeResult(False, ended=True)
        return ProbeResult(False)

    def forget(self, shard_id: str) -> None:
        """Drop the reader kept for a shard no longer held."""
        self._readers.pop(shard_id, None)
