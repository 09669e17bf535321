"""What the leader publishes after each run, so every replica's API can show runs, reasons, freshness and counters.

Only the leader has run history in memory; every replica serves the API. After each run the leader writes one
compact item, `LeaderStatus`, into the coordinator-state table: a versioned JSON document with the last runs (their
moves and unplaced leases, bounded so the item stays far below DynamoDB's 400 KB limit) and cumulative counters that
a new leader continues, so Prometheus counters survive failovers. Readers get a typed error for a malformed item.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coordinator.moves import Move, Unplaced
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
MAX_ENTRIES_PER_RUN = 200
MAX_DETAIL_CHARS = 200
MAX_STATUS_BYTES = 256_000
WRITE_FIELDS = ("handoffs_started", "assigned", "lost_races", "created", "deleted")


class MalformedLeaderStatus(ShardherdError):
    """The stored LeaderStatus item cannot be read (wrong version, not JSON, missing fields)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MoveRecord(_Frozen):
    """One move of a run: which lease went from whom to whom, and why."""

    lease_key: str
    from_owner: str | None
    to_worker: str
    reason: str
    detail: str

    @classmethod
    def of(cls, move: Move) -> MoveRecord:
        """The record of a decider move (detail shortened)."""
        return cls(lease_key=move.lease_key, from_owner=move.from_owner, to_worker=move.to_worker,
                   reason=move.reason.value, detail=move.detail[:MAX_DETAIL_CHARS])


class UnplacedRecord(_Frozen):
    """A lease the decider wanted to place but could not, and why."""

    lease_key: str
    owner: str | None
    reason: str
    detail: str

    @classmethod
    def of(cls, unplaced: Unplaced) -> UnplacedRecord:
        """The record of a spillover or held lease (detail shortened)."""
        return cls(lease_key=unplaced.lease_key, owner=unplaced.owner, reason=unplaced.reason.value,
                   detail=unplaced.detail[:MAX_DETAIL_CHARS])


class RunRecord(_Frozen):
    """One leader run as published: counts, writes, and (bounded) moves and unplaced leases."""

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
    writes: dict[str, int]
    moves: tuple[MoveRecord, ...] = ()
    unplaced: tuple[UnplacedRecord, ...] = ()
    entries_dropped: int = Field(0, description="moves and unplaced leases left out to keep the item small")

    @classmethod
    def of(cls, summary: RunSummary) -> RunRecord:
        """The compact record of a run summary (at most MAX_ENTRIES_PER_RUN moves plus unplaced leases)."""
        plan = summary.plan
        moves = [MoveRecord.of(move) for move in plan.moves] if plan else []
        unplaced = [UnplacedRecord.of(item) for item in (*plan.spillover, *plan.held)] if plan else []
        kept_moves = moves[:MAX_ENTRIES_PER_RUN]
        kept_unplaced = unplaced[:MAX_ENTRIES_PER_RUN - len(kept_moves)]
        writes = {name: int(getattr(summary.writes, name)) for name in WRITE_FIELDS}
        return cls(epoch=summary.epoch, started_at=summary.started_at, duration_ms=summary.duration_ms,
                   ok=summary.ok, error=summary.error, leases=summary.leases, active_workers=summary.active_workers,
                   expired_leases=summary.expired_leases, malformed_rows=summary.malformed_rows,
                   balanced=summary.balanced_this_run, shard_sync_ran=summary.shard_sync_ran, writes=writes,
                   moves=tuple(kept_moves), unplaced=tuple(kept_unplaced),
                   entries_dropped=len(moves) + len(unplaced) - len(kept_moves) - len(kept_unplaced))

    def without_entries(self) -> RunRecord:
        """A copy without its moves and unplaced leases dropped (counted in `entries_dropped`)."""
        dropped = self.entries_dropped + len(self.moves) + len(self.unplaced)
        return self.model_copy(update={"moves": (), "unplaced": (), "entries_dropped": dropped})


class Totals(_Frozen):
    """Counters over every published run since the table's first leader (continued across failovers)."""

    runs: int = 0
    failed_runs: int = 0
    duration_ms_sum: float = 0.0
    moves_by_reason: dict[str, int] = Field(default_factory=dict)
    writes: dict[str, int] = Field(default_factory=dict)

    def plus(self, run: RunRecord, moves_by_reason: dict[str, int]) -> Totals:
        """These totals with one more run counted."""
        reasons = dict(self.moves_by_reason)
        for reason, count in moves_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + count
        writes = dict(self.writes)
        for name, count in run.writes.items():
            writes[name] = writes.get(name, 0) + count
        return Totals(runs=self.runs + 1, failed_runs=self.failed_runs + (0 if run.ok else 1),
                      duration_ms_sum=self.duration_ms_sum + run.duration_ms, moves_by_reason=reasons, writes=writes)


