"""Spark offsets of the `shardherd` source: self-describing batch plans, never progress (Spark-free).

A batch's end offset says, per shard, where to start (the lease checkpoint when the batch was planned), how many
records and bytes to read at most, and, for `availableNow`, the arrival time after which to stop. Reading a plan
twice gives the same records (replay is deterministic); real progress is computed from the batch's data and kept
only in the lease table. `number` grows with every plan so that a new plan never equals the last one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from agent.read_spec import StartPosition
from shared.checkpoint import Checkpoint, Sentinel
from shared.errors import InvalidCheckpoint, ShardherdError

DEFAULT_MAX_RECORDS_PER_SHARD = 10_000


class InvalidOffset(ShardherdError, ValueError):
    """A stored Spark offset or source option cannot be understood."""


@dataclass(frozen=True, slots=True)
class Caps:
    """Admission control per shard per batch: at most `max_records` records and (if set) about `max_bytes` bytes."""

    max_records: int = DEFAULT_MAX_RECORDS_PER_SHARD
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_records < 1 or (self.max_bytes is not None and self.max_bytes < 1):
            raise InvalidOffset(f"per-shard caps must be >= 1, got {self.max_records} records, {self.max_bytes} bytes")


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """What one partition reads: a shard from a position, within caps, up to an arrival time (epoch s) if set."""

    shard_id: str
    position: StartPosition
    caps: Caps = field(default_factory=Caps)
    until: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in Spark's offset log (sequence numbers stay strings)."""
        checkpoint = self.position.checkpoint
        return {"after": checkpoint.sequence_number, "sub": checkpoint.sub_sequence_number,
                "ts": self.position.timestamp, "max": self.caps.max_records, "maxBytes": self.caps.max_bytes,
                "until": self.until}

    @classmethod
    def from_json(cls, shard_id: str, value: Any) -> ShardPlan:
        """Parse one shard's plan, raising InvalidOffset for anything malformed."""
        if not isinstance(value, dict):
            raise InvalidOffset(f"plan of {shard_id} must be an object, got {value!r}")
        try:
            checkpoint = Checkpoint(value["after"], int(value.get("sub", 0)))
            timestamp = _optional_float(value.get("ts"), "ts")
            position = (StartPosition.at_timestamp(timestamp) if checkpoint.sentinel is Sentinel.AT_TIMESTAMP
                        and timestamp is not None else StartPosition.after(checkpoint))
            caps = Caps(int(value["max"]), None if value.get("maxBytes") is None else int(value["maxBytes"]))
            return cls(shard_id, position, caps, _optional_float(value.get("until"), "until"))
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
