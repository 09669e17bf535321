"""Rewind (or fast-forward) shards online: pause them, wait until nobody processes them, rewrite, resume.

Invariants (decision 0031):
* Nothing is written before the whole request is checked and every shard's new position is resolved: bad input or
  a shard that cannot be read is one error and no write.
* One rewind at a time: the coordinator-state item `rewind-running` is created only where absent and deleted at the
  end; one left by a run that died is taken over after RUN_LIMIT_SECONDS.
* A checkpoint is rewritten only while its lease is paused and nobody processes it (its owner acknowledged the pause,
  or it has none), conditioned on the row as read (LeaseStore.rewrite_checkpoint): an owner change or a checkpoint
  in between makes the write fail and the row is read again. An owner's in-flight batch was delivered and
  checkpointed before it acknowledged, so no batch planned before the rewind is checkpointed after it.
* Leases the rewind paused are resumed at the end whatever happened; leases an operator had paused stay paused.
* Each rewind leaves one record (who, when, every shard's checkpoint before and after) in `rewind-history`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shardherd.coordinator.rewind_positions import (
    HELD_BACK_NOTE,
    RewindRecord,
    RewindRow,
    descendants,
    held_back,
    parse_sequences,
    parse_time,
    position_at,
)
from shardherd.coordinator.rewind_probe import ProbeFailed, probe, retention_hours
from shardherd.coordinator.stream_sync import stream_of
from shardherd.shared.checkpoint import SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.errors import ShardherdError
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.pause import BadControlRequest, select_leases
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards
from shardherd.shared.store import LeaseStore, Outcome
from shardherd.shared.streams import StreamIdentifier, stream_name_of

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

log = logging.getLogger(__name__)

RUNNING_KEY = "rewind-running"
HISTORY_KEY = "rewind-history"
HISTORY = 20  # records kept
RUN_LIMIT_SECONDS = 300.0
STOP_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.1
REWRITE_ATTEMPTS = 5
PROBE_THREADS = 8  # shards probed at once
REWIND_REASON = "rewind "  # + the rewind id: the pause reason of the leases a rewind paused


Placer = Callable[[Lease], tuple[Checkpoint, str]]  # a lease's new checkpoint and how it was chosen


class RewindFailed(ShardherdError):
    """A rewind could not complete (an owner did not stop, the store refused); its record says what was written."""


@dataclass(frozen=True, slots=True)
class RewindRequest:
    """What an operator asked: a time or per-shard sequences, which shards or streams (none: all), a dry run."""

    who: str
    to: str | None = None
    sequences: Sequence[str] = ()
    shards: Sequence[str] = ()
    streams: Sequence[str] = ()
    dry_run: bool = False


class Rewinder:
    """Runs rewinds against one application's store and streams; `news(worker)` makes the leader look at once."""

    def __init__(self, store: LeaseStore, kinesis: KinesisClient, settings: Settings, clock: Clock,
                 news: Callable[[str], None]) -> None:
        self._store = store
        self._kinesis = kinesis
        self._settings = settings
        self._clock = clock
        self._news = news

    def run(self, request: RewindRequest) -> RewindRecord:
        """Plan the rewind, and unless it is a dry run carry it out; the record of what was (or would be) done."""
        now = self._clock.time()
        leases = self._store.scan_leases().leases
        chosen = select_leases(leases, request.shards, request.streams) if (request.shards or request.streams) \
            else sorted(leases, key=lambda lease: lease.lease_key)
        if not chosen:
            raise BadControlRequest("the application has no leases to rewind")
        chosen, place = self._placer(request, chosen, now)
        keys = {lease.lease_key for lease in chosen}
        below = descendants(leases, keys) - keys  # paused too: they may be held back
        chosen += [lease for lease in leases if lease.lease_key in below]
        if request.to is not None and not (request.shards or request.streams):
            chosen += self._cleaned_up(leases)
        record = RewindRecord(uuid.uuid4().hex[:12], request.who, now, request.to or "sequences", request.dry_run)
        if request.dry_run:
            _, rows, planned_at = self._plan(place, chosen)
            return replace(record, rows=rows, planned_at=planned_at)
        self._take_lock(record, now)
        try:
            return self._carry_out(record, chosen, place)
        finally:
            self._store.delete_state(RUNNING_KEY, {"id": record.rewind_id})

    # ------------------------------------------------------------------ planning (reads only)
    def _placer(self, request: RewindRequest, chosen: list[Lease], now: float) -> tuple[list[Lease], Placer]:
        """The leases to rewind and how to find each one's new checkpoint; BadControlRequest for bad input."""
        if (request.to is None) == (not request.sequences):
            raise BadControlRequest("give either --to TIME or --to-sequence SHARD=SEQUENCE")
        if request.sequences:
            sequences = parse_sequences(list(request.sequences))
            named = select_leases(chosen, list(sequences))
            return named, lambda lease: (sequences.get(lease.shard, sequences.get(lease.lease_key, lease.checkpoint)),
                                         "sequence given")
        assert request.to is not None
        when = parse_time(request.to, now)
        at = datetime.fromtimestamp(now, UTC)
        streams = {lease.lease_key: self._settings.stream_name or stream_name_of(lease) for lease in chosen}
        if None in streams.values():
            raise BadControlRequest("a lease names no stream of this application")
        retention: dict[str, int] = {}

        def place(lease: Lease) -> tuple[Checkpoint, str]:
            stream = streams.get(lease.lease_key) or self._settings.stream_name or stream_name_of(lease)  # cleaned up
            assert stream is not None
            if stream not in retention:
                retention[stream] = retention_hours(self._kinesis, stream)
            return position_at(probe(self._kinesis, stream, lease.shard, when, at, retention[stream], self._clock))

        return chosen, place

    def _cleaned_up(self, leases: list[Lease]) -> list[Lease]:
        """Closed shards still in the application's streams whose finished lease shard sync deleted.

        They come back as unowned leases at SHARD_END (only in memory until the rewrite creates them), so a time
        before a split or merge restarts the parent. A multi-stream application's streams are those its leases name
        (a stream with no lease left at all is not looked at).
        """
        single = self._settings.stream_name
        named = {stream for stream in map(stream_of, leases) if stream is not None}
        streams: list[tuple[StreamIdentifier | None, str]] = [(None, single)] if single is not None else \
            [(stream, stream.name) for stream in sorted(named)]
        known = {lease.lease_key for lease in leases}
        found: list[Lease] = []
        for stream, name in streams:
            try:
                shards = list_shards(self._kinesis, name, RetryPolicy())
            except ShardherdError as exc:
                raise ProbeFailed(f"listing the shards of {name} failed: {exc}") from None
            for shard in shards:
                if shard.ending_sequence_number is None:
                    continue
                lease = new_lease(shard.shard_id, SHARD_END, frozenset(shard.parent_ids),
                                  (shard.starting_hash_key, shard.ending_hash_key))
                if stream is not None:
                    lease = lease.with_changes(lease_key=stream.lease_key(shard.shard_id),
                                               stream_name=stream.serialized, shard_id=shard.shard_id)
                if lease.lease_key not in known:
                    found.append(lease)
        return found

    def _plan(self, place: Placer, chosen: list[Lease]) -> tuple[dict[str, Checkpoint], tuple[RewindRow, ...], float]:
        """Every chosen shard's new checkpoint and row (Kinesis reads, in parallel), and when that was known."""

        def row(lease: Lease) -> tuple[Checkpoint, RewindRow]:
            target, note = place(lease)
            return target, RewindRow(lease.lease_key, lease.shard, lease.actual_owner, str(lease.checkpoint),
                                     str(target), note)

        with ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="rewind-probe") as pool:
            found = list(pool.map(row, chosen))
        targets = {row.lease_key: target for target, row in found}
        held = held_back(chosen, targets)
        rows = tuple(replace(row, after=str(TRIM_HORIZON), note=f"{row.note}; {HELD_BACK_NOTE}")
                     if row.lease_key in held else row for _, row in found)
        return targets, rows, self._clock.time()

    def _take_lock(self, record: RewindRecord, now: float) -> None:
        running = self._store.get_state(RUNNING_KEY)
        condition: dict[str, str | int | bytes | None] = {"key": None}
        if running is not None:
            started = float(str(running.get("started", "0")))
            if now - started < RUN_LIMIT_SECONDS:
                raise BadControlRequest(f"rewind {running.get('id')!s:.12} by {running.get('who')!s} is running since "
                                        f"{datetime.fromtimestamp(started, UTC).isoformat()}")
            condition = {"id": running.get("id")}
        attributes = {"id": record.rewind_id, "who": record.who, "started": str(now)}
        # A put whose reply was lost is retried and fails on itself: the item then holds this run's id.
        if not self._store.put_state(RUNNING_KEY, attributes, condition) and (
                self._store.get_state(RUNNING_KEY) or {}).get("id") != record.rewind_id:
            raise BadControlRequest("another rewind started just now")

    # ------------------------------------------------------------------ carrying out
    def _carry_out(self, record: RewindRecord, chosen: list[Lease], place: Placer) -> RewindRecord:
        """Pause, resolve positions while the owners stop, rewrite once all stopped, resume; keep the record."""
        reason = REWIND_REASON + record.rewind_id
        absent = self._absent(chosen)
        ours = [lease.lease_key for lease in chosen if not lease.is_paused and lease.lease_key not in absent]
        keys = [lease.lease_key for lease in chosen if lease.lease_key not in absent]
        written: dict[str, RewindRow] = {}
        with ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="rewind") as pool, \
                ThreadPoolExecutor(1, thread_name_prefix="rewind-plan") as planner:
            try:
                self._tell(list(pool.map(lambda key: self._store.set_pause(key, reason).lease, ours)))
                planned = planner.submit(self._plan, place, chosen)  # the Kinesis reads while the owners stop
                stopped = self._wait_stopped(keys, pool)
                targets, rows, planned_at = planned.result()
                record = replace(record, rows=rows, planned_at=planned_at, stopped_at=self._clock.time())
                written = {row.lease_key: row for row in pool.map(
                    lambda row: self._write_row(row, absent, stopped, targets), record.rows) if row is not None}
            finally:
                self._tell(list(pool.map(lambda key: self._resume(key), ours)))
                rows = tuple(written.get(row.lease_key, replace(row, note=f"{row.note}; not written"))
                             for row in record.rows if row.lease_key not in absent or row.lease_key in written)
                record = replace(record, rows=rows, finished_at=self._clock.time(),
                                 outcome="done" if set(keys) <= written.keys() else "failed")
                self._remember(record)
        return record

    def _absent(self, chosen: list[Lease]) -> dict[str, Lease]:
        """The chosen leases with no row in the table: `_cleaned_up`'s placeholders (counter 0, no owner)."""
        return {lease.lease_key: lease for lease in chosen if lease.lease_counter == 0 and lease.lease_owner is None
                and self._store.get_lease(lease.lease_key) is None}

    def _write_row(self, row: RewindRow, absent: Mapping[str, Lease], stopped: Mapping[str, Lease],
                   targets: Mapping[str, Checkpoint]) -> RewindRow | None:
        """Carry out one planned row once every owner stopped: rewrite, re-create or delete its lease."""
        if row.note.endswith(HELD_BACK_NOTE):  # shard sync creates it again after its parents
            return None if row.lease_key in absent else self._delete_held(stopped[row.lease_key], row)
        if row.lease_key in absent:
            return self._recreate(absent[row.lease_key], targets[row.lease_key], row)
        before, after = self._rewrite(stopped[row.lease_key], targets[row.lease_key])
        return replace(row, before=str(before.checkpoint), owner=after.actual_owner)

    def _recreate(self, lease: Lease, target: Checkpoint, row: RewindRow) -> RewindRow | None:
        """Create a cleaned-up shard's lease again at `target`, unless the shard ended before the time anyway."""
        if target.is_shard_end:
            return None  # nothing of it after the time: it stays cleaned up
        outcome = self._store.create_lease(lease.with_changes(checkpoint=target))
        if not outcome.applied:
            raise RewindFailed(f"{lease.lease_key}: its lease could not be created again ({outcome.conflict.value})")
        return replace(row, before="(cleaned up)", note=f"{row.note}; lease created again")

    def _delete_held(self, lease: Lease, row: RewindRow) -> RewindRow:
        """Delete a stopped lease held back behind a reopened ancestor (conditioned on its checkpoint as stopped)."""
        self._on_stopped(lease, lambda row: self._store.delete_lease(row.lease_key, expected_checkpoint=row.checkpoint),
                         "it was not held back behind its parents")
        return row

    def _tell(self, rows: list[Lease | None]) -> None:
        """Make the leader look at once: it publishes the pause marks to the owners over the channel."""
        for owner in sorted({row.actual_owner for row in rows if row is not None and row.actual_owner}):
            self._news(owner)

    def _resume(self, key: str) -> Lease | None:
        try:
            return self._store.set_pause(key, None).lease
        except ShardherdError as exc:  # the record says so; an operator resumes it by hand
            log.error("resuming %s after the rewind failed (shardherd resume %s): %s", key, key, exc)
            return None

    def _wait_stopped(self, keys: list[str], pool: ThreadPoolExecutor | None = None) -> dict[str, Lease]:
        """Each lease's row once nobody processes it (acknowledged, or no owner); RewindFailed after the timeout.

        The rows are read in `pool` when given (never from one of its own threads: that could wait for itself).
        """
        read = pool.map if pool is not None else map
        deadline = self._clock.monotonic() + STOP_TIMEOUT_SECONDS
        stopped: dict[str, Lease] = {}
        while True:
            waiting = [key for key in keys if key not in stopped]
            for key, lease in zip(waiting, read(self._store.get_lease, waiting), strict=True):
                if lease is not None and (lease.actual_owner is None or lease.pause_acknowledged):
                    stopped[key] = lease
            waiting = [key for key in keys if key not in stopped]
            if not waiting:
                return stopped
            if self._clock.monotonic() >= deadline:
                raise RewindFailed(f"{len(waiting)} shard(s) still processed after {STOP_TIMEOUT_SECONDS:.0f} s "
                                   f"(e.g. {waiting[0]}): nothing was rewritten")
            self._clock.sleep(POLL_SECONDS)

    def _rewrite(self, lease: Lease, target: Checkpoint) -> tuple[Lease, Lease]:
        """Rewrite one stopped lease: (the row rewritten, the row after)."""
        rewritten, outcome = self._on_stopped(
            lease, lambda row: self._store.rewrite_checkpoint(row.lease_key, row, target),
            "the shards before it were rewritten, it and the rest were not")
        assert outcome.lease is not None
        return rewritten, outcome.lease

    def _on_stopped(self, lease: Lease, write: Callable[[Lease], Outcome], failed: str) -> tuple[Lease, Outcome]:
        """`write` conditioned on the stopped row: (the row written, the outcome).

        A row that moved (e.g. a new owner after a failover) is waited for again, REWRITE_ATTEMPTS times.
        """
        for _ in range(REWRITE_ATTEMPTS):
            outcome = write(lease)
            if outcome.applied:
                return lease, outcome
            lease = self._wait_stopped([lease.lease_key])[lease.lease_key]
        raise RewindFailed(f"{lease.lease_key} kept changing while paused: {failed}")

    def _remember(self, record: RewindRecord) -> None:
        try:
            self._store.put_state(HISTORY_KEY, {"records": json.dumps(
                [json.loads(record.to_json()), *[json.loads(text) for text in history_json(self._store)]][:HISTORY])})
        except ShardherdError as exc:
            log.error("keeping the record of rewind %s failed: %s (record: %s)", record.rewind_id, exc,
                      record.to_json())


def history_json(store: LeaseStore) -> list[str]:
    """The kept rewind records, newest first, each as a JSON object."""
    item = store.get_state(HISTORY_KEY)
    if item is None:
        return []
    return [json.dumps(entry) for entry in json.loads(str(item.get("records", "[]")))]


def history(store: LeaseStore) -> list[RewindRecord]:
    """The kept rewind records, newest first."""
    return [RewindRecord.from_json(text) for text in history_json(store)]
