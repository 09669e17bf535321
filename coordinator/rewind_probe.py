"""Find, in one shard, the last record before a time: the Kinesis reads behind a rewind (coordinator/rewind.py).

Kinesis can start a read at a time (AT_TIMESTAMP) but not just before it, so the probe starts a little earlier and
reads forward to the first record at or after the time, widening the look-back (2 s, 30 s, 5 min, 1 h, then the
retention window) only while it found nothing before the time. Every call has the client's deadline; Kinesis'
throttling (the shard's 5 GetRecords calls/s are shared with the agents reading it) is retried after a growing wait
(THROTTLE_WAITS, on the caller's clock); a shard it still cannot read raises ProbeFailed, and the rewind writes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from shardherd.agent.kpl import BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_aggregate
from shardherd.coordinator.rewind_positions import Found
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.errors import ShardherdError

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

LOOK_BACK_SECONDS = (2.0, 30.0, 300.0, 3600.0)
# Records per GetRecords call: small at first (the time is usually a few records in), doubling up to Kinesis' limit.
FIRST_LIMIT = 100
MAX_LIMIT = 10_000
MAX_CALLS = 500  # GetRecords calls per look-back before the probe gives up (a very busy shard)
THROTTLE_WAITS = (0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0)  # seconds before each retry of a throttled call (~9 s in all)
_THROTTLED = frozenset({"ProvisionedThroughputExceededException", "LimitExceededException"})

T = TypeVar("T")


class ProbeFailed(ShardherdError):
    """A shard could not be read around the time (gone, throttled past the retries, too busy to search)."""


def retention_hours(kinesis: KinesisClient, stream: str) -> int:
    """The stream's retention period in hours (ProbeFailed if the stream cannot be described)."""
    try:
        summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    except (ClientError, BotoCoreError) as exc:
        raise ProbeFailed(f"stream {stream} cannot be described: {exc}") from None
    return int(summary["RetentionPeriodHours"])


def unthrottled(call: Callable[[], T], clock: Clock) -> T:
    """`call()`, retried after each of THROTTLE_WAITS while Kinesis throttles it (the last refusal is raised)."""
    for wait in THROTTLE_WAITS:
        try:
            return call()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _THROTTLED:
                raise
        clock.sleep(wait)
    return call()


def probe(kinesis: KinesisClient, stream: str, shard: str, when: datetime, now: datetime, retention: int,
          clock: Clock | None = None) -> Found:
    """What the shard holds around `when`: the last record before it, whether any follows, whether it is closed.

    ProbeFailed (with Kinesis' reason) when the shard cannot be read.
    """
    try:
        return _probe(kinesis, stream, shard, when, now, retention, clock or SystemClock())
    except (ClientError, BotoCoreError) as exc:
        raise ProbeFailed(f"{stream}/{shard} cannot be read around {when.isoformat()}: {exc}") from None


def _probe(kinesis: KinesisClient, stream: str, shard: str, when: datetime, now: datetime, retention: int,
           clock: Clock) -> Found:
    oldest = now - timedelta(hours=retention)
    closed = False
    for seconds in (*LOOK_BACK_SECONDS, (when - oldest).total_seconds()):
        start = max(when - timedelta(seconds=seconds), oldest)
        last, after, closed = _read_around(kinesis, stream, shard, start, when, clock)
        if last is not None or start <= oldest:
            return Found(last, after, closed, before_retention=when < oldest)
    return Found(None, True, closed, before_retention=when < oldest)


def _read_around(kinesis: KinesisClient, stream: str, shard: str, start: datetime,
                 when: datetime, clock: Clock) -> tuple[Checkpoint | None, bool, bool]:
    """Read from `start` to the first record at or after `when`: (last before it, found one after, shard closed)."""
    iterator: str | None = unthrottled(lambda: kinesis.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="AT_TIMESTAMP", Timestamp=start), clock)["ShardIterator"]
    last: Checkpoint | None = None
    limit = FIRST_LIMIT
    for _ in range(MAX_CALLS):
        if iterator is None:
            return last, False, True
        response: dict[str, Any] = dict(unthrottled(partial(kinesis.get_records, ShardIterator=iterator, Limit=limit),
                                                    clock))
        limit = min(MAX_LIMIT, limit * 2)
        for record in response.get("Records", []):
            if record["ApproximateArrivalTimestamp"] >= when:
                return last, True, False
            last = _whole(record)
        iterator = response.get("NextShardIterator")
        if not response.get("Records") and response.get("MillisBehindLatest", 0) == 0 and iterator is not None:
            return last, False, False  # read up to now
    raise ProbeFailed(f"{stream}/{shard}: more than {MAX_CALLS} reads to reach {when.isoformat()}")


def _whole(record: dict[str, Any]) -> Checkpoint:
    """The checkpoint covering a whole Kinesis record (its last user record, when aggregated)."""
    data: bytes = record["Data"]
    subs = 1
    if is_aggregate(data):
        try:
            subs = len(decode_aggregate(data))
        except BrokenAggregate:  # delivered as one record, as the agent's reader does
            subs = 1
    return Checkpoint.at(record["SequenceNumber"], max(0, subs - 1))
