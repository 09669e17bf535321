"""A fleet of one variant: the real shard sync planner, leader loop, lock and decider on an in-memory store, with
simulated workers on a virtual clock, and the owner-change counter.

Time advances only by the event queue. A leader run is one event and, by default, takes no virtual time: its writes
land at the instant it starts. With `write_seconds` > 0 each owner write the leader sends (an assignment or a handoff's
start) takes that long on one of its `leader_write_threads` lanes, as a loaded store makes the live leader's writes
take (bench/scale.py measures it): the k-th write of a run (0-based, plan order) lands `(k // lanes + 1) x
write_seconds` after the run's first write began, and the rest of the fleet (agents, the lock, the bench's looks) runs
on while the run waits for it. A run while one is writing does not start (the live loop is one thread); signals then
start the next a quarter interval after it ends, as `LeaderLoop.cycle` does.
"""

from __future__ import annotations

import contextvars
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from bench.fleet.noise import LiveNoise
from bench.fleet.worker import AgentWorker, CpuModel, Kcl2Worker, SimWorker, Timing
from bench.fleet.world import EventQueue, Stream
from bench.kcl2_taker import Kcl2Taker, taker_interval_seconds
from bench.store_counter import CountingStore
from shardherd.coordinator.assignment_feed import DROPPED, JOINED
from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.run_summary import RunSummary
from shardherd.coordinator.shard_sync import plan_shard_sync
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import LeaseStore, Outcome, TableNames

LOCK_TICK = 0.5
SAMPLE_PERIOD = 1.0

