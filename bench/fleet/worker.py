"""Simulated workers on the fleet's virtual clock.

`AgentWorker` is a shardherd agent that reads no records: the agent's own `LeaseKeeper` (discovery through the owner
index, heartbeats or lease renewal, handoffs, self-fencing, the worker record and its retirement), `MetricsSampler`
and `MetricsReporter` (the CPU history) run on the fleet's store and clock. The simulation supplies what the agent's
shard workers and threads would: a CPU source modelled from the carried throughput, the per-lease throughput (exact,
or measured by the real recorder under `bench/fleet/noise.py`), a final checkpoint `HANDOFF_DELAY` after a handoff
request, and the ticks of the keeper loop.

`Kcl2Worker` models a KCL 2.x worker (no leader, no handoff): `bench.kcl2_taker.Kcl2Taker` passes and the renewal of
every held lease.
"""

from __future__ import annotations

import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.kcl2_taker import Kcl2Taker
from shardherd.agent.lease_keeper import LeaseKeeper, LossReason
from shardherd.agent.metrics.sampler import MetricsSampler
from shardherd.agent.runtime import MetricsReporter
from shardherd.agent.spark.batch_ends import end_key
from shardherd.coordinator.assignment_feed import DROPPED, JOINED, NEWS, NotLeading
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.config import Settings
from shardherd.shared.lease import Lease
from shardherd.shared.worker import LeaseProgress, WorkerRecord

if TYPE_CHECKING:
    from bench.fleet.model import Fleet

BASE_CPU = 10.0
CPU_NOISE_SD = 2.0
HANDOFF_DELAY = 1.0
# The keeper loop ticks this long after each of the keeper's intervals: the virtual clock is a float moved by
# differences, so a tick at exactly the due time could land a rounding error early and wait a whole period.
TICK_LAG = 1e-6
PROGRESS = LeaseProgress(1_000, 10**8, 10**11)  # what an agent reports per lease when `Fleet.progress` is on

_sequence = itertools.count(10**9)


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
                   settings.effective_metrics_report_millis / 1000, settings.failover_time_millis / 1000,
                   settings.epsilon_millis / 1000, settings.no_of_persisted_metrics_per_worker_metrics)


@dataclass(frozen=True, slots=True)
class CpuModel:
    """How simulated workers' CPU behaves: a base with no lease, the fleet's mean at the start, per-sample noise, and
    excursions (a few seconds of CPU that no lease explains: garbage collection, a neighbour on a loaded host).

    Excursions start at `excursions_per_minute` per worker; their length is drawn from an exponential distribution of
    mean `excursion_seconds`, their height uniformly up to twice `excursion_points` (a share `dip_share` of them
    subtract it). The
    defaults (no excursions) are the simulator's model since issue 3; bench/fleet_noise.py calibrates one on the
    live stack.
    """

    base: float = BASE_CPU
    mean_at_start: float = 50.0
    sample_sd: float = CPU_NOISE_SD
    excursions_per_minute: float = 0.0
    excursion_seconds: float = 0.0
    excursion_points: float = 0.0
    dip_share: float = 0.0


class CpuNoise:
    """The CPU points one worker's samples have on top of their load (`CpuModel`): per-sample noise drawn from
    `samples`, and excursions drawn from their own generator; each scaled by the caller's `scale` (1: the model)."""

    def __init__(self, model: CpuModel, samples: random.Random, excursions: random.Random) -> None:
        self.model = model
        self._samples = samples
        # Excursions draw from their own seeded generator, so a model without them keeps the noise sequence as is.
        self._excursions = excursions if model.excursions_per_minute > 0 else None
        self._excursion: tuple[float, float] | None = None  # (end time, height) of the excursion under way

    def sample(self, scale: float = 1.0) -> float:
        """One sample's noise."""
        return self._samples.gauss(0.0, self.model.sample_sd * scale)

    def excursion(self, now: float, scale: float = 1.0) -> float:
        """The excursion under way at `now` (virtual seconds; asked once per sample), 0 outside one."""
        if self._excursions is None:
            return 0.0
        model = self.model
        if self._excursion is not None and now >= self._excursion[0]:
            self._excursion = None
        if self._excursion is None and self._excursions.random() < model.excursions_per_minute / 60.0:
            height = self._excursions.uniform(0.0, 2.0 * model.excursion_points)
            if self._excursions.random() < model.dip_share:
                height = -height
            self._excursion = (now + self._excursions.expovariate(1.0 / model.excursion_seconds), height)
        return self._excursion[1] * scale if self._excursion is not None else 0.0


