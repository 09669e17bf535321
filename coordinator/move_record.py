"""The leader's record of one move, stored on the lease row by the very write that moves the lease.

Invariants:
- A record is written only by the leader's fenced owner write of the move it describes (`assign`/`start_handoff`
  with `move=`), so it costs no extra write and exists exactly when that move landed.
- It is compact JSON of at most a few hundred bytes (the detail is cut to MAX_DETAIL_CHARS), so a lease row stays
  within one DynamoDB write unit.
- Decoding never raises anything but MalformedMoveRecord: a row written by another tool is reported, not fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shardherd.coordinator.moves import Move
from shardherd.shared.errors import ShardherdError

MAX_DETAIL_CHARS = 120


class MalformedMoveRecord(ShardherdError):
    """A lease row's `lastMove` cannot be read as a move record."""


@dataclass(frozen=True, slots=True)
class MoveRecord:
    """Why and when the leader of `epoch` moved a lease from `from_owner` to `to_worker` (run start, wall clock)."""

    epoch: int
    run_started_at: float
    reason: str
    detail: str
    from_owner: str | None
    to_worker: str

    @classmethod
    def of(cls, move: Move, epoch: int, run_started_at: float) -> MoveRecord:
        """The record of a planned move made by the run of `epoch` started at `run_started_at`."""
        return cls(epoch, run_started_at, move.reason.value, move.detail[:MAX_DETAIL_CHARS], move.from_owner,
                   move.to_worker)

    def encode(self) -> str:
        """The text stored as the lease's `lastMove`."""
        return json.dumps({"e": self.epoch, "t": round(self.run_started_at, 3), "r": self.reason, "d": self.detail,
                           "f": self.from_owner, "w": self.to_worker}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> MoveRecord:
        """The record stored as `text`; MalformedMoveRecord if it is not one."""
        try:
            raw = json.loads(text)
            record = cls(raw["e"], raw["t"], raw["r"], raw["d"], raw["f"], raw["w"])
        except (ValueError, TypeError, KeyError) as exc:
            raise MalformedMoveRecord(f"lastMove is not a move record: {text[:80]!r}") from exc
        types_ok = (isinstance(record.epoch, int) and isinstance(record.run_started_at, int | float)
                    and isinstance(record.reason, str) and isinstance(record.detail, str)
                    and isinstance(record.from_owner, str | None) and isinstance(record.to_worker, str))
        if not types_ok or isinstance(record.epoch, bool):
            raise MalformedMoveRecord(f"lastMove has a field of the wrong type: {text[:80]!r}")
        return record
