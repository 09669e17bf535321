"""The agent process: lease keeper, metrics, and one shard worker per owned lease; drains on shutdown."""

from __future__ import annotations

import logging
import os
import random
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agent.lease_keeper import HeldState, LeaseKeeper, LossReason
from agent.metrics.cpu_ecs import ECS_URI_ENV
from agent.metrics.sampler import MAX_UTILISATION_PERCENT, MetricsSampler, SamplingThread, WorkerMetrics
from agent.metrics.select import select_cpu_source
from agent.metrics.throughput import ThroughputRecorder
from agent.progress import ProgressBoard
from agent.read_spec import ReadLimits
from agent.shard_worker import ProcessorFactory, ShardContext, ShardWorker, Stop
from shared.aws import make_client
from shared.clock import Clock, SystemClock
from shared.config import Settings
from shared.errors import ConfigError
from shared.lease import Lease
from shared.retry import RetryPolicy
from shared.store import LeaseStore
from shared.store_factory import open_store
from shared.worker import CPU_METRIC

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

log = logging.getLogger(__name__)

TICK_SECONDS = 0.1


class MetricsReporter:
    """Closes a metrics interval once per reporter period and serves the latest `sts`/`opr` to every heartbeat.

    Until its first report a worker with a CPU source sends its operating range without a history: the leader then
    leaves it out (KCL's invalid-metrics rule) rather than taking it for a metric-less worker, which would have it
    balanced by throughput first and by CPU a few seconds later (and the switch made leases ping-pong).
    """

    def __init__(self, sampler: MetricsSampler, clock: Clock, period: float) -> None:
        self._sampler = sampler
        self._clock = clock
        self._period = period
        self._next = clock.monotonic() + min(2.0, period)  # KCL: first report after two capture periods
        self._last = WorkerMetrics() if sampler.source is None else WorkerMetrics(
            {}, {CPU_METRIC: (MAX_UTILISATION_PERCENT,)})

    def __call__(self) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[float, ...]]]:
        """The metric maps for the next worker record."""
        now = self._clock.monotonic()
        if now >= self._next:
            self._next = now + self._period
            self._last = self._sampler.report()
        return dict(self._last.metric_stats), dict(self._last.operating_range)