class ModelCpu:
    """A worker's CPU in percent: the model's base + carried KiB/s / the fleet's capacity + seeded noise and
    excursions (`CpuModel`, scaled by the worker's `noise_scale`), within [0, 100]."""

    name = "fleet-sim-model"

    def __init__(self, worker: SimWorker) -> None:
        self._worker = worker
        self._noise = CpuNoise(worker.fleet.cpu_model, worker.rng,
                               random.Random(f"{worker.fleet.seed}:{worker.worker_id}"))

    def sample(self) -> float:
        """One sample of the current load (taken once a second)."""
        worker, noise = self._worker, self._noise
        model, scale = worker.fleet.cpu_model, worker.noise_scale
        cpu = model.base + worker.own_cpu + worker.carried() / worker.fleet.capacity + noise.sample(scale)
        return min(100.0, max(0.0, cpu + noise.excursion(worker.fleet.events.now(), scale)))


class SimWorker(ABC):
    """What every simulated worker has: an id, the leases it processes, its modelled CPU, and a life.

    `own_cpu`: CPU points no lease explains, on top of the model's base (a Spark driver's JVM beside plain agents);
    `noise_scale`: the share of the model's CPU noise and excursions it has (bench/scale_sim.py fits the plain
    agents' to a live run's CPU figures).
    """

    def __init__(self, worker_id: str, fleet: Fleet, rng: random.Random) -> None:
        self.worker_id = worker_id
        self.fleet = fleet
        self.rng = rng
        self.own_cpu = 0.0
        self.noise_scale = 1.0
        self.alive = True
        self.draining = False
        self.processing: dict[str, int] = {}  # lease key -> the lease counter last written or read
        self.leaving: set[str] = set()  # leases being handed off by this worker
        self.cpu = ModelCpu(self)

    def carried(self) -> float:
        """KiB/s of the leases this worker processes."""
        kbps = self.fleet.stream.kbps
        return sum(kbps.get(key, 0.0) for key in self.processing)

    def sample_cpu(self) -> None:
        """One CPU sample (the fleet samples every worker once a second)."""
        self.cpu.sample()

    @abstractmethod
    def start(self, first: float) -> None:
        """Schedule this worker's actions from simulation time `first` on."""

    def row_wait(self) -> float:
        """Seconds from its start to its first row (a KCL 2.x worker writes none: 0)."""
        return 0.0

    @abstractmethod
    def scale_in(self) -> None:
        """Leave the fleet gracefully."""

    @abstractmethod
    def checkpoint_all(self) -> bool:
        """Application checkpoints of every processed lease (optional periodic load)."""

    def read_batch_ends(self) -> bool:
        """Read each processed lease's batch end, as a Spark agent's batches do (agent/spark/batch_ends.py): a
        consistent GetItem of a coordinator-state item per lease (optional periodic load)."""
        if not self.alive:
            return False
        for key in self.processing:
            self.fleet.store.get_state(end_key(key))
        return True

    def crash(self) -> None:
        """kill -9: nothing more is written."""
        self.alive = False

    def _stop(self, key: str) -> None:
        self.processing.pop(key, None)
        self.leaving.discard(key)
        if self.fleet.noise is not None:
            self.fleet.noise.stopped(self, key)


