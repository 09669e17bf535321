"""The agent's lease bookkeeping: discovery through the owner index, liveness, self-fencing and graceful handoff.

One `tick()` does whatever is due, on an injected clock, so the protocol is tested on virtual time. The keeper never
reads or processes records; it tells a `LeaseListener` when a lease is acquired, must be handed over, or is lost, and
it writes checkpoints fenced by ownership. Liveness follows the coordinator's mode: `worker` (one heartbeat row per
worker, default) or `lease` (KCL-compatible renewal of every lease).

Pause (shared/pause.py): a held lease whose row shows an operator's pause is stopped like a handoff (the processing
side checkpoints what it delivered and calls `finish_handoff`), then acknowledged in the row and reported to the
listener as lost for PAUSED while the keeper keeps it; a row seen without the pause again starts it with
`lease_acquired`. Rows are seen at acquisition, in checkpoint and renewal replies, on a channel change of the
lease's pause mark, every discovery interval for paused leases (one read each, to see a resume), and without the
channel every UNCHANNELED_PAUSE_POLL_SECONDS for every held lease.

Handoffs never wait for good: a handoff whose previous owner does not hold the lease (the leader handed it on before
that worker had discovered it) is completed by that worker as soon as the coordinator names it (nothing of its own to
checkpoint); and a receiver that has waited for a previous owner longer than the handoff timeout plus one failover
time (the leader's own bound on a pending handoff) completes it itself, from the last checkpoint, as the previous
owner does at its timeout.

A lease lost while one of its checkpoints is in flight (fenced during a store outage whose retries outlast the
fencing deadline) is not taken up again until that write has ended: a new worker started from a row read meanwhile
would deliver again what that write then covers.

Safety rule (self-fencing): the leader moves a lease only after it has watched the owner's heartbeat (or the lease's
counter) stay unchanged for the failover time, starting no earlier than the moment the last successful write was
sent. The keeper stops every lease once `failover - margin` has passed since that send time, so processing always ends
before anyone else can be given the shard.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

from shardherd.shared.assignment_channel import HANDS_OFF, base_relation
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.errors import MalformedLease, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.pause import pause_rechecks
from shardherd.shared.retry import retry_deadline
from shardherd.shared.store import Conflict, LeaseStore, Outcome
from shardherd.shared.worker import LeaseProgress, WorkerRecord, WorkerState, troubled

log = logging.getLogger(__name__)

READ_THREADS = 8  # leases read at once when discovery or a recheck reads several (a drain hands over many)
AWAIT_RECHECK_SECONDS = 0.2  # how often a lease handed to this worker is re-read while its previous owner finishes
# Without the coordinator channel (no coordinator_url, or no replica answers), a processing lease's pause is seen in
# the replies to its checkpoints; a shard too quiet to checkpoint is re-read this often.
UNCHANNELED_PAUSE_POLL_SECONDS = 5.0

MetricsProvider = Callable[[], tuple[Mapping[str, tuple[float, ...]], Mapping[str, tuple[float, ...]]]]
ThroughputProvider = Callable[[str], float | None]
ProgressProvider = Callable[[Iterable[str]], Mapping[str, LeaseProgress]]


class LossReason(enum.Enum):
    """Why the agent stopped holding a lease."""

    TAKEN = "taken"  # the store shows another owner (the leader reassigned it)
    DELETED = "deleted"  # the lease row is gone (shard sync cleaned it up)
    SELF_FENCED = "self_fenced"  # liveness writes failed for too long: stopped before anyone could take over
    HANDED_OFF = "handed_off"  # graceful handoff completed: the next owner continues from our checkpoint
    RELEASED = "released"  # given back on drain, or because this worker could not process it
    PAUSED = "paused"  # an operator paused it: processing stopped, the lease stays held (lease_acquired resumes it)


class LeaseListener(Protocol):
    """What the keeper tells the processing side (plain agent or Spark driver)."""

    def lease_acquired(self, lease: Lease) -> None:
        """Start processing `lease` from its checkpoint."""

    def handoff_requested(self, lease: Lease) -> None:
        """Stop reading new records of this lease, finish, checkpoint, then call `LeaseKeeper.finish_handoff`."""

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        """Stop processing at once; any checkpoint attempt will be refused."""

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        """The leases handed to this worker whose previous owner is still finishing changed (may be empty).

        Each comes with `lease_acquired` once the previous owner has released it (or not at all, if the leader moved
        it elsewhere meanwhile): a processing side that plans ahead may expect it.
        """


class HeldState(enum.Enum):
    """Where a held lease is in its life on this worker."""

    PROCESSING = "processing"
    HANDING_OFF = "handing_off"
    PAUSING = "pausing"  # paused by an operator: the processing side finishes its batch and checkpoints
    PAUSED = "paused"  # stopped and acknowledged in the row; held (liveness goes on), nothing processes it


@dataclass(slots=True)
class HeldLease:
    """A lease this worker holds, with the last row it saw and its local timers (monotonic seconds)."""

    lease: Lease
    state: HeldState
    last_renewed_send: float
    handoff_deadline: float | None = None
    handoff_ready: bool = False


@dataclass(frozen=True, slots=True)
class KeeperTiming:
    """Intervals in seconds, from Settings."""

    heartbeat: float
    discovery: float
    failover: float
    margin: float
    handoff_timeout: float
    discovery_fallback: float

    @classmethod
    def from_settings(cls, settings: Settings) -> KeeperTiming:
        """Derive the keeper's timings; the margin is 10 % of the failover time, at least 0.2 s."""
        failover = settings.failover_time_millis / 1000
        return cls(
            heartbeat=settings.effective_heartbeat_interval_millis / 1000,
            discovery=settings.discovery_interval_millis / 1000,
            failover=failover,
            margin=max(0.2, failover * 0.1),
            handoff_timeout=settings.graceful_lease_handoff_timeout_millis / 1000,
            discovery_fallback=settings.discovery_fallback_interval_millis / 1000,
        )


