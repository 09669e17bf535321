"""Driver-side probes: the records waiting after a held shard's checkpoint, as segments with fixed last records.

Kinesis has no cheap "latest sequence number", and a batch's end must be fixed before anything is read (so a re-read
gives the same rows). The probe therefore follows each shard with its own iterator from the frontier (the end of the
last segment it found, else the checkpoint) and notes, per GetRecords response, the last record's sequence number
(and, for a KPL aggregate, its last sub-sequence), how many records and bytes came, and when the first arrived. It
never decodes payloads except the last record's when it is an aggregate. An idle shard costs one GetRecords per
probe; shards are probed in parallel, so a probe round takes about one call's time whatever the shard count.
"""

from __future__ import annotations

import binascii
import logging
from dataclasses import dataclass
from typing import Any

from shardherd.agent.kpl import BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_aggregate
from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.channel import Segment
from shardherd.agent.spark.kinesis_raw import IteratorExpired, RawKinesis
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.streams import read_target

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What a probe saw after a frontier: a new segment, the shard's end, and the lag at the frontier (or it failed)."""

    segment: Segment | None = None
    ended: bool = False
    behind_millis: int | None = None
    failed: bool = False  # the read did not answer: no progress for the lease (agent/stall_watch.py)


def data_size(encoded: str) -> int:
    """Bytes of a base64 payload, without decoding it."""
    return len(encoded) * 3 // 4 - encoded.endswith("=") - encoded.endswith("==")


def last_sub_sequence(record: dict[str, Any]) -> int:
    """The sub-sequence number of a Kinesis record's last user record (0 unless it is a KPL aggregate)."""
    data = binascii.a2b_base64(record["Data"])
    if not is_aggregate(data):
        return 0
    try:
        return len(decode_aggregate(data)) - 1
    except BrokenAggregate:
        return 0  # delivered raw, as one record


def segment_of(records: list[dict[str, Any]]) -> Segment:
    """The segment one GetRecords response holds (records non-empty, in shard order)."""
    last = records[-1]
    arrival = records[0].get("ApproximateArrivalTimestamp")
    return Segment(Checkpoint.at(str(last["SequenceNumber"]), last_sub_sequence(last)), len(records),
                   sum(data_size(record["Data"]) for record in records),
                   None if arrival is None else float(arrival))


def skip_covered(records: list[dict[str, Any]], skip: Checkpoint | None) -> list[dict[str, Any]]:
    """Drop the record at an AT_SEQUENCE_NUMBER start if the checkpoint covers all of its user records."""
    if skip is None or not records or str(records[0]["SequenceNumber"]) != skip.sequence_number:
        return records
    if last_sub_sequence(records[0]) <= skip.sub_sequence_number:
        return records[1:]
    return records


class Prober:
    """Probes held shards from their frontiers; one kept iterator per shard.

    Two probes of one shard at once are harmless: each keeps a consistent (position, iterator) pair, and the book
    ignores a result from a frontier it has left.
    """

    def __init__(self, kinesis: RawKinesis, stream_name: str) -> None:
        self._kinesis = kinesis
        self._stream = stream_name
        self._iterators: dict[str, tuple[StartPosition, str | None]] = {}

    def probe(self, shard_id: str, frontier: StartPosition, limit: int) -> ProbeResult:
        """One GetRecords of at most `limit` records after `frontier` (plus an iterator when the frontier moved).

        Never raises: any failure is a failed probe (logged; the shard is probed again next round), so the probing
        thread cannot die of one and leave held shards unplanned.
        """
        try:
            return self._probe(shard_id, frontier, limit)
        except Exception as exc:  # read errors, credentials that fail to refresh, a body that is not JSON, ...
            log.warning("probe of %s failed: %s: %s", shard_id, type(exc).__name__, exc)
            self._iterators.pop(shard_id, None)
            return ProbeResult(failed=True)

    def _probe(self, shard_id: str, frontier: StartPosition, limit: int) -> ProbeResult:
        if frontier.at_shard_end:
            return ProbeResult(ended=True)
        kept = self._iterators.get(shard_id)
        skip = None
        if kept is None or kept[0] != frontier:
            stream, shard = read_target(shard_id, self._stream)  # a multi-stream source key names its stream
            iterator: str | None = self._kinesis.get_shard_iterator(stream, shard, frontier.iterator_arguments())
            skip = frontier.skips_through
        else:
            iterator = kept[1]
        if iterator is None:
            return ProbeResult(ended=True)
        try:
            response = self._kinesis.get_records(iterator, limit)
        except IteratorExpired:
            self._iterators.pop(shard_id, None)
            return ProbeResult()
        records = skip_covered(response.get("Records", []), skip)
        following: str | None = response.get("NextShardIterator")
        behind = response.get("MillisBehindLatest")
        if records:
            segment = segment_of(records)
            self._iterators[shard_id] = (StartPosition.after(segment.end, record_complete=True), following)
            return ProbeResult(segment, behind_millis=None if behind is None else int(behind))
        self._iterators[shard_id] = (frontier, following)
        ended = following is None or bool(response.get("ChildShards"))
        return ProbeResult(ended=ended, behind_millis=None if behind is None else int(behind))

    def forget(self, shard_id: str) -> None:
        """Drop the iterator kept for a shard no longer held."""
        self._iterators.pop(shard_id, None)
