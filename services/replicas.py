"""Which coordinator replicas exist: each replica reports itself into one shared coordinator-state item.

Only the leader has run history; an operator also needs to see the followers (is the standby alive? where is its
API?) and what went wrong on each. Every replica rewrites its own entry of the item `CoordinatorReplicas`: id, API
URL, start time, last report, whether it leads (and in which epoch), and the last error it met (a failed leader run
or a failed lock tick, with its time). It writes when its entry changes (checked every CHECK_SECONDS in memory, so a
new leader shows within about a second) and otherwise every KEEPALIVE_SECONDS, so that a silent replica stands out.
Each write is a read and an optimistic write (the item's version must be the one read), so concurrent replicas never
lose each other's entries; the read is eventually consistent (half a read unit: a stale version only makes the write
fail), and after a conflict the report is retried within CHECK_SECONDS with a strongly consistent read. Entries not
refreshed for FORGET_SECONDS are dropped; the item is bounded by MAX_REPLICAS entries (docs/store-cost.md).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from shardherd.coordinator.run_summary import RunSummary
from shardherd.shared.clock import Clock
from shardherd.shared.errors import ShardherdError
from shardherd.shared.store import LeaseStore

log = logging.getLogger(__name__)

REPLICAS_KEY = "CoordinatorReplicas"
ENTRIES_ATTRIBUTE = "replicas"
VERSION_ATTRIBUTE = "replicasVersion"
KEEPALIVE_SECONDS = 30.0  # a report without news: the replica is still there (KCL's worker-metrics cadence)
CHECK_SECONDS = 1.0  # how often the entry is compared with the last one reported (in memory, no store call)
FORGET_SECONDS = 300.0
MAX_REPLICAS = 32
MAX_ERROR_CHARS = 300


class ReplicaEntry(BaseModel):
    """One replica as it last reported itself."""

    replica_id: str
    api_url: str | None
    started_at: float = Field(description="wall-clock seconds since the epoch on the replica")
    reported_at: float = Field(description="its last report, wall-clock seconds on the replica")
    leading: bool
    epoch: Annotated[int | None, Field(description="the epoch it leads in (null when following)")] = None
    last_error: Annotated[str | None, Field(description="the last failed leader run or lock tick on it")] = None
    last_error_at: float | None = None


_ENTRIES = TypeAdapter(list[ReplicaEntry])
LeaderProbe = Callable[[], tuple[bool, int | None]]  # (leading now, epoch)


class MalformedReplicas(ShardherdError):
    """The stored replica list cannot be read."""


def read_replicas(store: LeaseStore, consistent: bool = True) -> tuple[list[ReplicaEntry], int | None]:
    """The entries (sorted by id) and the item's version (None before any replica reported)."""
    item = store.get_state(REPLICAS_KEY, consistent)
    if item is None:
        return [], None
    version, raw = item.get(VERSION_ATTRIBUTE), item.get(ENTRIES_ATTRIBUTE)
    if not isinstance(version, int) or not isinstance(raw, str):
        raise MalformedReplicas(f"{REPLICAS_KEY}: needs an integer {VERSION_ATTRIBUTE} and a JSON {ENTRIES_ATTRIBUTE}")
    try:
        entries = _ENTRIES.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]["msg"]
        raise MalformedReplicas(f"{REPLICAS_KEY}: {exc.error_count()} problems, first: {first}") from exc
    return sorted(entries, key=lambda entry: entry.replica_id), version


class ReplicaReporter:
    """Keeps this replica's entry fresh; `note_error` records what went wrong for operators to see."""

    def __init__(self, store: LeaseStore, replica_id: str, clock: Clock, is_leader: LeaderProbe) -> None:
        self._store = store
        self._clock = clock
        self._is_leader = is_leader
        self._entry = ReplicaEntry(replica_id=replica_id, api_url=None, started_at=clock.time(),
                                   reported_at=clock.time(), leading=False)
        self._guard = threading.Lock()
        self._reported: ReplicaEntry | None = None  # the entry as last written, report time aside
        self._reported_at = -math.inf  # monotonic time of that write
        self._consistent = False  # the last write lost a race: read the newest version strongly next time

    def set_api_url(self, url: str) -> None:
        """Where this replica serves the API (known once the server is bound)."""
        with self._guard:
            self._entry = self._entry.model_copy(update={"api_url": url})

    def note_run(self, summary: RunSummary) -> None:
        """LeaderLoop hook: remember a failed run's error."""
        if summary.error is not None:
            self.note_error(f"leader run (epoch {summary.epoch}) failed: {summary.error}")

    def note_error(self, error: str) -> None:
        """Remember the newest error (shortened) with its time."""
        with self._guard:
            self._entry = self._entry.model_copy(update={"last_error": error[:MAX_ERROR_CHARS],
                                                         "last_error_at": self._clock.time()})

    def due(self) -> bool:
        """True if the entry changed since it was last written (leadership, error, URL) or a keep-alive is due."""
        leading, epoch = self._is_leader()
        with self._guard:
            self._entry = self._entry.model_copy(update={"leading": leading, "epoch": epoch})
            current = _news(self._entry)
        return current != self._reported or self._clock.monotonic() - self._reported_at >= KEEPALIVE_SECONDS

    def report(self) -> bool:
        """Write this replica's entry (dropping stale ones); False on a write conflict or malformed item."""
        leading, epoch = self._is_leader()
        now = self._clock.time()
        with self._guard:
            self._entry = self._entry.model_copy(update={"reported_at": now, "leading": leading, "epoch": epoch})
            mine = self._entry
        sent = self._clock.monotonic()
        try:
            entries, version = read_replicas(self._store, consistent=self._consistent)
        except MalformedReplicas as exc:
            log.warning("replacing the replica list: %s", exc)
            self._store.delete_state(REPLICAS_KEY)
            entries, version = [], None
        others = [entry for entry in entries
                  if entry.replica_id != mine.replica_id and now - entry.reported_at <= FORGET_SECONDS]
        others.sort(key=lambda entry: entry.reported_at, reverse=True)
        kept = sorted([mine, *others[:MAX_REPLICAS - 1]], key=lambda entry: entry.replica_id)
        written = self._store.put_state(
            REPLICAS_KEY, {VERSION_ATTRIBUTE: (version or 0) + 1, ENTRIES_ATTRIBUTE: _ENTRIES.dump_json(kept).decode()},
            condition={VERSION_ATTRIBUTE: version})
        self._consistent = not written
        if written:
            self._reported = _news(mine)
            self._reported_at = sent
        return written

    def step(self) -> None:
        """Report if `due()` (the replica's supervised loop runs this every CHECK_SECONDS; store trouble is logged)."""
        try:
            if self.due() and not self.report():
                log.info("replica list changed under us; reporting again in %.0f s", CHECK_SECONDS)
        except ShardherdError as exc:
            log.warning("could not report this replica: %s", exc)


def _news(entry: ReplicaEntry) -> ReplicaEntry:
    """The parts of an entry whose change makes a report due (not its report time, nor an error's time alone)."""
    return entry.model_copy(update={"reported_at": 0.0, "last_error_at": None})
