"""Checkpoint values: KCL's sentinel strings or a Kinesis sequence number plus KPL sub-sequence, ordered numerically."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from shardherd.shared.errors import InvalidCheckpoint

MAX_SEQUENCE_DIGITS = 129
_DIGITS = re.compile(rf"[0-9]{{1,{MAX_SEQUENCE_DIGITS}}}")


class Sentinel(enum.Enum):
    """The sentinel strings KCL stores in `checkpoint` instead of a sequence number."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    SHARD_END = "SHARD_END"


INITIAL_SENTINELS = frozenset({Sentinel.TRIM_HORIZON, Sentinel.LATEST, Sentinel.AT_TIMESTAMP})


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A position in a shard: a sentinel, or a sequence number with the KPL sub-sequence processed up to.

    `sequence_number` keeps the stored string as is (so conditional writes can match it exactly); ordering uses its
    numeric value. Order: the initial sentinels < any sequence number < SHARD_END. Equality is exact (the stored
    strings), ordering is by rank, so two initial sentinels (or "012" and "12") are <= each other but not ==.
    """

    sequence_number: str
    sub_sequence_number: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.sub_sequence_number, bool) or not isinstance(self.sub_sequence_number, int):
            raise InvalidCheckpoint(f"sub-sequence number must be an integer, got {self.sub_sequence_number!r}")
        if self.sub_sequence_number < 0:
            raise InvalidCheckpoint(f"sub-sequence number must be >= 0, got {self.sub_sequence_number}")
        if not isinstance(self.sequence_number, str):
            raise InvalidCheckpoint(f"sequence number must be a string, got {type(self.sequence_number).__name__}")
        if self.sequence_number in Sentinel.__members__:
            if self.sub_sequence_number != 0:
                raise InvalidCheckpoint(f"sentinel {self.sequence_number} cannot carry a sub-sequence number")
            return
        if not _DIGITS.fullmatch(self.sequence_number):
            raise InvalidCheckpoint(
                f"checkpoint {self.sequence_number[:40]!r} is neither a sentinel "
                f"({', '.join(Sentinel.__members__)}) nor a decimal sequence number of at most "
                f"{MAX_SEQUENCE_DIGITS} digits"
            )

    @classmethod
    def of(cls, sentinel: Sentinel) -> Checkpoint:
        """The checkpoint holding a sentinel."""
        return cls(sentinel.value)

    @classmethod
    def at(cls, sequence_number: str | int, sub_sequence_number: int = 0) -> Checkpoint:
        """The checkpoint after processing `sequence_number` (up to and including `sub_sequence_number`)."""
        return cls(str(sequence_number), sub_sequence_number)

    @property
    def sentinel(self) -> Sentinel | None:
        """The sentinel this checkpoint holds, or None for a sequence number."""
        member = Sentinel.__members__.get(self.sequence_number)
        return member

    @property
    def is_shard_end(self) -> bool:
        """True once the whole shard has been processed."""
        return self.sequence_number == Sentinel.SHARD_END.value

    @property
    def is_initial(self) -> bool:
        """True while processing has not started (TRIM_HORIZON, LATEST or AT_TIMESTAMP)."""
        return self.sentinel in INITIAL_SENTINELS

    @property
    def sequence_value(self) -> int | None:
        """The numeric sequence number, or None for a sentinel."""
        return None if self.sentinel else int(self.sequence_number)

    def _order_key(self) -> tuple[int, int, int]:
        if self.is_shard_end:
            return (2, 0, 0)
        value = self.sequence_value
        if value is None:
            return (0, 0, 0)
        return (1, value, self.sub_sequence_number)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._order_key() < other._order_key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._order_key() <= other._order_key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._order_key() > other._order_key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._order_key() >= other._order_key()

    def regresses_from(self, current: Checkpoint) -> bool:
        """True if writing this checkpoint over `current` would move progress backwards (or move past SHARD_END)."""
        if current.is_shard_end:
            return not self.is_shard_end
        return self < current

    def __str__(self) -> str:
        if self.sub_sequence_number:
            return f"{self.sequence_number}/{self.sub_sequence_number}"
        return self.sequence_number


TRIM_HORIZON = Checkpoint.of(Sentinel.TRIM_HORIZON)
LATEST = Checkpoint.of(Sentinel.LATEST)
AT_TIMESTAMP = Checkpoint.of(Sentinel.AT_TIMESTAMP)
SHARD_END = Checkpoint.of(Sentinel.SHARD_END)


def parse_checkpoint(sequence_number: object, sub_sequence_number: object = None) -> Checkpoint:
    """Build a checkpoint from stored values (a string and an optional integer-like), raising InvalidCheckpoint."""
    if not isinstance(sequence_number, str):
        raise InvalidCheckpoint(f"checkpoint must be a string, got {type(sequence_number).__name__}")
    if sub_sequence_number is None:
        sub = 0
    elif isinstance(sub_sequence_number, bool):
        raise InvalidCheckpoint("sub-sequence number must be an integer, got a boolean")
    elif isinstance(sub_sequence_number, int):
        sub = sub_sequence_number
    else:
        text = str(sub_sequence_number)
        if not re.fullmatch(r"[0-9]+", text):
            raise InvalidCheckpoint(f"sub-sequence number must be a non-negative integer, got {text[:40]!r}")
        sub = int(text)
    if sub and sequence_number in Sentinel.__members__:
        # KCL writes checkpointSubSequenceNumber = 0 next to sentinels; anything else is corrupt.
        raise InvalidCheckpoint(f"sentinel {sequence_number} cannot carry sub-sequence number {sub}")
    return Checkpoint(sequence_number, sub)
