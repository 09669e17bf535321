"""The driver's book of held shards (Spark-free, thread-safe): what the runner may plan, and when handoffs finish.

The keeper thread (acquire, handoff, loss), the probing threads and the foreachBatch thread all change it; every
change is published to the channel as a new numbered snapshot.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.channel import Segment, ShardState, ShardView, Snapshot, write_snapshot
from shardherd.agent.spark.offsets import ShardPlan
from shardherd.agent.spark.probe import ProbeResult
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.streams import stream_prefix


def source_key(lease: Lease) -> str:
    """The key the source plans a lease's shard under: its shard id, or its lease key if it names a stream."""
    return lease.shard if stream_prefix(lease.lease_key) is None else lease.lease_key


class ShardBook:
    """Held shards by source key, with their lease keys and the snapshot version that started each handoff.

    The source key is the shard id, or in a multi-stream application the lease key (shard ids repeat across streams;
    `shardherd.shared.streams.read_target` turns it back into stream and shard).
    """

    def __init__(self, worker_id: str, channel: Path, initial_timestamp: datetime | None = None,
                 merge_below: int = 0) -> None:
        self._worker = worker_id
        self._merge_below = merge_below
        self._channel = channel
        self._timestamp = initial_timestamp.timestamp() if initial_timestamp is not None else None
        self._views: dict[str, ShardView] = {}
        self._keys: dict[str, str] = {}
        self._parts: dict[str, tuple[Segment, ...]] = {}  # each shard's probed segments before merging
        self._writing: dict[str, int] = {}  # shard -> sink writes in flight that will checkpoint it
        self._incoming: frozenset[str] = frozenset()  # lease keys handed to us, their previous owner still finishing
        self._version = 0
        self._guard = threading.Lock()
        self.publish()

    # ------------------------------------------------------------------ lease events
    def acquired(self, lease: Lease) -> None:
        """Start planning a newly held shard from its lease checkpoint (no records assumed until probed)."""
        with self._guard:
            source = source_key(lease)
            self._keys[source] = lease.lease_key
            self._incoming -= {lease.lease_key}
            self._parts[source] = ()
            self._views[source] = ShardView(lease.checkpoint, timestamp=self._timestamp,
                                            tenure=uuid.uuid4().hex[:12])
            self._publish()

    def expect(self, lease_keys: frozenset[str]) -> None:
        """Publish the leases handed to this driver that wait for their previous owner (the runner may wait)."""
        with self._guard:
            if lease_keys != self._incoming:
                self._incoming = lease_keys
                self._publish()

    def handing_off(self, lease_key: str) -> bool:
        """Stop planning and writing a shard under handoff; True if a sink write in flight still has to checkpoint it.

        False (nothing to wait for: finish the handoff now) also when the shard is not in the book.
        """
        with self._guard:
            shard = self._shard_of(lease_key)
            if shard is None:
                return False
            self._views[shard] = replace(self._views[shard], state=ShardState.HANDING_OFF, segments=())
            self._parts[shard] = ()
            self._publish()
            return self._writing.get(shard, 0) > 0

    def lost(self, lease_key: str) -> str | None:
        """Forget a shard no longer held; returns its shard id if it was in the book."""
        with self._guard:
            shard = self._shard_of(lease_key)
            if shard is None:
                return None
            del self._views[shard], self._keys[shard], self._parts[shard]
            self._publish()
            return shard

    # ------------------------------------------------------------------ probing and progress
    def to_probe(self, lookahead: int) -> list[tuple[str, StartPosition]]:
        """Owned shards with fewer than `lookahead` probed records waiting, with the frontier to probe from."""
        with self._guard:
            return [(shard, view.frontier) for shard, view in sorted(self._views.items())
                    if view.state is ShardState.OWNED and sum(item.records for item in view.segments) < lookahead]

    def probed(self, shard: str, frontier: StartPosition, result: ProbeResult) -> bool:
        """Apply a probe made from `frontier` (ignored if the shard moved on); True if the shard ended, all read."""
        with self._guard:
            view = self._views.get(shard)
            if view is None or view.frontier != frontier:
                return False
            behind = result.behind_millis if result.behind_millis is not None else view.behind_millis
            if result.segment is not None:
                self._parts[shard] = (*self._parts[shard], result.segment)
            segments = self._appended(view.segments, result.segment)
            if segments != view.segments or behind != view.behind_millis:
                self._views[shard] = replace(view, segments=segments, behind_millis=behind)
                self._publish()
            return result.ended and not segments

    def checkpointed(self, shard: str, tenure: str, checkpoint: Checkpoint) -> tuple[Segment, ...]:
        """A batch's checkpoint was stored: resume after it; returns the probed segments it covered.

        The covered segments carry their arrival times (empty if the checkpoint was not this hold's).
        A plan ends at a probed segment's end, but the probe may since have merged newer records into that segment;
        the waiting segments are rebuilt from the unmerged ones after the checkpoint, so nothing counts twice.
        """
        with self._guard:
            view = self._views.get(shard)
            if view is None or view.tenure != tenure:
                return ()
            covered = tuple(item for item in self._parts[shard] if item.end <= checkpoint)
            self._parts[shard], self._views[shard] = self._after(shard, view, checkpoint)
            self._publish()
            return covered

    def progress_after(self, shard: str, tenure: str, checkpoint: Checkpoint, now: float) -> tuple[int | None,
                                                                                                   int | None]:
        """Lag (ms) and records behind as they will be once `checkpoint` is stored, changing nothing.

        What the checkpoint itself carries onto the lease, so the stored figures are its own batch's, not the
        previous one's. (None, None) if the shard is no longer held under `tenure`.
        """
        with self._guard:
            view = self._views.get(shard)
            if view is None or view.tenure != tenure:
                return None, None
            _, after = self._after(shard, view, checkpoint)
            return _lag(after, now), _behind(after)

    def lag_millis(self, shard: str, now: float) -> int | None:
        """How far behind the stream the shard is: age of the first waiting record, else the probe's lag."""
        with self._guard:
            view = self._views.get(shard)
            return None if view is None else _lag(view, now)

    def records_behind(self, shard: str) -> int | None:
        """Records waiting after the checkpoint, where known: the probe reached the stream's tip (else None)."""
        with self._guard:
            view = self._views.get(shard)
            return None if view is None else _behind(view)

    # ------------------------------------------------------------------ queries
    def lease_key(self, shard: str) -> str | None:
        """The lease key of a held shard."""
        with self._guard:
            return self._keys.get(shard)

    def holds(self, shard: str, tenure: str) -> bool:
        """True if the shard is still held under `tenure` (the same hold a plan was made under)."""
        with self._guard:
            view = self._views.get(shard)
            return view is not None and view.tenure == tenure

    def is_handing_off(self, shard: str) -> bool:
        """True if the shard is held and its handoff was requested."""
        with self._guard:
            view = self._views.get(shard)
            return view is not None and view.state is ShardState.HANDING_OFF

    def last_write_of_handoff(self, shard: str) -> bool:
        """True if the shard is handing off and waits for one write only: that write's checkpoint may hand it over.

        No other write can join it (`begin_write` leaves shards handing off out).
        """
        with self._guard:
            view = self._views.get(shard)
            return (view is not None and view.state is ShardState.HANDING_OFF
                    and self._writing.get(shard, 0) == 1)

    def held_shards(self) -> set[str]:
        """Shards whose records this driver may still write (owned or finishing a handoff)."""
        with self._guard:
            return set(self._views)

    def begin_write(self, plans: Iterable[ShardPlan]) -> list[ShardPlan]:
        """The plans a sink write may include (shard owned, not handing off, same tenure), marked as in flight.

        A handoff requested from now on waits for `end_write` of these; one requested before is not written at all,
        so it completes without waiting for a batch (its rows stay for the next owner).
        """
        with self._guard:
            allowed = []
            for plan in plans:
                view = self._views.get(plan.shard_id)
                if view is not None and view.tenure == plan.tenure and view.state is ShardState.OWNED:
                    allowed.append(plan)
                    self._writing[plan.shard_id] = self._writing.get(plan.shard_id, 0) + 1
            return allowed

    def end_write(self, plans: Iterable[ShardPlan]) -> list[str]:
        """A sink write (and its checkpoints) ended: lease keys whose handoff no longer waits for anything."""
        with self._guard:
            ready = []
            for plan in plans:
                left = self._writing.get(plan.shard_id, 0) - 1
                if left > 0:
                    self._writing[plan.shard_id] = left
                    continue
                self._writing.pop(plan.shard_id, None)
                view = self._views.get(plan.shard_id)
                if view is not None and view.state is ShardState.HANDING_OFF:
                    ready.append(self._keys[plan.shard_id])
            return ready

    def snapshot(self) -> Snapshot:
        """The current snapshot."""
        with self._guard:
            return self._current()

    def publish(self) -> None:
        """Write the current state as a new snapshot version."""
        with self._guard:
            self._publish()

    def _publish(self) -> None:
        self._version += 1
        write_snapshot(self._channel, self._current())

    def _current(self) -> Snapshot:
        """The book as a snapshot of its current version (caller holds the guard)."""
        return Snapshot(self._version, self._worker, dict(self._views), self._incoming)

    def _after(self, shard: str, view: ShardView, checkpoint: Checkpoint) -> tuple[tuple[Segment, ...], ShardView]:
        """The shard's probed parts and view once `checkpoint` is stored (caller holds the guard)."""
        parts = tuple(item for item in self._parts[shard] if item.end > checkpoint)
        left: tuple[Segment, ...] = ()
        for part in parts:
            left = self._appended(left, part)
        return parts, replace(view, checkpoint=checkpoint, segments=left)

    def _appended(self, segments: tuple[Segment, ...], new: Segment | None) -> tuple[Segment, ...]:
        """Segments with a new one at the end, merged into the last while both together stay under `merge_below`.

        Merging keeps the snapshot small when a slow stream yields a segment of a few records per probe.
        """
        if new is None:
            return segments
        if segments and segments[-1].records + new.records < self._merge_below:
            last = segments[-1]
            return (*segments[:-1], Segment(new.end, last.records + new.records, last.bytes + new.bytes,
                                            last.first_arrival))
        return (*segments, new)

    def _shard_of(self, lease_key: str) -> str | None:
        for shard, key in self._keys.items():
            if key == lease_key:
                return shard
        return None


def _lag(view: ShardView, now: float) -> int | None:
    first = view.next_arrival
    if first is not None:
        return max(0, round((now - first) * 1000))
    return view.behind_millis


def _behind(view: ShardView) -> int | None:
    return None if view.behind_millis != 0 else sum(item.records for item in view.segments)


def arrival_spans(covered: tuple[Segment, ...], total: int) -> list[tuple[int, float, float]] | None:
    """(bytes, first arrival, last arrival) of each segment a committed batch covered, for the throughput recorder.

    None if an arrival time is unknown or the segments do not add up to the batch's bytes.
    A segment's records arrived from its first arrival until the next segment's (the last one: at its first). Booked
    at commit time instead, over the time since the previous commit, a shard's figure followed the batches'
    irregular spacing: sd/mean 0.5-0.7 in steady state against 0.04-0.08 for plain agents (bench/churn.py --noise).
    """
    arrivals = [part.first_arrival for part in covered if part.first_arrival is not None]
    if not covered or len(arrivals) < len(covered) or sum(part.bytes for part in covered) != total:
        return None
    return [(part.bytes, first, max(first, last))
            for part, first, last in zip(covered, arrivals, [*arrivals[1:], arrivals[-1]], strict=True)]
