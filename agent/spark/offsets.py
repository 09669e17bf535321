"""Spark offsets of the `shardherd` source: batch plans, never progress (Spark-free).

A batch's end offset says, per shard, where to start (the lease checkpoint when the batch was planned), the caps of
the read and the hold (tenure) it was planned under; not where to stop. The driver cannot know that without reading
the records, so the first executor read of a plan reads up to the caps (or until it caught up with the shard) and
records where it stopped before handing out any row (agent/spark/batch_ends.py); every later read of the plan (a
re-executed task, a second action of the sink, a replayed batch) reads exactly through that recorded end, and the
checkpoint the written batch earns is that end. `number` grows with every plan of a query's `run` (a random name a
fresh Spark checkpoint starts, which a query restarted on its checkpoint continues) so that a new plan never equals
the last one; with the run and the tenure it names the recorded end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from shardherd.agent.read_spec import StartPosition
from shardherd.shared.checkpoint import Checkpoint, Sentinel
from shardherd.shared.errors import InvalidCheckpoint, ShardherdError

DEFAULT_MAX_RECORDS_PER_SHARD = 10_000


class InvalidOffset(ShardherdError, ValueError):
    """A stored Spark offset or source option cannot be understood."""


@dataclass(frozen=True, slots=True)
class Caps:
    """Admission control per shard per batch: at most `max_records` Kinesis records and (if set) `max_bytes` bytes.

    A KPL aggregate counts as one record here; a batch holds whole probed segments, at least one.
    """

    max_records: int = DEFAULT_MAX_RECORDS_PER_SHARD
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_records < 1 or (self.max_bytes is not None and self.max_bytes < 1):
            raise InvalidOffset(f"per-shard caps must be >= 1, got {self.max_records} records, {self.max_bytes} bytes")


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """What one partition reads: a shard from a position, at most `caps`, its end fixed by the first read.

    `number` is the plan's number (the offset's) and `tenure` names the driver's hold of the lease the plan was
    made under: together they key the end the first read records (agent/spark/batch_ends.py), which every later
    read of the plan follows. A plan is read, and its end checkpointed, only while that same hold lasts (never after
    the lease was lost, even if it came back). `iterator` is a shard iterator at `position` if the driver has one
    (the last read's NextShardIterator): a read starts with GetShardIterator only without it or when it expired.
    `until` (availableNow) leaves out records that arrived after it.
    """

    shard_id: str
    position: StartPosition
    caps: Caps = field(default_factory=Caps)
    tenure: str = ""
    run: str = ""
    number: int = 0
    iterator: str | None = None
    until: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in Spark's offset log (sequence numbers stay strings; the number is the offset's)."""
        checkpoint = self.position.checkpoint
        return {"after": checkpoint.sequence_number, "sub": checkpoint.sub_sequence_number,
                "whole": self.position.record_complete, "ts": self.position.timestamp,
                "max": self.caps.max_records, "maxBytes": self.caps.max_bytes, "tenure": self.tenure,
                "it": self.iterator, "until": self.until}

    @classmethod
    def from_json(cls, shard_id: str, value: Any, run: str = "", number: int = 0) -> ShardPlan:
        """Parse one shard's plan, raising InvalidOffset for anything malformed."""
        if not isinstance(value, dict):
            raise InvalidOffset(f"plan of {shard_id} must be an object, got {value!r}")
        try:
            checkpoint = Checkpoint(value["after"], int(value.get("sub", 0)))
            timestamp = _optional_float(value.get("ts"), "ts")
            if checkpoint.sentinel is Sentinel.AT_TIMESTAMP and timestamp is not None:
                position = StartPosition.at_timestamp(timestamp)
            else:
                position = StartPosition.after(checkpoint, bool(value.get("whole", False)))
            max_bytes = value.get("maxBytes")
            # A plan written before reads were recorded (decision 0030) names its end and record count instead of
            # caps: replayed as at most that many records from its start, the same batch.
            caps = Caps(int(value["max"] if "max" in value else value["records"]),
                        None if max_bytes is None else int(max_bytes))
            iterator = value.get("it")
            return cls(shard_id, position, caps, str(value.get("tenure", "")), run, number,
                       None if iterator is None else str(iterator), _optional_float(value.get("until"), "until"))
        except (KeyError, TypeError, ValueError, InvalidCheckpoint) as exc:
            raise InvalidOffset(f"bad plan for {shard_id}: {value!r}: {exc}") from exc

    def starting_after(self, checkpoint: Checkpoint) -> ShardPlan:
        """The same plan starting after a later checkpoint (used to skip what was processed meanwhile).

        The iterator was for the old position, so it is dropped.
        """
        return replace(self, position=StartPosition.after(checkpoint), iterator=None)


def _optional_float(value: Any, name: str) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        raise InvalidOffset(f"{name} must be finite, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class BatchOffset:
    """A Spark offset of this source: the run, the plan number and the shard plans of the batch that ends here."""

    number: int = 0
    shards: dict[str, ShardPlan] = field(default_factory=dict)
    run: str = ""

    def to_json(self) -> dict[str, Any]:
        """The dict handed to Spark."""
        return {"run": self.run, "n": self.number,
                "shards": {shard: plan.to_json() for shard, plan in sorted(self.shards.items())}}

    @classmethod
    def from_json(cls, value: Any) -> BatchOffset:
        """Parse an offset dict (or its JSON string) as Spark hands it back."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidOffset(f"offset is not JSON: {value[:80]!r}") from exc
        if not isinstance(value, dict) or not isinstance(value.get("shards", {}), dict):
            raise InvalidOffset(f"offset must be an object with a 'shards' object, got {value!r}")
        number = value.get("n", 0)
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise InvalidOffset(f"offset number must be a non-negative integer, got {number!r}")
        run = str(value.get("run", ""))
        return cls(number, {shard: ShardPlan.from_json(shard, plan, run, number)
                            for shard, plan in value["shards"].items()}, run)
