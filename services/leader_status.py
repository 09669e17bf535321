"""What the leader publishes after each run, so every replica's API can show runs, reasons, freshness and counters.

Only the leader has run history in memory; every replica serves the API. After each run the leader writes one
compact item, `LeaderStatus`, into the coordinator-state table: a versioned JSON document with the last runs, the
last moves with their reasons, the leases the newest run could not place (all bounded, so the item stays far below
DynamoDB's 400 KB limit) and cumulative counters that a new leader continues, so Prometheus counters survive
failovers. Readers get a typed error for a malformed item.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coordinator.run_summary import RunSummary
from shared.clock import Clock
from shared.errors import ShardherdError
from shared.store import LeaseStore, StateValue

log = logging.getLogger(__name__)

STATUS_KEY = "LeaderStatus"
STATUS_ATTRIBUTE = "status"
VERSION_ATTRIBUTE = "statusVersion"
FORMAT_VERSION = 1
MAX_RUNS = 20
MAX_RECENT_MOVES = 250
MAX_UNPLACED = 200
MAX_DETAIL_CHARS = 200
MAX_STATUS_BYTES = 256_000
WRITE_FIELDS = ("handoffs_started", "assigned", "lost_races", "created", "deleted", "workers_deleted")


class MalformedLeaderStatus(ShardherdError):
    """The stored LeaderStatus item cannot be read (wrong version, not JSON, missing fields)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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


class RunRecord(_Frozen):
    """One leader run as published: what it saw, what it decided (counts) and what landed."""

    epoch: int
    started_at: float = Field(description="wall-clock seconds since the epoch on the leader")
    duration_ms: float
    ok: bool
    error: str | None = None
    leases: int
    active_workers: int
    expired_leases: int
    malformed_rows: int
    balanced: bool
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
        return cls(epoch=summary.epoch, started_at=summary.started_at, duration_ms=summary.duration_ms,
                   ok=summary.ok, error=summary.error, leases=summary.leases, active_workers=summary.active_workers,
                   expired_leases=summary.expired_leases, malformed_rows=summary.malformed_rows,
                   balanced=summary.balanced_this_run, shard_sync_ran=summary.shard_sync_ran,
                   moves_by_reason=summary.moves_by_reason(),
                   unplaced=len(plan.spillover) + len(plan.held) if plan else 0,
                   writes={name: int(getattr(summary.writes, name)) for name in WRITE_FIELDS},
                   shard_sync_error=summary.shard_sync_error, balancing_error=summary.balancing_error)


class Totals(_Frozen):
    """Counters over every published run since the table's first leader (continued across failovers)."""

    runs: int = 0
    failed_runs: int = 0
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


def encode(status: LeaderStatus) -> str:
    """The status as compact JSON, shrunk until it fits MAX_STATUS_BYTES (oldest moves go first, then runs)."""
    text = status.model_dump_json()
    while len(text.encode()) > MAX_STATUS_BYTES:
        if status.recent_moves:
            status = status.model_copy(update={"recent_moves": status.recent_moves[len(status.recent_moves) // 4 + 1:]})
        elif status.unplaced:
            status = status.model_copy(update={"unplaced": status.unplaced[:len(status.unplaced) // 2]})
        elif status.runs:
            status = status.model_copy(update={"runs": status.runs[1:]})
        else:
            break
        text = status.model_dump_json()
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


def read_status(store: LeaseStore) -> LeaderStatus | None:
    """The published status (one consistent read); None before any leader published."""
    return decode(store.get_state(STATUS_KEY))


def write_status(store: LeaseStore, status: LeaderStatus) -> None:
    """Replace the published status (unconditionally: only the leader calls this, once per run)."""
    store.put_state(STATUS_KEY, {VERSION_ATTRIBUTE: FORMAT_VERSION, STATUS_ATTRIBUTE: encode(status)})


class LeaderWatch:
    """A replica's view of its own leadership, fed by the lock's `on_change` and the loop's `on_run` hooks.

    On the leader it publishes a LeaderStatus after each run and remembers (on the monotonic clock) when it became
    leader and when a run last succeeded, so `/readyz` can fail for a stalled leader. It also counts lock changes.
    """

    def __init__(self, store: LeaseStore, leader_id: str, clock: Clock, max_runs: int = MAX_RUNS) -> None:
        self._store = store
        self._leader_id = leader_id
        self._clock = clock
        self._runs: deque[RunRecord] = deque(maxlen=max_runs)
        self._moves: deque[Decision] = deque(maxlen=MAX_RECENT_MOVES)
        self._unplaced: tuple[Decision, ...] = ()
        self._totals: Totals | None = None
        self._epoch: int | None = None
        self._last_success_at: float | None = None
        self._leader_since: float | None = None
        self._last_success: float | None = None
        # The current streak of failed shard syncs: (wall-clock start of its first run, monotonic, newest error).
        self._sync_failing: tuple[float, float, str] | None = None
        self._changes = {"acquired": 0, "lost": 0}
        self._guard = threading.Lock()

    def on_lock_change(self, leading: bool, epoch: int | None) -> None:
        """LeaderLock hook: count the change; a new term starts its stall clock now."""
        with self._guard:
            self._changes["acquired" if leading else "lost"] += 1
            self._leader_since = self._clock.monotonic() if leading else None
            self._last_success = None
            self._sync_failing = None

    def on_run(self, summary: RunSummary) -> None:
        """LeaderLoop hook: record the run and publish the status (store errors propagate; the loop logs them)."""
        record = RunRecord.of(summary)
        with self._guard:
            if self._totals is None or self._epoch != summary.epoch:
                self._continue_from(self._previous())
                self._epoch = summary.epoch
            assert self._totals is not None
            self._runs.append(record)
            self._totals = self._totals.plus(record)
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
            status = LeaderStatus(epoch=summary.epoch, leader_id=self._leader_id, published_at=self._clock.time(),
                                  last_success_at=self._last_success_at, shard_sync_failing_since=since,
                                  shard_sync_error=error, runs=tuple(self._runs),
                                  recent_moves=tuple(self._moves), unplaced=self._unplaced, totals=self._totals)
        write_status(self._store, status)

    def _previous(self) -> LeaderStatus | None:
        try:
            return read_status(self._store)
        except MalformedLeaderStatus as exc:
            log.warning("starting leader status afresh: %s", exc)
            return None

    def _continue_from(self, previous: LeaderStatus | None) -> None:
        self._runs.clear()
        self._moves.clear()
        self._unplaced = ()
        if previous is None:
            self._totals, self._last_success_at = Totals(), None
            return
        self._runs.extend(previous.runs)
        self._moves.extend(previous.recent_moves)
        self._unplaced = previous.unplaced
        self._totals, self._last_success_at = previous.totals, previous.last_success_at

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
