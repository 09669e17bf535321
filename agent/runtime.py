"""The agent process: lease keeper, metrics, and one shard worker per owned lease; drains on shutdown.

Every long-lived thread runs under the agent's Supervisor (shared/supervision.py, decision 0022): the heartbeat and
the lease keeper are critical (a failure, or no completed step within its bound, stops the heartbeat, gives the leases
back and exits non-zero); CPU sampling, the assignment watch and each shard worker are restartable. With
`agent_health_port` set, /healthz and /metrics serve that state (agent/health_server.py). A held lease whose
shard worker makes no progress turns /healthz red and is given back once its worker cannot be restarted
(agent/stall_watch.py), or after its give-up bound (sooner while its reads only fail) unless the leader says most of
the fleet stalls with it. Kinesis calls have a deadline (agent/read_deadline.py).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from shardherd.agent import kpl_decoding
from shardherd.agent.assignment_watch import AssignmentWatch
from shardherd.agent.heap import freeze_long_lived
from shardherd.agent.lease_keeper import HeldState, LeaseKeeper, LossReason
from shardherd.agent.metrics.cpu_ecs import ECS_URI_ENV
from shardherd.agent.metrics.sampler import MAX_UTILISATION_PERCENT, MetricsSampler, SamplingThread, WorkerMetrics
from shardherd.agent.metrics.select import select_cpu_source
from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.agent.progress import ProgressBoard
from shardherd.agent.quarantine import Destination, open_destination
from shardherd.agent.read_deadline import kinesis_timeouts
from shardherd.agent.read_spec import ReadLimits
from shardherd.agent.reader import ReaderStats
from shardherd.agent.shard_worker import ProcessorFactory, ShardContext, ShardWorker, Stop
from shardherd.agent.stall_watch import FleetVerdict, StallWatch
from shardherd.shared.aws import make_client
from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.config import Settings
from shardherd.shared.errors import ConfigError, MalformedWorker, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.restart import stop_window
from shardherd.shared.retry import RetryPolicy, retry_deadline
from shardherd.shared.stall_bounds import StallBounds
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store
from shardherd.shared.supervision import Kind, Supervisor
from shardherd.shared.worker import CPU_METRIC, WorkerRecord, common_metric_kinds
from shardherd.shared.worker_metrics import WorkerStatus, classify

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

    from shardherd.agent.health_server import HealthServer

log = logging.getLogger(__name__)

TICK_SECONDS = 0.1
HEARTBEAT = "heartbeat"
LEASE_KEEPER = "lease-keeper"
STALL_WATCH = "stall-watch"
STALL_WATCH_SECONDS = 0.25
GIVE_UP_SECONDS = 1.0  # how long giving the leases back may take before the process exits anyway


class MetricsReporter:
    """Closes a metrics interval once per reporter period and serves the latest `sts`/`opr` to every heartbeat.

    Until its first report a worker with a CPU source sends its operating range without a history: the leader then
    leaves it out (KCL's invalid-metrics rule) rather than taking it for a metric-less worker, which would have it
    balanced by throughput first and by CPU a few seconds later (and the switch made leases ping-pong).

    With `fleet` (lease mode, where Java KCL workers may share the tables) the reporter also reads the other workers'
    rows once per period and reports only the metric kinds every live one reports (common_metric_kinds):
    next to a KCL worker without a CPU metric it reports none, so a KCL leader balances it by throughput share like
    that worker instead of averaging its CPU alone (where it never looks out of balance and never gets a lease).
    """

    def __init__(self, sampler: MetricsSampler, clock: Clock, period: float,
                 fleet: Callable[[], Iterable[WorkerRecord]] | None = None, me: str = "") -> None:
        self._sampler = sampler
        self._clock = clock
        self._period = period
        self._fleet = fleet
        self._me = me
        self._next = clock.monotonic() + min(2.0, period)  # KCL: first report after two capture periods
        self._last = WorkerMetrics() if sampler.source is None else WorkerMetrics(
            {}, {CPU_METRIC: (MAX_UTILISATION_PERCENT,)})
        self._others: frozenset[str] | None = None  # kinds every other live worker reports; None: no other worker

    @property
    def first_wait(self) -> float:
        """Seconds from the agent's start to its first report: two capture periods (0 without a CPU source)."""
        return 0.0 if self._sampler.source is None else min(2.0, self._period)

    def start(self) -> float:
        """Seconds until the first report (`first_wait`), counted from now.

        The first heartbeat waits for it, so a new worker's first row already counts for the leader, which fills it
        in the run that first sees that row (decision 0038).
        """
        wait = self.first_wait
        self._next = self._clock.monotonic() + wait
        return wait

    def __call__(self) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[float, ...]]]:
        """The metric maps for the next worker record."""
        now = self._clock.monotonic()
        if now >= self._next:
            self._next = now + self._period
            self._last = self._sampler.report()
            self._others = self._fleet_kinds(self._others)
        kinds = self._others
        sts, opr = self._last.metric_stats, self._last.operating_range
        if kinds is None:
            return dict(sts), dict(opr)
        return ({m: h for m, h in sts.items() if m in kinds}, {m: r for m, r in opr.items() if m in kinds})

    def _fleet_kinds(self, previous: frozenset[str] | None) -> frozenset[str] | None:
        """The kinds the other live, balanced workers all report (KCL's view: `lut` within two reporter periods)."""
        if self._fleet is None:
            return None
        try:
            rows = list(self._fleet())
        except StoreUnavailable as exc:
            log.warning("reading the other workers' metric kinds failed (kept the last answer): %s", exc)
            return previous
        cutoff = self._clock.time() - 2 * self._period
        others = [row.metric_stats for row in rows
                  if row.worker_id != self._me and row.last_update >= cutoff and not row.is_draining
                  and classify(row) is WorkerStatus.ACTIVE]
        return common_metric_kinds(others) if others else None


