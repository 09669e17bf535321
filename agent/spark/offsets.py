"""Spark offsets of the `shardherd` source: self-describing batch plans with fixed ends, never progress (Spark-free).

A batch's end offset says, per shard, where to start (the lease checkpoint when the batch was planned) and the last
record to read, inclusive: a Kinesis sequence number the driver's probe saw, with the KPL sub-sequence of its last
user record. Records of a shard never change order or content, so reading a plan again (a re-executed task, a lost
block, a batch replayed after a crash) gives exactly the same rows, and the checkpoint a written batch earns is
known from the plan alone. `records` and `bytes` are what the probe counted (Kinesis records, data bytes) between
the start and the end. `number` grows with every plan so that a new plan never equals the last one.
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
    """What one partition reads: a shard from a position through a fixed last record (inclusive).

    `tenure` names the driver's hold of the lease the plan was made under: a plan is read, and its end
    checkpointed, only while that same hold lasts (never after the lease was lost, even if it came back).
    """

    shard_id: str
    position: StartPosition
    end: Checkpoint
    records: int = 0
    bytes: int = 0
    tenure: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in Spark's offset log (sequence numbers stay strings)."""
        checkpoint = self.position.checkpoint
        return {"after": checkpoint.sequence_number, "sub": checkpoint.sub_sequence_number,
                "whole": self.position.record_complete, "ts": self.position.timestamp,
                "end": self.end.sequence_number, "endSub": self.end.sub_sequence_number,
                "records": self.records, "bytes": self.bytes, "tenure": self.tenure}

    @classmethod
    def from_json(cls, shard_id: str, value: Any) -> ShardPlan:
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
            end = Checkpoint.at(str(value["end"]), int(value.get("endSub", 0)))
            if end.sentinel is not None:
                raise InvalidOffset(f"the end of a plan must be a sequence number, got {end}")
            return cls(shard_id, position, end, int(value.get("records", 0)), int(value.get("bytes", 0)),
                       str(value.get("tenure", "")))
        except (KeyError, TypeError, ValueError, InvalidCheckpoint) as exc:
            raise InvalidOffset(f"bad plan for {shard_id}: {value!r}: {exc}") from exc

    def starting_after(self, checkpoint: Checkpoint) -> ShardPlan:
        """The same plan starting after a later checkpoint (used to skip what was processed meanwhile)."""
        return replace(self, position=StartPosition.after(checkpoint))


def _optional_float(value: Any, name: str) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        raise InvalidOffset(f"{name} must be finite, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class BatchOffset:
    """A Spark offset of this source: the plan number and the shard plans of the batch that ends here."""

    number: int = 0
    shards: dict[str, ShardPlan] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The dict handed to Spark."""
        return {"n": self.number, "shards": {shard: plan.to_json() for shard, plan in sorted(self.shards.items())}}

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
        return cls(number, {shard: ShardPlan.from_json(shard, plan) for shard, plan in value["shards"].items()})
