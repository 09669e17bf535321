"""The leader loop: load the store, observe liveness, sync shards, decide, and write owners with fenced updates.

Only the holder of the leader lock does anything; every other replica's run returns at once, so a fleet start causes
no ListShards or Scan storm. All state kept here (liveness observations, handoff timers, the balancing counter, the
cached shard list) belongs to one leader term and is reset when leadership is (re)gained.

The leader scans both tables only when `coordinator/scan_policy.py` says so: every interval while anything needs
watching, else every `leader_full_scan_interval_millis`; between full runs it ticks on its view in memory (its last
scans with its own conditional writes applied) and is woken at once by signals from the assignment channel.

A term starts by learning who is alive: while agent rows its first scan found are neither seen changing nor silent,
and for at most one heartbeat interval and one assignment interval, it places no unowned lease and balances nothing
(failing over expired leases and draining go on). A cold start's leases then go to every running agent at once, not
all to the one whose row it happened to see change first (decision 0047).
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime

from shardherd.coordinator.assignment_feed import AssignmentFeed
from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.fleet_stall import judge
from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.liveness import (
    LivenessTracker,
    MalformedSightings,
    WorkerGrace,
    decode_sightings,
    encode_sightings,
)
from shardherd.coordinator.load_model import Line
from shardherd.coordinator.move_record import MoveRecord
from shardherd.coordinator.moves import Move, MoveReason, Plan, UnplacedReason
from shardherd.coordinator.paused_leases import hold_paused
from shardherd.coordinator.run_summary import RunHistory, RunLaps, RunSummary, WriteTally
from shardherd.coordinator.scale_model import ScaleFigure, ScaleSettings, ScaleState
from shardherd.coordinator.scale_model import inherited as scale_inherited
from shardherd.coordinator.scale_model import step as scale_step
from shardherd.coordinator.scan_policy import CADENCE, ViewState, pending_in, scan_reason
from shardherd.coordinator.shard_listing import Found, Listed, ShardListing
from shardherd.coordinator.shard_stall import ShardStalls, window_for
from shardherd.coordinator.shard_sync import SyncPlan
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.coordinator.stream_sync import (
    Listings,
    StreamListings,
    children_waiting,
    plan_streams_sync,
    scope_problem,
)
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.errors import StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.restart import reserved
from shardherd.shared.row_checks import report_row
from shardherd.shared.shards import Shard
from shardherd.shared.store import Conflict, Fence, LeaseScan, LeaseStore, Outcome, WorkerScan
from shardherd.shared.store_meter import acting_as
from shardherd.shared.streams import StreamIdentifier, stream_name_of
from shardherd.shared.worker import WorkerRecord
from shardherd.shared.worker_metrics import WorkerStatus, classify

log = logging.getLogger(__name__)

# A single-stream application's source lists its stream; a multi-stream one's lists each configured stream.
ShardSource = Callable[[], list[Shard] | StreamListings]


class ShardSyncFailed(Exception):
    """No stream could be synced this pass (each one's reason in the message)."""


# At most this many runs' carried throughput is kept per worker between two metric reports (a bound on memory).
_CARRIED_RUNS = 64
# Failover times a worker whose row shows a lease it newly gave back (it could not read or process it) receives none
# (decision 0026): handed a lease at once, a worker whose reads fail gave each back at red, again and again.
GAVE_BACK_FAILOVERS = 3
VERDICT_SLACK_SECONDS = 0.02  # a run for a worker's verdict comes this long after its failover time ends


class LeaderGaveUp(Exception):
    """Runs kept failing with a permanent error (denied, disk full, a bug): the lock was released; the replica exits.

    Raised out of `run_once` so the replica's supervisor ends the process (decision 0022): a replica that cannot run
    must not take the lock back after its stand-down. Transient trouble (StoreUnavailable) only stands down.
    """


class LeadershipLost(Exception):
    """A fenced write found the lock taken: the run stops at once (not counted as a failure)."""


@dataclass
class _Reports:
    """The last metric history seen from a worker and the KiB/s it carried at each report seen (oldest first).

    A report averages the samples of the interval before it, so its throughput entry is the mean of what the worker
    carried at the runs of that interval (`carried`), not what it carries when the report arrives.
    """

    signature: Signature
    throughput: list[float]
    carried: list[float] = field(default_factory=list)  # KiB/s carried at each run since the last report
    # How many of the newest reports the worker made while none of its lease figures changed (`settled_reports`),
    # and whether none changed at any run since the last report.
    settled: int = 0
    calm: bool = True


@dataclass
class _Term:
    """Per-term memory of the leader."""

    epoch: int
    tracker: LivenessTracker
    started: float  # monotonic seconds: a shard listing started before the term is never applied in it
    handoff_seen: dict[str, tuple[str | None, str, float]] = field(default_factory=dict)
    reports: dict[str, _Reports] = field(default_factory=dict)
    lines: dict[str, Line] = field(default_factory=dict)  # the last line fitted per metric (see Snapshot.lines)
    # Per worker and metric, its own base as the last run knew it (see Snapshot.own_excess); only active workers'.
    own_excess: dict[str, Mapping[str, float]] = field(default_factory=dict)
    moved_in_run: dict[str, int] = field(default_factory=dict)  # lease key -> run of its last balancing move
    # Lease key -> the KiB/s its owner last reported: a lease keeps its figure while its new owner measures none yet.
    figures: dict[str, float] = field(default_factory=dict)
    # Lease key -> its figure at each of the last few runs (oldest first): is it still changing (`LeaseView.settling`)?
    trends: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # Leases this term placed (unassigned, expired, drained) whose figure has not settled since (`LeaseView.fresh`).
    placed: set[str] = field(default_factory=set)
    runs: int = 0
    shards: Listings | None = None
    # Multi-stream: the streams identified so far this term (leases of other streams are never assigned).
    streams: frozenset[StreamIdentifier] = frozenset()
    shards_listed_at: float | None = None
    sync_failures: int = 0  # consecutive failed shard syncs; retried with backoff, up to the sync interval
    sync_ended_at: float | None = None  # when the last failed listing attempt ended (backoff counts from there)
    # The leader's view between full runs: the leases as its last run left them, and what that run left pending.
    leases: dict[str, Lease] = field(default_factory=dict)
    view: ViewState | None = None
    rebalancing: bool = False  # the last balancing pass moved leases: run every interval until one moves none
    balanced: frozenset[str] = frozenset()  # the live workers with valid metrics, not draining, at the last full run
    on_view: bool = False  # the newest tick ran on the view (no scan)
    scale: ScaleState = field(default_factory=ScaleState)  # the desired-worker count's memory (scale_model.py)
    # Worker -> its row (last update, heartbeat) when a lease of its own lapsed: it receives nothing until it changes.
    lapsed: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    shard_stalls: ShardStalls | None = None  # leases whose reads stalled at two workers (shard_stall.py)
    # Worker -> the leases its row reports given back, and when this leader first saw the newest of them (_gave_back).
    gave_back: dict[str, tuple[frozenset[str], float]] = field(default_factory=dict)


def _places_or_balances(move: Move) -> bool:
    """A move a term still learning its roster holds: placing an unowned lease, or balancing."""
    return move.reason is MoveReason.UNASSIGNED or move.reason.is_balancing


def _held(term: _Term, plan: Plan, leases: Mapping[str, Lease], roster_pending: bool) -> Plan:
    """The plan without the moves this run holds, each kept as held with its reason.

    Balancing of paused leases; balancing of leases whose reads stalled at two workers (the last run's verdict:
    decision 0043); while the term learns its roster, placing unowned leases and balancing (decision 0047).
    """
    plan = hold_paused(plan, leases)
    if term.shard_stalls is not None and term.shard_stalls.verdict:
        plan = plan.hold_balancing(term.shard_stalls.verdict.__contains__, UnplacedReason.SHARD_STALLED,
                                   "its reads stalled at two workers or more: a move would not help")
    if roster_pending:
        plan = plan.hold(_places_or_balances, UnplacedReason.ROSTER_PENDING,
                         "the term's first scan found agent rows not yet seen changing: waiting one heartbeat")
    return plan


@dataclass(frozen=True, slots=True)
class LoopTiming:
    """The loop's timings in seconds, derived from Settings."""

    interval: float
    full_scan: float
    failover: float
    grace: WorkerGrace
    handoff_timeout: float
    shard_sync_interval: float
    balancing_frequency: int
    failure_threshold: int
    stand_down: float
    heartbeat: float  # the agents' heartbeat period: a row unchanged for longer is watched for its verdict
    listing_deadline: float  # a shard listing attempt gives up after this long (well under the failover time)

    @classmethod
    def from_settings(cls, settings: Settings) -> LoopTiming:
        """Convert the millisecond settings; how long workers stay alive is the rule of liveness.WorkerGrace."""
        return cls(
            interval=settings.lease_assignment_interval_millis / 1000,
            full_scan=settings.leader_full_scan_interval_millis / 1000,
            failover=settings.failover_time_millis / 1000,
            grace=WorkerGrace.from_settings(settings),
            handoff_timeout=settings.graceful_lease_handoff_timeout_millis / 1000,
            shard_sync_interval=settings.shard_sync_interval_millis / 1000,
            balancing_frequency=settings.variance_balancing_frequency,
            failure_threshold=settings.leader_failure_threshold,
            stand_down=settings.leader_stand_down_millis / 1000,
            heartbeat=settings.effective_heartbeat_interval_millis / 1000,
            listing_deadline=min(settings.failover_time_millis, settings.shard_sync_interval_millis) / 2000,
        )


class LeaderLoop:
    """One coordinator replica's assignment loop; call `run_once()` every interval (or `cycle` in a loop)."""

    def __init__(self, store: LeaseStore, lock: LeaderLock, settings: Settings, clock: Clock,
                 shard_source: ShardSource | None = None, history: RunHistory | None = None,
                 on_run: Callable[[RunSummary], None] | None = None,
                 on_progress: Callable[[], None] | None = None,
                 published_scale: Callable[[], tuple[int, str | None, float] | None] | None = None) -> None:
        self._store = store
        self._lock = lock
        self._settings = settings
        self._clock = clock
        self._shards = shard_source
        self._timing = LoopTiming.from_settings(settings)
        # ListShards runs apart from the runs (on the replica's listing thread): a run only takes finished listings.
        self.listing = None if shard_source is None else ShardListing(shard_source, clock,
                                                                      self._timing.listing_deadline)
        self._on_progress = on_progress  # a long run's fenced writes tell the supervisor it is not stalled
        # The stored status's desired-worker count (count, removal candidate, wall time): a new term continues it.
        self._published_scale = published_scale
        self._decider = DeciderConfig.from_settings(settings)
        self._scale = ScaleSettings.from_settings(settings)
        self._graceful = settings.graceful_lease_handoff_enabled
        # Balancing leaves a lease alone for two balancing cycles after balancing moved it: no ping-pong. (A cooldown
        # as long as a throughput window delayed the correction of overshoots after a scale-out; the agents' arrival
        # windows and the minimum gain keep a moved lease's figure from bouncing instead.)
        self._cooldown_runs = 2 * settings.variance_balancing_frequency
        # A lease's figure counts as settled once it held still over this many runs (two balancing cycles).
        self._trend_runs = 2 * settings.variance_balancing_frequency + 1
        self.history = history or RunHistory()
        self._on_run = on_run
        self._term: _Term | None = None
        self._failures = 0
        self._latest: tuple[LeaseScan, WorkerScan, float] | None = None  # the newest run's scans and their time
        self._latest_guard = threading.Lock()
        self._sightings: dict[str, tuple[int, int, float]] = {}  # this term's newest row sightings (replaced whole)
        self._contending: LivenessTracker | None = None  # rows watched while the lock's holder looks dead
        # What agents long-poll for (assignment_feed.py); a request is held at most a heartbeat period, so a frozen
        # agent leaves the channel (and the leader watches its row) within that period plus the re-poll grace.
        self.feed = AssignmentFeed(clock, self._timing.interval, hold=self._timing.heartbeat)
        # The owner writes' threads, started at the first run that writes in parallel and kept: a pool started per
        # run waited for each of its threads to start, which on a busy host took up to 0.5 s (bench/leader_run.py).
        self._writers: ThreadPoolExecutor | None = None
        lock.publish_with_heartbeat(self.published_sightings)

    # ------------------------------------------------------------------ driving
    def cycle(self, stop: threading.Event) -> None:
        """One run, then the wait until the next (fixed delay); a signal from the channel starts the next run early.

        The replica's supervised `leader-loop` thread repeats this until `stop` is set (the service then stands the
        feed down). While this replica contends for a lock whose holder misses heartbeats it runs four times as
        often, so its own watch of the worker rows (see `_watch_while_contending`) starts within half a second. A
        signal (a dropped connection, an agent's news) starts a run a quarter interval after the last one at the
        earliest; a worker's verdict due sooner starts it then (a verdict that came due during a run under load is
        not held back another quarter interval).
        """
        self.run_once()
        contending = self._term is None and self._lock.looks_abandoned()
        verdict = self.next_verdict()
        quarter = self._timing.interval / 4 if verdict is None else min(self._timing.interval / 4, verdict)
        if stop.wait(quarter) or contending:
            return
        deadline = time.monotonic() + self._timing.interval * 3 / 4
        verdict = self.next_verdict()
        if verdict is not None:
            deadline = min(deadline, time.monotonic() + verdict)
        while (not stop.is_set() and not self.feed.wakeup.is_set() and time.monotonic() < deadline
               and not self._lock_changing()):
            self.feed.wakeup.wait(min(0.25, max(0.0, deadline - time.monotonic())))

    def _lock_changing(self) -> bool:
        """True when a run is due at once: the lock was just taken, or (not leading) its holder looks abandoned.

        A replica that just took the lock has not run in the term yet; one whose holder looks abandoned should start
        watching the worker rows now.

        Across a leader change every second counts (a dead worker's leases wait for the new leader's runs, and the
        earlier a contender first reads the dead worker's row, the earlier that row's failover time ends), so the
        wait between runs ends within a quarter second instead of at the interval's end.
        """
        return self._term is None and (self._lock.is_leader() or self._lock.looks_abandoned())

    def next_verdict(self) -> float | None:
        """Seconds until a run should judge a quiet worker gone (`LivenessTracker.next_verdict`), if one is quiet.

        `cycle` runs then (a small slack after it), and so does the fleet simulator (bench/fleet/model.py).

        So a crashed worker's leases move one failover time after its last heartbeat was seen, not up to an
        assignment interval later (kill -9 -> read elsewhere at a 3 s failover and a 1 s interval: 0.5 s on average).
        """
        term = self._term
        if term is None:
            return None
        now = self._clock.monotonic()
        due = term.tracker.next_verdict(now, self._timing.heartbeat)
        return None if due is None else max(0.0, due - now) + VERDICT_SLACK_SECONDS

    def run_once(self) -> RunSummary | None:
        """One leader run; None when this replica is not the leader.

        Never raises for transient store trouble; LeaderGaveUp once runs failed `leader_failure_threshold` times in a
        row with a permanent error (the lock is released first).
        """
        with acting_as("leader"):
            return self._run_once()

    def _run_once(self) -> RunSummary | None:
        fence = self._lock.fence()
        epoch = self._lock.epoch()
        if fence is None or epoch is None:
            self._term = None
            self.feed.stand_down()
            self.feed.take_signals()  # nobody here acts on them: do not spin on the wake-up
            self._watch_while_contending()
            return None
        if self._term is None or self._term.epoch != epoch:
            self._term = self._new_term(epoch)
            self._failures = 0
        started_wall, started = self._clock.time(), self._clock.monotonic()
        term = self._term
        reason = scan_reason(term.view, started, self._timing.full_scan, self._settings.liveness_mode == "lease",
                             self.feed.on_channel, self.feed.take_signals())
        try:
            if reason is None:
                summary = self._tick_on_view(term, fence, started_wall, started)
            else:
                summary = self._run(term, fence, started_wall, started, reason)
        except LeadershipLost:
            log.warning("leader loop: lock lost during the run; stopping writes")
            self._term = None
            self.feed.stand_down()
            return None
        except Exception as exc:  # a failed run is recorded, counted, and may release leadership
            log.exception("leader loop: run failed")
            summary = RunSummary(epoch, started_wall, (self._clock.monotonic() - started) * 1000, 0, 0, 0, 0,
                                 False, None, error=_describe(exc), scanned=reason is not None, scan_reason=reason)
            self._failures += 1
            if self._failures >= self._timing.failure_threshold:
                log.error("leader loop: %d consecutive failed runs: releasing leadership for %.1f s",
                          self._failures, self._timing.stand_down)
                self._lock.release(self._timing.stand_down)
                self._term = None
                self.feed.stand_down()
                self._failures = 0
                if not isinstance(exc, StoreUnavailable):
                    self._publish(summary)
                    raise LeaderGaveUp(f"{self._timing.failure_threshold} failed runs, the last: {_describe(exc)}") \
                        from exc
        else:
            self._failures = 0
        self._publish(summary)
        return summary

    def _publish(self, summary: RunSummary) -> None:
        self.history.append(summary)
        if self._on_run is not None:
            try:
                self._on_run(summary)
            except Exception:  # publishing is best effort; it must never fail the loop
                log.exception("leader loop: publishing the run summary failed")

    def published_sightings(self, room: int) -> bytes | None:
        """The leader's newest worker-row sightings as of now, in `room` bytes (sent with each lock heartbeat).

        A row an agent named on the channel after the leader's last scan replaces that worker's sighting: between
        full scans (20 s by default) the publication stays as fresh as the agents' requests (one per heartbeat).
        """
        sightings = dict(self._sightings) if self._term is not None else {}
        for worker, (heartbeat, last_update, named_at) in self.feed.beats().items():
            known = sightings.get(worker)
            if known is not None and known[:2] != (heartbeat, last_update) and named_at > known[2]:
                sightings[worker] = (heartbeat, last_update, named_at)
        return encode_sightings(sightings, self._clock.monotonic(), room) if sightings else None

    def latest_scans(self, max_age: float) -> tuple[LeaseScan, WorkerScan, float] | None:
        """The leader's view (its newest scans, its writes applied) and the monotonic time of those scans, or None.

        The operator API serves these on the leader replica, so dashboards and scrapes there cost no store reads.
        The view is accepted while at most `max_age` seconds old, or, while the leader ticks on it (between full
        runs), up to a full-scan interval.
        """
        with self._latest_guard:
            latest = self._latest
        term = self._term
        on_view = term is not None and term.view is not None and term.on_view
        limit = max(max_age, self._timing.full_scan + self._timing.interval) if on_view else max_age
        if latest is None or self._term is None or self._clock.monotonic() - latest[2] > limit:
            return None
        return latest

    def viewed_leases(self) -> list[Lease] | None:
        """The lease rows of the leader's newest view (its writes applied), however old; None before its first."""
        latest = self.latest_scans(math.inf)
        return None if latest is None else latest[0].leases

    def dry_run(self) -> Plan:
        """What the decider would do now (a balancing run), from the store and, on the leader, its observations.

        Writes nothing. A replica that is not the leader has no liveness history, so only unowned leases count as
        needing an owner and every worker with a record counts as active.
        """
        now = self._clock.monotonic()
        scan = self._store.scan_leases()
        workers = self._store.scan_workers().workers
        term = self._term
        # A private copy: the loop thread keeps using its own observations while the API thread plans.
        tracker = (copy.deepcopy(term.tracker) if term is not None else
                   LivenessTracker(self._settings.liveness_mode, self._timing.failover, self._timing.grace))
        tracker.observe(scan.leases, workers, now)
        # A non-leader has watched nothing change yet: every worker with a record counts as active.
        active = workers if term is None else [w for w in workers if tracker.worker_alive(w.worker_id, now)]
        last = term if term is not None else _Term(0, tracker, now)  # a non-leader remembers nothing
        shadow = _Term(last.epoch, tracker, now, dict(last.handoff_seen), streams=last.streams,
                       figures=dict(last.figures), trends=dict(last.trends))
        views = self._lease_views(shadow, self._in_scope(shadow, scan.leases), workers, now)
        reports = last.reports  # read only: the loop replaces it, never mutates it
        lapsed = _lapsed(last.lapsed, views, active)
        gave_back = _gave_back(last.gave_back, active, now)
        workers_seen = (_view(w, reports.get(w.worker_id), self._stale(tracker, w, now, lapsed, gave_back))
                        for w in active)
        return self._plan(Snapshot.of(views, workers_seen, dict(last.lines), dict(last.own_excess)), True)[0]

    # ------------------------------------------------------------------ one run
    def _watch_while_contending(self) -> None:
        """While the lock's holder misses heartbeats, watch worker rows as a leader would (one scan per run).

        A replica that then takes the lock over starts from these sightings and from those the old leader
        published, instead of watching every row for a whole failover time from zero. Costs nothing otherwise.
        """
        if not self._lock.looks_abandoned():
            self._contending = None
            return
        if self._contending is None:
            self._contending = LivenessTracker(self._settings.liveness_mode, self._timing.failover,
                                               self._timing.grace)
        try:
            self._contending.observe((), self._store.scan_workers().workers, self._clock.monotonic())
        except Exception as exc:  # best effort: a failed scan only means a slower start as leader
            log.warning("leader loop: watching worker rows while contending failed: %s", exc)

    def _new_term(self, epoch: int) -> _Term:
        """A fresh term; after a takeover it starts from what the old leader published and this replica watched."""
        tracker = LivenessTracker(self._settings.liveness_mode, self._timing.failover, self._timing.grace)
        self._sightings = {}
        handover = self._lock.take_handover()
        if handover is not None:
            try:
                tracker.take_over(decode_sightings(handover.observed_rows), handover.published_before)
            except MalformedSightings as exc:
                log.warning("leader loop: ignoring the previous leader's sightings: %s", exc)
        if self._contending is not None:
            tracker.start_from(self._contending.row_sightings(), self._contending.confirmed_workers())
            self._contending = None
        return _Term(epoch, tracker, self._clock.monotonic(), scale=self._inherited_scale())

    def _inherited_scale(self) -> ScaleState:
        """The desired-worker count's start for a new term: the published one, if fresh (scale_model.inherited)."""
        if self._published_scale is None:
            return ScaleState()
        try:
            previous = self._published_scale()
        except Exception as exc:  # best effort: a term without it only starts its count afresh
            log.warning("leader loop: reading the published desired-worker count failed: %s", exc)
            return ScaleState()
        return scale_inherited(previous, self._clock.time(), self._scale)

    def _run(self, term: _Term, fence: Fence, started_wall: float, started: float, reason: str) -> RunSummary:
        """A full run (both tables scanned, for `reason`): shard sync, assignment, balancing; each fails on its own.

        A failing shard sync or balancing pass is reported in the summary while the rest of the run goes on
        (unowned and expired leases are placed every run); only failing to read the store, to plan the assignment
        or to write it fails the run (the next tick then scans again).
        """
        laps = RunLaps()
        term.view, term.on_view = None, False
        scan = self._store.scan_leases()
        worker_scan = self._store.scan_workers()
        scan_ms = laps.lap("scan")
        now = self._clock.monotonic()
        leases = {lease.lease_key: lease for lease in scan.leases}
        # Rows the agents named on the channel: unchanged since then, and written by a live agent (a request names
        # only the row its agent last wrote), so alive at once even at a term's first scan (a new stack's agents get
        # their leases in one run instead of one agent taking them all until the others' next heartbeat).
        beats = self.feed.beats()
        term.tracker.start_from(beats, confirmed=beats.keys())
        term.tracker.observe(leases.values(), worker_scan.workers, now)
        self._sightings = term.tracker.row_sightings()
        laps.lap("observe")
        synced, tally, sync_error = self._sync_if_due(term, leases, fence, now)
        laps.lap("sync")
        active = [w for w in worker_scan.workers if term.tracker.worker_alive(w.worker_id, now)]
        holding = self._roster_pending(term, now)
        # Throughput as last reported by any worker, a dead one included: its leases are placed by their real size.
        views = self._lease_views(term, self._in_scope(term, leases.values()), worker_scan.workers, now)
        histories = self._throughput_histories(term, active, views)
        # In steady state full runs come every full-scan interval: each of those balances. So does a run in which a
        # worker joins the balanced ones: it gets its share now, not at the cadence's next turn (decision 0038).
        joined = not holding and self._joined(term, active)  # held: every worker counts as joined once it ends
        balance = joined or reason == CADENCE or term.runs % self._timing.balancing_frequency == 0
        term.runs += 1
        term.lapsed = _lapsed(term.lapsed, views, active)
        term.gave_back = _gave_back(term.gave_back, active, now)
        workers = (_view(w, histories.get(w.worker_id), self._stale(term.tracker, w, now, term.lapsed, term.gave_back))
                   for w in active)
        laps.lap("views")
        snapshot = Snapshot.of(views, workers, term.lines, term.own_excess)
        plan, balance_error = self._plan(snapshot, balance)
        scale = self._scale_figure(term, snapshot, leases.values(), now)
        plan = _held(term, plan, leases, holding)
        decide_ms = laps.lap("decide")
        term.lines.update(plan.fitted)
        term.own_excess = dict(plan.own_excess)
        # Watched every interval while balancing moves leases: the fleet converges at the interval's pace.
        if balance and balance_error is None:
            term.rebalancing = any(move.reason.is_balancing for move in plan.moves)
        tally = self._write(term, plan, leases, views, fence, tally, started_wall)
        laps.lap("write")
        with self._latest_guard:  # the tables as this run left them (its own writes applied)
            self._latest = (LeaseScan(list(leases.values()), scan.malformed), worker_scan, now)
        self.feed.observe(term.epoch, leases.values(), self._fleet_stalls(active, leases.values()),
                          self._shard_stalls(term, active, leases.values(), now))
        laps.lap("feed")
        term.leases = leases
        term.view = self._view_after(term, leases, views, worker_scan.workers, active, tally, now)
        tally = dataclasses.replace(tally, workers_deleted=self._delete_stale_workers(term, worker_scan.workers, now))
        self._note_balancing_moves(term, plan)
        laps.lap("cleanup")
        return RunSummary(
            epoch=term.epoch, started_at=started_wall, duration_ms=(self._clock.monotonic() - started) * 1000,
            leases=len(leases), active_workers=len(active), worker_rows=len(worker_scan.workers),
            expired_leases=sum(1 for view in views if view.expired),
            malformed_rows=len(scan.malformed) + len(worker_scan.malformed), balanced_this_run=balance,
            plan=plan, writes=tally, shard_sync_ran=synced, shard_sync_error=sync_error, balancing_error=balance_error,
            decide_ms=decide_ms, scan_reason=reason, scale=scale, scan_ms=scan_ms, parts=laps.parts("scan", "decide"),
            cpu_ms=laps.cpu_ms(),
        )

    def _roster_pending(self, term: _Term, now: float) -> bool:
        """Whether this run places nothing unowned and balances nothing (decision 0047).

        True while the term is younger than one heartbeat interval and one assignment interval and agent rows its
        first scan found are still undecided.
        """
        return (now - term.started < self._timing.heartbeat + self._timing.interval
                and term.tracker.agents_undecided(now))

    def _fleet_stalls(self, active: Sequence[WorkerRecord], leases: Collection[Lease]) -> bool:
        """The run's verdict on a fleet-wide stall (coordinator/fleet_stall.py), logged when it changes."""
        fleet = judge(active, leases)
        if fleet.stalls != self.feed.fleet_stalls:
            log.warning("leader loop: %d of %d lease-holding workers report stalled leases: %s", fleet.stalling,
                        fleet.holders, "the fleet stalls at once, agents keep their stalled leases (decision 0039)"
                        if fleet.stalls else "no fleet-wide stall (a stalled lease is given back at its bound)")
        return fleet.stalls

    def _shard_stalls(self, term: _Term, active: Sequence[WorkerRecord], leases: Collection[Lease],
                      now: float) -> frozenset[str]:
        """The run's shard-stalled leases (coordinator/shard_stall.py), each logged when its verdict starts or ends."""
        if term.shard_stalls is None:
            term.shard_stalls = ShardStalls(window_for(self._settings))
        judged = term.shard_stalls
        before = judged.verdict
        after = judged.judge(active, leases, now)
        for key in sorted(after - before):
            log.warning("leader loop: lease %s: reads stalled at %s: the shard's fault (or the service's), not a "
                        "worker's; its owner keeps it while its reader retries (decision 0043)", key,
                        ", ".join(judged.workers(key)))
        for key in sorted(before - after):
            log.info("leader loop: lease %s: no shard-wide stall any more", key)
        return after

    @staticmethod
    def _view_after(term: _Term, leases: dict[str, Lease], views: Sequence[LeaseView], workers: Sequence[WorkerRecord],
                    active: Sequence[WorkerRecord], tally: WriteTally, now: float) -> ViewState:
        """The leader's view as a full run leaves it, with what it left pending (scan_policy.pending_in)."""
        tracker = term.tracker
        # A reservation's end is a verdict too: while one holds, the leader watches every interval.
        undecided = [w.worker_id for w in workers if not tracker.worker_alive(w.worker_id, now)
                     and (not tracker.worker_silent(w.worker_id, now)
                          or reserved(w, tracker.workers.silent_for(w.worker_id, now)))]
        pending = pending_in(unplaced=sum(1 for view in views if view.expired),
                             handoffs=sum(1 for lease in leases.values() if lease.checkpoint_owner is not None),
                             lost=tally.lost_races, undecided=undecided,
                             sync_changed=bool(tally.created or tally.deleted), rebalancing=term.rebalancing)
        return ViewState(now, frozenset(w.worker_id for w in active), pending)

    @staticmethod
    def _joined(term: _Term, active: Sequence[WorkerRecord]) -> bool:
        """Whether a live worker that reports valid metrics and does not drain is new since the last full run."""
        balanced = frozenset(w.worker_id for w in active
                             if not w.is_draining and classify(w) is WorkerStatus.ACTIVE)
        joined, term.balanced = bool(balanced - term.balanced), balanced
        return joined

    def _note_balancing_moves(self, term: _Term, plan: Plan) -> None:
        """Remember the run of each balancing move for the cooldown, forgetting those past it, and each placement."""
        term.moved_in_run = {key: run for key, run in term.moved_in_run.items()
                             if term.runs - run <= self._cooldown_runs}
        for move in plan.moves:
            if move.reason.is_balancing:
                term.moved_in_run[move.lease_key] = term.runs
                term.placed.discard(move.lease_key)
            else:
                term.placed.add(move.lease_key)

    def _tick_on_view(self, term: _Term, fence: Fence, started_wall: float, started: float) -> RunSummary:
        """A run without scans: the view stands (scan_policy said so); only a due shard sync runs, on the view.

        Shard sync's creates and deletes are conditional, so a view that missed a change only makes one fail; one
        that changed leases makes the next tick scan.
        """
        assert term.view is not None
        term.on_view = True
        now = self._clock.monotonic()
        synced, tally, sync_error = self._sync_if_due(term, term.leases, fence, now)
        with self._latest_guard:
            if self._latest is not None and (tally.created or tally.deleted):
                self._latest = (LeaseScan(list(term.leases.values()), self._latest[0].malformed), *self._latest[1:])
            rows = 0 if self._latest is None else len(self._latest[1].workers)  # as the last full run saw them
        if tally.created or tally.deleted:
            term.view = dataclasses.replace(term.view, pending="shard sync changed leases")
        return RunSummary(
            epoch=term.epoch, started_at=started_wall, duration_ms=(self._clock.monotonic() - started) * 1000,
            leases=len(term.leases), active_workers=len(term.view.roster), worker_rows=rows, expired_leases=0,
            malformed_rows=0,
            balanced_this_run=False, plan=None, writes=tally, shard_sync_ran=synced, shard_sync_error=sync_error,
            scanned=False,
        )

    def _sync_if_due(self, term: _Term, leases: dict[str, Lease], fence: Fence,
                     now: float) -> tuple[bool, WriteTally, str | None]:
        """Apply a finished shard listing, asking for the next when due: whether one was applied, writes, error.

        A failure is counted, not raised. The listing itself never runs in this thread once the replica's listing
        thread runs (coordinator/shard_listing.py), so a hanging ListShards never delays a failover.
        """
        if self.listing is None:
            return False, WriteTally(), None
        listed = self.listing.take()
        if listed is not None and listed.started < term.started:
            listed = None  # from before this term: another leader may have synced a newer listing since
        if listed is None and self._shard_sync_due(term, leases.values(), now):
            self.listing.request()  # inline without a listing thread: then it is done here
            listed = self.listing.take()
        if listed is None:
            return False, WriteTally(), None
        try:
            if listed.error is not None:
                raise listed.error
            assert listed.found is not None
            tally, error = self._sync_shards(term, leases, fence, listed)
        except LeadershipLost:
            raise
        except Exception as exc:  # ListShards down or denied, a listing that does not tile, foreign leases
            error = _describe(exc)
            term.sync_failures += 1
            term.sync_ended_at = listed.ended
            log.warning("leader loop: shard sync failed (%d in a row), assigning anyway: %s",
                        term.sync_failures, error)
            return True, WriteTally(), error
        return True, tally, error

    def _in_scope(self, term: _Term, leases: Collection[Lease]) -> list[Lease]:
        """The leases this application processes; the others (another stream's, a malformed key) are left alone.

        Without a shard source (no stream configured) every lease counts. Each left-alone row is reported once.
        """
        if self._shards is None:
            return list(leases)
        streams = term.streams if self._settings.multi_stream else None
        pending = set(self._settings.stream_names) - {stream.name for stream in term.streams}
        kept = []
        for lease in leases:
            problem = scope_problem(lease, streams)
            if problem is None:
                kept.append(lease)
            elif streams is not None and stream_name_of(lease) in pending:
                continue  # a configured stream not identified yet (DescribeStreamSummary failed): next run
            else:
                report_row("lease", lease.lease_key, "left alone", problem)
        return kept

    def _scale_figure(self, term: _Term, snapshot: Snapshot, leases: Collection[Lease],
                      now: float) -> ScaleFigure | None:
        """The desired-worker count from this run's snapshot and lease lags (no store read); None if it failed."""
        lags = [lease.millis_behind_latest for lease in leases
                if lease.millis_behind_latest is not None and not lease.is_finished]
        try:
            term.scale, figure = scale_step(term.scale, snapshot, max(lags, default=None), now, self._scale)
        except Exception:  # a bug in the figure must not fail the run that assigns leases
            log.exception("leader loop: computing the desired-worker count failed")
            return None
        return figure

    def _stale(self, tracker: LivenessTracker, worker: WorkerRecord, now: float,
               lapsed: Mapping[str, object], gave_back: Mapping[str, tuple[frozenset[str], float]]) -> bool:
        """True for a live worker that must receive no lease: old heartbeat, restart, lapsed or given-back lease.

        A lease given back counts for GAVE_BACK_FAILOVERS failover times after the leader first saw it in the row (as
        for every such worker, the decider still hands it unowned leases when no other worker can take them).

        With too old a heartbeat it may have died; one that announced a restart keeps what it holds
        (shared/restart.py) and takes nothing new. A lease of its own that expired (`lapsed`: one it stopped
        renewing) is the leader's own sign that it may be dead while its row still looks fresh (a Java KCL worker
        killed: its metrics row stays fresh for a reporting period), until its row changes. In a CI run one run
        placed a killed KCL worker's expired leases elsewhere and, in the same run, balanced another lease onto it.
        """
        given = gave_back.get(worker.worker_id)
        return (worker.restart_within_ms is not None or worker.worker_id in lapsed
                or (given is not None and now - given[1] < GAVE_BACK_FAILOVERS * self._timing.failover)
                or not tracker.worker_receives(worker.worker_id, now))

    def _plan(self, snapshot: Snapshot, balance: bool) -> tuple[Plan, str | None]:
        """The decider's plan, and why balancing failed if it did (the plan then places leases without balancing).

        A bug in balancing must not stop failover; a failure to place leases at all propagates.
        """
        try:
            return decide(snapshot, self._decider, balance), None
        except Exception as exc:
            if not balance:
                raise
            log.exception("leader loop: balancing failed; placing unowned and expired leases only")
            return decide(snapshot, self._decider, False), _describe(exc)

    def _lease_views(self, term: _Term, leases: Collection[Lease], reporters: list[WorkerRecord],
                     now: float) -> list[LeaseView]:
        owners = {worker.worker_id: worker for worker in reporters}
        refusals: dict[str, set[str]] = {}  # lease key -> the workers whose rows say they gave it back
        for worker in reporters:
            for key, progress in worker.lease_progress.items():
                if progress.refused:
                    refusals.setdefault(key, set()).add(worker.worker_id)
        views = []
        figures: dict[str, float] = {}
        trends: dict[str, tuple[float, ...]] = {}
        seen_handoffs: dict[str, tuple[str | None, str, float]] = {}
        for lease in leases:
            verdict = term.tracker.lease(lease, now)
            owner = lease.actual_owner
            held_for = owner is not None and reserved(owners.get(owner), term.tracker.workers.silent_for(owner, now))
            blocked = False
            if lease.checkpoint_owner is not None:
                first = term.handoff_seen.get(lease.lease_key)
                started_at = now
                if first is not None and first[:2] == (lease.lease_owner, lease.checkpoint_owner):
                    started_at = first[2]
                seen_handoffs[lease.lease_key] = (lease.lease_owner, lease.checkpoint_owner, started_at)
                blocked = now - started_at <= self._timing.handoff_timeout + self._timing.failover
            throughput = reported_throughput(lease, owners)
            if throughput is None:
                throughput = term.figures.get(lease.lease_key)
            settling = False
            if throughput is not None:
                figures[lease.lease_key] = throughput
                settling = self._still_changing(term, lease.lease_key, throughput, trends)
            moved = term.moved_in_run.get(lease.lease_key)
            refused_by = frozenset(refusals.get(lease.lease_key, ()))
            views.append(LeaseView.from_lease(lease, throughput_kbps=throughput,
                                              expired=verdict.expired and not held_for, reserved=held_for,
                                              silent_ms=int(verdict.silent_seconds * 1000),
                                              handoff_blocked=blocked,
                                              recently_moved=moved is not None
                                              and term.runs - moved <= self._cooldown_runs, refused_by=refused_by,
                                              settling=settling, fresh=lease.lease_key in term.placed))
        term.handoff_seen = seen_handoffs
        term.placed.intersection_update(view.key for view in views)
        term.figures = figures
        term.trends = trends
        return views

    def _still_changing(self, term: _Term, key: str, throughput: float, trends: dict[str, tuple[float, ...]]) -> bool:
        """Whether a lease's figure moved over its recent runs by more than the band's share and the minimum gain.

        Its trend is kept in `trends`; a placed lease whose figure held over a whole trend is no longer fresh.
        """
        trend = trends[key] = (*term.trends.get(key, ()), throughput)[-self._trend_runs:]
        first, last = trend[0], trend[-1]
        share = self._settings.rebalance_threshold_percentage / 100.0
        changing = abs(last - first) > max(share * max(first, last), self._settings.rebalance_min_gain_kbps)
        if not changing and len(trend) == self._trend_runs:
            term.placed.discard(key)
        return changing

    # ------------------------------------------------------------------ reports
    @staticmethod
    def _throughput_histories(term: _Term, active: list[WorkerRecord], views: list[LeaseView]) -> dict[str, _Reports]:
        """Per reporting worker, the KiB/s it carried at each new metric report the leader has seen (this term).

        The decider compares the moving average of this history with what the worker carries now, so a move or a
        load change counts at once instead of after the several reports its moving average needs. It also counts
        the newest reports made while none of the worker's lease figures changed (`WorkerView.settled_reports`).
        """
        carried: dict[str, float] = {}
        for view in views:
            owner = view.actual_owner
            if owner is not None and view.throughput_kbps is not None:
                carried[owner] = carried.get(owner, 0.0) + view.throughput_kbps
        changing = {view.actual_owner for view in views if view.settling}
        kept: dict[str, _Reports] = {}
        for record in active:
            if not record.metric_stats:
                continue
            signature = _metrics_signature(record)
            now, calm = carried.get(record.worker_id, 0.0), record.worker_id not in changing
            seen = term.reports.get(record.worker_id)
            if seen is None:
                seen = _Reports(signature, [now], [now], int(calm), calm)
            elif signature != seen.signature:
                length = max(len(history) for history in record.metric_stats.values())
                during = statistics.fmean(seen.carried) if seen.carried else now
                # Every report since the last one seen gets an entry (full scans may come several reports apart),
                # so the throughput history stays aligned with the metric history it is averaged like.
                fresh = [during] * _reports_since(seen.signature, signature)
                throughput = [*seen.throughput, *fresh][-max(1, length):]
                settled = min(len(throughput), seen.settled + len(fresh)) if seen.calm and calm else 0
                seen = _Reports(signature, throughput, [now], settled, calm)
            else:
                seen = _Reports(signature, seen.throughput, [*seen.carried, now][-_CARRIED_RUNS:], seen.settled,
                                seen.calm and calm)
            kept[record.worker_id] = seen
        term.reports = kept
        return kept

    # ------------------------------------------------------------------ shard sync
    def _shard_sync_due(self, term: _Term, leases: Collection[Lease], now: float) -> bool:
        if term.sync_failures and term.sync_ended_at is not None:
            # After a failure: retry 1, 2, 4, ... intervals after the failed attempt ENDED (at most the sync
            # interval), not every run, so a throttled ListShards is not hammered; assignment goes on meanwhile.
            backoff = min(self._timing.shard_sync_interval,
                          self._timing.interval * (1 << min(term.sync_failures - 1, 30)))
            return now - term.sync_ended_at >= backoff
        if term.shards_listed_at is None or now - term.shards_listed_at >= self._timing.shard_sync_interval:
            return True
        # A finished parent whose children have no lease yet: list again now, so children start within a run or two.
        return children_waiting(term.shards or {}, leases)

    def _sync_shards(self, term: _Term, leases: dict[str, Lease], fence: Fence,
                     listed: Listed) -> tuple[WriteTally, str | None]:
        found: Found | None = listed.found
        listings: Listings
        if isinstance(found, StreamListings):
            term.streams, listings, errors = found.streams, found.shards, dict(found.errors)
        else:
            listings, errors = {None: found or []}, {}
        planned = plan_streams_sync(listings, leases.values(), self._position_of)
        errors.update(planned.errors)
        if errors and len(errors) >= len(term.streams or {None: None}):
            raise ShardSyncFailed("; ".join(f"{stream}: {error}" for stream, error in sorted(errors.items())))
        plan = planned.plan
        # Only listings the planner accepted replace the last good ones (used to spot children waiting for leases).
        good = {stream: shards for stream, shards in listings.items()
                if (stream.serialized if stream else "stream") not in errors}
        term.shards, term.shards_listed_at = {**(term.shards or {}), **good}, listed.ended
        term.sync_failures = 0
        tally = self._apply_sync(plan, leases, fence)
        if plan.inconsistent_shard_ids:
            log.info("shard sync: skipped inconsistent children %s", ", ".join(plan.inconsistent_shard_ids))
        # Some streams synced, others not: the run reports the failures while the synced streams go on.
        partial = "; ".join(f"{stream}: {error}" for stream, error in sorted(errors.items())) or None
        return tally, partial

    def _apply_sync(self, plan: SyncPlan, leases: dict[str, Lease], fence: Fence) -> WriteTally:
        """Create and delete leases as shard sync planned (conditional writes; `leases` follows what landed)."""
        created = deleted = 0
        for creation in plan.creates:
            outcome = self._store.create_lease(creation.lease)
            if outcome.applied and outcome.lease is not None:
                leases[outcome.lease.lease_key] = outcome.lease
                created += 1
        for deletion in plan.deletes:
            lease = deletion.lease
            outcome = self._store.delete_lease(lease.lease_key, expected_checkpoint=lease.checkpoint, fence=fence)
            self._check_fence(outcome)
            if outcome.applied:
                leases.pop(lease.lease_key, None)
                deleted += 1
        return WriteTally(created=created, deleted=deleted)

    def _position_of(self, stream: StreamIdentifier | None) -> tuple[str, datetime | None]:
        """Where new leases of `stream` start (its own configured position, else the application's)."""
        return self._settings.initial_position_for(None if stream is None else stream.name)

    # ------------------------------------------------------------------ housekeeping
    def _delete_stale_workers(self, term: _Term, records: list[WorkerRecord], now: float) -> int:
        """Delete worker rows not updated for `stale_worker_metrics_entry_cleanup_seconds` (KCL: 1 day).

        As in KCL each delete is conditioned on the row still holding what was read (`lut`, and `hb`), so a worker
        that came back keeps its row. Beyond KCL, the leader must also have watched the row stay unchanged for the
        grace period this term, so a live worker whose wall clock is far behind is never deleted. Housekeeping is
        best effort: a failing delete is logged and retried next run, never failing the run.
        """
        cutoff = self._clock.time() - self._settings.stale_worker_metrics_entry_cleanup_seconds
        deleted = 0
        for record in records:
            if record.last_update >= cutoff or not term.tracker.worker_silent(record.worker_id, now):
                continue
            try:
                if self._store.delete_worker_if_unchanged(record.worker_id, record.last_update, record.heartbeat):
                    deleted += 1
                    log.info("leader loop: deleted the row of worker %s (last update %d)", record.worker_id,
                             record.last_update)
            except Exception:
                log.exception("leader loop: deleting the stale row of worker %s failed", record.worker_id)
        return deleted

    # ------------------------------------------------------------------ writes
    def _write(self, term: _Term, plan: Plan, leases: dict[str, Lease], views: list[LeaseView], fence: Fence,
               tally: WriteTally, started_wall: float) -> WriteTally:
        """Apply the plan's moves, up to `leader_write_threads` fenced writes at once; tally them in plan order.

        Each write carries the move's record (coordinator/move_record.py), stamped with this run's epoch and start.

        Every write stays conditional and fenced. Once one finds the fence lost, writes not yet started are skipped
        and LeadershipLost is raised after those in flight return (they fail on the same fence).
        """
        expired = {view.key for view in views if view.expired}
        outcomes = self._outcomes(plan.moves, leases, expired, fence, (term.epoch, started_wall))
        handoffs = assigned = lost = 0
        for move, outcome in zip(plan.moves, outcomes, strict=True):
            if outcome is None or outcome.conflict is Conflict.FENCED:
                continue
            if outcome.lease is not None:  # applied: the row now; lost: the row that won
                leases[move.lease_key] = outcome.lease
            if not outcome.applied:
                lost += 1
                log.info("leader loop: %s to %s lost its race (%s)", move.lease_key, move.to_worker,
                         outcome.conflict.value)
                continue
            if outcome.lease is not None and outcome.lease.checkpoint_owner is not None:
                handoffs += 1
            else:
                assigned += 1
                if outcome.lease is not None:
                    term.tracker.assigned(move.lease_key, outcome.lease.lease_counter, move.to_worker,
                                          self._clock.monotonic())
        if any(outcome is None or outcome.conflict is Conflict.FENCED for outcome in outcomes):
            raise LeadershipLost()
        return WriteTally(handoffs, assigned, lost, tally.created, tally.deleted)

    def _outcomes(self, moves: Sequence[Move], leases: dict[str, Lease], expired: set[str],
                  fence: Fence, run: tuple[int, float]) -> list[Outcome | None]:
        """Each move's outcome, in order; None for a move skipped because the fence was lost or a write failed.

        A store error is raised (the first in plan order) after the writes in flight return, as one write at a time
        raised it before the writes after it.
        """
        stop = threading.Event()

        def write(move: Move) -> Outcome | None:
            if stop.is_set():
                return None
            try:
                outcome = self._apply(move, leases[move.lease_key], move.lease_key in expired, fence,
                                      MoveRecord.of(move, *run).encode())
            except BaseException:
                stop.set()
                raise
            if outcome.conflict is Conflict.FENCED:
                stop.set()
            if self._on_progress is not None:
                self._on_progress()
            return outcome

        if min(self._settings.leader_write_threads, len(moves)) <= 1:
            return [write(move) for move in moves]
        if self._writers is None:
            self._writers = ThreadPoolExecutor(self._settings.leader_write_threads, thread_name_prefix="leader-write")
        # Each task runs in a copy of this context, so the store meter still attributes it to the leader.
        futures: list[Future[Outcome | None]] = [
            self._writers.submit(contextvars.copy_context().run, write, move) for move in moves]
        wait(futures)  # every write returns before the first error (in plan order) is raised
        return [future.result() for future in futures]

    def close(self) -> None:
        """Stop the owner writes' threads (the replica is stopping); writes of a run in progress finish first."""
        if self._writers is not None:
            self._writers.shutdown(wait=True)

    def _apply(self, move: Move, lease: Lease, expired: bool, fence: Fence, record: str) -> Outcome:
        graceful = (self._graceful and not expired and not lease.is_finished and lease.checkpoint_owner is None
                    and lease.lease_owner is not None)
        if graceful:
            assert lease.lease_owner is not None
            return self._store.start_handoff(lease.lease_key, move.to_worker, lease.lease_owner, fence=fence,
                                             move=record)
        return self._store.assign(lease.lease_key, move.to_worker, lease.lease_owner, lease.checkpoint_owner,
                                  fence=fence, move=record)

    @staticmethod
    def _check_fence(outcome: Outcome) -> None:
        if outcome.conflict is Conflict.FENCED:
            raise LeadershipLost()


def _lapsed(previous: Mapping[str, tuple[int, int | None]], views: Iterable[LeaseView],
            workers: Iterable[WorkerRecord]) -> dict[str, tuple[int, int | None]]:
    """Workers that let a lease lapse, each with its row as it was then (LeaderLoop._stale).

    The owners of leases expired now, and those seen so before whose row has not changed since.
    """
    owners = {view.lease_owner for view in views if view.expired and view.lease_owner is not None}
    lapsed: dict[str, tuple[int, int | None]] = {}
    for worker in workers:
        row = (worker.last_update, worker.heartbeat)
        if worker.worker_id in owners or previous.get(worker.worker_id) == row:
            lapsed[worker.worker_id] = row
    return lapsed

def _gave_back(previous: Mapping[str, tuple[frozenset[str], float]], workers: Iterable[WorkerRecord],
               now: float) -> dict[str, tuple[frozenset[str], float]]:
    """Per worker whose row reports leases given back (`refused`): those leases, and when the newest was first seen.

    A row reports a lease given back for minutes (agent/progress.py); only one not reported at the last run restarts
    the span. A new leader sees every reported one as new: a worker gives its span once more.
    """
    seen: dict[str, tuple[frozenset[str], float]] = {}
    for worker in workers:
        keys = frozenset(key for key, progress in worker.lease_progress.items() if progress.refused)
        if keys:
            before = previous.get(worker.worker_id)
            seen[worker.worker_id] = (keys, before[1] if before is not None and keys <= before[0] else now)
    return seen


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


Signature = tuple[tuple[str, tuple[float, ...]], ...]  # a worker's metric histories, by metric name


def _metrics_signature(record: WorkerRecord) -> Signature:
    return tuple(sorted((name, tuple(history)) for name, history in record.metric_stats.items()))


def _view(record: WorkerRecord, reports: _Reports | None, stale: bool) -> WorkerView:
    """A worker's view with the leader's record of its reports (none yet: an empty history)."""
    if reports is None:
        return WorkerView.from_record(record, (), stale)
    return WorkerView.from_record(record, tuple(reports.throughput), stale, reports.settled)


def _reports_since(before: Signature, after: Signature) -> int:
    """How many reports a worker made between two signatures of its metrics (at least 1).

    The smallest shift that lines the newer history up with the older one (each report appends one value and
    drops the oldest once the history is full); a history that lines up with no shift (the worker restarted)
    counts as that many new reports.
    """
    old = before[0][1] if before else ()
    new = after[0][1] if after else ()
    for shift in range(1, len(new) + 1):
        overlap = len(new) - shift
        if overlap <= len(old) and new[:overlap] == old[len(old) - overlap:]:
            return shift
    return 1


def reported_throughput(lease: Lease, owners: dict[str, WorkerRecord]) -> float | None:
    """The throughput the lease's actual owner reports in its heartbeat (`worker` mode), else the lease's own value."""
    owner = owners.get(lease.actual_owner or "")
    if owner is not None and lease.lease_key in owner.lease_throughput:
        return owner.lease_throughput[lease.lease_key]
    return lease.throughput_kbps
