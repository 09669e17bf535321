"""Virtual-clock fleet simulator: the real shard sync planner, decider, leader loop and leader lock against simulated
workers on an in-memory store, compared with the `lease-count` strategy and a KCL 2.x taker model in the same process.

Time is a ManualClock moved by an event queue (nothing sleeps). Workers are modelled as the agent behaves:
* discovery every `discovery_interval` (GSI query of their own keys, a GetItem per new key; a lease still in a
  handoff towards them is ignored until the old owner completes it);
* mode `worker`: a heartbeat (worker record with hb+1, per-lease throughput and the CPU history) every heartbeat
  interval; mode `lease`: every held lease renewed every `failover/3 - epsilon` with its throughput, and the worker
  record (CPU history) written every reporter interval, as KCL 3.x workers do;
* CPU sampled every second as `base + carried KiB/s / capacity` (+ seeded noise, clamped to 100), averaged into one
  `sts` value per report (worker mode: every heartbeat, as agent/metrics/sampler.py does; lease mode: every
  reporter interval);
* a lease handed off to another worker is checkpointed and its handoff completed after `handoff_delay`;
* crash = every scheduled action of the worker stops; graceful scale-in = the worker reports DRAINING and exits once
  it holds nothing (KCL 2.x has no drain: its workers just stop after a final checkpoint).
KCL 2.x workers renew like lease mode and run `bench.kcl2_taker.Kcl2Taker` every `(failover + epsilon) x 2`.

Figures per scenario and variant (definitions in `Result`, `minimum_moves` and `within_bound`): lease moves (changes
of the actual owner to another worker, counted exactly from the applied writes) against the minimum, leader runs and
balancing runs from the leader's first reaction until balanced, final max/mean load, and store requests per minute
by kind. Variants: `variance` (band balancing, the default), `variance-kcl` (KCL's dampened budgets), `lease-count`
and a KCL 2.x taker model.

    python -m bench.fleet_sim --quick            # all scenarios, small fleets (about a minute on 2 cores)
    python -m bench.fleet_sim                    # the sizes of issue 3
    python -m bench.fleet_sim --scenario crash --quick --zipf 1.0
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.kcl2_taker import Kcl2Taker, taker_interval_seconds
from bench.store_counter import READ_KINDS, WRITE_KINDS, CountingStore
from coordinator.leader_lock import LeaderLock
from coordinator.leader_loop import LeaderLoop
from coordinator.run_summary import RunSummary
from coordinator.shard_sync import plan_shard_sync
from shared.checkpoint import Checkpoint
from shared.clock import ManualClock
from shared.config import Settings, load_settings
from shared.lease import Lease
from shared.memory_store import MemoryLeaseStore
from shared.shards import MAX_HASH_KEY, Shard
from shared.store import LeaseStore, Outcome, TableNames
from shared.worker import CPU_METRIC, LeaseProgress, WorkerRecord, WorkerState

if TYPE_CHECKING:
    from bench.fleet_noise import LiveNoise, NoiseModel

PEAK_SHARD_KBPS = 1024.0  # a Kinesis shard takes at most 1 MiB/s of writes
BASE_CPU = 10.0
MEAN_CPU_AT_START = 50.0
CPU_NOISE_SD = 2.0
HANDOFF_DELAY = 1.0
LOCK_TICK = 0.5
SAMPLE_PERIOD = 1.0
THRESHOLD = 1.10  # max/mean load that counts as balanced (1 + reBalanceThresholdPercentage / 100)

VARIANCE = "variance"
VARIANCE_KCL = "variance-kcl"  # strategy variance with KCL's dampened-budget balancing (variance_balancing = kcl)
LEASE_COUNT = "lease-count"
KCL2 = "kcl2-taker"
VARIANTS = (VARIANCE, VARIANCE_KCL, LEASE_COUNT, KCL2)


# ---------------------------------------------------------------------------------------------------------- the world
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
    def zipf(cls, count: int, exponent: float, rng: random.Random) -> Stream:
        """`count` open shards tiling the hash space; shard of rank r carries PEAK / r**exponent."""
        width = (MAX_HASH_KEY + 1) // count
        shards = []
        for index in range(count):
            end = MAX_HASH_KEY if index == count - 1 else (index + 1) * width - 1
            shards.append(Shard(f"shardId-{index:012d}", None, None, str(index * width), str(end), str(100 + index)))
        ranks = list(range(1, count + 1))
        rng.shuffle(ranks)
        return cls(shards, {s.shard_id: PEAK_SHARD_KBPS / r**exponent for s, r in zip(shards, ranks, strict=True)})

    def total(self) -> float:
        """Throughput of the whole stream."""
        return sum(self.kbps.values())


@dataclass(frozen=True, slots=True)
class Timing:
    """The intervals workers use, from Settings."""

    heartbeat: float
    discovery: float
    reporter: float
    failover: float
    epsilon: float
    history: int

    @classmethod
    def of(cls, settings: Settings) -> Timing:
        """Seconds from the millisecond settings."""
        return cls(settings.effective_heartbeat_interval_millis / 1000, settings.discovery_interval_millis / 1000,
                   settings.worker_metrics_reporter_freq_millis / 1000, settings.failover_time_millis / 1000,
                   settings.epsilon_millis / 1000, settings.no_of_persisted_metrics_per_worker_metrics)


_sequence = itertools.count(10**9)


class SimWorker:
    """One simulated worker; `mode` is `worker`, `lease` (shardherd liveness modes) or `kcl2` (KCL 2.x taker)."""

    def __init__(self, worker_id: str, mode: str, fleet: Fleet, rng: random.Random) -> None:
        self.worker_id = worker_id
        self.mode = mode
        self.fleet = fleet
        self.rng = rng
        self.alive = True
        self.draining = False
        self.processing: dict[str, int] = {}  # lease key -> counter last written or read (lease and kcl2 modes)
        self.leaving: set[str] = set()  # leases being handed off by this worker
        self.heartbeat = 0
        self.reported_at = -math.inf
        self.history: list[float] = []
        self.samples: list[float] = []
        self.taker: Kcl2Taker | None = None

    # ---- load
    def carried(self) -> float:
        """KiB/s of the leases this worker processes."""
        kbps = self.fleet.stream.kbps
        return sum(kbps.get(key, 0.0) for key in self.processing)

    def sample_cpu(self) -> None:
        """One CPU sample from the carried throughput."""
        cpu = BASE_CPU + self.carried() / self.fleet.capacity + self.rng.gauss(0.0, CPU_NOISE_SD)
        self.samples.append(min(100.0, max(0.0, cpu)))

    def _report(self) -> None:
        """Close the sampling interval into one history value (-1 if nothing was sampled)."""
        self.reported_at = self.fleet.events.now()
        value = round(statistics.fmean(self.samples), 6) if self.samples else -1.0
        self.samples = []
        self.history = [*self.history, value][-self.fleet.timing.history:]

    def _record(self) -> WorkerRecord:
        throughput = {key: self.fleet.stream.kbps.get(key, 0.0) for key in self.processing} if self.mode == "worker" \
            else {}
        if self.fleet.noise is not None and self.mode == "worker":  # what the agent's recorder measures
            throughput = self.fleet.noise.report(self)
        metrics = not self.fleet.settings.disable_worker_metrics
        progress = {key: LeaseProgress(1_000, 10**8, 10**11) for key in throughput} if self.fleet.progress else {}
        return WorkerRecord(
            self.worker_id, int(self.fleet.clock.time()), {CPU_METRIC: tuple(self.history)} if metrics else {},
            {CPU_METRIC: (100.0,)} if metrics else {},
            heartbeat=self.heartbeat, state=WorkerState.DRAINING if self.draining else WorkerState.ACTIVE,
            lease_throughput=throughput, lease_progress=progress)

    # ---- scheduled actions (each returns False once the worker is gone, which stops its schedule)
    def beat(self) -> bool:
        """Worker mode: heartbeat with a fresh CPU report and the per-lease throughput."""
        if not self.alive:
            return False
        self.heartbeat += 1
        period = self.fleet.report_seconds or self.fleet.timing.heartbeat
        if self.fleet.events.now() - self.reported_at >= period - 1e-6:
            self._report()
        self.fleet.store.upsert_worker(self._record())
        if self.draining and not self.processing and not self.leaving:
            self.alive = False
        return self.alive

    def report(self) -> bool:
        """Lease mode: the KCL worker-metrics reporter."""
        if not self.alive:
            return False
        self._report()
        self.fleet.store.upsert_worker(self._record())
        return True

    def renew(self) -> bool:
        """Lease and kcl2 modes: renew every held lease (with its throughput); a failed renewal tells why."""
        if not self.alive:
            return False
        store = self.fleet.store
        for key, counter in list(self.processing.items()):
            if key in self.leaving:
                continue
            tp = self.fleet.stream.kbps.get(key, 0.0) if self.mode == "lease" else None
            outcome = store.renew(key, self.worker_id, counter, tp)
            if outcome.applied and outcome.lease is not None:
                self.processing[key] = outcome.lease.lease_counter
            else:
                self._lost(key, outcome.lease)
        return True

    def discover(self) -> bool:
        """Leases assigned to me (GSI) that I do not process yet; leases no longer mine are checked and let go."""
        if not self.alive:
            return False
        store = self.fleet.store
        owned = store.list_owned_keys(self.worker_id)
        for key in owned:
            if key in self.processing:
                continue
            lease = store.get_lease(key)
            if lease is not None and lease.lease_owner == self.worker_id and lease.checkpoint_owner is None:
                self.processing[key] = lease.lease_counter
                if self.fleet.noise is not None:
                    self.fleet.noise.started(self, key)
        mine = set(owned)
        for key in [k for k in self.processing if k not in mine and k not in self.leaving]:
            self._lost(key, store.get_lease(key))
        return True

    def take(self) -> bool:
        """KCL 2.x: one taker pass; taken leases start being processed (and renewed) at once."""
        if not self.alive or self.taker is None:
            return False
        for lease in self.taker.take_leases():
            self.processing[lease.lease_key] = lease.lease_counter
        return True

    def _lost(self, key: str, lease: Lease | None) -> None:
        """The lease is not mine any more: finish a handoff towards its new owner, or just stop."""
        if lease is not None and lease.checkpoint_owner == self.worker_id:
            self.leaving.add(key)
            self.fleet.events.at(self.fleet.events.now() + HANDOFF_DELAY, lambda: self._hand_over(key))
            return
        self._stop(key)

    def _stop(self, key: str) -> None:
        self.processing.pop(key, None)
        if self.fleet.noise is not None:
            self.fleet.noise.stopped(self, key)

    def _hand_over(self, key: str) -> None:
        """Final checkpoint, then complete the handoff (KCL 3.x's graceful handoff, step 3: docs/store-semantics.md)."""
        self.leaving.discard(key)
        self._stop(key)
        if not self.alive:
            return
        store = self.fleet.store
        store.checkpoint(key, self.worker_id, Checkpoint.at(next(_sequence)))
        store.complete_handoff(key, self.worker_id)

    def checkpoint_all(self) -> bool:
        """Application checkpoints of every processed lease (optional periodic load)."""
        if not self.alive:
            return False
        for key in [k for k in self.processing if k not in self.leaving]:
            outcome = self.fleet.store.checkpoint(key, self.worker_id, Checkpoint.at(next(_sequence)))
            if outcome.applied and outcome.lease is not None:
                self.processing[key] = outcome.lease.lease_counter
        return True

    def crash(self) -> None:
        """kill -9: nothing more is written."""
        self.alive = False


# ---------------------------------------------------------------------------------------------------------- a fleet
class MoveCounter:
    """Follows the actual owner of every lease from the applied writes; a move is a change to another worker."""

    def __init__(self) -> None:
        self.owner: dict[str, str | None] = {}
        self.moves = 0

    def __call__(self, outcome: Outcome) -> None:
        lease = outcome.lease
        if lease is None:
            return
        new = lease.actual_owner
        if new is not None and new != self.owner.get(lease.lease_key):
            self.moves += 1
        self.owner[lease.lease_key] = new


@dataclass
class Fleet:
    """One variant of one scenario: store, stream, workers, and (unless kcl2) a leader on a virtual clock."""

    variant: str
    mode: str
    stream: Stream
    seed: int
    report_seconds: float | None = None
    checkpoint_seconds: float = 0.0
    overrides: dict[str, object] = field(default_factory=dict)  # settings beyond the defaults
    noise: LiveNoise | None = None  # the live stack's measurement noise and lag (bench/fleet_noise.py)
    clock: ManualClock = field(default_factory=ManualClock)
    workers: dict[str, SimWorker] = field(default_factory=dict)
    # Hooks for bench/fleet_cost.py: a wrapper around the in-memory store (e.g. a StoreMeter) and a run hook.
    wrap_store: Callable[[LeaseStore], LeaseStore] | None = None
    on_run: Callable[[RunSummary], None] | None = None
    progress: bool = False  # heartbeats carry per-lease progress (lag, records, bytes) as the real agent's do

    def __post_init__(self) -> None:
        liveness = "worker" if self.mode == "worker" else "lease"  # KCL 2.x workers renew leases like lease mode
        overrides: dict[str, object] = {"application_name": "fleet-sim", "liveness_mode": liveness}
        if self.variant == LEASE_COUNT:
            overrides["lease_assignment_strategy"] = "lease-count"
        if self.variant == VARIANCE_KCL:
            overrides["variance_balancing"] = "kcl"
        self.settings = load_settings(**overrides, **self.overrides)
        self.timing = Timing.of(self.settings)
        self.moves = MoveCounter()
        self.inner = MemoryLeaseStore(TableNames.for_application("fleet-sim"))
        wrapped = self.wrap_store(self.inner) if self.wrap_store is not None else self.inner
        self.store = CountingStore(wrapped, on_write=self.moves)
        self.events = EventQueue(self.clock)
        self.rng = random.Random(self.seed)
        self.capacity = 1.0
        self.runs: list[tuple[float, bool, bool]] = []  # (time, balancing run, moved a lease) of every leader run
        self.loop: LeaderLoop | None = None
        self.lock: LeaderLock | None = None
        if self.variant != KCL2:
            lock = LeaderLock(self.store, "coordinator-a", self.clock, self.settings.leader_lock_lease_duration_millis,
                              self.settings.leader_lock_heartbeat_period_millis)
            self.lock = lock
            self.loop = LeaderLoop(self.store, lock, self.settings, self.clock,
                                   shard_source=lambda: list(self.stream.shards), on_run=self.on_run)

            def tick() -> bool:
                lock.tick()
                return True

            self.events.every(0.0, LOCK_TICK, tick)
            self.events.every(1.0, self.settings.lease_assignment_interval_millis / 1000, self._lead)
        else:
            plan = plan_shard_sync(self.stream.shards, [], self.settings.initial_position_in_stream)
            for creation in plan.creates:
                self.store.create_lease(creation.lease)
        self.events.every(SAMPLE_PERIOD, SAMPLE_PERIOD, self._sample)
        if self.noise is not None:
            self.noise.attach(self)

    def _lead(self) -> bool:
        assert self.loop is not None
        summary = self.loop.run_once()
        if summary is not None:
            moved = summary.plan is not None and bool(summary.plan.moves)
            self.runs.append((self.events.now(), summary.balanced_this_run, moved))
        return True

    def _sample(self) -> bool:
        for worker in self.workers.values():
            if worker.alive:
                worker.sample_cpu()
        return True

    def calibrate(self, workers: int) -> None:
        """CPU capacity such that `workers` workers sharing the stream sit at MEAN_CPU_AT_START on average."""
        share = self.stream.total() / max(1, workers)
        self.capacity = share / (MEAN_CPU_AT_START - BASE_CPU) if share > 0 else 1.0

    def add_workers(self, count: int) -> list[str]:
        """Start `count` new workers within the next second (seeded offsets)."""
        now = self.events.now()
        added = []
        for _ in range(count):
            wid = f"w{len(self.workers):04d}"
            worker = SimWorker(wid, self.mode, self, random.Random(self.rng.random()))
            self.workers[wid] = worker
            start = now + self.rng.random()
            t = self.timing
            if self.variant == KCL2:
                worker.taker = Kcl2Taker(wid, self.store, self.clock, t.failover, random.Random(self.rng.random()),
                                         max_leases_for_worker=self.settings.max_leases_for_worker)
                self.events.every(start, taker_interval_seconds(t.failover, t.epsilon), worker.take)
                self.events.every(start + t.heartbeat, t.heartbeat, worker.renew)
            else:
                self.events.every(start, t.discovery, worker.discover)
                if self.mode == "worker":
                    self.events.every(start, t.heartbeat, worker.beat)
                else:
                    self.events.every(start, t.heartbeat, worker.renew)
                    self.events.every(start, self.report_seconds or t.reporter, worker.report)
            if self.checkpoint_seconds > 0:
                self.events.every(start + self.checkpoint_seconds, self.checkpoint_seconds, worker.checkpoint_all)
            added.append(wid)
        return added

    def live(self) -> list[str]:
        """Workers that run and are not draining (the ones load should be spread over)."""
        return sorted(w.worker_id for w in self.workers.values() if w.alive and not w.draining)

    def leases(self) -> list[Lease]:
        """The lease table, read without being counted."""
        return self.inner.scan_leases().leases

    def heaviest_held(self, metric: str) -> dict[str, float]:
        """Per live worker, the load its heaviest lease alone would give it (same units as `loads`)."""
        tops: dict[str, float] = {}
        idle = self.stream.total() <= 0
        for lease in self.leases():
            owner = lease.actual_owner
            if owner is None:
                continue
            weight = 1.0 if idle and metric == "tp" else self.stream.kbps.get(lease.lease_key, 0.0)
            tops[owner] = max(tops.get(owner, 0.0), weight)
        if metric == "cpu":
            return {w: min(100.0, BASE_CPU + top / self.capacity) for w, top in tops.items()}
        return tops

    def loads(self, metric: str) -> dict[str, float]:
        """Load per live worker by actual owner: `cpu` (the modelled CPU without noise, what the decider balances)
        or `tp` (carried throughput; lease counts when the stream is idle)."""
        loads = dict.fromkeys(self.live(), 0.0)
        idle = self.stream.total() <= 0
        for lease in self.leases():
            owner = lease.actual_owner
            if owner in loads:
                loads[owner] += 1.0 if idle and metric == "tp" else self.stream.kbps.get(lease.lease_key, 0.0)
        if metric == "cpu":
            return {w: min(100.0, BASE_CPU + load / self.capacity) for w, load in loads.items()}
        return loads


def ratio(loads: dict[str, float]) -> float:
    """max/mean of the loads (1.0 for an empty or all-zero fleet)."""
    values = list(loads.values())
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def lpt_ratio(weights: Iterable[float], workers: int) -> float:
    """max/mean of a longest-processing-time-first packing: a near-optimal reference for what is achievable."""
    bins = [0.0] * max(1, workers)
    for weight in sorted(weights, reverse=True):
        heapq.heapreplace(bins, bins[0] + weight)
    mean = statistics.fmean(bins)
    return max(bins) / mean if mean > 0 else 1.0


def within_bound(fleet: Fleet, metric: str) -> bool:
    """Balanced: every worker's load at most THRESHOLD x max(mean, the load of its heaviest lease alone).

    With Zipf shards on many workers one shard alone can exceed the mean (the big 500-shard fleet: LPT packing
    reaches max/mean 4.6), so max/mean <= 1.10 cannot be reached; a worker holding such a shard may carry up to
    THRESHOLD x that shard, every other worker is held to THRESHOLD x the mean. Equal to max/mean <= THRESHOLD
    wherever no lease outweighs the mean.
    """
    loads = fleet.loads(metric)
    if not loads:
        return True
    mean = statistics.fmean(loads.values())
    tops = fleet.heaviest_held(metric)
    return all(load <= THRESHOLD * max(mean, tops.get(w, 0.0)) for w, load in loads.items())


def minimum_moves(fleet: Fleet) -> tuple[int, int]:
    """The fewest owner changes that can reach max/mean <= THRESHOLD from the assignment at the event: (forced, shed).


    Every lease that is unowned or held by a leaving (crashed, drained) worker must move; every staying worker whose
    load exceeds its ceiling (THRESHOLD x max(mean, its heaviest lease); see `within_bound`) after the event must
    shed at least the fewest of its leases (largest first) that cover the excess. A lease so heavy that even the
    least loaded other worker would pass THRESHOLD x the mean with it can only move if its receiver sheds too, so it
    costs two moves: a worker's count is the smaller of "only leases others can take" and "any leases, plus one".
    A lower bound: moving leases onto a worker never lowers another worker's excess. `forced` alone is the minimum
    for every strategy; `shed` only binds a strategy that does reach the band.
    """
    idle = fleet.stream.total() <= 0
    stay = fleet.live()
    held: dict[str, list[float]] = {w: [] for w in stay}
    forced = 0
    for lease in fleet.leases():
        owner = lease.actual_owner
        weight = 1.0 if idle else fleet.stream.kbps.get(lease.lease_key, 0.0)
        if owner in held:
            held[owner].append(weight)
        else:
            forced += 1
    total = len(fleet.leases()) if idle else fleet.stream.total()
    mean = total / max(1, len(stay))
    loads = {w: sum(weights) for w, weights in held.items()}
    shed = 0
    for wid, weights in held.items():
        ceiling = THRESHOLD * max([mean, *weights])
        if loads[wid] <= ceiling:
            continue
        room = THRESHOLD * mean - min((load for w, load in loads.items() if w != wid), default=0.0)
        takeable = [w for w in weights if w <= room]
        any_count = _cover(weights, loads[wid] - ceiling)
        heavy_extra = 1 if len(takeable) < len(weights) else 0
        shed += min(_cover(takeable, loads[wid] - ceiling), any_count + heavy_extra)
    return forced, shed


def greedy_moves(fleet: Fleet) -> tuple[int, bool]:
    """Moves an offline greedy with exact loads makes from the assignment at the event, and whether it reached the
    balance bound: an achievable count, so the true minimum lies between `minimum_moves` and this.

    Leases that must move go largest first to the least loaded worker; then, while a worker is above its ceiling,
    the most loaded one gives the lease nearest half its gap to the least loaded one.
    """
    idle = fleet.stream.total() <= 0
    held: dict[str, list[float]] = {w: [] for w in fleet.live()}
    if not held:
        return 0, True
    forced: list[float] = []
    for lease in fleet.leases():
        weight = 1.0 if idle else fleet.stream.kbps.get(lease.lease_key, 0.0)
        held.get(lease.actual_owner or "", forced).append(weight)
    loads = {w: sum(weights) for w, weights in held.items()}
    moves = 0
    for weight in sorted(forced, reverse=True):
        wid = min(loads, key=lambda w: (loads[w], w))
        held[wid].append(weight)
        loads[wid] += weight
        moves += 1
    mean = sum(loads.values()) / len(loads)
    for _ in range(10 * len(fleet.stream.shards) + 10):
        over = [w for w in loads if loads[w] > THRESHOLD * max([mean, *held[w]]) * (1 + 1e-9)]
        if not over:
            return moves, True
        donor = max(over, key=lambda w: (loads[w], w))
        receiver = min(loads, key=lambda w: (loads[w], w))
        gap = loads[donor] - loads[receiver]
        candidates = [weight for weight in held[donor] if weight < gap]
        if not candidates:
            break
        weight = min(candidates, key=lambda c: abs(c - gap / 2))
        held[donor].remove(weight)
        held[receiver].append(weight)
        loads[donor] -= weight
        loads[receiver] += weight
        moves += 1
    return moves, False


def _cover(weights: list[float], excess: float) -> int:
    """How many of `weights`, largest first, cover `excess` (more than all of them if they cannot)."""
    count = 0
    for weight in sorted(weights, reverse=True):
        if excess <= 0:
            return count
        excess -= weight
        count += 1
    return count if excess <= 0 else len(weights) + 1


# ---------------------------------------------------------------------------------------------------------- scenarios
@dataclass(frozen=True, slots=True)
class Size:
    """Fleet sizes and durations of one run of the benchmark."""

    shards: int
    workers: int
    change: int  # workers added, drained, or shards made hot
    big_shards: int
    big_workers: int
    cost_shards: int
    cost_workers: int
    warmup: float
    observe: float


FULL = Size(200, 20, 5, 500, 100, 1000, 50, 300.0, 300.0)
QUICK = Size(48, 8, 2, 100, 20, 1000, 50, 160.0, 160.0)


@dataclass(frozen=True, slots=True)
class Balance:
    """How one load measure evolved from the event on.

    `runs`: leader runs (kcl2: taker rounds) until the fleet became balanced (`within_bound`, every lease on a live
    worker) for good; None if it was not balanced at the end. `balancing_runs`: how many of those leader runs were
    balancing runs. `final`: max/mean at the end; `within`: whether the end state is within the bound.
    """

    runs: int | None
    balancing_runs: int | None
    seconds: float | None
    final: float
    within: bool


@dataclass
class Result:
    """What one variant did in one scenario, measured from the event on.

    `moves`: changes of a lease's actual owner to another worker (an unowned lease getting an owner counts; a
    handoff counts once, when it completes). `forced`, `minimum` (= forced + shed): see `minimum_moves`; where the
    offline greedy reached the bound with fewer moves, its count is the minimum.
    `cpu`, `tp`: balance judged on the modelled CPU and on carried throughput (see `Balance`). `greedy`: moves of
    an offline greedy with exact loads from the same state, and whether it reached the bound (`greedy_moves`).
    """

    scenario: str
    variant: str
    moves: int
    forced: int
    minimum: int
    cpu: Balance
    tp: Balance
    lpt_ratio: float
    split: tuple[int, int]
    lease_counts: tuple[int, int]
    minutes: float
    counts: dict[str, int]
    greedy: tuple[int, bool] | None
    unowned: int
    dead_owned: int
    missing: int

    def per_minute(self, kinds: Sequence[str]) -> dict[str, float]:
        """Requests per minute of the given kinds (only those that occurred)."""
        return {k: self.counts[k] / self.minutes for k in kinds if self.counts.get(k)}

    def total_per_minute(self, kinds: Sequence[str]) -> float:
        """All requests of the given kinds per minute."""
        return sum(self.per_minute(kinds).values())


Event = Callable[[Fleet], None]  # applies the scenario's change


def _scale_out(count: int) -> Event:
    def apply(fleet: Fleet) -> None:
        fleet.add_workers(count)

    return apply


def _scale_in(count: int) -> Event:
    def apply(fleet: Fleet) -> None:
        for wid in fleet.live()[-count:]:
            worker = fleet.workers[wid]
            if fleet.variant == KCL2:  # KCL 2.x has no drain: the worker checkpoints and stops
                worker.checkpoint_all()
                worker.crash()
            else:
                worker.draining = True

    return apply


def _crash(fleet: Fleet) -> None:
    fleet.workers[fleet.live()[0]].crash()


def _hot(count: int) -> Event:
    def apply(fleet: Fleet) -> None:
        keys = sorted(fleet.stream.kbps, key=lambda k: (fleet.stream.kbps[k], k))
        chosen = random.Random(fleet.seed + 1).sample(keys[: len(keys) // 2], count)  # quiet shards turn hot
        for key in chosen:
            fleet.stream.kbps[key] = PEAK_SHARD_KBPS

    return apply


def _idle(fleet: Fleet) -> None:
    for key in fleet.stream.kbps:
        fleet.stream.kbps[key] = 0.0


def _nothing(fleet: Fleet) -> None:
    """No change: the scenario measures what happens from the start (cold start) or in steady state (cost)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A fleet, an optional warm-up, an event, and an observation window."""

    name: str
    shards: int
    workers: int
    event: Event
    warmup: bool
    modes: tuple[tuple[str, str], ...] = ((VARIANCE, "worker"), (VARIANCE_KCL, "worker"), (LEASE_COUNT, "worker"),
                                          (KCL2, "kcl2"))
    checkpoint_seconds: float = 0.0


def scenarios(size: Size) -> list[Scenario]:
    """Every scenario at the given size."""
    n, w, k = size.shards, size.workers, size.change
    cost_modes = ((VARIANCE, "worker"), (VARIANCE, "lease"), (KCL2, "kcl2"))
    return [
        Scenario("cold-start", n, w, _nothing, warmup=False),
        Scenario(f"scale-out+{k}", n, w, _scale_out(k), warmup=True),
        Scenario(f"scale-in-{k}", n, w, _scale_in(k), warmup=True),
        Scenario("crash", n, w, _crash, warmup=True),
        Scenario(f"hot-shards-{k}", n, w, _hot(k), warmup=True),
        Scenario("idle-stream", n, w, _idle, warmup=True),
        Scenario(f"{size.big_shards}sh-{size.big_workers}+{size.big_workers}w", size.big_shards, size.big_workers,
                 _scale_out(size.big_workers), warmup=True),
        Scenario(f"cost-{size.cost_shards}sh-{size.cost_workers}w", size.cost_shards, size.cost_workers, _nothing,
                 warmup=True, modes=cost_modes),
        Scenario(f"cost-{size.cost_shards}sh-{size.cost_workers}w-ckpt60s", size.cost_shards, size.cost_workers,
                 _nothing, warmup=True, modes=cost_modes, checkpoint_seconds=60.0),
    ]


def run_variant(scenario: Scenario, variant: str, mode: str, size: Size, seed: int, zipf: float,
                report_seconds: float | None, noise: NoiseModel | None = None) -> Result:
    """Run one variant of a scenario and measure it from the event on (with the live stack's noise if given)."""
    from bench.fleet_noise import LiveNoise

    stream = Stream.zipf(scenario.shards, zipf, random.Random(seed))
    fleet = Fleet(variant, mode, stream, seed, report_seconds, scenario.checkpoint_seconds,
                  noise=None if noise is None else LiveNoise(noise, seed))
    fleet.calibrate(scenario.workers)
    fleet.add_workers(scenario.workers)
    if scenario.warmup:
        fleet.events.run_until(size.warmup)
    original = set(fleet.workers)
    scenario.event(fleet)
    start = fleet.events.now()
    forced, shed = (len(fleet.stream.shards), 0) if not scenario.warmup else minimum_moves(fleet)
    greedy = greedy_moves(fleet) if scenario.warmup else None
    fleet.store.reset()
    fleet.moves.moves = 0
    since: dict[str, float | None] = {"cpu": None, "tp": None}
    step = fleet.settings.lease_assignment_interval_millis / 1000
    end = start + size.observe
    t = start
    while t < end:
        t = min(end, t + step)
        fleet.events.run_until(t)
        placed = not _unplaced(fleet)
        for metric, first in since.items():
            balanced = placed and within_bound(fleet, metric)
            since[metric] = (first if first is not None else t) if balanced else None
    balances = {metric: _balance(fleet, metric, start, first) for metric, first in since.items()}
    return _result(scenario, fleet, start, (forced, shed), balances, original, greedy)


def _unplaced(fleet: Fleet) -> bool:
    live = set(fleet.live())
    return any(lease.actual_owner not in live for lease in fleet.leases())


def _balance(fleet: Fleet, metric: str, start: float, balanced_since: float | None) -> Balance:
    runs = balancing = seconds = None
    if balanced_since is not None:
        seconds = balanced_since - start
        if fleet.variant == KCL2:
            runs = math.ceil(seconds / taker_interval_seconds(fleet.timing.failover, fleet.timing.epsilon))
        else:
            # Counted from the leader's first reaction (its first move after the event): before it, a crashed
            # worker's leases are not expired yet and a new worker has not reported, so no decider could act.
            reaction = next((r[0] for r in fleet.runs if r[0] >= start and r[2]), start)
            until = [r for r in fleet.runs if reaction <= r[0] <= balanced_since]
            runs, balancing = len(until), sum(1 for r in until if r[1])
    return Balance(runs, balancing, seconds, ratio(fleet.loads(metric)), within_bound(fleet, metric))


def _result(scenario: Scenario, fleet: Fleet, start: float, minimum: tuple[int, int], balances: dict[str, Balance],
            original: set[str], greedy: tuple[int, bool] | None) -> Result:
    leases = fleet.leases()
    alive = {w.worker_id for w in fleet.workers.values() if w.alive}
    per_worker: dict[str, int] = dict.fromkeys(fleet.live(), 0)
    for lease in leases:
        if lease.actual_owner in per_worker:
            per_worker[lease.actual_owner] += 1
    weights = [fleet.stream.kbps.get(lease.lease_key, 0.0) for lease in leases]
    if fleet.stream.total() <= 0:
        weights = [1.0] * len(leases)
    return Result(
        scenario=scenario.name, variant=f"{fleet.variant}/{fleet.mode}", moves=fleet.moves.moves, forced=minimum[0],
        # The counting bound is not a true lower bound once a shard outweighs the mean (moving it raises its
        # receiver's allowance), so an achieved greedy count below it replaces it.
        minimum=min(sum(minimum), greedy[0]) if greedy is not None and greedy[1] else sum(minimum),
        cpu=balances["cpu"], tp=balances["tp"], lpt_ratio=lpt_ratio(weights, len(per_worker)),
        split=(sum(n for w, n in per_worker.items() if w in original),
               sum(n for w, n in per_worker.items() if w not in original)),
        lease_counts=(min(per_worker.values(), default=0), max(per_worker.values(), default=0)),
        minutes=(fleet.events.now() - start) / 60, counts=dict(fleet.store.counts),
        greedy=greedy,
        unowned=sum(1 for lease in leases if lease.actual_owner is None),
        dead_owned=sum(1 for lease in leases if lease.actual_owner is not None and lease.actual_owner not in alive),
        missing=len({s.shard_id for s in fleet.stream.shards} - {lease.lease_key for lease in leases}),
    )


def run_scenario(scenario: Scenario, size: Size, seed: int, zipf: float,
                 report_seconds: float | None = None, noise: NoiseModel | None = None) -> list[Result]:
    """Every variant of one scenario, same seed."""
    return [run_variant(scenario, variant, mode, size, seed, zipf, report_seconds, noise)
            for variant, mode in scenario.modes]


# ---------------------------------------------------------------------------------------------------------- output
def _short(kinds: dict[str, float]) -> str:
    return " ".join(f"{kind}={value:.0f}" for kind, value in sorted(kinds.items(), key=lambda kv: -kv[1]))


def table(results: Sequence[Result]) -> str:
    """The per-scenario table and the cost lines."""
    header = (f"{'scenario':<24} {'variant':<19} {'moves':>5} {'min=forced+shed':>15} {'x min':>5} {'greedy':>6} "
              f"{'runs cpu/tp':>11} {'bal.runs':>8} {'max/mean cpu/tp':>15} {'LPT':>5} {'leases':>6} {'old/new':>9} "
              f"{'reads/min':>9} {'writes/min':>10}")
    lines = [header, "-" * len(header)]
    for r in results:
        factor = f"{r.moves / r.minimum:.2f}" if r.minimum else ("0" if r.moves == 0 else "inf")
        split = f"{r.split[0]}/{r.split[1]}" if r.split[1] else "-"
        lines.append(
            f"{r.scenario:<24} {r.variant:<19} {r.moves:>5} {f'{r.minimum}={r.forced}+{r.minimum - r.forced}':>15} "
            f"{factor:>5} {_greedy(r):>6} {f'{_opt(r.cpu.runs)}/{_opt(r.tp.runs)}':>11} "
            f"{f'{_opt(r.cpu.balancing_runs)}/{_opt(r.tp.balancing_runs)}':>8} "
            f"{f'{r.cpu.final:.3f}/{r.tp.final:.3f}':>15} {r.lpt_ratio:>5.2f} "
            f"{f'{r.lease_counts[0]}-{r.lease_counts[1]}':>6} {split:>9} "
            f"{r.total_per_minute(READ_KINDS):>9.0f} {r.total_per_minute(WRITE_KINDS):>10.0f}")
    lines.append("")
    lines.append("store requests per minute by kind (observation window):")
    for r in results:
        lines.append(f"  {r.scenario:<24} {r.variant:<20} reads:  {_short(r.per_minute(READ_KINDS))}")
        lines.append(f"  {'':<24} {'':<20} writes: {_short(r.per_minute(WRITE_KINDS))}")
    return "\n".join(lines)


def _greedy(r: Result) -> str:
    """The offline greedy's moves; `*` if it did not reach the bound; `-` where it does not apply (cold start)."""
    if r.greedy is None:
        return "-"
    return f"{r.greedy[0]}{'' if r.greedy[1] else '*'}"


def _opt(value: float | None, spec: str = "d") -> str:
    return "-" if value is None else format(value, spec)


def targets(results: Sequence[Result]) -> list[str]:
    """The issue's targets, judged for the default strategy (variance, worker mode)."""
    lines = []
    for r in results:
        if r.variant != f"{VARIANCE}/worker" or r.scenario.startswith("cost"):
            continue
        moves_ok = r.moves <= 1.1 * r.minimum
        runs = [_yes(b.balancing_runs is not None and b.balancing_runs <= 3) for b in (r.cpu, r.tp)]
        ends = [_yes(b.within) for b in (r.cpu, r.tp)]
        lines.append(f"  {r.scenario:<24} moves<=1.1xmin: {_yes(moves_ok):<6} balanced within 3 balancing runs "
                     f"cpu/tp: {runs[0]}/{runs[1]:<6}  ends balanced (<=1.10 x bound) cpu/tp: {ends[0]}/{ends[1]:<6} "
                     f"(offline greedy {_greedy(r)} moves; max/mean of LPT packing: tp {r.lpt_ratio:.2f})")
    costs: dict[str, dict[str, Result]] = {}
    for r in results:
        if r.scenario.startswith("cost"):
            costs.setdefault(r.scenario, {})[r.variant] = r
    coordination = [k for k in WRITE_KINDS if k != "checkpoint"]  # application checkpoints are the same in both
    for name, by_variant in costs.items():
        worker_result, lease_result = by_variant.get(f"{VARIANCE}/worker"), by_variant.get(f"{VARIANCE}/lease")
        if worker_result is None or lease_result is None:
            continue
        worker, lease = worker_result.total_per_minute(WRITE_KINDS), lease_result.total_per_minute(WRITE_KINDS)
        if lease:
            lines.append(f"  {name:<24} writes/min worker {worker:.0f} vs lease {lease:.0f}: ratio "
                         f"{worker / lease:.3f} (target <= 0.100: {_yes(worker <= lease / 10)})")
        own_worker, own_lease = (r.total_per_minute(coordination) for r in (worker_result, lease_result))
        counts = worker_result.counts
        if own_lease and counts.get("checkpoint", 0) > counts.get("handoff_complete", 0):  # application checkpoints
            lines.append(f"  {'':<24} without application checkpoints: {own_worker:.0f} vs {own_lease:.0f}: ratio "
                         f"{own_worker / own_lease:.3f}")
    return lines


def _yes(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen scenarios and print the table and the targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small fleets and short windows")
    parser.add_argument("--scenario", action="append", help="run only scenarios whose name starts with this")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--zipf", type=float, default=0.5, help="Zipf exponent of shard throughput (default 0.5)")
    parser.add_argument("--report-seconds", type=float, default=None,
                        help="worker CPU report period (default: every heartbeat in worker mode, 30 s in lease mode)")
    parser.add_argument("--noise", choices=("plain", "spark"), default=None,
                        help="workers measure throughput as the live agents do (bench/fleet_noise.py)")
    args = parser.parse_args(argv)
    from bench.fleet_noise import PLAIN_DELIVERY, SPARK_DELIVERY, NoiseModel

    noise = None if args.noise is None else NoiseModel(PLAIN_DELIVERY if args.noise == "plain" else SPARK_DELIVERY)
    size = QUICK if args.quick else FULL
    chosen = [s for s in scenarios(size) if not args.scenario or any(s.name.startswith(p) for p in args.scenario)]
    if not chosen:
        parser.error("no scenario matches")
    results: list[Result] = []
    for scenario in chosen:
        outcome = run_scenario(scenario, size, args.seed, args.zipf, args.report_seconds, noise)
        results.extend(outcome)
        print(f"... {scenario.name} done", file=sys.stderr, flush=True)
    print(f"zipf exponent {args.zipf}, seed {args.seed}, warm-up {size.warmup:.0f} s, window {size.observe:.0f} s; "
          f"balanced = every lease on a live worker and each worker's load <= {THRESHOLD:.2f} x max(mean, its "
          f"heaviest lease alone) in modelled CPU (cpu) or carried throughput (tp; lease counts on an idle stream); "
          f"runs counted from the leader's first move after the event")
    print(table(results))
    print("\ntargets (variance, worker mode):")
    print("\n".join(targets(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