VARIANCE = "variance"
VARIANCE_KCL = "variance-kcl"  # strategy variance with KCL's dampened-budget balancing (variance_balancing = kcl)
LEASE_COUNT = "lease-count"
KCL2 = "kcl2-taker"


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
    cpu_model: CpuModel = field(default_factory=CpuModel)  # how the workers' CPU behaves
    clock: ManualClock = field(default_factory=ManualClock)
    workers: dict[str, SimWorker] = field(default_factory=dict)
    # Hooks for bench/fleet_cost.py: a wrapper around the in-memory store (e.g. a StoreMeter) and a run hook.
    wrap_store: Callable[[LeaseStore], LeaseStore] | None = None
    # The store under the fleet (bench/leader_run.py: a real PostgreSQL); None: an in-memory store.
    base_store: LeaseStore | None = None
    on_run: Callable[[RunSummary], None] | None = None
    progress: bool = False  # agents report per-lease progress as the real agent does (checkpoints, troubled leases)
    channel: bool = False  # agents long-poll the leader for assignment changes (coordinator_url set, as on Helm)
    write_seconds: float = 0.0  # the store's time per owner write on one leader write lane (0: a run's land at once)

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
        self.inner = self.base_store or MemoryLeaseStore(TableNames.for_application("fleet-sim"))
        wrapped = self.wrap_store(self.inner) if self.wrap_store is not None else self.inner
        self.store = CountingStore(wrapped, on_write=self.moves,
                                   before_owner_write=self._owner_write if self.write_seconds > 0 else None)
        self.events = EventQueue(self.clock)
        self.rng = random.Random(self.seed)
        self.capacity = 1.0
        self.runs: list[tuple[float, bool, bool]] = []  # (time, balancing run, moved a lease) of every leader run
        self.loop: LeaderLoop | None = None
        self._hold: Callable[[], bool] | None = None  # while it answers True the leader does not run (its lock does)
        self._early_run = False  # an early leader run is scheduled for signals from the channel
        self._leading = False  # a leader run is in progress (its timed writes let other events run meanwhile)
        self._again = False  # signals came while it ran: the next run comes a quarter interval after it
        self._written = 0  # owner writes of the run in progress so far
        self._writes_from = 0.0  # when its first write began
        self.lock: LeaderLock | None = None
        if self.variant != KCL2:
            lock = LeaderLock(self.store, "coordinator-a", self.clock, self.settings.leader_lock_lease_duration_millis,
                              self.settings.leader_lock_heartbeat_period_millis)
            self.lock = lock
            # Timed writes run other events while they wait, so the leader sends them one at a time from this thread
            # (`_owner_write` times each as its lane would have finished it).
            loop_settings = self.settings if self.write_seconds <= 0 else self.settings.model_copy(
                update={"leader_write_threads": 1})
            self.loop = LeaderLoop(self.store, lock, loop_settings, self.clock,
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

    def signal(self, worker_id: str, kind: str) -> None:
        """An agent's event on the coordinator channel (joined, dropped, news); the leader runs a quarter interval
        later, as `LeaderLoop.cycle` does when its feed signals."""
        if self.loop is None:
            return
        feed = self.loop.feed
        if kind == JOINED:
            feed.connect(worker_id)
        elif kind == DROPPED:
            feed.disconnect(worker_id, dropped=True)
        else:
            feed.signal(worker_id, kind)
        if not self._early_run:  # signals coalesce into one early run, as the loop's wake-up does
            self._early_run = True
            self.events.at(self.events.now() + self.settings.lease_assignment_interval_millis / 4000, self._lead_once)

    def _lead_once(self) -> None:
        self._early_run = False
        if self._leading:  # signals during a run: the next comes a quarter interval after it ends
            self._again = True
            return
        self._lead()

    def _lead(self) -> bool:
        """One leader run (none while one is in progress: the live loop is one thread); a quiet worker's verdict due
        before the next interval's run, or signals that came during this one, get a run of their own then (not
        before a quarter interval), as `LeaderLoop.cycle` waits."""
        assert self.loop is not None
        if self._leading:
            return True
        if self._hold is not None:
            if self._hold():
                return True
            self._hold = None
        started = self.events.now()
        self._leading, self._written = True, 0
        try:
            summary = self.loop.run_once()
        finally:
            self._leading = False
        if summary is not None:
            moved = summary.plan is not None and bool(summary.plan.moves)
            self.runs.append((started, summary.balanced_this_run, moved))
        verdict = self.loop.next_verdict()
        interval = self.settings.lease_assignment_interval_millis / 1000
        again, self._again = self._again, False
        soon = verdict is not None and verdict < interval
        if (soon or again) and not self._early_run:
            self._early_run = True
            wait = interval / 4 if again or verdict is None else max(interval / 4, verdict)
            self.events.at(self.events.now() + wait, self._lead_once)
        return True

    def _owner_write(self) -> None:
        """Before an owner write reaches the store: during a leader run, the fleet runs on until the write's lane
        has finished it (the module's docstring). The events run in a context of their own, so a store meter does not
        count the agents' calls made meanwhile as the leader's."""
        if not self._leading:
            return  # not the leader's (a KCL 2.x taker's)
        if self._written == 0:
            self._writes_from = self.events.now()
        due = self._writes_from + (self._written // self.settings.leader_write_threads + 1) * self.write_seconds
        self._written += 1
        contextvars.Context().run(self.events.run_until, due)

    def _sample(self) -> bool:
        for worker in self.workers.values():
            if worker.alive:
                worker.sample_cpu()
        return True

    def calibrate(self, workers: int) -> None:
        """CPU capacity such that `workers` workers sharing the stream sit at the CPU model's mean on average."""
        share = self.stream.total() / max(1, workers)
        span = self.cpu_model.mean_at_start - self.cpu_model.base
        self.capacity = share / span if share > 0 and span > 0 else 1.0

    def add_workers(self, count: int, own_cpu: float = 0.0, batch_end_seconds: float = 0.0,
                    row_at: float | None = None, noise_scale: float = 1.0) -> list[str]:
        """Start `count` new workers within the next second (seeded offsets), each with `own_cpu` and `noise_scale`
        (SimWorker); with `batch_end_seconds` > 0 each reads its held leases' batch ends that often, as a Spark agent
        does. With `row_at` each starts so that its first row is written then (at once if that is too soon), as a
        replay of a live run's rows needs."""
        now = self.events.now()
        added = []
        for _ in range(count):
            wid = f"w{len(self.workers):04d}"
            rng = random.Random(self.rng.random())
            start = now + self.rng.random() if row_at is None else now
            worker: SimWorker
            if self.variant == KCL2:
                t = self.timing
                taker = Kcl2Taker(wid, self.store, self.clock, t.failover, random.Random(self.rng.random()),
                                  max_leases_for_worker=self.settings.max_leases_for_worker)
                worker = Kcl2Worker(wid, self, rng, taker, taker_interval_seconds(t.failover, t.epsilon))
            else:
                worker = AgentWorker(wid, self, rng)
            worker.own_cpu, worker.noise_scale = own_cpu, noise_scale
            if row_at is not None:
                start = max(now, row_at - worker.row_wait())
            self.workers[wid] = worker
            worker.start(start)
            if self.checkpoint_seconds > 0:
                self.events.every(start + self.checkpoint_seconds, self.checkpoint_seconds, worker.checkpoint_all)
            if batch_end_seconds > 0:
                self.events.every(start + batch_end_seconds, batch_end_seconds, worker.read_batch_ends)
            added.append(wid)
        return added

    def first_run_at(self, at: float, worker_ids: Collection[str]) -> None:
        """Hold the leader's first run until simulation time `at` and every row of `worker_ids`, and run it at `at`
        (bench/scale_sim.py: the live leader's first assignment found the rows of the agents there before it)."""
        wanted = set(worker_ids)
        self._hold = lambda: self.events.now() < at or not wanted <= {
            record.worker_id for record in self.inner.scan_workers().workers}

        def first() -> None:
            self._lead()

        self.events.at(at, first)

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
            return {w: min(100.0, self.cpu_model.base + top / self.capacity) for w, top in tops.items()}
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
            return {w: min(100.0, self.cpu_model.base + load / self.capacity) for w, load in loads.items()}
        return loads
