"""Per-lease progress the agent reports with its heartbeat: lag behind the stream tip, records and bytes handled.

It also carries failed processing attempts, a batch the shard is stuck on (`failing`), the poison record a shard is
blocked on (`poisoned`: its sequence and sub-sequence, found by bisecting the batch) and the records quarantined per
shard (`quarantined`, with the newest one's position and object; docs/decisions/0031-operator-controls.md; all
reported in the worker row as a bounded `PoisonReport` per lease, never a list), and the leases this worker gave back
because it could not process them (reported as `refused` for `REFUSAL_SECONDS`, so the leader gives them to another
worker while one exists), and the read calls Kinesis throttled on each lease within the last THROTTLE_WINDOW_SECONDS
(`throttled`, from the readers' running totals: counted from when the board first saw the lease's total), and the
leases whose reader makes no progress now (`stalled`, from agent/stall_watch.py: the leader tells a fleet-wide stall
from a local one by them, decision 0039).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.worker import (
    MAX_FAILING_ERROR_CHARS,
    THROTTLE_WINDOW_SECONDS,
    FailingBatch,
    LeaseProgress,
    PoisonReport,
)

# How long a given-back lease stays reported as refused by this worker.
REFUSAL_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class PoisonRecord:
    """The record a shard is blocked on after bisecting its batch: the batch's failures go on being counted."""

    sequence_number: str
    sub_sequence_number: int

    def __str__(self) -> str:
        return f"{self.sequence_number}/{self.sub_sequence_number}"


class RecentCounts:
    """Per key, how much a running total grew within the last `window` seconds (totals sampled by `recent`).

    A key keeps at most one sample per `window / SAMPLES` seconds however often it is sampled (a checkpoint asks for
    its lease's progress after each batch), so its history stays bounded.
    """

    SAMPLES = 60

    def __init__(self, clock: Clock, window: float) -> None:
        self._clock = clock
        self._window = window
        self._marks: dict[str, deque[tuple[float, int]]] = {}  # key -> (when, total), oldest first

    def recent(self, totals: Mapping[str, int]) -> dict[str, int]:
        """Each key's growth since the newest sample at least `window` old (else since its first sample)."""
        now = self._clock.monotonic()
        grown = {}
        for key, total in totals.items():
            marks = self._marks.setdefault(key, deque())
            if not marks or now - marks[-1][0] >= self._window / self.SAMPLES:
                marks.append((now, total))
            while len(marks) > 1 and marks[1][0] <= now - self._window:
                marks.popleft()
            grown[key] = total - marks[0][1]
        return grown