class LeaderStatus(_Frozen):
    """The document the leader publishes after every run (runs oldest first)."""

    version: int = FORMAT_VERSION
    epoch: int
    leader_id: str
    published_at: float = Field(description="wall-clock seconds since the epoch on the leader")
    last_success_at: float | None = Field(None, description="wall-clock start of the newest successful run")
    runs: tuple[RunRecord, ...] = ()
    totals: Totals = Field(default_factory=Totals)


def encode(status: LeaderStatus) -> str:
    """The status as compact JSON, shrunk until it fits MAX_STATUS_BYTES (oldest runs' entries go first)."""
    text = status.model_dump_json()
    runs = list(status.runs)
    while len(text.encode()) > MAX_STATUS_BYTES and runs:
        index = next((i for i, run in enumerate(runs) if run.moves or run.unplaced), None)
        if index is None:
            runs.pop(0)
        else:
            runs[index] = runs[index].without_entries()
        text = status.model_copy(update={"runs": tuple(runs)}).model_dump_json()
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
        self._totals: Totals | None = None
        self._epoch: int | None = None
        self._last_success_at: float | None = None
        self._leader_since: float | None = None
        self._last_success: float | None = None
        self._changes = {"acquired": 0, "lost": 0}
        self._guard = threading.Lock()

    def on_lock_change(self, leading: bool, epoch: int | None) -> None:
        """LeaderLock hook: count the change; a new term starts its stall clock now."""
        with self._guard:
            self._changes["acquired" if leading else "lost"] += 1
            self._leader_since = self._clock.monotonic() if leading else None
            self._last_success = None

    def on_run(self, summary: RunSummary) -> None:
        """LeaderLoop hook: record the run and publish the status (store errors propagate; the loop logs them)."""
        record = RunRecord.of(summary)
        with self._guard:
            if self._totals is None or self._epoch != summary.epoch:
                self._continue_from(self._previous())
                self._epoch = summary.epoch
            assert self._totals is not None
            self._runs.append(record)
            self._totals = self._totals.plus(record, summary.moves_by_reason())
            if record.ok:
                self._last_success_at = record.started_at
                self._last_success = self._clock.monotonic()
            status = LeaderStatus(epoch=summary.epoch, leader_id=self._leader_id, published_at=self._clock.time(),
                                  last_success_at=self._last_success_at, runs=tuple(self._runs), totals=self._totals)
        write_status(self._store, status)

    def _previous(self) -> LeaderStatus | None:
        try:
            return read_status(self._store)
        except MalformedLeaderStatus as exc:
            log.warning("starting leader status afresh: %s", exc)
            return None

    def _continue_from(self, previous: LeaderStatus | None) -> None:
        self._runs.clear()
        if previous is None:
            self._totals, self._last_success_at = Totals(), None
            return
        self._runs.extend(previous.runs)
        self._totals, self._last_success_at = previous.totals, previous.last_success_at

    def lock_changes(self) -> dict[str, int]:
        """How often this replica gained and lost the lock since it started."""
        with self._guard:
            return dict(self._changes)

    def seconds_without_progress(self) -> float | None:
        """On the leader: seconds since the last successful run (or since the term began); None if not leading."""
        with self._guard:
            if self._leader_since is None:
                return None
            since = self._leader_since if self._last_success is None else max(self._leader_since, self._last_success)
        return self._clock.monotonic() - since


class Explanation(_Frozen):
    """One reason, from a recent leader run, why a lease sits where it does (or could not be placed)."""

    epoch: int
    run_started_at: float
    kind: str = Field(description="move (the lease was given to `to_worker`) or unplaced (it could not be placed)")
    reason: str
    detail: str
    from_owner: str | None = None
    to_worker: str | None = None


def explain(status: LeaderStatus | None, lease_keys: Iterable[str]) -> dict[str, list[Explanation]]:
    """For each key, what the published runs (newest first) decided about it; keys never named are left out."""
    wanted = set(lease_keys)
    found: dict[str, list[Explanation]] = {}
    for run in reversed(status.runs if status else ()):
        for move in run.moves:
            if move.lease_key in wanted:
                found.setdefault(move.lease_key, []).append(Explanation(
                    epoch=run.epoch, run_started_at=run.started_at, kind="move", reason=move.reason,
                    detail=move.detail, from_owner=move.from_owner, to_worker=move.to_worker))
        for item in run.unplaced:
            if item.lease_key in wanted:
                found.setdefault(item.lease_key, []).append(Explanation(
                    epoch=run.epoch, run_started_at=run.started_at, kind="unplaced", reason=item.reason,
                    detail=item.detail, from_owner=item.owner))
    return found
