"""The shard as shard sync sees it: lineage, hash range and sequence range, read from a ListShards item."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from shardherd.shared.errors import ShardherdError

MAX_HASH_KEY = 2**128 - 1
_DECIMAL = re.compile(r"[0-9]{1,129}")
_SHARD_ID = re.compile(r"[a-zA-Z0-9_.\-]{1,128}")


class MalformedShard(ShardherdError, ValueError):
    """A shard description (usually one ListShards item) is missing a field or holds an impossible value."""

    def __init__(self, shard_id: object, reason: str) -> None:
        super().__init__(f"malformed shard {shard_id!r}: {reason}")
        self.shard_id = shard_id
        self.reason = reason


class ShardListError(ShardherdError, ValueError):
    """A shard listing cannot describe a stream: conflicting duplicates, a lineage cycle, or gaps.

    Gaps and overlaps are judged on the open shards, which must tile the hash key space 0..2^128-1.
    """


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard of a stream: who its parents are, which hash keys it owns, and whether it is still open.

    Hash keys and sequence numbers keep Kinesis' decimal strings (exact, and what the lease table stores).
    `ending_sequence_number` is None while the shard is open.
    """

    shard_id: str
    parent_shard_id: str | None
    adjacent_parent_shard_id: str | None
    starting_hash_key: str
    ending_hash_key: str
    starting_sequence_number: str
    ending_sequence_number: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.shard_id, str) or not _SHARD_ID.fullmatch(self.shard_id):
            raise MalformedShard(self.shard_id, "ShardId must be 1-128 characters of [a-zA-Z0-9_.-]")
        self._check_lineage()
        self._check_ranges()

    def _check_lineage(self) -> None:
        for name in ("parent_shard_id", "adjacent_parent_shard_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not _SHARD_ID.fullmatch(value)):
                raise MalformedShard(self.shard_id, f"{name} {value!r} is not a shard id")
        if self.adjacent_parent_shard_id is not None and self.parent_shard_id is None:
            raise MalformedShard(self.shard_id, "has an adjacent parent but no parent")
        if self.parent_shard_id is not None and self.parent_shard_id == self.adjacent_parent_shard_id:
            raise MalformedShard(self.shard_id, "parent and adjacent parent are the same shard")
        if self.shard_id in self.parent_ids:
            raise MalformedShard(self.shard_id, "is its own parent")

    def _check_ranges(self) -> None:
        for name in ("starting_hash_key", "ending_hash_key", "starting_sequence_number", "ending_sequence_number"):
            value = getattr(self, name)
            if value is None and name == "ending_sequence_number":
                continue
            if not isinstance(value, str) or not _DECIMAL.fullmatch(value):
                raise MalformedShard(self.shard_id, f"{name} {value!r} is not a decimal string")
        low, high = self.hash_range
        if not low <= high <= MAX_HASH_KEY:
            raise MalformedShard(
                self.shard_id, f"hash range {self.starting_hash_key}..{self.ending_hash_key} is not within 0..2^128-1"
            )

    @property
    def parent_ids(self) -> tuple[str, ...]:
        """The parent and the adjacent parent (merge), those that are set, in that order."""
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p is not None)

    @property
    def is_open(self) -> bool:
        """True while the shard still accepts records (no ending sequence number yet)."""
        return self.ending_sequence_number is None

    @property
    def hash_range(self) -> tuple[int, int]:
        """The inclusive hash key range as integers."""
        return int(self.starting_hash_key), int(self.ending_hash_key)

    @property
    def start_order(self) -> tuple[int, str]:
        """Sort key: starting sequence number, then shard id (the order KCL creates leases in)."""
        return int(self.starting_sequence_number), self.shard_id

    @classmethod
    def from_list_shards_item(cls, item: Mapping[str, object]) -> Shard:
        """Build a Shard from one element of a ListShards (or DescribeStream) `Shards` list."""
        if not isinstance(item, Mapping):
            raise MalformedShard(None, f"expected a mapping, got {type(item).__name__}")
        shard_id = item.get("ShardId")
        hash_range = _sub_mapping(item, "HashKeyRange", shard_id)
        sequence_range = _sub_mapping(item, "SequenceNumberRange", shard_id)
        return cls(
            shard_id=_required(item, "ShardId", shard_id),
            parent_shard_id=_optional(item, "ParentShardId", shard_id),
            adjacent_parent_shard_id=_optional(item, "AdjacentParentShardId", shard_id),
            starting_hash_key=_required(hash_range, "StartingHashKey", shard_id),
            ending_hash_key=_required(hash_range, "EndingHashKey", shard_id),
            starting_sequence_number=_required(sequence_range, "StartingSequenceNumber", shard_id),
            ending_sequence_number=_optional(sequence_range, "EndingSequenceNumber", shard_id),
        )


def _sub_mapping(item: Mapping[str, object], key: str, shard_id: object) -> Mapping[str, object]:
    value = item.get(key)
    if not isinstance(value, Mapping):
        raise MalformedShard(shard_id, f"{key} is missing or not a mapping")
    return value


def _optional(item: Mapping[str, object], key: str, shard_id: object) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise MalformedShard(shard_id, f"{key} must be a string, got {type(value).__name__}")
    return value


def _required(item: Mapping[str, object], key: str, shard_id: object) -> str:
    value = _optional(item, key, shard_id)
    if value is None:
        raise MalformedShard(shard_id, f"{key} is missing")
    return value