class AgentWorker(SimWorker):
    """A shardherd agent (liveness mode `worker` or `lease`) driven through the agent's own keeper and metrics."""

    def __init__(self, worker_id: str, fleet: Fleet, rng: random.Random) -> None:
        super().__init__(worker_id, fleet, rng)
        settings = fleet.settings.model_copy(update={"worker_id": worker_id})
        timing = fleet.timing
        self.sampler = MetricsSampler(None if settings.disable_worker_metrics else self.cpu, timing.history)
        lease_mode = settings.liveness_mode == "lease"
        # The agent's own report period (Settings.effective_metrics_report_millis) unless `report_seconds` is set.
        period = fleet.report_seconds or timing.reporter
        rows = self._fleet_rows if lease_mode else None
        self.reporter = MetricsReporter(self.sampler, fleet.clock, period, fleet=rows, me=worker_id)
        self.keeper = LeaseKeeper(fleet.store, settings, fleet.clock, self, metrics=self.reporter,
                                  throughput=self._throughput, progress=self._progress if fleet.progress else None)
        self._beats = 0  # generation of the heartbeat tick chain (a drain restarts it)
        self._told: tuple[str, int] | None = None  # the leader's feed position last passed to the keeper
        if fleet.channel:
            self.keeper.attach_channel(self._channel_answers, lambda: fleet.signal(worker_id, NEWS), self._name_row)

    # ---- what the agent's threads would do
    def sample_cpu(self) -> None:
        """The sampling thread's sample; with metrics off the model still moves on (same seeded noise either way)."""
        if self.sampler.source is None:
            self.cpu.sample()
        else:
            self.sampler.sample()

    def _fleet_rows(self) -> list[WorkerRecord]:
        return self.fleet.store.scan_workers().workers

    def _throughput(self, key: str) -> float | None:
        noise = self.fleet.noise
        if noise is not None:
            return noise.recorder(self).compute(key)
        return self.fleet.stream.kbps.get(key, 0.0)

    def _progress(self, keys: Iterable[str]) -> Mapping[str, LeaseProgress]:
        return dict.fromkeys(keys, PROGRESS)

    # ---- LeaseListener
    def lease_acquired(self, lease: Lease) -> None:
        """Start processing the lease (and, under noise, reading it)."""
        self.processing[lease.lease_key] = lease.lease_counter
        if self.fleet.noise is not None:
            self.fleet.noise.started(self, lease)

    def handoff_requested(self, lease: Lease) -> None:
        """Stop reading; the final checkpoint and the transfer follow after HANDOFF_DELAY."""
        key = lease.lease_key
        self.leaving.add(key)
        self.fleet.events.at(self.fleet.events.now() + HANDOFF_DELAY, lambda: self._hand_over(key))

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        """Stop processing the lease."""
        self._stop(lease_key)

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        """Simulated workers do not plan ahead."""

    # ---- schedule
    def row_wait(self) -> float:
        """Its first row waits for its first CPU report, as `Agent.start` does."""
        return self.reporter.first_wait

    def start(self, first: float) -> None:
        """The agent starts at `first`: its recorder (under noise), then, once its first CPU report is due (as
        `Agent.start` waits: agent/runtime.py), the keeper loop's ticks, so its first row is valid (decision 0038)."""
        events = self.fleet.events

        def boot() -> None:
            if self.fleet.channel:
                self.fleet.signal(self.worker_id, JOINED)
            if self.fleet.noise is not None:
                self.fleet.noise.recorder(self)
            ticks = events.now() + self.reporter.start()
            events.every(ticks, self.fleet.timing.discovery + TICK_LAG, self._tick)
            self._beat_from(ticks)

        events.at(first, boot)

    def _beat_from(self, first: float) -> None:
        """Tick at the keeper's heartbeat interval from `first` (a new chain replaces the previous one)."""
        self._beats += 1
        generation = self._beats

        def beat() -> bool:
            return generation == self._beats and self._tick()

        self.fleet.events.every(first, self.fleet.timing.heartbeat + TICK_LAG, beat)

    def _channel_answers(self) -> bool:
        """Whether the agent's long-poll gets answers: while the simulated coordinator leads."""
        loop = self.fleet.loop
        try:
            return loop is not None and bool(loop.feed.position(self.worker_id).feed)
        except NotLeading:
            return False

    def _name_row(self) -> None:
        """Name the worker row last written to the leader, as each real request does (`hb`, `lut`): the leader then
        times a crashed worker's silence from its last write, not from when a scan first saw that row."""
        loop, beat = self.fleet.loop, self.keeper.last_beat()
        if loop is not None and beat is not None and self.alive:
            loop.feed.report_beat(self.worker_id, *beat)

    def _listen(self) -> None:
        """What agent/assignment_watch.py passes on: the leader's view of this worker's leases once it changed.

        Each keeper tick stands for an answer that arrived since the previous one (real answers come at once), and
        for the agent's next request: the feed sees the answered request end and a new one open, as a real agent's
        re-poll does. Without it the feed held one request open from the agent's start, judged it stale after its
        hold (`AssignmentFeed.on_channel`), and the simulated leader scanned the store at every run.
        """
        loop = self.fleet.loop
        if loop is None:
            return
        loop.feed.disconnect(self.worker_id, dropped=False)
        loop.feed.connect(self.worker_id)
        self._name_row()
        try:
            position = loop.feed.position(self.worker_id)
        except NotLeading:
            return
        if (position.feed, position.version) != self._told:
            self._told = (position.feed, position.version)
            self.keeper.tell(position.leases)

    def _tick(self) -> bool:
        if not self.alive:
            return False
        if self.fleet.channel:
            self._listen()
        self.keeper.tick()
        self._exit_if_drained()
        return self.alive

    def crash(self) -> None:
        """kill -9: nothing more is written, and the long-poll's connection closes at once."""
        super().crash()
        if self.fleet.channel:
            self.fleet.signal(self.worker_id, DROPPED)

    def scale_in(self) -> None:
        """Graceful stop: announce DRAINING at once, exit once the leader has moved every lease away."""
        self.draining = True
        self.keeper.begin_drain()  # the next tick heartbeats: tick now, then every interval
        self._beat_from(self.fleet.events.now())

    def _exit_if_drained(self) -> None:
        if self.alive and self.draining and not self.keeper.held():
            self.keeper.release_all()
            self.keeper.retire()
            self.alive = False
            if self.fleet.channel:
                self.fleet.signal(self.worker_id, DROPPED)

    def _hand_over(self, key: str) -> None:
        """Final checkpoint, then complete the handoff (KCL 3.x's graceful handoff, step 3: docs/store-semantics.md)."""
        if not self.alive:
            self._stop(key)
            return
        self.keeper.checkpoint(key, Checkpoint.at(next(_sequence)))
        self.keeper.finish_handoff(key)
        self._exit_if_drained()

    def checkpoint_all(self) -> bool:
        """Application checkpoints of every processed lease (optional periodic load)."""
        if not self.alive:
            return False
        for key in [k for k in self.processing if k not in self.leaving]:
            self.keeper.checkpoint(key, Checkpoint.at(next(_sequence)))
        return True