def poison_destination(settings: Settings) -> Destination | None:
    """Under poison_policy quarantine, the destination, proven to exist and take writes (BadDestination otherwise)."""
    if settings.poison_policy != "quarantine" or settings.poison_destination is None:
        return None
    return open_destination(settings.poison_destination, settings.region, settings.s3_endpoint_url, check=True)


class Agent:
    """A worker: holds leases through the keeper, processes each in its own thread, drains on stop."""

    def __init__(self, settings: Settings, factory: ProcessorFactory, clock: Clock | None = None,
                 store: LeaseStore | None = None, kinesis: KinesisClient | None = None,
                 limits: ReadLimits | None = None, rng: random.Random | None = None, prefetch: bool = False,
                 exit: Callable[[int], None] | None = None) -> None:
        if not settings.stream_names:
            raise ConfigError("the agent needs stream_name (SHARDHERD_STREAM_NAME) or streams (SHARDHERD_STREAMS)")
        self.settings = settings
        # `auto` loads the C decoder only once this process has decoded enough records to pay for it (3 MiB)
        self.kpl_decoder = kpl_decoding.use(settings.kpl_decoder, after=kpl_decoding.PAYBACK_RECORDS)
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
        # `exit` ends the process when a critical thread fails or stalls (default os._exit; tests record it).
        self.supervisor = Supervisor(self.clock, give_up=self._let_go, exit=exit)
        self.health: HealthServer | None = None
        self._sampling = SamplingThread(self.sampler, self.clock,
                                        settings.in_memory_worker_metrics_capture_frequency_millis / 1000, self._rng)
        self._reporter = MetricsReporter(self.sampler, self.clock, settings.effective_metrics_report_millis / 1000,
                                         fleet=self._fleet_rows if settings.liveness_mode == "lease" else None,
                                         me=settings.worker_id)
        reads: dict[str, ReaderStats] = {}  # per lease: GetRecords calls and throttles (/metrics, the worker row)
        self.progress = ProgressBoard(self.clock, throttle_totals=lambda: {
            key: stats.throttled for key, stats in list(reads.items())}, stalled=lambda: self.stalls.stalled_keys())
        self.keeper = LeaseKeeper(self.store, settings, self.clock, self, metrics=self._reporter,
                                  throughput=self.throughput.compute, progress=self.progress.snapshot)
        bounds = StallBounds.from_settings(settings)
        # The leader's word on a fleet-wide stall (decision 0039) and on leases stalled at every owner (decision 0043),
        # heard on the assignment channel while it answers.
        self.fleet_verdict = FleetVerdict(self.clock, bounds.red_after)
        self.stalls = StallWatch(self.clock, bounds, self._reading, self._give_up_lease, self._worker_running,
                                 fleet_stalls=self.fleet_verdict, shard_stalls=self.fleet_verdict.shard_stalls,
                                 on_report=self.keeper.beat_soon)
        self._context = ShardContext(
            keeper=self.keeper,
            kinesis=kinesis or make_client("kinesis", settings.region, settings.kinesis_endpoint_url,
                                           kinesis_timeouts(settings)),
            stream_name=settings.stream_name, stream_names=frozenset(settings.stream_names), factory=factory,
            throughput=self.throughput, progress=self.progress,
            clock=self.clock,
            limits=limits or ReadLimits(), initial_timestamp=settings.initial_timestamp,
            stream_timestamps={name: settings.initial_position_for(name)[1] for name in settings.stream_names},
            prefetch=prefetch, progressed=self.stalls.progressed, failed=self.stalls.failed,
            poison_attempts=settings.poison_attempts, quarantine=poison_destination(settings),
            worker_id=settings.worker_id, reads=reads,
        )
        self.watch = (AssignmentWatch(settings, self.keeper, self.clock, fleet_verdict=self.fleet_verdict.heard)
                      if settings.coordinator_url else None)
        if self.watch is not None:
            self.keeper.attach_channel(self.watch.healthy, self.watch.news, self.watch.beat)
        self.workers: dict[str, ShardWorker] = {}
        self._leaving: dict[str, ShardWorker] = {}  # workers told to stop, by lease, until their lease comes back
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []  # the heartbeat and lease keeper loops, once started
        self._self_drain: threading.Thread | None = None
        self.stopped = threading.Event()  # set once `stop` finished

    def _fleet_rows(self) -> list[WorkerRecord]:
        return self.store.scan_workers().workers

    # ------------------------------------------------------------------ stalled leases (agent/stall_watch.py)
    def _reading(self) -> list[str]:
        """The held leases someone must be reading: processing here, the shard not finished."""
        return [key for key, held in self.keeper.held_items()
                if held.state is HeldState.PROCESSING and not held.lease.is_finished]

    def _worker_running(self, lease_key: str) -> bool:
        """False while the lease's shard worker is dead or waiting for a restart (True without one of ours)."""
        with self._guard:
            worker = self.workers.get(lease_key)
        return worker is None or worker.running

    def _give_up_lease(self, lease_key: str, why: str) -> None:
        """A lease nobody here reads: report it refused (the leader gives it to another worker) and release it."""
        self.progress.refuse(lease_key)
        self.keeper.give_back(lease_key)

    # ------------------------------------------------------------------ LeaseListener
    def lease_acquired(self, lease: Lease) -> None:
        """Start a shard worker for a newly held lease (none for a finished one)."""
        self.throughput.track(lease.lease_key)
        if lease.throughput_kbps is not None:
            self.throughput.seed(lease.lease_key, lease.throughput_kbps)
        if lease.is_finished:
            return
        with self._guard:
            previous = self._leaving.pop(lease.lease_key, None)
            worker = ShardWorker(lease, self._context, previous)
            self.workers[lease.lease_key] = worker
            worker.start(self.supervisor)  # under the guard: `stop` never sees (and joins) a worker not yet started

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
            self._leaving = {key: left for key, left in self._leaving.items() if left.thread.is_alive()}
            if worker is not None:
                self._leaving[lease_key] = worker
        if worker is not None and reason is not LossReason.HANDED_OFF:
            worker.request_stop(Stop.LOST if reason is not LossReason.RELEASED else Stop.SHUTDOWN)
        self.throughput.drop(lease_key)

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        """Nothing to prepare: a shard worker starts reading within a tick of `lease_acquired`."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Agent:
        """Start sampling and the keeper loop; the first heartbeat after the first CPU report, jittered.

        A fleet started at once does not heartbeat in step. The start-up heap is frozen first (agent/heap.py), so no
        full garbage collection pauses the heartbeat for long while the agent holds leases.
        """
        freeze_long_lived("at agent start")
        source = self.sampler.source
        if source is not None:
            try:
                source.sample()  # delta-based sources answer 0 on their first call: take that one outside the history
            except Exception as exc:  # the sampler counts later failures; this one only primes the baseline
                log.warning("priming the CPU source failed: %s", exc)
        log.info("KPL aggregates are de-aggregated by the %s decoder (kpl_decoder=%s%s)", self.kpl_decoder,
                 self.settings.kpl_decoder, f"; the C one, if installed, after {kpl_decoding.PAYBACK_RECORDS:,} user "
                 "records" if self.settings.kpl_decoder == "auto" else "")
        self._sampling.start(self.supervisor)
        self.keeper.beat_apart()
        jitter = self._rng.uniform(0, min(1.0, self.settings.effective_heartbeat_interval_millis / 1000))
        # A fleet started at once does not heartbeat in step; the first row carries the first CPU report.
        self.keeper.delay_next_beat(self._reporter.start() + jitter)
        failover = self.settings.failover_time_millis / 1000
        handoff = self.settings.graceful_lease_handoff_timeout_millis / 1000
        # Health bounds: a heartbeat that completes none for two failover times has had its leases fenced and moved;
        # the keeper completes handoffs within their timeout. The process exits on a stall once it is also past
        # GIVE_UP_FLOOR_SECONDS (shared/supervision.py), at once on a failure.
        self._threads = [self.supervisor.loop(HEARTBEAT, self.keeper.beat, TICK_SECONDS, Kind.CRITICAL,
                                              2 * failover, self._stop),
                         self.supervisor.loop(LEASE_KEEPER, self.keeper.tick, TICK_SECONDS, Kind.CRITICAL,
                                              failover + handoff, self._stop)]
        self.supervisor.loop(STALL_WATCH, self.stalls.check, STALL_WATCH_SECONDS, Kind.RESTARTABLE, stop=self._stop)
        if self.watch is not None:
            self.watch.start(self.supervisor)
        self.supervisor.watch()
        if self.settings.agent_health_port is not None:
            from shardherd.agent.health_server import HealthServer  # prometheus_client: only with a health port

            self.health = HealthServer(self.supervisor, self.progress.failing, self.clock.time, self.stalls,
                                       self.settings.agent_health_host, self.settings.agent_health_port,
                                       reads=lambda: dict(self._context.reads), drain=self.drain_itself,
                                       poison=self.progress).start()
        return self

    def running(self) -> bool:
        """True while the lease keeper's loop runs (started, not stopped, not given up)."""
        return any(thread.name == LEASE_KEEPER and thread.is_alive() for thread in self._threads)

    def _let_go(self, why: str) -> None:
        """A critical thread failed or stalled: stop heartbeating and give the leases back before the exit."""
        self._stop.set()
        with retry_deadline(self.clock.monotonic() + GIVE_UP_SECONDS):
            self.keeper.release_all()

    def begin_stop(self) -> None:
        """A stop signal came: announce DRAINING at once, unless this deployment stops for restarts."""
        if self.settings.shutdown_mode == "drain":
            self.keeper.begin_drain()

    def stop(self, drain: bool = True, drain_timeout: float | None = None, restart_ms: int | None = None) -> None:
        """Stop; with `drain`, first let the leader hand every lease to others (no gap), then give back the rest.

        Last, the worker's row is deleted (LeaseKeeper.retire), so no leader assigns it leases afterwards.
        A stop for a restart (`restart_ms`, `shutdown_mode: restart`, or an operator's reservation already in the row)
        reserves the leases instead (shared/restart.py): the row gets the window, each shard worker checkpoints what
        it delivered and stops, and neither the leases nor the row are given up.
        """
        if drain and restart_ms is None:
            restart_ms = self._restart_window()
        restarting = restart_ms is not None and self.keeper.reserve_for_restart(restart_ms)
        if drain and not restarting:
            self._drain(drain_timeout)
        with self._guard:
            workers = list(self.workers.values())
        for worker in workers:
            worker.request_stop(Stop.SHUTDOWN)
        for worker in workers:
            worker.thread.join(10)
        if not restarting:
            self.keeper.release_all()
        self._stop.set()
        self.supervisor.stop()
        for thread in self._threads:
            thread.join(10)
        if self.health is not None:
            self.health.stop()
        if self.watch is not None:
            self.watch.stop()
        if not restarting:
            self.keeper.retire()  # no leader, ours or KCL's, assigns to a stopped worker whose row still looks fresh
        self._sampling.stop(5)
        self.stopped.set()

    def _restart_window(self) -> int | None:
        """The reservation to make on stop, or None to drain: read from this worker's row (one read at stop).

        An operator's drain flag wins (an autoscaler removing this pod for good drained it first); then this
        deployment's `shutdown_mode: restart`; then a reservation an operator put in the row. Unreadable, the
        deployment's mode decides.
        """
        mode = self.settings.restart_window_millis if self.settings.shutdown_mode == "restart" else None
        try:
            row = self.store.get_worker(self.settings.worker_id)
        except (StoreUnavailable, MalformedWorker) as exc:
            log.warning("reading this worker's row on stop failed (going by shutdown_mode): %s", exc)
            return mode
        return stop_window(row, mode)

    def drain_itself(self, wait: float, restart_ms: int | None = None) -> bool:
        """Drain (or with `restart_ms` stop for a restart) as on SIGTERM; True once stopped.

        A preStop hook asks through the health port. The first call starts it on a thread of its own; every call
        waits up to `wait` seconds for the end.
        """
        with self._guard:
            if self._self_drain is None:
                log.info("%s requested through the health port, then stopping",
                         "drain" if restart_ms is None else f"a restart within {restart_ms} ms")
                self._self_drain = threading.Thread(target=self.stop, kwargs={"drain": True, "restart_ms": restart_ms},
                                                    name="self-drain", daemon=True)
                self._self_drain.start()
            thread = self._self_drain
        thread.join(wait)
        return not thread.is_alive()

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
