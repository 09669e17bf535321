"""The simulator's world: virtual time driven by an event queue, and the stream whose shards the fleet reads."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardherd.shared.clock import ManualClock
from shardherd.shared.shards import MAX_HASH_KEY, Shard

PEAK_SHARD_KBPS = 1024.0  # a Kinesis shard takes at most 1 MiB/s of writes


class EventQueue:
    """Callbacks ordered by virtual time; running it advances the ManualClock to each event."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.start = clock.monotonic()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """Seconds since the simulation started."""
        return self.clock.monotonic() - self.start

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run `action` at simulation time `when` (not before now)."""
        heapq.heappush(self._heap, (max(when, self.now()), next(self._seq), action))

    def every(self, first: float, period: float, action: Callable[[], bool]) -> None:
        """Run `action` at `first` and then every `period` seconds while it returns True."""

        def tick() -> None:
            if action():
                self.at(self.now() + period, tick)

        self.at(first, tick)

    def run_until(self, end: float) -> None:
        """Run every event due up to `end`, then leave the clock at `end`."""
        while self._heap and self._heap[0][0] <= end:
            when, _, action = heapq.heappop(self._heap)
            if when > self.now():
                self.clock.advance(when - self.now())
            action()
        if end > self.now():
            self.clock.advance(end - self.now())


@dataclass
class Stream:
    """Shards of one stream with their current throughput (KiB/s): Zipf over randomly ranked shards."""

    shards: list[Shard]
    kbps: dict[str, float]

    @classmethod
    def tiled(cls, rates: Sequence[float]) -> Stream:
        """One open shard per rate (KiB/s), the shards tiling the hash key space in order."""
        width = (MAX_HASH_KEY + 1) // len(rates)
        shards = [Shard(f"shardId-{i:012d}", None, None, str(i * width),
                        str(MAX_HASH_KEY if i == len(rates) - 1 else (i + 1) * width - 1), str(100 + i))
                  for i in range(len(rates))]
        return cls(shards, {shard.shard_id: rate for shard, rate in zip(shards, rates, strict=True)})

    @classmethod
    def zipf(cls, count: int, exponent: float, rng: random.Random) -> Stream:
        """`count` open shards tiling the hash space; shard of rank r carries PEAK / r**exponent."""
        ranks = list(range(1, count + 1))
        rng.shuffle(ranks)
        return cls.tiled([PEAK_SHARD_KBPS / r**exponent for r in ranks])

    def total(self) -> float:
        """Throughput of the whole stream."""
        return sum(self.kbps.values())
