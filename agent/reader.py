"""ShardReader: reads one shard with GetRecords, within Kinesis' limits, and hands out de-aggregated batches.

The plain agent and Spark executors share it. It starts from a StartPosition (usually built from a lease
checkpoint), and paces GetRecords by whether it is caught up: after a call that left it at the stream's tip (no
records, or MillisBehindLatest 0 on a page that was not full) it waits `idle_backoff` (1 s: one call per shard per
second); while behind it calls again after `min_call_interval` and after the bytes just read are paid for at
`read_bytes_per_second`, its share of the shard's limits (docs/decisions/0029-kinesis-limits-model.md). It retries
throttling and transient failures with jittered backoff on an injected clock (counting throttles), refreshes an expired
iterator from the last delivered position, and detects the end of a closed shard three ways: no
`NextShardIterator` (AWS, kinesalite), `ChildShards` in the response (kinesis-local), or an optional lookup of the
shard's `EndingSequenceNumber` (moto, which never signals shard end on its own).

A GetRecords that hit its read deadline (agent/read_deadline.py) is asked again for MIN_RECORDS_PER_CALL records, and
each call that answers doubles the ask back towards `records_per_call` (as TCP's slow start): a server that builds a
large page before its first byte (kinesalite on a loaded host took over 30 s for 10,000 records and 7 s for 100, the
scale run's hot shards) otherwise never answers within the deadline, and the shard is never read. Halving instead
took seven timed-out calls to get there, longer than the stall watch waits for reads that only fail.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from shardherd.agent.read_spec import ENDED, ReadLimits, ReadSpec, StartPosition
from shardherd.agent.records import DeaggregationCounters, Record, records_from_kinesis
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.dynamo.errors import error_code, is_transient
from shardherd.shared.errors import ShardherdError
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient
    from mypy_boto3_kinesis.type_defs import GetRecordsOutputTypeDef

log = logging.getLogger(__name__)
T = TypeVar("T")

_EXPIRED = "ExpiredIteratorException"
_THROTTLED = "ProvisionedThroughputExceededException"
_KINESIS_TRANSIENT = frozenset({"KMSThrottlingException"})
# Answers rejecting the caller's credentials: a failed read that is this worker's own fault, never the shard's
# (agent/stall_watch.py, invariant 4).
_CREDENTIAL_CODES = frozenset({"ExpiredTokenException", "ExpiredToken", "UnrecognizedClientException",
                               "AccessDeniedException", "InvalidSignatureException", "IncompleteSignature",
                               "InvalidClientTokenId", "MissingAuthenticationToken"})
MIN_RECORDS_PER_CALL = 100  # the ask after a call that hit its read deadline

EndingSequenceLookup = Callable[[], str | None]


class ShardReadError(ShardherdError):
    """GetShardIterator or GetRecords failed for a non-transient reason (bad request, access denied, KMS...)."""


class ShardNotFound(ShardReadError, LookupError):
    """The stream or shard does not exist (or is not visible with these credentials)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """What one GetRecords call delivered: user records in order, lag, whether the shard ended, where to go on.

    `next_position` resumes just after the last record delivered (ENDED once the shard has ended).
    """

    records: list[Record]
    millis_behind_latest: int | None
    shard_ended: bool
    next_position: StartPosition

    @property
    def data_bytes(self) -> int:
        """Bytes of user data in the batch (what throughput metrics count)."""
        return sum(len(record.data) for record in self.records)


@dataclass(slots=True)
class ReaderStats:
    """Counters of one reader's calls, for metrics and tests."""

    get_records_calls: int = 0
    iterators_requested: int = 0
    transient_failures: int = 0
    expired_iterators: int = 0
    throttled: int = 0  # calls Kinesis refused with ProvisionedThroughputExceededException (retried after a backoff)


