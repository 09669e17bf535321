"""Picklable descriptions of what to read from a shard: where to start, which limits to keep, and where Kinesis is.

A ReadSpec holds only plain values, so a Spark driver can send it to an executor, which opens a ShardReader from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shardherd.shared.checkpoint import SHARD_END, Checkpoint, Sentinel
from shardherd.shared.errors import ShardherdError

MAX_RECORDS_PER_CALL = 10_000


class InvalidReadSpec(ShardherdError, ValueError):
    """A start position or read limit is impossible (missing timestamp, negative interval, Limit above 10000...)."""


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a read starts: an initial sentinel, SHARD_END (nothing left), or just after a checkpoint.

    For a sequence-number checkpoint, `record_complete` says every user record of that Kinesis record is covered
    (it was not aggregated, or the checkpoint is at its last sub-record): the read then starts AFTER_SEQUENCE_NUMBER.
    Otherwise (unknown, as for a checkpoint read from the lease table) it starts AT_SEQUENCE_NUMBER and skips every
    user record up to and including the checkpoint's (sequence, sub-sequence). `timestamp` (epoch seconds) goes
    with AT_TIMESTAMP only.
    """

    checkpoint: Checkpoint
    timestamp: float | None = None
    record_complete: bool = False

    def __post_init__(self) -> None:
        sentinel = self.checkpoint.sentinel
        if (sentinel is Sentinel.AT_TIMESTAMP) != (self.timestamp is not None):
            raise InvalidReadSpec("AT_TIMESTAMP needs a timestamp, and only AT_TIMESTAMP takes one")
        if self.timestamp is not None and not math.isfinite(self.timestamp):
            raise InvalidReadSpec(f"timestamp must be finite, got {self.timestamp}")
        if self.record_complete and sentinel is not None:
            raise InvalidReadSpec("record_complete applies to sequence-number checkpoints only")

    @classmethod
    def after(cls, checkpoint: Checkpoint, record_complete: bool = False) -> StartPosition:
        """Resume just after `checkpoint` (an initial sentinel or SHARD_END also works)."""
        return cls(checkpoint, record_complete=record_complete)

    @classmethod
    def at_timestamp(cls, timestamp: float) -> StartPosition:
        """Start at the first record that arrived at or after `timestamp` (epoch seconds)."""
        return cls(Checkpoint.of(Sentinel.AT_TIMESTAMP), timestamp=timestamp)

    @property
    def at_shard_end(self) -> bool:
        """True if nothing is left to read."""
        return self.checkpoint.is_shard_end

    @property
    def skips_through(self) -> Checkpoint | None:
        """The checkpoint whose records must be skipped after an AT_SEQUENCE_NUMBER iterator, if any."""
        if self.checkpoint.sentinel is None and not self.record_complete:
            return self.checkpoint
        return None

    def iterator_arguments(self) -> dict[str, Any]:
        """The GetShardIterator arguments (type, and sequence number or timestamp) for this position."""
        sentinel = self.checkpoint.sentinel
        if sentinel is Sentinel.SHARD_END:
            raise InvalidReadSpec("a shard read to its end has no iterator")
        if sentinel is Sentinel.AT_TIMESTAMP:
            return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": self.timestamp}
        if sentinel is not None:
            return {"ShardIteratorType": sentinel.value}
        kind = "AFTER_SEQUENCE_NUMBER" if self.record_complete else "AT_SEQUENCE_NUMBER"
        return {"ShardIteratorType": kind, "StartingSequenceNumber": self.checkpoint.sequence_number}


ENDED = StartPosition(SHARD_END)


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """How fast and how far a reader goes; the defaults keep within half of Kinesis' per-shard GetRecords limits.

    A caught-up reader calls once per `idle_backoff` (1 s; caught up: no records, or MillisBehindLatest 0 on a page
    short of `records_per_call`). A reader behind the tip calls again after `min_call_interval` (0.4 s: 2.5 calls/s,
    half of the shard's 5) and no sooner than the bytes it just read take at `read_bytes_per_second` (1 MiB/s, half
    of the shard's 2 MiB/s): half, because a stream usually has a second consumer application (decision 0029).
    `max_records` stops the reader after that many user records (None: no end). `stop_when_caught_up` ends the
    read at the first empty response with MillisBehindLatest 0 (a bounded read, as a Spark task wants).
    Throttling and transient errors are retried `retry_attempts` times with full-jitter backoff from
    `retry_base_delay` up to `retry_max_delay`. `closed_check_interval` spaces calls of the optional closed-shard
    check.
    """

    records_per_call: int = MAX_RECORDS_PER_CALL
    min_call_interval: float = 0.4
    idle_backoff: float = 1.0
    read_bytes_per_second: float = 1024 * 1024
    max_records: int | None = None
    stop_when_caught_up: bool = False
    retry_attempts: int = 10
    retry_base_delay: float = 0.1
    retry_max_delay: float = 5.0
    max_iterator_refreshes: int = 3
    closed_check_interval: float = 5.0

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.records_per_call <= MAX_RECORDS_PER_CALL:
            problems.append(f"records_per_call must be in 1..{MAX_RECORDS_PER_CALL}, got {self.records_per_call}")
        for name in ("min_call_interval", "idle_backoff", "retry_base_delay", "retry_max_delay",
                     "closed_check_interval"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.read_bytes_per_second) and self.read_bytes_per_second > 0):
            problems.append(f"read_bytes_per_second must be a finite number > 0, got {self.read_bytes_per_second}")
        if self.max_records is not None and self.max_records < 1:
            problems.append(f"max_records must be >= 1 or None, got {self.max_records}")
        if self.retry_attempts < 1 or self.max_iterator_refreshes < 1:
            problems.append("retry_attempts and max_iterator_refreshes must be >= 1")
        if problems:
            raise InvalidReadSpec("; ".join(problems))


@dataclass(frozen=True, slots=True)
class ReadSpec:
    """Everything needed to open a reader in another process: stream, shard, start, endpoint, region, limits."""

    stream_name: str
    shard_id: str
    position: StartPosition
    region: str = "us-east-1"
    endpoint_url: str | None = None
    limits: ReadLimits = field(default_factory=ReadLimits)

    def __post_init__(self) -> None:
        if not self.stream_name or not self.shard_id or not self.region:
            raise InvalidReadSpec("stream_name, shard_id and region must be non-empty")