def unheld_handoffs(told: Mapping[str, str] | None, held: Mapping[str, object]) -> list[str]:
    """The leases the coordinator says this worker hands off while it does not hold them, sorted."""
    return sorted(key for key, relation in (told or {}).items() if base_relation(relation) == HANDS_OFF
                  and key not in held)


def handed_over(outcome: Outcome, worker: str) -> bool:
    """True if a checkpoint of `worker` also completed its handoff: applied, and the lease now owned by another."""
    lease = outcome.lease
    return outcome.applied and lease is not None and lease.checkpoint_owner is None and lease.lease_owner != worker


class LeaseKeeper:
    """Holds this worker's leases; thread-safe for `checkpoint`/`finish_handoff` calls from processing threads."""

    def __init__(self, store: LeaseStore, settings: Settings, clock: Clock, listener: LeaseListener,
                 metrics: MetricsProvider | None = None, throughput: ThroughputProvider | None = None,
                 progress: ProgressProvider | None = None) -> None:
        self._store = store
        self._me = settings.worker_id
        self._mode = settings.liveness_mode
        self._clock = clock
        self._listener = listener
        self._metrics = metrics
        self._throughput = throughput
        self._progress = progress
        self._timing = KeeperTiming.from_settings(settings)
        self._held: dict[str, HeldLease] = {}
        self._writing: Counter[str] = Counter()  # checkpoint writes in flight, by lease: not re-acquired meanwhile
        self._guard = threading.RLock()
        self._row_guard = threading.RLock()  # reentrant: a give-back inside a row write never waits on itself
        self._heartbeat_count = 0
        self._last_heartbeat_send: float | None = None
        self._last_record: WorkerRecord | None = None  # the last row this keeper wrote
        self._next_heartbeat = 0.0
        self._next_discovery = 0.0
        self._draining = False
        self._reservation_open = True  # a reservation may wait for this process until its first row clears it
        self._giving_back: set[str] = set()  # leases to release as soon as the store accepts it
        self._channel: Callable[[], bool] | None = None  # True while the coordinator tells us of changes
        self._news: Callable[[], None] | None = None  # tells the leader to look at the store now (see attach_channel)
        self._beat: Callable[[], None] | None = None  # names the row just written to the leader (see attach_channel)
        self._told: dict[str, str] | None = None  # the coordinator's newest view of our leases, not yet applied
        self._awaiting: set[str] = set()  # leases handed to us whose previous owner has not finished yet
        self._awaited_since: dict[str, float] = {}  # when this keeper first found each of them waiting
        self._next_await_check = 0.0
        self._next_pause_check = 0.0  # paused leases are re-read every discovery interval, to see a resume
        self._next_unchanneled_check = 0.0  # without the coordinator channel, every held lease now and then
        self._beats_apart = False  # liveness writes run on their own thread (beat), not in tick
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="lease-read")  # threads made on demand

    # ------------------------------------------------------------------ queries
    @property
    def worker_id(self) -> str:
        """The id this worker holds leases under (their `leaseOwner`)."""
        return self._me

    def held(self) -> dict[str, Lease]:
        """The leases held now, by key (the last row seen for each)."""
        with self._guard:
            return {key: held.lease for key, held in self._held.items()}

    def is_live(self) -> bool:
        """True while liveness writes succeed often enough that no lease needs fencing."""
        if self._mode == "lease":
            return True
        last = self._last_heartbeat_send
        return last is not None and self._clock.monotonic() - last < self._timing.failover - self._timing.margin

    # ------------------------------------------------------------------ processing-side calls
    def checkpoint(self, lease_key: str, checkpoint: Checkpoint, progress: LeaseProgress | None = None,
                   hand_over: bool = False) -> Outcome:
        """Write a checkpoint fenced by ownership; losing ownership ends the lease (listener told) and returns it.

        The lease's progress figures ride along: `progress` if given, else the progress board's for the lease.
        `hand_over` makes a lease under handoff's final checkpoint complete the handoff in the same store write
        (the lease then ends here as handed off; `handed_over` tells from the outcome): one round trip instead of a
        checkpoint and then `finish_handoff`.
        """
        with self._guard:
            held = self._held.get(lease_key)
            if held is None:
                return Outcome.lost(Conflict.OWNERSHIP, None)
            self._writing[lease_key] += 1
        try:
            if self._fenced_now(lease_key):
                return Outcome.lost(Conflict.OWNERSHIP, None)
            with self._within_fence(lease_key):
                return self._write_checkpoint(lease_key, held, checkpoint, progress, hand_over)
        finally:
            with self._guard:
                self._writing[lease_key] -= 1
                if not self._writing[lease_key]:
                    del self._writing[lease_key]

    def _write_checkpoint(self, lease_key: str, held: HeldLease, checkpoint: Checkpoint,
                          progress: LeaseProgress | None, hand_over: bool) -> Outcome:
        if progress is None and self._progress:
            progress = self._progress([lease_key]).get(lease_key)
        if progress is not None:  # when it was written: the operator API's checkpoint age counts from it
            progress = replace(progress, checkpointed_at_millis=int(self._clock.time() * 1000))
        outcome = self._store.checkpoint(lease_key, self._me, checkpoint, progress=progress,
                                         expected=held.lease,  # the row as our last write left it: no read first
                                         hand_over=hand_over and held.state is HeldState.HANDING_OFF)
        if handed_over(outcome, self._me):
            self._lose(lease_key, LossReason.HANDED_OFF)
        elif outcome.applied and outcome.lease is not None:
            with self._guard:
                if lease_key in self._held:
                    self._held[lease_key].lease = outcome.lease
            self._follow_pause(lease_key, outcome.lease)
            if checkpoint.is_shard_end:
                self._tell_news()  # shard sync creates the children once the leader sees this
        elif outcome.conflict in (Conflict.OWNERSHIP, Conflict.NOT_FOUND):
            reason = LossReason.DELETED if outcome.conflict is Conflict.NOT_FOUND else LossReason.TAKEN
            self._lose(lease_key, reason)
        return outcome

    def finish_handoff(self, lease_key: str) -> None:
        """The processing side has checkpointed a lease under handoff (or pause): complete the transfer (or pause)."""
        with self._guard:
            held = self._held.get(lease_key)
            if held is None or held.state not in (HeldState.HANDING_OFF, HeldState.PAUSING):
                return
            pausing = held.state is HeldState.PAUSING
            if pausing:
                held.state = HeldState.PAUSED
            else:
                held.handoff_ready = True
        with self._within_fence(lease_key):
            if pausing:
                self._pause_stopped(lease_key)
            else:
                self._complete_handoff(lease_key)  # at once: the next owner's wait is the shard's gap in processing

    def last_beat(self) -> tuple[int, int] | None:
        """The `hb` and `lut` of the last worker row this keeper wrote successfully (None before the first).

        The agent tells the leader on the channel (agent/assignment_watch.py): the leader then knows when this row
        changed without scanning for it, and so does its successor (coordinator/liveness.py).
        """
        last = self._last_record
        return None if last is None else (last.heartbeat, last.last_update)

    def lease_live(self, lease_key: str) -> bool:
        """True while this worker may still process `lease_key`: held, and its liveness deadline not passed.

        Time-based, so processing threads stop on time even while the keeper thread is stuck in store retries.
        """
        with self._guard:
            held = self._held.get(lease_key)
        if held is None:
            return False
        if self._mode == "worker":
            return self.is_live()
        return self._clock.monotonic() - held.last_renewed_send < self._timing.failover - self._timing.margin

    def begin_drain(self) -> None:
        """Announce DRAINING in the worker record so the leader moves every lease away gracefully."""
        self._draining = True
        self._next_heartbeat = 0.0

    def reserve_for_restart(self, within_ms: int) -> bool:
        """Write a restart reservation into this worker's row (shared/restart.py); True if it landed.

        Called before the shard workers stop: from then on the leader keeps every lease held here for a process with
        the same worker id, for as long as the row stays silent less than `within_ms`. False (no row, or the store
        failing) means the caller must give the leases up as usual.
        """
        try:
            reserved = self._store.set_restart(self._me, within_ms)
        except StoreUnavailable as exc:
            log.warning("writing the restart reservation of %s failed (giving the leases up instead): %s",
                        self._me, exc)
            return False
        if reserved:
            log.info("leases of %s reserved for a restart within %d ms: %s", self._me, within_ms,
                     ", ".join(sorted(self.held())) or "none held")
            self._tell_news()
        return reserved

    def _end_reservation(self) -> None:
        """Clear a reservation that waited for this process, once a row of its own landed (it is alive).

        Until it is cleared the leader gives this worker nothing, so a failing clear is tried again next heartbeat.
        """
        try:
            self._store.set_restart(self._me, None)
        except StoreUnavailable as exc:
            log.warning("clearing the restart reservation of %s failed (again next heartbeat): %s", self._me, exc)
            return
        self._reservation_open = False

    def release_all(self) -> list[str]:
        """Give back every lease not under handoff (drain fallback when no leader moves them); returns the keys.

        The row says DRAINING before the first lease is free: else a leader, told at once, may hand a lease back to
        this worker in the moment before it stops, and it sits with a worker that is gone until the next full scan
        (the fault matrix's Spark driver whose query failed: 22 s).
        """
        giving = [(key, held) for key, held in self.held_items() if held.state is not HeldState.HANDING_OFF]
        if giving and self._mode == "worker" and not self._draining:
            self._draining = True
            self._write_worker_record(self._clock.monotonic())
        released: list[str] = []
        failed: Exception | None = None
        for key, _ in giving:
            try:
                outcome = self._store.release(key, self._me)
            except StoreUnavailable as exc:
                log.warning("release of %s failed: %s", key, exc)
                continue
            if outcome.applied:
                released.append(key)
            try:
                self._lose(key, LossReason.RELEASED if outcome.applied else LossReason.TAKEN)
            except Exception as exc:  # the listener's trouble (a full disk) must not keep the other leases held
                failed = failed or exc
        if released:
            self._tell_news()
        if failed is not None:
            raise failed
        return released

    def retire(self) -> bool:
        """Delete this worker's row on a graceful stop, after its leases were handed on or given back.

        A leader, shardherd's or a Java KCL one, treats a worker whose row is fresh as active and may assign it
        leases (KCL: for 60 s after the last write); without a row nothing is assigned to it. The delete is
        conditioned on the row still being the one this keeper wrote last, so a process that reuses the worker id
        and already wrote its own row keeps it. Returns True if the row was deleted.
        """
        last = self._last_record
        if last is None:
            return False
        try:
            deleted = self._store.delete_worker_if_unchanged(self._me, last.last_update, last.heartbeat)
        except StoreUnavailable as exc:
            log.warning("deleting the worker row of %s on stop failed (leaders see it expire instead): %s",
                        self._me, exc)
            return False
        if deleted:
            log.info("worker row of %s deleted on stop", self._me)
        return deleted

    def give_back(self, lease_key: str) -> None:
        """Release a lease this worker cannot process, now or (if the store fails) at the next ticks.

        Until the release lands the lease stays held, so it is not processed twice; a lease taken meanwhile by the
        leader (or under handoff) simply ends here.
        """
        with self._guard:
            if lease_key not in self._held:
                return
            self._giving_back.add(lease_key)
        with self._within_fence(lease_key):
            self._release_given_back()

    def _fenced_now(self, lease_key: str) -> bool:
        """Fence now if `lease_key`'s liveness deadline has passed (the keeper thread may be stuck): True if so.

        A processing thread's store write starts only while the lease is live, and at the deadline it stops the
        lease itself rather than wait for the keeper's next tick: nothing is written for a lease past its fence.
        """
        if self.lease_live(lease_key):
            return False
        self._fence(self._clock.monotonic())
        return True

    @contextmanager
    def _within_fence(self, lease_key: str) -> Iterator[None]:
        """A processing thread's store write: its retries end by the lease's fence, which is then applied at once.

        Without it a checkpoint against a failing store retried `RetryPolicy.max_attempts` times (seconds of
        backoff) whatever the fence, so its wait, and its last attempt, could come after another worker took over.
        Writes that give a lease up (a release, a handoff's completion) are bounded the same way but not refused
        past the fence: they are conditioned on this worker's ownership and only speed the next owner up.
        """
        try:
            with retry_deadline(self._lease_deadline(lease_key)):
                yield
        finally:
            self._fenced_now(lease_key)

    def _lease_deadline(self, lease_key: str) -> float:
        """The moment `lease_key` must be fenced (now if it is not held, or no heartbeat has been written)."""
        now = self._clock.monotonic()
        limit = self._timing.failover - self._timing.margin
        with self._guard:
            held = self._held.get(lease_key)
        if held is None:
            return now
        last = self._last_heartbeat_send if self._mode == "worker" else held.last_renewed_send
        return now if last is None else last + limit

    def _release_given_back(self) -> None:
        with self._guard:  # claimed under the guard: the keeper thread and a shard thread never both release
            keys, self._giving_back = sorted(self._giving_back), set()
        if keys:  # the row says `refused` before the lease is free: else the leader, told at once, may hand it back
            self._write_worker_record(self._clock.monotonic())
        for key in keys:
            try:
                outcome = self._store.release(key, self._me)
            except StoreUnavailable as exc:
                log.warning("giving back %s failed (retried at the next tick): %s", key, exc)
                with self._guard:
                    if key in self._held:
                        self._giving_back.add(key)
                continue
            if outcome.applied:
                log.error("lease %s given back: this worker cannot process it", key)
                self._tell_news()
            self._lose(key, LossReason.RELEASED if outcome.applied else LossReason.TAKEN)

    def held_items(self) -> list[tuple[str, HeldLease]]:
        """A snapshot of the held leases with their local state."""
        with self._guard:
            return list(self._held.items())

    # ------------------------------------------------------------------ the coordinator channel
    def attach_channel(self, healthy: Callable[[], bool], news: Callable[[], None] | None = None,
                       beat: Callable[[], None] | None = None) -> None:
        """Learn of assignment changes from the coordinator (agent/assignment_watch.py) while `healthy()` holds.

        The owner index is then queried only every `discovery_fallback_interval_millis`, and every second again
        while a lease handed to this worker waits for its previous owner, or once the channel fails. `news()` tells
        the leader that this worker changed something it must see soon (decision 0010): its first row, a drain or
        a refused lease announced in its row, leases given back, a shard's end checkpointed. The leader then scans
        the store at once instead of at its next full scan. `beat()` names each other new row to the leader at once
        (not at the next long-poll, up to a heartbeat later), so the sightings it publishes for a successor include
        this worker's last row even if it dies right after writing it (coordinator/liveness.py).
        """
        self._channel = healthy
        self._news = news
        self._beat = beat

    def _tell_news(self) -> None:
        self._tell(self._news)

    def _tell(self, what: Callable[[], None] | None) -> None:
        if what is not None:
            try:
                what()
            except Exception:  # best effort: the leader's full scans and fallbacks still see the change
                log.exception("telling the coordinator failed")

    def tell(self, leases: Mapping[str, str]) -> None:
        """The coordinator's view of this worker's leases (key -> relation) changed: apply it at the next tick."""
        with self._guard:
            self._told = dict(leases)
        self.discover_soon()

    def discover_soon(self) -> None:
        """Run discovery at the next tick (the channel answered, or stopped answering)."""
        self._next_discovery = 0.0

    def _discovery_period(self) -> float:
        channel = self._channel
        if channel is None or self._awaiting or not channel():
            return self._timing.discovery
        return self._timing.discovery_fallback

    # ------------------------------------------------------------------ the protocol
    def beat_apart(self) -> None:
        """From now on liveness writes are made by `beat()` on a thread of their own, no longer by `tick()`.

        A tick runs its store calls one after another (discovery, a read per lease handed to us, releases), and on a
        loaded machine against a slow store one tick took longer than a short failover leaves between heartbeats
        (2.7 s at a 3 s failover): the heartbeat due meanwhile waited behind it and the agent fenced itself. On its
        own thread a heartbeat waits for nothing but its own write.
        """
        self._beats_apart = True

    def delay_next_beat(self, seconds: float) -> None:
        """The next liveness write comes `seconds` from now at the earliest (a start jitter)."""
        self._next_heartbeat = self._clock.monotonic() + seconds

    def beat_soon(self) -> None:
        """The next liveness write comes at the heartbeat thread's next step (a lease newly reported stalled)."""
        self._next_heartbeat = min(self._next_heartbeat, self._clock.monotonic())

    def beat(self) -> None:
        """The liveness write (worker row; renewals in `lease` mode) if it is due; the heartbeat thread's loop."""
        now = self._clock.monotonic()
        if now < self._next_heartbeat:
            return
        with retry_deadline(self._fencing_deadline(now)):
            self._next_heartbeat = now + self._timing.heartbeat
            self._liveness(now)

    def tick(self) -> None:
        """Do whatever is due: liveness writes (unless `beat_apart`), self-fencing, discovery, handoff completion.

        Store calls give up (rather than keep retrying) when the fencing deadline comes, so the listener is told of a
        self-fence on time even against an unreachable store.
        """
        now = self._clock.monotonic()
        if not self._beats_apart:
            self.beat()
        with retry_deadline(self._fencing_deadline(now)):
            self._fence(self._clock.monotonic())
            if now >= self._next_discovery and self.is_live():
                self._discover()
                self._next_discovery = now + self._discovery_period()
                self._next_await_check = now + AWAIT_RECHECK_SECONDS
            elif self._awaiting and now >= self._next_await_check and self.is_live():
                self._next_await_check = now + AWAIT_RECHECK_SECONDS
                self._recheck_awaiting()
            if now >= self._next_pause_check and self.is_live():
                self._next_pause_check = now + self._timing.discovery
                self._recheck_paused(every=now >= self._next_unchanneled_check and not self._channel_healthy())
                if now >= self._next_unchanneled_check:
                    self._next_unchanneled_check = now + UNCHANNELED_PAUSE_POLL_SECONDS
            self._progress_handoffs(self._clock.monotonic())
            if self._giving_back:
                self._release_given_back()
        self._fence(self._clock.monotonic())

    def _fencing_deadline(self, now: float) -> float:
        """The earliest moment a held lease must be fenced (far ahead when nothing is held)."""
        limit = self._timing.failover - self._timing.margin
        if self._mode == "worker":
            last = self._last_heartbeat_send
            return (last + limit) if last is not None and self._held else now + limit
        sends = [held.last_renewed_send for _, held in self.held_items()]
        return min(sends) + limit if sends else now + limit

    def _liveness(self, now: float) -> None:
        # The worker row is written every heartbeat in both modes: in `lease` mode too the leader (and the API)
        # tell a dead agent from its row within a failover time, where KCL's rule (a row older than two reporter
        # intervals) kept a killed agent "alive", and receiving leases, for a minute. Metric histories still change
        # only once per reporter interval (MetricsReporter).
        self._write_worker_record(now)
        if self._mode == "lease":
            for key, held in self.held_items():
                self._renew(key, held)

    def _write_worker_record(self, sent: float) -> None:
        with self._row_guard:  # the keeper's heartbeat and a shard thread's give-back both write the row
            self._write_row(sent)

    def _write_row(self, sent: float) -> None:
        sts, opr = self._metrics() if self._metrics else ({}, {})
        held = self.held()
        throughput = {}
        if self._throughput is not None:
            for key in held:
                value = self._throughput(key)
                if value is not None:
                    throughput[key] = value
        self._heartbeat_count += 1
        record = WorkerRecord(
            worker_id=self._me, last_update=int(self._clock.time()), metric_stats=sts, operating_range=opr,
            heartbeat=self._heartbeat_count, state=WorkerState.DRAINING if self._draining else WorkerState.ACTIVE,
            lease_throughput=throughput, lease_progress=troubled(self._progress(held)) if self._progress else {},
        )
        gathered = self._clock.monotonic()
        try:
            self._store.upsert_worker(record)
        except StoreUnavailable as exc:
            log.warning("heartbeat failed: %s", exc)
            return
        written = self._clock.monotonic()
        if written - sent > self._timing.heartbeat / 2:  # a slow store or a starved process: fencing comes nearer
            log.warning("heartbeat took %.2f s (%.2f s gathering its figures, %.2f s writing the row)",
                        written - sent, gathered - sent, written - gathered)
        self._last_heartbeat_send = sent
        last, self._last_record = self._last_record, record
        if self._reservation_open:
            self._end_reservation()
        if last is None:
            log.info("first heartbeat of %s written", self._me)
        if last is None or last.state is not record.state or _troubles(last) != _troubles(record):
            self._tell_news()  # a new row, a drain, a refused, failing or stalled lease: the leader must see it now
        else:
            self._tell(self._beat)

    def _renew(self, key: str, held: HeldLease) -> None:
        sent = self._clock.monotonic()
        lease = held.lease
        throughput = self._throughput(key) if self._throughput else None
        during = held.state is HeldState.HANDING_OFF
        try:
            outcome = self._store.renew(key, self._me, lease.lease_counter, throughput, during_handoff=during)
            current = outcome.lease
            if not outcome.applied and current is not None and self._still_mine(current, during):
                # Our own checkpoint (or a handoff start) moved the row on: renew against what is there now.
                during = current.checkpoint_owner == self._me
                if during and held.state is not HeldState.HANDING_OFF:
                    self._request_handoff(key, current)
                outcome = self._store.renew(key, self._me, current.lease_counter, throughput, during_handoff=during)
        except StoreUnavailable as exc:
            log.warning("renewal of %s failed: %s", key, exc)
            return
        if outcome.applied and outcome.lease is not None:
            with self._guard:
                if key in self._held:
                    self._held[key].lease = outcome.lease
                    self._held[key].last_renewed_send = sent
            self._follow_pause(key, outcome.lease)
        elif outcome.conflict is Conflict.NOT_FOUND:
            self._lose(key, LossReason.DELETED)
        else:
            self._lose(key, LossReason.TAKEN)

    def _still_mine(self, current: Lease, during_handoff: bool) -> bool:
        if current.checkpoint_owner == self._me:
            return True
        return not during_handoff and current.lease_owner == self._me and current.checkpoint_owner is None

    def _fence(self, now: float) -> None:
        limit = self._timing.failover - self._timing.margin
        if self._mode == "worker":
            if self._held and not self.is_live():
                log.error("no successful heartbeat for %.1f s: fencing %d leases", limit, len(self._held))
                for key in list(self.held()):
                    self._lose(key, LossReason.SELF_FENCED)
            return
        for key, held in self.held_items():
            if now - held.last_renewed_send >= limit:
                log.error("lease %s not renewed for %.1f s: fencing it", key, limit)
                self._lose(key, LossReason.SELF_FENCED)

    def _discover(self) -> None:
        with self._guard:
            told, self._told = self._told, None
        if told is not None:  # the coordinator's view: what the owner index would list (lease owner is us)
            owned = {key for key, relation in told.items() if base_relation(relation) != HANDS_OFF}
        else:
            try:
                owned = set(self._store.list_owned_keys(self._me))
            except StoreUnavailable as exc:
                log.warning("discovery failed: %s", exc)
                return
        held = self.held()
        with self._guard:  # a lease lost while its checkpoint is in flight is re-read once that write has ended
            writing = set(self._writing)
        new, gone = sorted(owned - held.keys() - writing), sorted(held.keys() - owned)
        watched = sorted(pause_rechecks(held, owned, told)) if told is not None else []
        unheld = unheld_handoffs(told, held)
        rows = self._read_leases(new + gone + watched + unheld)
        self._hand_on_unheld(unheld, rows)
        self._set_awaiting({key for key in new if self._consider_new(key, rows[key])})
        for key in gone:
            self._recheck(key, rows[key])
        for key in watched:
            row = rows[key]
            if isinstance(row, Lease):
                self._follow_pause(key, row)

    def _recheck_awaiting(self) -> None:
        """Re-read only the leases handed to us that wait for their previous owner: take each once it finished.

        The previous owner's release is the end of the shard's gap in processing; one read per waiting lease every
        AWAIT_RECHECK_SECONDS finds it sooner than the next full discovery (a second apart by default).
        """
        rows = self._read_leases(sorted(self._awaiting))
        self._set_awaiting({key for key, row in rows.items() if self._consider_new(key, row)})

    def _read_leases(self, keys: list[str]) -> dict[str, Lease | Exception | None]:
        """Each lease's row (None if absent), or the StoreUnavailable/MalformedLease its read raised; read at once.

        A drain hands a receiver all of a worker's leases in one run: read one after another, the last of them was
        taken (and, at the donor, its handoff requested) a store round trip per lease after the first (0.05-0.1 s
        each against the local stack's moto at load 15), often missing the receiver's next micro-batch.
        """
        deadline = self._fencing_deadline(self._clock.monotonic())

        def read(key: str) -> Lease | Exception | None:
            with retry_deadline(deadline):  # the caller's deadline is per thread
                try:
                    return self._store.get_lease(key)
                except (StoreUnavailable, MalformedLease) as exc:
                    return exc

        if len(keys) < 2:
            return {key: read(key) for key in keys}
        context = contextvars.copy_context()  # e.g. the store meter's caller, as in this thread
        futures = {key: self._readers.submit(context.copy().run, read, key) for key in keys}
        return {key: future.result() for key, future in futures.items()}

    def _channel_healthy(self) -> bool:
        return self._channel is not None and self._channel()

    def _recheck_paused(self, every: bool) -> None:
        """Re-read the paused leases (`every`: all held ones, to see a pause): resume, pause, or acknowledge again."""
        states = {key: held.state for key, held in self.held_items()}
        keys = sorted(key for key, state in states.items() if every or state is HeldState.PAUSED)
        for key, row in self._read_leases(keys).items():
            if not isinstance(row, Lease):
                continue
            if states[key] is HeldState.PAUSED and row.is_paused and row.paused_by != self._me:
                self._pause_stopped(key)
            else:
                self._follow_pause(key, row)

    def _set_awaiting(self, awaiting: set[str]) -> None:
        """Keep the leases that wait for their previous owner; tell the listener when that set changed."""
        changed, self._awaiting = awaiting != self._awaiting, awaiting
        self._awaited_since = {key: since for key, since in self._awaited_since.items() if key in awaiting}
        if changed:
            self._listener.leases_awaited(frozenset(awaiting))

    def _consider_new(self, key: str, lease: Lease | Exception | None) -> bool:
        """Start holding `key` if its row (just read) shows it ours; True if it is ours but still being handed over."""
        if self._draining:
            return False
        if isinstance(lease, StoreUnavailable):
            log.warning("reading discovered lease %s failed: %s", key, lease)
            return False
        if isinstance(lease, Exception):  # malformed: reported by the decoder; not taken, the row stays as it is
            return False
        if lease is None or lease.lease_owner != self._me:
            return False  # stale index entry (or view)
        if lease.checkpoint_owner is not None:
            taken = self._take_overdue_handoff(key, lease)
            if taken is None:
                return True  # still draining from its previous owner: look again at the next discovery
            lease = taken
        if lease.is_paused:
            with self._guard:
                self._held[key] = HeldLease(lease, HeldState.PAUSED, self._clock.monotonic())
            log.info("acquired %s at %s, paused (%s): not processed until resumed", key, lease.checkpoint,
                     lease.paused)
            self._pause_stopped(key)
            return False
        with self._guard:
            self._held[key] = HeldLease(lease, HeldState.PROCESSING, self._clock.monotonic())
        log.info("acquired %s at %s", key, lease.checkpoint)
        try:
            self._listener.lease_acquired(lease)
        except Exception as exc:  # not started: not held either, so the next discovery offers it again
            with self._guard:
                self._held.pop(key, None)
            log.error("starting to process %s failed (offered again at the next discovery): %s: %s", key,
                      type(exc).__name__, exc)
        return False

    def _hand_on_unheld(self, keys: list[str], rows: Mapping[str, Lease | Exception | None]) -> None:
        """Complete at once the handoffs the coordinator says this worker makes of leases it does not hold."""
        for key in keys:
            row = rows[key]
            if not isinstance(row, Lease) or row.checkpoint_owner != self._me or key in self.held():
                continue
            log.info("handoff of %s to %s: not processed here, handed on at once", key, row.lease_owner)
            try:
                self._store.complete_handoff(key, self._me)
            except StoreUnavailable as exc:
                log.warning("completing the handoff of %s failed (again when the coordinator names it): %s", key, exc)

    def _take_overdue_handoff(self, key: str, lease: Lease) -> Lease | None:
        """The row once this receiver completed a handoff overdue by the module docstring's bound, else None.

        None also when the previous owner completed it meanwhile: the next look sees the row.
        """
        now = self._clock.monotonic()
        since = self._awaited_since.setdefault(key, now)
        if now - since <= self._timing.handoff_timeout + self._timing.failover:
            return None
        previous = lease.checkpoint_owner
        assert previous is not None
        log.warning("handoff of %s from %s not completed after %.0f s: completing it here, from the last checkpoint",
                    key, previous, now - since)
        try:
            outcome = self._store.complete_handoff(key, previous)
        except StoreUnavailable as exc:
            log.warning("completing the handoff of %s failed (again at the next look): %s", key, exc)
            return None
        row = outcome.lease
        if not outcome.applied or row is None or row.lease_owner != self._me or row.checkpoint_owner is not None:
            return None
        return row

    def _recheck(self, key: str, lease: Lease | Exception | None) -> None:
        """A held lease no longer shows under our owner in the index: its row (just read) tells why."""
        if isinstance(lease, StoreUnavailable):
            log.warning("re-reading %s failed: %s", key, lease)
            return
        if isinstance(lease, Exception):  # malformed: stop processing it; the row is reported and left as it is
            self._lose(key, LossReason.TAKEN)
            return
        if lease is None:
            self._lose(key, LossReason.DELETED)
        elif lease.checkpoint_owner == self._me:
            self._request_handoff(key, lease)
        elif lease.lease_owner != self._me:
            self._lose(key, LossReason.TAKEN)

    def _follow_pause(self, key: str, row: Lease) -> None:
        """A fresh row of a held lease: stop it if it was paused, start it again if it was resumed."""
        with self._guard:
            held = self._held.get(key)
            if held is None or held.lease.lease_counter > row.lease_counter:
                return  # gone, or a newer row was seen meanwhile
            held.lease = row
            state = held.state
            if row.is_paused and state is HeldState.PROCESSING:
                held.state = HeldState.PAUSING
            elif not row.is_paused and state is HeldState.PAUSED:
                held.state = HeldState.PROCESSING
            else:
                return
        if row.is_paused:
            log.info("%s paused (%s): stopping after the batch in hand", key, row.paused)
            self._listener.handoff_requested(row)  # finish, checkpoint, then finish_handoff (which pauses)
            return
        log.info("%s resumed at %s", key, row.checkpoint)
        try:
            self._listener.lease_acquired(row)
        except Exception as exc:  # not started: the lease goes back to paused-and-held, retried at a discovery
            with self._guard:
                if key in self._held:
                    self._held[key].state = HeldState.PAUSED
            log.error("resuming %s failed: %s: %s", key, type(exc).__name__, exc)

    def _pause_stopped(self, key: str) -> None:
        """Nothing processes the paused lease any more: say so in its row, and tell the listener it stopped."""
        try:
            outcome = self._store.acknowledge_pause(key, self._me)
        except StoreUnavailable as exc:
            log.warning("acknowledging the pause of %s failed (again at the next discovery): %s", key, exc)
            outcome = None
        self._listener.lease_lost(key, LossReason.PAUSED)
        if outcome is not None and outcome.lease is not None:
            self._follow_pause(key, outcome.lease)  # resumed meanwhile: start again

    def _request_handoff(self, key: str, lease: Lease) -> None:
        with self._guard:
            held = self._held.get(key)
            if held is None or held.state is HeldState.HANDING_OFF:
                return
            was_paused = held.state is HeldState.PAUSED
            held.lease = lease
            held.state = HeldState.HANDING_OFF
            held.handoff_deadline = self._clock.monotonic() + self._timing.handoff_timeout
        log.info("handoff of %s to %s requested", key, lease.lease_owner)
        if was_paused:  # nothing processes it: transfer at once
            self.finish_handoff(key)
            return
        self._listener.handoff_requested(lease)

    def _progress_handoffs(self, now: float) -> None:
        for key, held in self.held_items():
            if held.state is not HeldState.HANDING_OFF:
                continue
            deadline = held.handoff_deadline or now
            if not held.handoff_ready and now < deadline:
                continue
            if not held.handoff_ready:
                log.warning("handoff of %s timed out: transferring without a final checkpoint", key)
            self._complete_handoff(key)

    def _complete_handoff(self, key: str) -> None:
        try:
            outcome = self._store.complete_handoff(key, self._me)
        except StoreUnavailable as exc:
            log.warning("completing the handoff of %s failed (retried at the next tick): %s", key, exc)
            return
        self._lose(key, LossReason.HANDED_OFF if outcome.applied else LossReason.TAKEN)

    def _lose(self, key: str, reason: LossReason) -> None:
        with self._guard:
            held = self._held.pop(key, None)
            self._giving_back.discard(key)
        if held is not None:
            log.info("lease %s ended on this worker: %s", key, reason.value)
            self._listener.lease_lost(key, reason)


def _troubles(record: WorkerRecord) -> tuple[frozenset[str], frozenset[str]]:
    """The leases a row reports trouble for, and those of them it reports stalled (a change of either is news)."""
    progress = record.lease_progress
    return frozenset(progress), frozenset(key for key, entry in progress.items() if entry.stalled)
