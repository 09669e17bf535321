"""Which open shard a Kinesis record goes to: the MD5 of its partition key (or its ExplicitHashKey) in a hash range.

Invariants: the hash key is the 128-bit big-endian integer of MD5(partition key as UTF-8) unless an explicit hash key
is given; a stream's open shards' ranges do not overlap, so at most one shard matches. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardherd.shared.errors import ShardherdError


class NoShardForKey(ShardherdError, LookupError):
    """No open shard's hash range holds the key (a stale shard map, or a bad explicit hash key)."""


def hash_key(partition_key: str, explicit_hash_key: str | None = None) -> int:
    """The 128-bit hash key Kinesis places a record by."""
    if explicit_hash_key is not None:
        return int(explicit_hash_key)
    return int.from_bytes(hashlib.md5(partition_key.encode("utf-8"), usedforsecurity=False).digest(), "big")


@dataclass(frozen=True)
class ShardMap:
    """The open shards of one stream, sorted by the start of their hash range."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    shard_ids: tuple[str, ...]

    @classmethod
    def from_list_shards(cls, shards: Iterable[Mapping[str, Any]]) -> ShardMap:
        """Build from ListShards' `Shards` entries, keeping open shards only (no EndingSequenceNumber)."""
        open_shards = sorted(
            (int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"]),
             str(shard["ShardId"]))
            for shard in shards if "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {}))
        return cls(tuple(s for s, _, _ in open_shards), tuple(e for _, e, _ in open_shards),
                   tuple(i for _, _, i in open_shards))

    def shard_for(self, key: int) -> str:
        """The open shard whose range holds `key`; NoShardForKey if none does."""
        index = bisect.bisect_right(self.starts, key) - 1
        if index < 0 or key > self.ends[index]:
            raise NoShardForKey(f"no open shard holds hash key {key}")
        return self.shard_ids[index]
