"""The stack's producer: user records at a steady rate, skewed keys (hot shards), some packed KPL-style.

Partition keys are drawn from a seeded Zipf-like distribution (key i has weight 1/(i+1)^s), so the shards that the
most popular keys hash to receive far more records than the rest. A fraction of the user records is packed into KPL
aggregates, which the agents de-aggregate. `make_hot` adds an extra rate aimed at one shard through an explicit hash
key inside the shard's range. Records PutRecords rejects are sent again, never dropped: after a tick in which Kinesis
throttled any record (ProvisionedThroughputExceededException, per record), the producer holds everything for a
full-jitter backoff (uniform up to 0.1 s * 2^n, at most 2 s) before it puts again, as AWS asks of clients; the throttled
records are counted per shard.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shardherd.agent.kpl import Aggregator, UserRecord
from shardherd.shared.errors import ConfigError, ShardherdError
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards

log = logging.getLogger(__name__)

PUT_RECORDS_LIMIT = 500
TICK_SECONDS = 0.2
AGGREGATE_RECORDS = 10
THROTTLED = "ProvisionedThroughputExceededException"
BACKOFF_BASE = 0.1
BACKOFF_CAP = 2.0
_SHARD_ID = re.compile(r"shardId-\d+")


class UnknownShard(ShardherdError, KeyError):
    """The stream has no open shard with that id."""


class ZipfKeys:
    """Partition keys `key-0000` ... with weight 1/(i+1)^exponent, drawn from a seeded generator."""

    def __init__(self, count: int, exponent: float, rng: random.Random) -> None:
        if count < 1 or exponent < 0:
            raise ConfigError(f"need at least one key and a non-negative exponent (got {count}, {exponent})")
        self.keys = [f"key-{index:04d}" for index in range(count)]
        self._cumulative = list(itertools.accumulate(1 / (index + 1) ** exponent for index in range(count)))
        self._rng = rng

    def draw(self, count: int) -> list[str]:
        """`count` keys, independently drawn."""
        return self._rng.choices(self.keys, cum_weights=self._cumulative, k=count)


@dataclass
class ProducerStats:
    """What the producer has put so far."""

    user_records: int = 0
    made_records: int = 0  # Kinesis records made (written, rejected and held, or in flight)
    kinesis_records: int = 0
    aggregated_user_records: int = 0
    retried: int = 0
    errors: int = 0
    by_shard: Counter[str] = field(default_factory=Counter)
    throttled: int = 0
    throttled_by_shard: Counter[str] = field(default_factory=Counter)


class Producer:
    """Puts `rate` user records per second (plus any hot-shard extra) into `stream` until stopped."""

    def __init__(self, kinesis: Any, stream: str, rate: float, aggregated_fraction: float, keys: ZipfKeys,
                 rng: random.Random) -> None:
        if rate < 0 or not 0 <= aggregated_fraction <= 1:
            raise ConfigError(f"rate must be >= 0 and aggregated fraction in [0, 1] (got {rate}, "
                              f"{aggregated_fraction})")
        self._kinesis = kinesis
        self._stream = stream
        self.rate = rate
        self._fraction = aggregated_fraction
        self._keys = keys
        self._rng = rng
        self._hot: dict[str, tuple[str, float]] = {}  # shard id -> (explicit hash key, extra records/s)
        self._pending: list[dict[str, Any]] = []
        self._resume_at = 0.0  # monotonic time before which a throttled producer puts nothing
        self._throttled_ticks = 0
        self._serial = itertools.count()
        self.stats = ProducerStats()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> Producer:
        """Start producing in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current tick."""
        self._stop.set()
        self._thread.join(10)

    @property
    def pending(self) -> int:
        """Kinesis records made but not yet accepted (rejected or held during a throttling backoff)."""
        return len(self._pending)

    def make_hot(self, shard_id: str, extra_rate: float) -> None:
        """Send `extra_rate` more records per second to `shard_id` (0 ends it); UnknownShard if it is not open."""
        if extra_rate < 0:
            raise ConfigError(f"extra rate must be >= 0 (got {extra_rate})")
        shards = {shard.shard_id: shard for shard in list_shards(self._kinesis, self._stream, RetryPolicy())
                  if shard.ending_sequence_number is None}
        if shard_id not in shards:
            raise UnknownShard(f"{shard_id} is not an open shard of {self._stream} (open: {', '.join(sorted(shards))})")
        shard = shards[shard_id]
        middle = (int(shard.starting_hash_key) + int(shard.ending_hash_key)) // 2
        with self._guard:
            if extra_rate == 0:
                self._hot.pop(shard_id, None)
            else:
                self._hot[shard_id] = (str(middle), extra_rate)

    def _run(self) -> None:
        last = time.monotonic()
        owed: dict[str, float] = {}
        while not self._stop.wait(TICK_SECONDS):
            now = time.monotonic()
            elapsed, last = now - last, now
            with self._guard:
                targets = {"": ("", self.rate), **self._hot}
            entries = list(self._pending)
            for target, (hash_key, rate) in targets.items():
                owed[target] = owed.get(target, 0.0) + rate * elapsed
                due = int(owed[target])
                owed[target] -= due
                entries += self._entries(due, hash_key or None)
            if now < self._resume_at:
                self._pending = entries
                continue
            try:
                self._back_off(now, self._put(entries))
            except Exception as exc:  # the emulator may be going away while we stop
                self.stats.errors += 1
                self._pending = entries
                log.warning("producer: PutRecords failed (%s); will retry", exc)

    def _back_off(self, now: float, throttled: bool) -> None:
        """After a throttled tick, hold puts for a full-jitter backoff that doubles with each throttled tick."""
        self._throttled_ticks = self._throttled_ticks + 1 if throttled else 0
        if throttled:
            ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self._throttled_ticks, 10))
            self._resume_at = now + self._rng.uniform(0.0, ceiling)

    def _entries(self, count: int, hash_key: str | None) -> list[dict[str, Any]]:
        """PutRecords entries carrying `count` user records: a fraction of them packed into aggregates."""
        if count == 0:
            return []
        keys = [f"hot-{next(self._serial)}" for _ in range(count)] if hash_key else self._keys.draw(count)
        records = [UserRecord(key, json.dumps({"n": next(self._serial), "key": key, "t": time.time()}).encode(),
                              hash_key) for key in keys]
        packed = sum(1 for _ in records if self._rng.random() < self._fraction)
        entries = [_entry(record.partition_key, record.explicit_hash_key, record.data, 1, aggregated=False)
                   for record in records[packed:]]
        aggregator = Aggregator(max_records=AGGREGATE_RECORDS)
        for start in range(0, packed, AGGREGATE_RECORDS):
            for aggregate in aggregator.pack(records[start:start + AGGREGATE_RECORDS]):
                entries.append(_entry(aggregate.partition_key, aggregate.explicit_hash_key, aggregate.data,
                                      len(aggregate.records), aggregated=True))
        self.stats.made_records += len(entries)
        return entries

    def _put(self, entries: list[dict[str, Any]]) -> bool:
        """Put `entries`, keeping those Kinesis rejected for the next put; True if Kinesis throttled any."""
        self._pending = []
        throttled = False
        for start in range(0, len(entries), PUT_RECORDS_LIMIT):
            batch = entries[start:start + PUT_RECORDS_LIMIT]
            answer = self._kinesis.put_records(StreamName=self._stream,
                                               Records=[entry["request"] for entry in batch])
            for entry, result in zip(batch, answer["Records"], strict=True):
                if "ErrorCode" in result:
                    self._pending.append(entry)
                    self.stats.retried += 1
                    if result["ErrorCode"] == THROTTLED:
                        throttled = True
                        self._count_throttle(str(result.get("ErrorMessage", "")))
                    continue
                self.stats.kinesis_records += 1
                self.stats.user_records += entry["user_records"]
                if entry["aggregated"]:
                    self.stats.aggregated_user_records += entry["user_records"]
                self.stats.by_shard[result["ShardId"]] += entry["user_records"]
        return throttled

    def _count_throttle(self, message: str) -> None:
        self.stats.throttled += 1
        shard = _SHARD_ID.search(message)
        self.stats.throttled_by_shard[shard.group(0) if shard else "unknown"] += 1


def _entry(partition_key: str, hash_key: str | None, data: bytes, user_records: int,
           aggregated: bool) -> dict[str, Any]:
    request: dict[str, Any] = {"Data": data, "PartitionKey": partition_key}
    if hash_key is not None:
        request["ExplicitHashKey"] = hash_key
    return {"request": request, "user_records": user_records, "aggregated": aggregated}
