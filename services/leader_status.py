"""What the leader publishes about its runs, so every replica's API can show runs, reasons, freshness and counters.

Only the leader has run history in memory; every replica serves the API. The leader writes one compact item,
`LeaderStatus`, into the coordinator-state table: a versioned JSON document with the last runs that changed something,
the newest moves with their reasons, the leases the newest run could not place and cumulative counters that a new
leader continues, so Prometheus counters survive failovers. The item is bounded to MAX_STATUS_BYTES (one write unit
per started KiB on DynamoDB: at most four) and written only when a run changed something (moves, unplaced leases,
counts, errors), at once after a quiet spell but on average at most once per MIN_PUBLISH_SECONDS while every run
changes something (a token bucket of PUBLISH_BURST; changes in between go out together; a failure starting or
ending goes out at once), never once per run;
freshness rides on the leader lock's heartbeat instead (`lastSuccessAt`). A move made between two publications is
not lost with its leader: the leader's owner write of each move also stores the move's record on the lease row
(`lastMove`, coordinator/move_record.py; no extra write), a new leader folds those records into its history at its
term's first run, and a replica reading the store folds them into what it serves. Every write is fenced by the leader's
epoch: it only replaces an item of its own term, or of the term it read before, so a deposed leader cannot overwrite
its successor's status. Readers get a typed error for a malformed item.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardherd.coordinator.move_record import MalformedMoveRecord, MoveRecord
from shardherd.coordinator.run_summary import RunSummary
from shardherd.coordinator.scale_model import ScaleFigure
from shardherd.shared.clock import Clock
from shardherd.shared.errors import ShardherdError
from shardherd.shared.lease import Lease
from shardherd.shared.store import LeaseStore, StateValue
from shardherd.shared.store_meter import state_size

log = logging.getLogger(__name__)

STATUS_KEY = "LeaderStatus"
STATUS_ATTRIBUTE = "status"
VERSION_ATTRIBUTE = "statusVersion"
EPOCH_ATTRIBUTE = "statusEpoch"  # the epoch of the leader that wrote the item: the fence of the next write
FORMAT_VERSION = 1
MAX_RUNS = 5
MAX_RECENT_MOVES = 50
MAX_UNPLACED = 50
MAX_DETAIL_CHARS = 200
MAX_SCAN_REASON_CHARS = 60  # a run record's scan reason: the runs of one status item share its 4 KB
MIN_KEPT_MOVES = 5  # moves kept before older runs are given up to fit the size bound
MIN_PUBLISH_SECONDS = 10.0  # a leader that changes something every run writes on average at most this often
PUBLISH_BURST = 3  # publications allowed back to back after a quiet spell (term start, then the first assignments)
MAX_STATUS_BYTES = 4096  # the whole item, by DynamoDB's size rules (attribute names and values)
WRITE_FIELDS = ("handoffs_started", "assigned", "lost_races", "created", "deleted", "workers_deleted")


class MalformedLeaderStatus(ShardherdError):
    """The stored LeaderStatus item cannot be read (wrong version, not JSON, missing fields)."""


class _Frozen(BaseModel):
    # A newer leader may publish fields this version does not know (a rolling deploy of the replicas): they are
    # ignored, as a missing field takes its default, so mixed replicas read each other's status.
    model_config = ConfigDict(frozen=True, extra="ignore")


class Decision(_Frozen):
    """A lease the leader moved (kind `move`) or could not place (kind `unplaced`) in one run, and why."""

    lease_key: str
    epoch: int
    run_started_at: float = Field(description="wall-clock start of the run on the leader")
    kind: Literal["move", "unplaced"]
    reason: str
    detail: str
    from_owner: Annotated[str | None, Field(description="owner before the move (unplaced: the owner it keeps)")] = None
    to_worker: str | None = None


def decisions_of(summary: RunSummary) -> tuple[list[Decision], list[Decision]]:
    """The run's moves and its unplaced leases (spillover and held) as decisions, in the decider's order."""
    plan = summary.plan
    if plan is None:
        return [], []
    epoch, started = summary.epoch, summary.started_at
    moves = [Decision(lease_key=m.lease_key, epoch=epoch, run_started_at=started, kind="move", reason=m.reason.value,
                      detail=m.detail[:MAX_DETAIL_CHARS], from_owner=m.from_owner, to_worker=m.to_worker)
             for m in plan.moves]
    unplaced = [Decision(lease_key=u.lease_key, epoch=epoch, run_started_at=started, kind="unplaced",
                         reason=u.reason.value, detail=u.detail[:MAX_DETAIL_CHARS], from_owner=u.owner)
                for u in (*plan.spillover, *plan.held)]
    return moves, unplaced


def recorded_moves(leases: Iterable[Lease]) -> list[Decision]:
    """The moves recorded on lease rows (`Lease.last_move`) as decisions; an unreadable record is logged, skipped."""
    found = []
    for lease in leases:
        if lease.last_move is None:
            continue
        try:
            record = MoveRecord.decode(lease.last_move)
        except MalformedMoveRecord as exc:
            log.warning("lease %s: %s", lease.lease_key, exc)
            continue
        found.append(Decision(lease_key=lease.lease_key, epoch=record.epoch, run_started_at=record.run_started_at,
                              kind="move", reason=record.reason, detail=record.detail,
                              from_owner=record.from_owner, to_worker=record.to_worker))
    return found


def _identity(move: Decision) -> tuple[str, int, float]:
    return move.lease_key, move.epoch, round(move.run_started_at, 3)  # as a move record stores the time


def merge_moves(known: Iterable[Decision], found: Iterable[Decision]) -> tuple[Decision, ...]:
    """`known` plus the moves of `found` it lacks, oldest first (by run start), the newest MAX_RECENT_MOVES."""
    moves = list(known)
    seen = {_identity(move) for move in moves}
    moves.extend(move for move in found if _identity(move) not in seen)
    moves.sort(key=lambda move: move.run_started_at)  # stable: a run's moves keep the decider's order
    return tuple(moves[-MAX_RECENT_MOVES:])


def with_recorded_moves(status: LeaderStatus | None, leases: Iterable[Lease]) -> LeaderStatus | None:
    """The status with the moves recorded on `leases` that it lacks (made after the leader's last publication)."""
    if status is None:
        return None
    moves = merge_moves(status.recent_moves, recorded_moves(leases))
    return status if moves == status.recent_moves else status.model_copy(update={"recent_moves": moves})


class RunRecord(_Frozen):
    """One leader run as published: what it saw, what it decided (counts) and what landed."""

    epoch: int
    started_at: float = Field(description="wall-clock seconds since the epoch on the leader")
    duration_ms: float
    scanned: bool = Field(default=True, description="a full run (both tables read); false: a tick on the view")
    scan_ms: float = Field(default=0.0, description="a full run's time reading both tables")
    decide_ms: float = Field(default=0.0, description="a full run's wall time in the decider")
    parts: dict[str, float] = Field(default_factory=dict, description="a full run's wall milliseconds in each other "
                                    "part (observe, sync, views, write, feed, cleanup: RunLaps), those of 0.1 or more")
    cpu_ms: float = Field(default=0.0, description="the run thread's CPU time (wall far above it: the host was busy)")
    scan_reason: str | None = Field(default=None, description="why a full run read the tables "
                                    "(coordinator/scan_policy.py), at most MAX_SCAN_REASON_CHARS")
    ok: bool
    error: str | None = None
    leases: int
    active_workers: int
    worker_rows: int = Field(default=0, description="worker rows in the table (live or not): a new row is news")
    expired_leases: int
    malformed_rows: int
    balanced: bool
    balancing_runs: int = Field(default=0, description="the totals' balancing runs, this one included")
    shard_sync_ran: bool
    moves_by_reason: dict[str, int]
    unplaced: int
    writes: dict[str, int]
    shard_sync_error: Annotated[str | None, Field(description="why this run's shard sync failed (leases were "
                                                              "still assigned)")] = None
    balancing_error: Annotated[str | None, Field(description="why this run's balancing failed (leases were "
                                                             "still assigned)")] = None

    @classmethod
    def of(cls, summary: RunSummary) -> RunRecord:
        """The compact record of a run summary."""
        plan = summary.plan
        return cls(epoch=summary.epoch, started_at=summary.started_at, duration_ms=round(summary.duration_ms, 1),
                   scanned=summary.scanned, scan_ms=round(summary.scan_ms, 1), decide_ms=round(summary.decide_ms, 1),
                   parts={part: round(ms, 1) for part, ms in summary.parts.items() if round(ms, 1) > 0},
                   cpu_ms=round(summary.cpu_ms, 1),
                   scan_reason=summary.scan_reason[:MAX_SCAN_REASON_CHARS] if summary.scan_reason else None,
                   ok=summary.ok,
                   error=summary.error, leases=summary.leases, active_workers=summary.active_workers,
                   worker_rows=summary.worker_rows, expired_leases=summary.expired_leases,
                   malformed_rows=summary.malformed_rows,
                   balanced=summary.balanced_this_run, shard_sync_ran=summary.shard_sync_ran,
                   moves_by_reason=summary.moves_by_reason(),
                   unplaced=len(plan.spillover) + len(plan.held) if plan else 0,
                   writes={name: int(getattr(summary.writes, name)) for name in WRITE_FIELDS},
                   shard_sync_error=summary.shard_sync_error, balancing_error=summary.balancing_error)


MAX_SCALE_REASONS = 4
SCALE_NEWS_FRACTION = 0.1  # a load or capacity this far from the last figure that was news is news again


class ScaleRecord(_Frozen):
    """The leader's desired-worker count as published (coordinator/scale_model.py; served by GET /v1/scale)."""

    desired: int
    current: int
    remove_first: str | None = None
    reasons: tuple[str, ...] = ()
    load_kbps: float = 0.0
    capacity_kbps: float | None = None
    computed_at: float = Field(description="wall-clock start of the leader run that computed it")

    @classmethod
    def of(cls, figure: ScaleFigure, started_at: float) -> ScaleRecord:
        """The compact record of a run's figure."""
        return cls(desired=figure.desired, current=figure.current, remove_first=figure.remove_first,
                   reasons=tuple(r[:MAX_DETAIL_CHARS] for r in figure.reasons[:MAX_SCALE_REASONS]),
                   load_kbps=round(figure.load_kbps, 3),
                   capacity_kbps=None if figure.capacity_kbps is None else round(figure.capacity_kbps, 3),
                   computed_at=started_at)

    def is_news_after(self, counted: ScaleRecord | None) -> bool:
        """Whether this figure is worth publishing after `counted`, the last one that was.

        It is when the counts or the removal candidate differ, or the load or the capacity is 10 % or more away from
        the counted one. Measured from the counted figure, not rounded: a capacity estimate hovering at a rounding
        boundary (2,268 and 2,215 KiB/s are 2.3e3 and 2.2e3 to two digits) published the status again at every full
        scan of a steady fleet.
        """
        if counted is None or (self.desired, self.current, self.remove_first) != (
                counted.desired, counted.current, counted.remove_first):
            return True
        if (self.capacity_kbps is None) != (counted.capacity_kbps is None):
            return True
        pairs = [(self.load_kbps, counted.load_kbps)]
        if self.capacity_kbps is not None and counted.capacity_kbps is not None:
            pairs.append((self.capacity_kbps, counted.capacity_kbps))
        return any(abs(new - old) >= SCALE_NEWS_FRACTION * max(abs(old), 1.0) for new, old in pairs)


class Totals(_Frozen):
    """Counters over every published run since the table's first leader (continued across failovers)."""

    runs: int = 0
    failed_runs: int = 0
    balancing_runs: int = 0  # runs that balanced (bench/churn.py counts a joining worker's wait in them)
    shard_sync_failures: int = 0
    balancing_failures: int = 0
    duration_ms_sum: float = 0.0
    moves_by_reason: dict[str, int] = Field(default_factory=dict)
    writes: dict[str, int] = Field(default_factory=dict)

    def plus(self, run: RunRecord) -> Totals:
        """These totals with one more run counted."""
        reasons = dict(self.moves_by_reason)
        for reason, count in run.moves_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + count
        writes = dict(self.writes)
        for name, count in run.writes.items():
            writes[name] = writes.get(name, 0) + count
        return Totals(runs=self.runs + 1, failed_runs=self.failed_runs + (0 if run.ok else 1),
                      balancing_runs=self.balancing_runs + run.balanced,
                      shard_sync_failures=self.shard_sync_failures + (run.shard_sync_error is not None),
                      balancing_failures=self.balancing_failures + (run.balancing_error is not None),
                      duration_ms_sum=self.duration_ms_sum + run.duration_ms, moves_by_reason=reasons, writes=writes)


class LeaderStatus(_Frozen):
    """The document the leader publishes after every run (runs oldest first)."""

    version: int = FORMAT_VERSION
    epoch: int
    leader_id: str
    published_at: float = Field(description="wall-clock seconds since the epoch on the leader")
    last_success_at: Annotated[float | None, Field(description="wall-clock start of the newest successful run")] = None
    shard_sync_failing_since: Annotated[float | None, Field(
        description="wall-clock start of the first run of the current streak of failed shard syncs; None while "
                    "shard sync works")] = None
    shard_sync_error: Annotated[str | None, Field(description="the newest shard sync error of that streak")] = None
    runs: tuple[RunRecord, ...] = ()
    recent_moves: Annotated[tuple[Decision, ...], Field(description="the last moves over all runs, oldest first")] = ()
    unplaced: Annotated[tuple[Decision, ...], Field(description="leases the newest run could not place")] = ()
    totals: Totals = Field(default_factory=Totals)
    scale: Annotated[ScaleRecord | None, Field(description="the desired-worker count of the newest full run")] = None


def _item(status: LeaderStatus, text: str) -> dict[str, StateValue]:
    return {VERSION_ATTRIBUTE: FORMAT_VERSION, EPOCH_ATTRIBUTE: status.epoch, STATUS_ATTRIBUTE: text}


def encode(status: LeaderStatus) -> str:
    """The status as compact JSON, shrunk until the item fits MAX_STATUS_BYTES.

    Fields at their defaults are left out (readers fill them in). The oldest moves go first (down to
    MIN_KEPT_MOVES), then the oldest runs (the newest stays), then unplaced leases, then the remaining moves.
    """
    text = status.model_dump_json(exclude_defaults=True)
    while state_size(STATUS_KEY, _item(status, text)) > MAX_STATUS_BYTES:
        moves, runs, unplaced = status.recent_moves, status.runs, status.unplaced
        if len(moves) > MIN_KEPT_MOVES:
            update: dict[str, object] = {"recent_moves": moves[max(1, min(len(moves) // 4,
                                                                          len(moves) - MIN_KEPT_MOVES)):]}
        elif len(runs) > 1:
            update = {"runs": runs[1:]}
        elif unplaced:
            update = {"unplaced": unplaced[:len(unplaced) // 2]}
        elif moves:
            update = {"recent_moves": moves[1:]}
        else:
            break
        status = status.model_copy(update=update)
        text = status.model_dump_json(exclude_defaults=True)
    return text


def decode(item: dict[str, StateValue] | None) -> LeaderStatus | None:
    """The status in a coordinator-state item; None if there is none; MalformedLeaderStatus if unreadable."""
    if item is None:
        return None
    version = item.get(VERSION_ATTRIBUTE)
    if version != FORMAT_VERSION:
        raise MalformedLeaderStatus(f"{STATUS_KEY}: unsupported {VERSION_ATTRIBUTE} {version!r}")
    raw = item.get(STATUS_ATTRIBUTE)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedLeaderStatus(f"{STATUS_KEY}: {STATUS_ATTRIBUTE} is not UTF-8") from exc
    if not isinstance(raw, str):
        raise MalformedLeaderStatus(f"{STATUS_KEY}: {STATUS_ATTRIBUTE} is missing or not text")
    try:
        status = LeaderStatus.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors()[:5])
        raise MalformedLeaderStatus(f"{STATUS_KEY}: {problems}") from exc
    if status.version != FORMAT_VERSION:
        raise MalformedLeaderStatus(f"{STATUS_KEY}: document version {status.version} is not {FORMAT_VERSION}")
    return status


def read_status(store: LeaseStore, consistent: bool = True) -> LeaderStatus | None:
    """The published status (one read); None before any leader published."""
    return decode(store.get_state(STATUS_KEY, consistent))


def write_status(store: LeaseStore, status: LeaderStatus, replaces_epoch: int | None) -> bool:
    """Replace the published status if the stored one was written in `replaces_epoch` (None: none, or unfenced).

    The leader passes its own epoch once it has written in this term, else the epoch it read; False if the item
    changed meanwhile (a newer leader published), and then nothing was written.
    """
    condition: dict[str, StateValue | None] = {EPOCH_ATTRIBUTE: replaces_epoch}  # None: absent (or no item)
    return store.put_state(STATUS_KEY, _item(status, encode(status)), condition)


def _stored_epoch(item: dict[str, StateValue] | None) -> int | None:
    value = None if item is None else item.get(EPOCH_ATTRIBUTE)
    return value if isinstance(value, int) else None


def _shape(run: RunRecord, summary: RunSummary) -> tuple[object, ...]:
    """What a run says besides its timing: a run with the same shape as the one before is not news."""
    moves = tuple((m.lease_key, m.to_worker) for m in summary.plan.moves) if summary.plan else ()
    # Not the run's own shard_sync_error: sync runs every few runs, so it flaps; the caller adds the failing streak.
    return (run.ok, run.error, run.balancing_error, run.leases, run.active_workers, run.worker_rows,
            run.expired_leases, run.malformed_rows, sorted(run.moves_by_reason.items()), run.unplaced,
            sorted(run.writes.items()), moves)


class LeaderWatch:
    """A replica's view of its own leadership, fed by the lock's `on_change` and the loop's `on_run` hooks.

    On the leader it publishes a LeaderStatus after each run and remembers (on the monotonic clock) when it became
    leader and when a run last succeeded, so `/readyz` can fail for a stalled leader. It also counts lock changes.
    """

    def __init__(self, store: LeaseStore, leader_id: str, clock: Clock, max_runs: int = MAX_RUNS,
                 min_interval: float = MIN_PUBLISH_SECONDS) -> None:
        self._store = store
        self._leader_id = leader_id
        self._clock = clock
        self._runs: deque[RunRecord] = deque(maxlen=max_runs)
        self._moves: deque[Decision] = deque(maxlen=MAX_RECENT_MOVES)
        self._unplaced: tuple[Decision, ...] = ()
        self._scale: ScaleRecord | None = None  # the newest full run's desired-worker count
        self._scale_counted: ScaleRecord | None = None  # the last figure that was news (ScaleRecord.is_news_after)
        self._scale_news = 0  # how many figures were news
        self._totals: Totals | None = None
        self._epoch: int | None = None
        self._last_success_at: float | None = None
        self._leader_since: float | None = None
        self._last_success: float | None = None
        # The current streak of failed shard syncs: (wall-clock start of its first run, monotonic, newest error).
        self._sync_failing: tuple[float, float, str] | None = None
        self._changes = {"acquired": 0, "lost": 0}
        self._replaces: int | None = None  # the epoch a publish must find stored (see write_status)
        self._seen: tuple[object, ...] | None = None  # the shape of the newest run (see _shape)
        self._dirty = False  # a run changed something that is not published yet
        self._min_interval = min_interval
        self._tokens = float(PUBLISH_BURST)  # publications allowed now; one more every `min_interval` seconds
        self._refilled: float | None = None  # monotonic time the tokens were last counted
        self._health: tuple[object, ...] | None = None  # failures of the newest run (see on_run)
        self._deposed = False  # a newer leader's status is stored: this term publishes nothing more
        self._unfolded = False  # this term has not yet folded the moves recorded on lease rows into its history
        # The stored status as this term knows it (read at the term's first run, then each publication), so the
        # leader replica's API serves it without reading the item; None until known.
        self._stored: tuple[LeaderStatus | None] | None = None
        self._guard = threading.Lock()

    def on_lock_change(self, leading: bool, epoch: int | None) -> None:
        """LeaderLock hook: count the change; a new term starts its stall clock now."""
        with self._guard:
            self._changes["acquired" if leading else "lost"] += 1
            self._leader_since = self._clock.monotonic() if leading else None
            self._last_success = None
            self._sync_failing = None
            self._stored = None

    def on_run(self, summary: RunSummary, leases: Callable[[], Iterable[Lease] | None] | None = None) -> None:
        """LeaderLoop hook: record the run; publish the status if the run changed something.

        `leases` gives the lease rows as the leader's newest scan saw them (None: none at hand): the term's first run
        that has them folds the moves recorded there into the history (moves its predecessor made after its last
        publication). Store errors propagate (the loop logs them).
        """
        if summary.ok and not summary.scanned and not summary.shard_sync_ran:  # a tick on the view: fresh, no news
            with self._guard:
                self._last_success_at = summary.started_at
                self._last_success = self._clock.monotonic()
            return
        record = RunRecord.of(summary)
        with self._guard:
            if self._totals is None or self._epoch != summary.epoch:
                self._begin_term(summary.epoch)
            if self._unfolded and leases is not None:
                self._fold(leases)
            since, error = self._note(record, summary)
            assert self._totals is not None
            record = record.model_copy(update={"balancing_runs": self._totals.balancing_runs})
            if not self._due(record, summary, since, error):
                return
            status = LeaderStatus(epoch=summary.epoch, leader_id=self._leader_id, published_at=self._clock.time(),
                                  last_success_at=self._last_success_at, shard_sync_failing_since=since,
                                  shard_sync_error=error, runs=tuple(self._runs),
                                  recent_moves=tuple(self._moves), unplaced=self._unplaced, totals=self._totals,
                                  scale=self._scale)
            replaces = self._replaces
        self._publish(status, replaces)

    def _begin_term(self, epoch: int) -> None:
        """A new term: continue the stored status (caller holds the guard)."""
        previous, self._replaces = self._previous()
        self._continue_from(previous)
        self._stored = (previous,) if previous is not None or self._replaces is None else None
        self._epoch, self._seen = epoch, None
        self._deposed = self._replaces is not None and self._replaces > epoch
        self._unfolded = True

    def _note(self, record: RunRecord, summary: RunSummary) -> tuple[float | None, str | None]:
        """Count the run, keep its moves, follow the shard-sync failure streak; the streak's start and error."""
        assert self._totals is not None
        self._totals = self._totals.plus(record)
        if summary.scale is not None:
            self._scale = ScaleRecord.of(summary.scale, summary.started_at)
            if self._scale.is_news_after(self._scale_counted):
                self._scale_counted, self._scale_news = self._scale, self._scale_news + 1
        if record.ok:
            moves, unplaced = decisions_of(summary)
            self._moves.extend(moves)
            self._unplaced = tuple(unplaced[:MAX_UNPLACED])
            self._last_success_at = record.started_at
            self._last_success = self._clock.monotonic()
        if record.shard_sync_error is not None:
            first = self._sync_failing or (record.started_at, self._clock.monotonic(), "")
            self._sync_failing = (first[0], first[1], record.shard_sync_error)
        elif summary.shard_sync_ran and record.ok:
            self._sync_failing = None
        since, _, error = self._sync_failing or (None, None, None)
        return since, error

    def _due(self, record: RunRecord, summary: RunSummary, since: float | None, error: str | None) -> bool:
        """Whether to publish now: news not yet published, and a token (failures starting or ending need none)."""
        # A shard-sync streak starting or ending is news, and so is a new desired-worker count or removal candidate.
        shape = (*_shape(record, summary), since, error, self._scale_news)
        if shape != self._seen:
            self._seen, self._dirty = shape, True
            self._runs.append(record)
        now = self._clock.monotonic()
        if self._refilled is not None:
            gained = (now - self._refilled) / self._min_interval if self._min_interval > 0 else PUBLISH_BURST
            self._tokens = min(float(PUBLISH_BURST), self._tokens + gained)
        self._refilled = now
        health = (record.ok, record.error, record.balancing_error, since, error)
        urgent = health != self._health  # failures starting or ending skip the bucket: operators wait on them
        self._health = health
        if self._deposed or not self._dirty or (self._tokens < 1 and not urgent):
            return False
        self._tokens = max(0.0, self._tokens - 1)
        return True

    def _publish(self, status: LeaderStatus, replaces: int | None) -> None:
        """Write the status fenced on `replaces`; a refusal means a newer leader's status is stored."""
        if write_status(self._store, status, replaces):
            stored = LeaderStatus.model_validate_json(encode(status))  # as readers decode it: shrunk to the bound
            with self._guard:
                self._replaces, self._dirty = status.epoch, False
                self._stored = (stored,) if self._epoch == status.epoch else None
            return
        log.info("leader status of epoch %d not published: a newer leader's status is stored", status.epoch)
        with self._guard:
            _, self._replaces = self._previous()
            self._deposed = self._replaces is not None and self._replaces > status.epoch
            self._stored = None

    def _fold(self, leases: Callable[[], Iterable[Lease] | None]) -> None:
        """Fold the moves recorded on the lease rows into the history, once per term (caller holds the guard)."""
        rows = leases()
        if rows is None:
            return
        self._unfolded = False
        merged = merge_moves(self._moves, recorded_moves(rows))
        if merged != tuple(self._moves):
            self._moves.clear()
            self._moves.extend(merged)
            self._dirty = True

    def stored_status(self) -> tuple[bool, LeaderStatus | None]:
        """(known, status): the LeaderStatus item as this leader's term last read or wrote it, without a store read.

        Not known before a term's first run, after a lock change, after an unreadable item (the reader's error is
        then what operators should see) or when another leader's status was found. Callers check leadership.
        """
        with self._guard:
            stored = self._stored
        return (False, None) if stored is None else (True, stored[0])

    def last_success_wall(self) -> float | None:
        """Wall-clock start of the newest successful run of this replica's term (the lock heartbeat publishes it)."""
        with self._guard:
            return self._last_success_at if self._leader_since is not None else None

    def _previous(self) -> tuple[LeaderStatus | None, int | None]:
        """The stored status (None if unreadable) and the epoch that wrote it."""
        item = self._store.get_state(STATUS_KEY)
        try:
            return decode(item), _stored_epoch(item)
        except MalformedLeaderStatus as exc:
            log.warning("starting leader status afresh: %s", exc)
            return None, _stored_epoch(item)

    def _continue_from(self, previous: LeaderStatus | None) -> None:
        self._runs.clear()
        self._moves.clear()
        self._unplaced = ()
        self._scale = self._scale_counted = None if previous is None else previous.scale
        if previous is None:
            self._totals, self._last_success_at = Totals(), None
            return
        self._runs.extend(previous.runs)
        self._moves.extend(previous.recent_moves)
        self._unplaced = previous.unplaced
        self._totals, self._last_success_at = previous.totals, previous.last_success_at

    def published_scale(self) -> tuple[int, str | None, float] | None:
        """The stored status's desired-worker count (count, removal candidate, wall time computed), read now.

        A new leader term continues it (LeaderLoop), so a leader change does not move what autoscalers read.
        """
        previous, _ = self._previous()
        scale = None if previous is None else previous.scale
        return None if scale is None else (scale.desired, scale.remove_first, scale.computed_at)

    def lock_changes(self) -> dict[str, int]:
        """How often this replica gained and lost the lock since it started."""
        with self._guard:
            return dict(self._changes)

    def shard_sync_failing(self) -> tuple[float, str] | None:
        """On the leader: seconds since shard sync started failing (this term) and the newest error; else None."""
        with self._guard:
            failing = self._sync_failing
        return None if failing is None else (self._clock.monotonic() - failing[1], failing[2])

    def seconds_without_progress(self) -> float | None:
        """On the leader: seconds since the last successful run (or since the term began); None if not leading."""
        with self._guard:
            if self._leader_since is None:
                return None
            since = self._leader_since if self._last_success is None else max(self._leader_since, self._last_success)
        return self._clock.monotonic() - since


def explain(status: LeaderStatus | None, lease_keys: Iterable[str]) -> dict[str, list[Decision]]:
    """For each key, newest first: why the newest run could not place it, then the recent moves that named it."""
    wanted = set(lease_keys)
    found: dict[str, list[Decision]] = {}
    if status is None:
        return found
    for decision in (*status.unplaced, *reversed(status.recent_moves)):
        if decision.lease_key in wanted:
            found.setdefault(decision.lease_key, []).append(decision)
    return found
