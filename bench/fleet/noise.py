"""The live stack's measurement noise and lag, attached to a simulated fleet.

Without it every simulated worker reports each shard's exact rate, so the decider never sees noise and a fleet
settles in a run or two, while the live stack (`shardherd up`) moved leases every few seconds (bench/churn.py: 45
owner changes in 180 s). `LiveNoise` reproduces what the live agents measure:

* bursty arrivals per shard: the local stack's producer puts single user records and KPL aggregates of
  `AGGREGATE` records (`AGGREGATED_SHARE` of them), each aggregate landing whole in one shard; every `TICK` seconds a
  shard receives a compound-Poisson number of bytes around its mean rate;
* each worker reads its shards every `delivery_period` seconds (plain agents: about every half second; Spark
  agents: once per micro-batch, committing everything since the last batch) and feeds the agent's real
  `ThroughputRecorder` (built from the same settings) with the bytes and their arrival times, as
  `agent/shard_worker.py` and `agent/spark/driver.py` do;
* a lease that changes owner is not read between the old owner's stop and the new owner's first read; the new owner
  then reads that backlog in one delivery (the read burst the live bench saw after every move);
* heartbeats carry the recorder's figures (`compute`), so the leader gets the real windows, EMA and lag.

Calibrated against `python -m bench.churn --noise` (plain agents, 200 records/s, 8 shards, 3 agents): the settled
per-shard figures the API showed varied with sd/mean 0.11-0.21 (shard medians 0.65-3.6 KiB/s, the local stack's
rates in bench/fleet_noise.py), and 0.3-1.5x the median in the 10 s after a move.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.shared.lease import Lease

if TYPE_CHECKING:
    from bench.fleet.model import Fleet
    from bench.fleet.worker import SimWorker

TICK = 0.2  # the producer's tick
RECORD_BYTES = 61.0  # mean user record of the local stack's producer (12 KiB/s at 200 records/s)
AGGREGATE = 10
AGGREGATED_SHARE = 0.3
PLAIN_DELIVERY = 0.5
SPARK_DELIVERY = 2.0  # a 1 s processing-time trigger: a micro-batch plus its commit takes about 2 s on 2 cores
LOG_SECONDS = 120.0  # arrivals kept per shard (the longest a backlog can be)


@dataclass(frozen=True, slots=True)
class NoiseModel:
    """How bursty the shards are and how often agents read them."""

    delivery_period: float = PLAIN_DELIVERY
    record_bytes: float = RECORD_BYTES
    aggregate: int = AGGREGATE
    aggregated_share: float = AGGREGATED_SHARE


@dataclass
class _Shard:
    arrivals: deque[tuple[float, int]] = field(default_factory=deque)  # (wall time, bytes)
    position: float | None = None  # wall time up to which arrivals were delivered to some owner


class LiveNoise:
    """Bursty arrivals, per-worker throughput recorders and handoff backlogs for one simulated fleet."""

    def __init__(self, model: NoiseModel, seed: int) -> None:
        self.model = model
        self.rng = random.Random(seed)
        self.shards: dict[str, _Shard] = defaultdict(_Shard)
        self.recorders: dict[str, ThroughputRecorder] = {}
        self.readers: dict[str, str] = {}  # lease key -> worker reading it now
        self._fleet: Fleet | None = None

    @property
    def fleet(self) -> Fleet:
        """The fleet this model is attached to."""
        assert self._fleet is not None, "attach() first"
        return self._fleet

    def attach(self, fleet: Fleet) -> None:
        """Start producing on the fleet's clock; called once by the fleet."""
        self._fleet = fleet
        fleet.events.every(TICK, TICK, self._produce)

    def recorder(self, worker: SimWorker) -> ThroughputRecorder:
        """The worker's recorder, built as the agent builds its own."""
        recorder = self.recorders.get(worker.worker_id)
        if recorder is None:
            recorder = ThroughputRecorder.for_settings(self.fleet.clock, self.fleet.settings)
            self.recorders[worker.worker_id] = recorder
            offset = worker.rng.random() * self.model.delivery_period
            self.fleet.events.every(self.fleet.events.now() + offset, self.model.delivery_period,
                                    lambda: self._deliver(worker))
        return recorder

    def started(self, worker: SimWorker, lease: Lease) -> None:
        """The worker starts reading the lease from where the previous owner stopped; its recorder tracks the lease,
        seeded with the stored throughput if there is one, as agent/runtime.py's `lease_acquired` does."""
        key = lease.lease_key
        recorder = self.recorder(worker)
        recorder.track(key)
        if lease.throughput_kbps is not None:
            recorder.seed(key, lease.throughput_kbps)
        self.readers[key] = worker.worker_id
        shard = self.shards[key]
        if shard.position is None:
            shard.position = self.fleet.clock.time()

    def stopped(self, worker: SimWorker, key: str) -> None:
        """The worker stops reading `key` (handed off, lost or crashed)."""
        if self.readers.get(key) == worker.worker_id:
            del self.readers[key]
        recorder = self.recorders.get(worker.worker_id)
        if recorder is not None:
            recorder.drop(key)

    def _produce(self) -> bool:
        now = self.fleet.clock.time()
        m = self.model
        for key, kbps in self.fleet.stream.kbps.items():
            records = kbps * 1024.0 * TICK / m.record_bytes
            singles = _poisson(self.rng, records * (1 - m.aggregated_share))
            aggregates = _poisson(self.rng, records * m.aggregated_share / m.aggregate)
            size = int((singles + aggregates * m.aggregate) * m.record_bytes)
            shard = self.shards[key]
            if size:
                shard.arrivals.append((now, size))
            while shard.arrivals and shard.arrivals[0][0] < now - LOG_SECONDS:
                shard.arrivals.popleft()
        return True

    def _deliver(self, worker: SimWorker) -> bool:
        if not worker.alive:
            return False
        recorder = self.recorder(worker)
        now = self.fleet.clock.time()
        for key in worker.processing:
            if key in worker.leaving or self.readers.get(key) != worker.worker_id:
                continue
            shard = self.shards[key]
            since = shard.position if shard.position is not None else now
            read = []  # arrivals are in time order: only the newest, back to `since`, are unread
            for t, b in reversed(shard.arrivals):
                if t <= since:
                    break
                if t <= now:
                    read.append((t, b))
            read.reverse()
            shard.position = now
            if read:
                recorder.record(key, sum(b for _, b in read), read[0][0], read[-1][0])
        return True


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth for small means, a rounded normal above 30)."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, product, count = math.exp(-mean), rng.random(), 0
    while product > limit:
        product *= rng.random()
        count += 1
    return count