class Agent:
    """A worker: holds leases through the keeper, processes each in its own thread, drains on stop."""

    def __init__(self, settings: Settings, factory: ProcessorFactory, clock: Clock | None = None,
                 store: LeaseStore | None = None, kinesis: KinesisClient | None = None,
                 limits: ReadLimits | None = None, rng: random.Random | None = None) -> None:
        if settings.stream_name is None:
            raise ConfigError("the agent needs stream_name (SHARDHERD_STREAM_NAME)")
        self.settings = settings
        self.clock = clock or SystemClock()
        self.store = store or open_store(settings, RetryPolicy(clock=self.clock), caller="agent")
        self.throughput = ThroughputRecorder.for_settings(self.clock, settings)
        environ = dict(os.environ)
        if settings.ecs_metadata_uri:
            environ[ECS_URI_ENV] = settings.ecs_metadata_uri
        source = select_cpu_source(self.clock, disabled=settings.disable_worker_metrics, environ=environ,
                                   cgroup_root=Path(settings.cgroup_root))
        self.sampler = MetricsSampler(source, settings.no_of_persisted_metrics_per_worker_metrics,
                                      metric_name=CPU_METRIC)
        self._rng = rng or random.Random()
        self._sampling = SamplingThread(self.sampler, self.clock,
                                        settings.in_memory_worker_metrics_capture_frequency_millis / 1000, self._rng)
        reporter = MetricsReporter(self.sampler, self.clock, settings.worker_metrics_reporter_freq_millis / 1000)
        self.progress = ProgressBoard(self.clock)
        self.keeper = LeaseKeeper(self.store, settings, self.clock, self, metrics=reporter,
                                  throughput=self.throughput.compute, progress=self.progress.snapshot)
        self._context = ShardContext(
            keeper=self.keeper,
            kinesis=kinesis or make_client("kinesis", settings.region, settings.kinesis_endpoint_url),
            stream_name=settings.stream_name, factory=factory, throughput=self.throughput, progress=self.progress,
            clock=self.clock,
            limits=limits or ReadLimits(), initial_timestamp=settings.initial_timestamp,
        )
        self.workers: dict[str, ShardWorker] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    # ------------------------------------------------------------------ LeaseListener
    def lease_acquired(self, lease: Lease) -> None:
        """Start a shard worker for a newly held lease (none for a finished one)."""
        self.throughput.track(lease.lease_key)
        if lease.throughput_kbps is not None:
            self.throughput.seed(lease.lease_key, lease.throughput_kbps)
        if lease.is_finished:
            return
        worker = ShardWorker(lease, self._context)
        with self._guard:
            self.workers[lease.lease_key] = worker
        worker.start()

    def handoff_requested(self, lease: Lease) -> None:
        """Stop reading the lease; its worker checkpoints and tells the keeper to complete the transfer."""
        with self._guard:
            worker = self.workers.get(lease.lease_key)
        if worker is None:
            self.keeper.finish_handoff(lease.lease_key)  # nothing running (e.g. finished shard): hand over now
        else:
            worker.request_stop(Stop.HANDOFF)

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        """Stop the lease's worker at once (a completed handoff's worker has already stopped)."""
        with self._guard:
            worker = self.workers.pop(lease_key, None)
        if worker is not None and reason is not LossReason.HANDED_OFF:
            worker.request_stop(Stop.LOST if reason is not LossReason.RELEASED else Stop.SHUTDOWN)
        self.throughput.drop(lease_key)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Agent:
        """Start sampling and the keeper loop (heartbeat start jittered so a fleet start does not synchronise)."""
        source = self.sampler.source
        if source is not None:
            try:
                source.sample()  # delta-based sources answer 0 on their first call: take that one outside the history
            except Exception as exc:  # the sampler counts later failures; this one only primes the baseline
                log.warning("priming the CPU source failed: %s", exc)
        self._sampling.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        jitter = self._rng.uniform(0, min(1.0, self.settings.effective_heartbeat_interval_millis / 1000))
        self._stop.wait(jitter)
        while not self._stop.is_set():
            try:
                self.keeper.tick()
            except Exception:
                log.exception("lease keeper tick failed")
            self._stop.wait(TICK_SECONDS)

    def stop(self, drain: bool = True, drain_timeout: float | None = None) -> None:
        """Stop; with `drain`, first let the leader hand every lease to others (no gap), then give back the rest."""
        if drain:
            self._drain(drain_timeout)
        with self._guard:
            workers = list(self.workers.values())
        for worker in workers:
            worker.request_stop(Stop.SHUTDOWN)
        for worker in workers:
            worker.thread.join(10)
        self.keeper.release_all()
        self._stop.set()
        self._thread.join(10)
        self._sampling.stop(5)

    def _drain(self, timeout: float | None) -> None:
        """Announce DRAINING, then wait while the leader hands leases on; give up early if no handoff ever starts."""
        settings = self.settings
        # The DRAINING heartbeat must land and a few leader runs pass before the first handoff can start.
        first_move = (settings.effective_heartbeat_interval_millis
                      + 3 * settings.lease_assignment_interval_millis) / 1000
        if timeout is None:
            timeout = first_move + settings.graceful_lease_handoff_timeout_millis / 1000
        self.keeper.begin_drain()
        started = self.clock.monotonic()
        moving = False
        while self.keeper.held():
            elapsed = self.clock.monotonic() - started
            moving = moving or any(held.state is HeldState.HANDING_OFF for _, held in self.keeper.held_items())
            if elapsed >= timeout or (not moving and elapsed >= first_move):
                log.warning("drain: %d leases not moved by a leader after %.1f s; giving them back",
                            len(self.keeper.held()), elapsed)
                return
            self._stop.wait(TICK_SECONDS)

    def wait(self) -> None:
        """Block until stop() is called."""
        self._stop.wait()
