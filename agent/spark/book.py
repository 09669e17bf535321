"""The driver's book of held shards (Spark-free, thread-safe): what the runner may plan, and when handoffs finish.

The keeper thread (acquire, handoff, loss), the probing threads and the foreachBatch thread all change it; every
change is published to the channel as a new numbered snapshot. A shard is pending (planned by the next batch) once
a probe saw a record after its checkpoint, or when its last batch read records (a busy shard is read again without a
probe; a read that finds nothing makes it idle again, and only idle shards are probed).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.batch_ends import BatchEnd
from shardherd.agent.spark.channel import ShardState, ShardView, Snapshot, write_snapshot
from shardherd.agent.spark.offsets import ShardPlan
from shardherd.agent.spark.probe import ProbeResult
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

    def __init__(self, worker_id: str, channel: Path, initial_timestamp: datetime | None = None) -> None:
        self._worker = worker_id
        self._channel = channel
        self._timestamp = initial_timestamp.timestamp() if initial_timestamp is not None else None
        self._views: dict[str, ShardView] = {}
        self._keys: dict[str, str] = {}
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
            self._views[shard] = replace(self._views[shard], state=ShardState.HANDING_OFF, pending=False)
            self._publish()
            return self._writing.get(shard, 0) > 0

    def lost(self, lease_key: str) -> str | None:
        """Forget a shard no longer held; returns the tenure of that hold if it was in the book."""
        with self._guard:
            shard = self._shard_of(lease_key)
            if shard is None:
                return None
            tenure = self._views[shard].tenure
            del self._views[shard], self._keys[shard]
            self._publish()
            return tenure

    # ------------------------------------------------------------------ probing and progress
    def to_probe(self) -> list[tuple[str, StartPosition, str | None]]:
        """Owned shards not known to have records waiting: the position to probe at and the iterator kept there."""
        with self._guard:
            return [(shard, view.position, view.iterator) for shard, view in sorted(self._views.items())
                    if view.state is ShardState.OWNED and not view.pending]

    def probed(self, shard: str, position: StartPosition, result: ProbeResult) -> bool:
        """Apply a probe made at `position` (ignored if the shard moved on meanwhile); True if the shard ended."""
        with self._guard:
            view = self._views.get(shard)
            if view is None or view.position != position or view.pending or result.failed:
                return False
            behind = result.behind_millis if result.behind_millis is not None else view.behind_millis
            updated = replace(view, pending=result.pending, iterator=result.iterator or view.iterator,
                              behind_millis=behind, waiting_since=result.first_arrival)
            if updated != view:
                self._views[shard] = updated
                self._publish()
            return result.ended

    def checkpointed(self, shard: str, tenure: str, end: BatchEnd | None) -> None:
        """A batch of the shard was written: resume after its recorded end (None: nothing recorded, read again).

        The shard stays pending if the batch read records (a busy shard: the next batch reads it without a probe)
        or stopped before the shard's tip.
        """
        with self._guard:
            view = self._views.get(shard)
            if view is None or view.tenure != tenure:
                return
            if end is None:
                self._views[shard] = replace(view, pending=True)
            else:
                self._views[shard] = replace(
                    view, checkpoint=end.end or view.checkpoint, iterator=end.iterator,
                    pending=end.records > 0 or not end.caught_up, behind_millis=end.behind_millis,
                    waiting_since=None)
            self._publish()

    def lag_millis(self, shard: str, now: float) -> int | None:
        """How far behind the stream the shard is: age of the first waiting record, else Kinesis' last figure."""
        with self._guard:
            view = self._views.get(shard)
            return None if view is None else _lag(view, now)

    def records_behind(self, shard: str) -> int | None:
        """Records waiting after the checkpoint where known: 0 when the last probe or read was at the tip."""
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

    def _shard_of(self, lease_key: str) -> str | None:
        for shard, key in self._keys.items():
            if key == lease_key:
                return shard
        return None


def _lag(view: ShardView, now: float) -> int | None:
    if view.waiting_since is not None:
        return max(0, round((now - view.waiting_since) * 1000))
    return view.behind_millis


def _behind(view: ShardView) -> int | None:
    return 0 if view.behind_millis == 0 else None
