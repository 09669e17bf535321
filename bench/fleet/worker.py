"""A simulated worker: discovery, heartbeats or lease renewal, CPU samples and handoffs on the fleet's virtual clock."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.kcl2_taker import Kcl2Taker
from shared.checkpoint import Checkpoint
from shared.config import Settings
from shared.lease import Lease
from shared.worker import CPU_METRIC, LeaseProgress, WorkerRecord, WorkerState

if TYPE_CHECKING:
    from bench.fleet.model import Fleet

BASE_CPU = 10.0
CPU_NOISE_SD = 2.0
HANDOFF_DELAY = 1.0


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
