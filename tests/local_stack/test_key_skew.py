"""The producer's key skew (`shardherd up --key-skew`): 0 leaves no shard nearly idle; the default does."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

from shardherd.services.local_stack.producer import ZipfKeys
from shardherd.services.local_stack.stack import StackOptions

SHARDS = 64
HASH_SPACE = 2**128  # Kinesis maps MD5(partition key) onto the shards' equal hash ranges


def _per_shard(exponent: float) -> Counter[int]:
    keys = ZipfKeys(StackOptions.keys, exponent, random.Random(7))
    return Counter(int(hashlib.md5(key.encode()).hexdigest(), 16) * SHARDS // HASH_SPACE
                   for key in keys.draw(64_000))


def test_no_skew_leaves_no_shard_nearly_idle() -> None:
    even, skewed = _per_shard(0.0), _per_shard(StackOptions.zipf_exponent)
    mean = 64_000 / SHARDS
    # 1,000 keys over 64 shards: about 16 keys each, so no shard gets under a third of the mean or over twice it.
    assert len(even) == SHARDS and mean / 3 <= min(even.values()) and max(even.values()) <= 2 * mean, even
    # The default skew leaves shards with about a tenth of the mean: a stretch without records there says nothing
    # about whether the shard has a reader (bench/rolling_restart.py runs without skew).
    assert min(skewed.get(shard, 0) for shard in range(SHARDS)) < mean / 5, skewed