class ProgressBoard:
    """Thread-safe totals per lease since this worker started holding it; shard threads write, the keeper reads."""

    def __init__(self, clock: Clock | None = None, refusal_seconds: float = REFUSAL_SECONDS,
                 throttle_totals: Callable[[], Mapping[str, int]] | None = None,
                 stalled: Callable[[], Collection[str]] | None = None) -> None:
        self._clock = clock or SystemClock()
        self._refusal = refusal_seconds
        self._throttle_totals = throttle_totals  # per lease: read calls throttled since the agent started
        self._stalled = stalled or frozenset  # the leases whose reader makes no progress now (agent/stall_watch.py)
        self._throttles = RecentCounts(self._clock, THROTTLE_WINDOW_SECONDS)
        self._progress: dict[str, LeaseProgress] = {}
        self._refused: dict[str, tuple[LeaseProgress, float]] = {}  # key -> (last progress, until when)
        self._failing: dict[str, FailingBatch] = {}  # shards whose current batch failed, until it is delivered
        self._poisoned: dict[str, PoisonRecord] = {}  # shards blocked on one record, until it goes through
        self._quarantined: dict[str, int] = {}  # records quarantined per lease since the agent started
        self._last_quarantined: dict[str, tuple[str, str]] = {}  # per lease: the newest one (SEQ/SUB, object URL)
        self._guard = threading.Lock()

    def record(self, lease_key: str, records: int, byte_count: int, millis_behind_latest: int | None,
               records_behind: int | None = None) -> None:
        """Add one delivered batch (an empty batch still updates the lag).

        `records_behind` replaces the last count (None: not known now, so no stale count is reported).
        """
        with self._guard:
            self._refused.pop(lease_key, None)  # it is being processed again after all
            self._progress[lease_key] = self._with(lease_key, records, byte_count, millis_behind_latest, records_behind)

    def preview(self, lease_key: str, records: int, byte_count: int, millis_behind_latest: int | None,
                records_behind: int | None = None) -> LeaseProgress:
        """The lease's progress as `record` with these figures would leave it, recording nothing.

        For a checkpoint that must carry its own batch's figures while the batch counts only once the checkpoint
        is stored (the Spark driver: a failed checkpoint means the batch is read and counted again).
        """
        with self._guard:
            return self._with(lease_key, records, byte_count, millis_behind_latest, records_behind)

    def _with(self, lease_key: str, records: int, byte_count: int, millis_behind_latest: int | None,
              records_behind: int | None) -> LeaseProgress:
        before = self._progress.get(lease_key, LeaseProgress())
        lag = millis_behind_latest if millis_behind_latest is not None else before.millis_behind_latest
        return replace(before, millis_behind_latest=lag, records=before.records + records,
                       bytes=before.bytes + byte_count, records_behind=records_behind)

    def fail(self, lease_key: str) -> int:
        """Count one failed attempt to process the lease; returns the attempts failed since it was taken."""
        with self._guard:
            before = self._progress.get(lease_key, LeaseProgress())
            self._progress[lease_key] = replace(before, failures=before.failures + 1)
            return before.failures + 1

    def batch_failed(self, lease_key: str, error: str) -> FailingBatch:
        """One more failed delivery of the lease's current batch; the shard stays stuck on it until it succeeds."""
        with self._guard:
            before = self._failing.get(lease_key)
            since = before.since if before is not None else self._clock.time()
            failing = FailingBatch(since, (before.attempts if before is not None else 0) + 1,
                                   error[:MAX_FAILING_ERROR_CHARS])
            self._failing[lease_key] = failing
            return failing

    def batch_delivered(self, lease_key: str) -> None:
        """The lease's current batch went through: it is no longer stuck."""
        with self._guard:
            self._failing.pop(lease_key, None)

    def poison(self, lease_key: str, record: PoisonRecord | None) -> None:
        """The shard is blocked on `record` (None: no longer)."""
        with self._guard:
            if record is None:
                self._poisoned.pop(lease_key, None)
            else:
                self._poisoned[lease_key] = record

    def poisoned(self) -> dict[str, PoisonRecord]:
        """The shards blocked on a poison record now, by lease key."""
        with self._guard:
            return dict(self._poisoned)

    def quarantine(self, lease_key: str, record: PoisonRecord, stored_at: str) -> None:
        """One more record of the lease written to the poison destination (object `stored_at`) and checkpointed past."""
        with self._guard:
            self._quarantined[lease_key] = self._quarantined.get(lease_key, 0) + 1
            self._last_quarantined[lease_key] = (str(record), stored_at)
            self._poisoned.pop(lease_key, None)

    def quarantined(self) -> dict[str, int]:
        """Records quarantined per lease since the agent started (kept after the lease moves: a counter)."""
        with self._guard:
            return dict(self._quarantined)

    def failing(self) -> dict[str, FailingBatch]:
        """The shards stuck on a failing batch now, by lease key."""
        with self._guard:
            return dict(self._failing)

    def refuse(self, lease_key: str) -> None:
        """The worker gives the lease back: keep reporting it as refused for a while."""
        with self._guard:
            before = self._progress.pop(lease_key, LeaseProgress())
            self._refused[lease_key] = (replace(before, refused=True), self._clock.monotonic() + self._refusal)

    def drop(self, lease_key: str) -> None:
        """Forget a lease this worker no longer holds (a refusal is kept until it expires)."""
        with self._guard:
            self._progress.pop(lease_key, None)
            self._failing.pop(lease_key, None)
            self._poisoned.pop(lease_key, None)

    def snapshot(self, lease_keys: Iterable[str]) -> dict[str, LeaseProgress]:
        """The progress of the given leases (those with any report), plus the leases refused lately."""
        now = self._clock.monotonic()
        totals = self._throttle_totals() if self._throttle_totals is not None else {}
        stalled = self._stalled()
        with self._guard:
            throttled = self._throttles.recent(totals)
            self._refused = {key: entry for key, entry in self._refused.items() if entry[1] > now}
            wanted = {key: replace(self._progress.get(key, LeaseProgress()), failing=self._failing.get(key),
                                   poison=self._poison_report(key), throttled=throttled.get(key, 0),
                                   stalled=key in stalled)
                      for key in lease_keys
                      if key in self._progress or key in self._failing or throttled.get(key) or key in stalled}
            refused = {key: progress for key, (progress, _) in self._refused.items()}
        # A lease given back stays refused in the row while it is still held (until the release lands) and has
        # figures of its own (throttled reads, a stall): else the leader may hand it straight back.
        return {**refused, **{key: replace(entry, refused=True) if key in refused else entry
                              for key, entry in wanted.items()}}

    def _poison_report(self, lease_key: str) -> PoisonReport | None:
        """The lease's poison records for the worker row (caller holds the guard); None when it has none."""
        blocked = self._poisoned.get(lease_key)
        count = self._quarantined.get(lease_key, 0)
        if blocked is None and not count:
            return None
        last, stored_at = self._last_quarantined.get(lease_key, (None, None))
        return PoisonReport(None if blocked is None else str(blocked), count, last, stored_at)