class ShardReader:
    """Reads one shard from a start position; call `read_batch` repeatedly or iterate `batches()`; `stop()` ends it.

    Not thread-safe except for `stop()`, which may be called from any thread.
    """

    def __init__(
        self,
        client: KinesisClient,
        stream_name: str,
        shard_id: str,
        start: StartPosition,
        limits: ReadLimits | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        ending_sequence_number: EndingSequenceLookup | None = None,
        counters: DeaggregationCounters | None = None,
        stats: ReaderStats | None = None,
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._client = client
        self._failed = failed  # told of each failed call but an expired iterator (agent/stall_watch.py)
        self.stream_name = stream_name
        self.shard_id = shard_id
        self._limits = limits or ReadLimits()
        self._ask = self._limits.records_per_call  # records asked per GetRecords: small again after a call timed out
        self._asked = self._ask  # the ask of the last call made (a page that filled it is not the stream's tip)
        self._clock = clock or SystemClock()
        self._retry = RetryPolicy(
            max_attempts=self._limits.retry_attempts,
            base_delay=self._limits.retry_base_delay,
            max_delay=self._limits.retry_max_delay,
            clock=self._clock,
            rng=rng or random.Random(),
        )
        self._ending_lookup = ending_sequence_number
        self.counters = counters or DeaggregationCounters()
        self.stats = stats or ReaderStats()  # a caller's own, to keep counting across readers of one lease
        self._position = start
        self._iterator: str | None = None
        self._skip_through: Checkpoint | None = None
        self._next_call_at = self._clock.monotonic()
        self._next_closed_check_at = self._next_call_at
        self._ending_sequence: int | None = None
        self._ended = start.at_shard_end
        self._caught_up = False
        self._delivered = 0
        self._stop = threading.Event()
        self.millis_behind_latest: int | None = None

    @classmethod
    def open(
        cls,
        spec: ReadSpec,
        clock: Clock | None = None,
        client: KinesisClient | None = None,
        ending_sequence_number: EndingSequenceLookup | None = None,
    ) -> ShardReader:
        """A reader for `spec`, with a new boto3 client for its endpoint and region unless one is given."""
        kinesis: KinesisClient = client or make_client("kinesis", spec.region, spec.endpoint_url)
        return cls(kinesis, spec.stream_name, spec.shard_id, spec.position, spec.limits, clock,
                   ending_sequence_number=ending_sequence_number)

    @property
    def position(self) -> StartPosition:
        """Where reading would resume: just after the last record delivered (ENDED after shard end)."""
        return self._position

    @property
    def done(self) -> bool:
        """True once the shard ended, the reader stopped, `max_records` were delivered or it caught up (if asked)."""
        limit = self._limits.max_records
        return (
            self._ended
            or self._stop.is_set()
            or (limit is not None and self._delivered >= limit)
            or (self._limits.stop_when_caught_up and self._caught_up)
        )

    def stop(self) -> None:
        """Stop reading: a sleeping or later `read_batch` returns an empty batch, and `batches()` ends."""
        self._stop.set()

    def batches(self) -> Iterator[Batch]:
        """Batches until `done` (empty ones included, so callers see lag and can heartbeat while idle)."""
        while not self.done:
            yield self.read_batch()

    def read_batch(self) -> Batch:
        """One paced GetRecords call turned into a Batch (empty, without a call, once `done`)."""
        if self.done:
            return self._batch([])
        self._sleep_until(self._next_call_at)
        if self._stop.is_set():
            return self._batch([])
        started = self._clock.monotonic()
        response = self._get_records()
        require_records(response, self._what)
        raw_records = response.get("Records", [])
        lag = response.get("MillisBehindLatest")
        self._next_call_at = self._next_call(started, raw_records, lag)
        self.millis_behind_latest = lag
        records = self._skip_processed([
            record for raw in raw_records for record in records_from_kinesis(self.shard_id, raw, self.counters)
        ])
        limit = self._limits.max_records
        truncated = limit is not None and self._delivered + len(records) > limit
        if truncated and limit is not None:
            records = records[: limit - self._delivered]
            self._iterator = None  # the rest of this response was not delivered: resume from the position
        else:
            self._iterator = response.get("NextShardIterator")
        if records:
            self._delivered += len(records)
            last = records[-1]
            self._position = StartPosition.after(last.checkpoint, last.completes_kinesis_record)
        caught_up = not raw_records and not lag
        self._caught_up = caught_up
        if not truncated and self._shard_ended(response, raw_records, caught_up):
            self._ended = True
            self._iterator = None
            self._position = ENDED
        return self._batch(records)

    def _next_call(self, started: float, raw_records: list[Any], lag: int | None) -> float:
        """When the next GetRecords may go: 1 call per `idle_backoff` once caught up, else the share of the limits."""
        limits = self._limits
        if not raw_records or (not lag and len(raw_records) < self._asked):
            return self._clock.monotonic() + limits.idle_backoff
        data_bytes = sum(len(raw.get("Data", b"")) for raw in raw_records)
        return started + max(limits.min_call_interval, data_bytes / limits.read_bytes_per_second)

    def _batch(self, records: list[Record]) -> Batch:
        return Batch(records, self.millis_behind_latest, self._ended, self._position)

    def _sleep_until(self, deadline: float) -> None:
        """Wait for `deadline` on the stop event: `stop()` ends the wait at once.

        The reader is not woken before (it woke every 50 ms to look: 8 idle readers cost 0.25 CPU s a minute, against
        0.02 waiting on the event).
        """
        while not self._stop.is_set():
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return
            self._clock.wait(self._stop, remaining)

    def _get_records(self) -> GetRecordsOutputTypeDef:
        """GetRecords with throttling retries; an expired iterator is refreshed from the last delivered position."""
        refreshes = 0
        while True:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            iterator = self._iterator

            def call(iterator: str = iterator) -> GetRecordsOutputTypeDef:
                self.stats.get_records_calls += 1
                self._asked = self._ask
                try:
                    return self._client.get_records(ShardIterator=iterator, Limit=self._ask)
                except ReadTimeoutError:
                    self._ask = min(MIN_RECORDS_PER_CALL, self._limits.records_per_call)
                    raise

            try:
                response = self._call(call, "GetRecords")
                self._ask = min(self._limits.records_per_call, 2 * self._ask)
                return response
            except _IteratorExpired as exc:
                refreshes += 1
                self.stats.expired_iterators += 1
                if refreshes > self._limits.max_iterator_refreshes:
                    raise ShardReadError(
                        f"GetRecords on {self._what}: iterator expired {refreshes} times in a row"
                    ) from exc
                log.info("%s: shard iterator expired; getting a new one from %s", self._what, self._position)
                self._iterator = None

    def _get_iterator(self) -> str:
        arguments = self._position.iterator_arguments()

        def call() -> str:
            self.stats.iterators_requested += 1
            response = self._client.get_shard_iterator(StreamName=self.stream_name, ShardId=self.shard_id,
                                                       **arguments)
            return response["ShardIterator"]

        iterator = self._call(call, "GetShardIterator")
        self._skip_through = self._position.skips_through
        return iterator

    def _call(self, operation: Callable[[], T], what: str) -> T:
        """Run one Kinesis call with retries, turning failures into typed errors."""
        try:
            return self._retry.call(operation, self._is_transient, f"{what} on {self._what}")
        except ClientError as exc:
            code = error_code(exc)
            message = exc.response.get("Error", {}).get("Message", "")
            if code == _EXPIRED:
                raise _IteratorExpired(message) from exc
            if code == "ResourceNotFoundException":
                raise ShardNotFound(f"{what} on {self._what}: {message}") from exc
            raise ShardReadError(f"{what} on {self._what} failed: {code}: {message}") from exc
        except BotoCoreError as exc:
            raise ShardReadError(f"{what} on {self._what} failed: {exc}") from exc

    def _is_transient(self, exc: BaseException) -> bool:
        code = error_code(exc) if isinstance(exc, ClientError) else None
        transient = is_transient(exc) or code in _KINESIS_TRANSIENT
        if code == _THROTTLED:
            self.stats.throttled += 1
        if code != _EXPIRED and self._failed is not None:  # an expired iterator only needs refreshing
            self._failed(exc)
        if transient:
            self.stats.transient_failures += 1
            log.debug("%s: transient failure, backing off: %s", self._what, exc)
        return transient

    @property
    def _what(self) -> str:
        return f"{self.stream_name}/{self.shard_id}"

    def _skip_processed(self, records: list[Record]) -> list[Record]:
        """Drop user records at or before the checkpoint an AT_SEQUENCE_NUMBER iterator started from."""
        skip = self._skip_through
        if skip is None:
            return records
        through = (int(skip.sequence_number), skip.sub_sequence_number)
        for index, record in enumerate(records):
            sequence = int(record.sequence_number)
            if (sequence, record.sub_sequence_number) > through:
                self._skip_through = None
                return records[index:]
            if sequence == through[0] and record.completes_kinesis_record:
                # The whole Kinesis record at the checkpoint is covered: later refreshes can start after it.
                self._position = StartPosition.after(skip, record_complete=True)
        return []

    def _shard_ended(self, response: GetRecordsOutputTypeDef, raw: list[Any], caught_up: bool) -> bool:
        if not response.get("NextShardIterator") or response.get("ChildShards"):
            return True
        if self._ending_lookup is None:
            return False
        if self._ending_sequence is None and self._clock.monotonic() >= self._next_closed_check_at:
            self._next_closed_check_at = self._clock.monotonic() + self._limits.closed_check_interval
            ending = self._ending_lookup()
            self._ending_sequence = int(ending) if ending is not None else None
        if self._ending_sequence is None:
            return False
        last = int(raw[-1]["SequenceNumber"]) if raw else None
        if last is not None and last > self._ending_sequence:
            log.warning("%s: records past the closed shard's EndingSequenceNumber %s (up to %s) were delivered",
                        self._what, self._ending_sequence, last)
        return (last is not None and last >= self._ending_sequence) or caught_up


def require_records(response: Mapping[str, Any], what: str) -> None:
    """Raise ShardReadError unless `response` has GetRecords' shape (a `Records` list).

    A 200 whose body is something else (a proxy's page, a cut body) parses to neither `Records` nor
    `NextShardIterator`, which would otherwise read as the shard's end: a SHARD_END checkpoint on an open shard
    (records lost for good). The caller reads again from its position instead.
    """
    if not isinstance(response.get("Records"), list):
        raise ShardReadError(f"GetRecords on {what}: the answer has no Records list (not GetRecords' response); "
                             "reading again, not taken as the shard's end")


class _IteratorExpired(Exception):
    """Internal: GetRecords said the iterator expired."""


def closed_shard_lookup(client: KinesisClient, stream_name: str, shard_id: str,
                        retry: RetryPolicy | None = None) -> EndingSequenceLookup:
    """A lookup of the shard's EndingSequenceNumber via ListShards (None while open), for ShardReader on moto."""
    policy = retry or RetryPolicy()

    def lookup() -> str | None:
        for shard in list_shards(client, stream_name, policy):
            if shard.shard_id == shard_id:
                return shard.ending_sequence_number
        raise ShardNotFound(f"shard {shard_id} is not listed in stream {stream_name}")

    return lookup


def own_fault(exc: BaseException) -> bool:
    """True when a failed Kinesis call says this worker's credentials are rejected, or none could be had."""
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return True
    return isinstance(exc, ClientError) and error_code(exc) in _CREDENTIAL_CODES