class Kcl2Worker(SimWorker):
    """A KCL 2.x worker: a taker pass every `(failover + epsilon) x 2`, every held lease renewed each heartbeat."""

    def __init__(self, worker_id: str, fleet: Fleet, rng: random.Random, taker: Kcl2Taker,
                 taker_interval: float) -> None:
        super().__init__(worker_id, fleet, rng)
        self.taker = taker
        self._taker_interval = taker_interval

    def start(self, first: float) -> None:
        """Taker passes from `first`, renewals from one heartbeat later."""
        heartbeat = self.fleet.timing.heartbeat
        self.fleet.events.every(first, self._taker_interval, self._take)
        self.fleet.events.every(first + heartbeat, heartbeat, self._renew)

    def scale_in(self) -> None:
        """KCL 2.x has no drain: the worker checkpoints and stops."""
        self.checkpoint_all()
        self.crash()

    def _take(self) -> bool:
        """One taker pass; taken leases start being processed (and renewed) at once."""
        if not self.alive:
            return False
        for lease in self.taker.take_leases():
            self.processing[lease.lease_key] = lease.lease_counter
        return True

    def _renew(self) -> bool:
        """Renew every held lease; a lease whose renewal fails was stolen or expired: stop processing it."""
        if not self.alive:
            return False
        for key, counter in list(self.processing.items()):
            outcome = self.fleet.store.renew(key, self.worker_id, counter, None)
            if outcome.applied and outcome.lease is not None:
                self.processing[key] = outcome.lease.lease_counter
            else:
                self._stop(key)
        return True

    def checkpoint_all(self) -> bool:
        """Application checkpoints of every processed lease (optional periodic load)."""
        if not self.alive:
            return False
        for key in list(self.processing):
            outcome = self.fleet.store.checkpoint(key, self.worker_id, Checkpoint.at(next(_sequence)))
            if outcome.applied and outcome.lease is not None:
                self.processing[key] = outcome.lease.lease_counter
        return True

