"""Driver-side probes: is anything waiting after a held shard's checkpoint? One GetRecords of Limit 1, no payloads.

Kinesis has no cheap "latest sequence number", and Spark's micro-batch contract makes the driver decide, before
anything is read, whether a batch runs. The probe answers only that: one GetRecords with Limit 1 from an iterator
at the shard's resume position (at most one record, whose payload is the only one the driver ever fetches). It
never fixes where a batch ends: the executors do (agent/spark/batch_ends.py). The iterator comes from the last
read (its NextShardIterator) or the last empty probe; GetShardIterator is called only when a shard has none (a
lease just arrived) or it expired. A shard known to have records waiting is not probed at all.

A probe that got no answer (an error answer, throttling included, or its deadline) is a *failed* read, as a plain
agent's read is (agent/stall_watch.py invariant 3, decision 0026's session-23 amendment): a throttled shard turns red
and is given back on the plain agent's bounds, and it is probed again only after a backoff
(agent/spark/probe_schedule.py `ProbeBackoff`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.reader import ReaderStats, own_fault
from shardherd.agent.spark.kinesis_raw import IteratorExpired, RawKinesis
from shardherd.agent.spark.kinesis_records import skip_covered
from shardherd.shared.streams import read_target

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What a probe saw at a position: records waiting (with the first one's arrival), the shard's end, an iterator.

    `iterator` is an iterator at the probed position (to keep for the next probe or read); `failed` marks a probe
    that could not read, `failure` says why and `own` whether the refusal was of this worker's credentials.
    """

    pending: bool = False
    ended: bool = False
    iterator: str | None = None
    behind_millis: int | None = None
    first_arrival: float | None = None
    failed: bool = False  # the read did not answer: no progress for the lease (agent/stall_watch.py)
    failure: str | None = None  # why it failed (throttling too: a failed read, agent/stall_watch.py)
    own: bool = False  # it failed on this worker's credentials (agent/reader.py own_fault)


class Prober:
    """Probes held shards at their resume positions with GetRecords(Limit=1)."""

    def __init__(self, kinesis: RawKinesis, stream_name: str) -> None:
        self._kinesis = kinesis
        self._stream = stream_name

    def probe(self, shard_id: str, position: StartPosition, iterator: str | None,
              stats: ReaderStats | None = None) -> ProbeResult:
        """One GetRecords of one record at `position` (plus GetShardIterator without a live `iterator`).

        Never raises: any failure, throttling included, is a failed probe (logged; the shard is probed again after
        a backoff), so the probing thread cannot die of one and leave held shards unplanned. Its calls and throttles
        count in `stats`.
        """
        try:
            return self._probe(shard_id, position, iterator, stats)
        except Exception as exc:  # read errors, throttling, credentials that fail to refresh, a body not JSON, ...
            log.warning("probe of %s failed: %s: %s", shard_id, type(exc).__name__, exc)
            own = any(own_fault(error) for error in (exc, exc.__cause__) if error is not None)
            return ProbeResult(failed=True, failure=f"{type(exc).__name__}: {exc}", own=own)

    def _probe(self, shard_id: str, position: StartPosition, iterator: str | None,
               stats: ReaderStats | None) -> ProbeResult:
        if position.at_shard_end:
            return ProbeResult(ended=True)
        skip = position.skips_through if iterator is None else None
        if iterator is None:
            iterator = self._iterator(shard_id, position, stats)
        try:
            response = self._kinesis.get_records(iterator, 1, stats)
        except IteratorExpired:
            skip = position.skips_through
            iterator = self._iterator(shard_id, position, stats)
            response = self._kinesis.get_records(iterator, 1, stats)
        records = response.get("Records", [])
        if records and not skip_covered(records, skip):
            # An AT_SEQUENCE_NUMBER iterator (a new lease) answered the checkpoint's own record, fully covered:
            # one more call from after it says whether anything follows.
            iterator = response.get("NextShardIterator")
            if iterator is None:
                return ProbeResult(ended=True)
            response = self._kinesis.get_records(iterator, 1, stats)
            records = response.get("Records", [])
        following: str | None = response.get("NextShardIterator")
        behind = response.get("MillisBehindLatest")
        behind_millis = None if behind is None else int(behind)
        if records:
            arrival = records[0].get("ApproximateArrivalTimestamp")
            return ProbeResult(True, iterator=iterator, behind_millis=behind_millis,
                               first_arrival=None if arrival is None else float(arrival))
        ended = following is None or bool(response.get("ChildShards"))
        return ProbeResult(ended=ended, iterator=following, behind_millis=behind_millis)

    def _iterator(self, shard_id: str, position: StartPosition, stats: ReaderStats | None) -> str:
        stream, shard = read_target(shard_id, self._stream)  # a multi-stream source key names its stream
        return self._kinesis.get_shard_iterator(stream, shard, position.iterator_arguments(), stats)
