"""Where a rewind (or fast-forward) puts each shard: pure rules from what a shard holds around the requested time.

Invariants (decision 0031):
* A new checkpoint is the last record that arrived before the time, so delivery resumes at the first record at or
  after it; aggregated (KPL) records are whole (every user record of one arrived together), so the checkpoint names
  the record's last sub-record.
* No record before the time: TRIM_HORIZON (the shard's oldest record still held; a time before the retention window
  says so). A closed shard with no record at or after the time: SHARD_END (it ended before the time).
* Across a split or a merge each shard is placed on its own records: a parent rewound before the split gets a real
  position and its children, whose records all came after it, start at TRIM_HORIZON.
* `--to-sequence` checkpoints exactly the sequence named (that record counts as processed).
* Parents before children: a lease with an ancestor the rewind reopens (gives any position but SHARD_END) is held
  back: its lease is deleted, and shard sync creates it again at TRIM_HORIZON once its parents end, as after any
  split or merge. No child record is delivered before its parent's records after the time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from shardherd.shared.checkpoint import SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.pause import BadControlRequest
from shardherd.shared.streams import stream_name_of

# Kinesis timestamps are milliseconds; a time this far ahead of the coordinator's clock is "in the future".
FUTURE_TOLERANCE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Found:
    """What a probe found in a shard around the time: the last record before it and what follows."""

    last_before: Checkpoint | None  # the last record (its last sub-record) that arrived before the time
    any_after: bool  # a record at or after the time exists
    closed: bool  # the shard is closed (read to its end)
    before_retention: bool  # the time lies before the oldest data the stream may still hold


def position_at(found: Found) -> tuple[Checkpoint, str]:
    """The checkpoint that makes the shard deliver from the time on, and a note saying how it was chosen."""
    if found.last_before is None:
        note = "before the retention window: TRIM_HORIZON" if found.before_retention else "no record before the time"
        return TRIM_HORIZON, note
    if found.closed and not found.any_after:
        return SHARD_END, "the shard ended before the time"
    return found.last_before, f"after {found.last_before}"


HELD_BACK_NOTE = "held back: its lease is deleted and created again at TRIM_HORIZON once its parents end"


def _ancestry(leases: list[Lease]) -> dict[str, list[str]]:
    """Each lease's parents' lease keys (the parents that have a lease), by lease key."""
    by_shard = {(stream_name_of(lease), lease.shard): lease.lease_key for lease in leases}
    return {lease.lease_key: [by_shard[(stream_name_of(lease), parent)] for parent in sorted(lease.parent_shard_ids)
                              if (stream_name_of(lease), parent) in by_shard] for lease in leases}


def descendants(leases: list[Lease], of: set[str]) -> set[str]:
    """Lease keys of every lease below one of `of` (children, their children ...), members of `of` included."""
    parents = _ancestry(leases)
    found: set[str] = set()
    grew = True
    while grew:
        below = {key for key, above in parents.items() if any(p in of or p in found for p in above)}
        grew = not below <= found
        found |= below
    return found


def held_back(leases: list[Lease], targets: dict[str, Checkpoint]) -> set[str]:
    """Lease keys whose records must wait: an ancestor gets a new checkpoint other than SHARD_END (it is reopened)."""
    reopened = {key for key, target in targets.items() if not target.is_shard_end}
    return descendants(leases, reopened)


def parse_time(text: str, now: float) -> datetime:
    """An ISO 8601 time (UTC if it names no zone); BadControlRequest when unreadable or in the future."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadControlRequest(f"--to {text!r} is not an ISO 8601 time (e.g. 2026-11-28T10:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if when.timestamp() > now + FUTURE_TOLERANCE_SECONDS:
        raise BadControlRequest(f"--to {when.isoformat()} is in the future (now {datetime.fromtimestamp(now, UTC)})")
    return when


def parse_sequences(pairs: list[str]) -> dict[str, Checkpoint]:
    """`SHARD=SEQUENCE` pairs as checkpoints; BadControlRequest for a malformed pair."""
    chosen: dict[str, Checkpoint] = {}
    for pair in pairs:
        shard, _, sequence = pair.partition("=")
        if not shard or not sequence.isdigit():
            raise BadControlRequest(f"--to-sequence {pair!r} is not SHARD=SEQUENCE (a decimal sequence number)")
        chosen[shard.strip()] = Checkpoint.at(sequence)
    return chosen


@dataclass(frozen=True, slots=True)
class RewindRow:
    """One shard of a rewind: its checkpoint before and after, and how the new one was chosen."""

    lease_key: str
    shard: str
    owner: str | None
    before: str
    after: str
    note: str


@dataclass(frozen=True, slots=True)
class RewindRecord:
    """The record a rewind leaves (in the coordinator-state table and the API): who, when, to where, every shard."""

    rewind_id: str
    who: str
    requested_at: float
    to: str  # the ISO time, or "sequences"
    dry_run: bool
    rows: tuple[RewindRow, ...] = field(default=())
    planned_at: float | None = None  # every shard's position resolved
    stopped_at: float | None = None  # every shard paused and stopped by its owner
    finished_at: float | None = None  # rewritten and resumed
    outcome: str = "planned"

    def to_json(self) -> str:
        """The record as one JSON object."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RewindRecord:
        """A record written by `to_json`."""
        data = json.loads(text)
        data["rows"] = tuple(RewindRow(**row) for row in data.get("rows", ()))
        return cls(**data)
