"""Whether a Spark driver's streaming query makes progress: one query reads every held shard (issue 30).

A shard with records waiting is not probed: the next batch reads it, so its lease's progress is the query's. A query
stuck inside a batch (a write that never returns, a task that hangs, a hung checkpoint store) must neither keep those
leases nor keep the driver alive; a batch that is long but works (a slow first batch on a loaded host, a sink that
writes for a minute in many Spark tasks) must keep both.

Invariants:
1. The query progresses when its trigger is seen not running (the last trigger completed), when the sink committed a
   batch, or when Spark's active stages changed (a stage started or ended, a task completed). Nothing else counts:
   a trigger that runs and changes none of those for a while is stuck, however alive its threads look.
2. `last_progress` is the monotonic time of the latest progress; a lease whose records wait for the next batch made
   its progress then (the driver reports it to the stall watch with that time: red after 3 heartbeat intervals,
   given back after 3 failover times more, as a plain agent's hung reader). Until the query's first trigger ended
   it is now: a first trigger starts Spark's Python source runner and runs no job (7 s at a load of 15, over 9 s at
   50, with nothing to tell that from a hang), so only invariant 3 bounds it.
3. `hung()` is True once the query made no progress for `exit_after` (the stall watch's give-up bound, and at least
   the supervisor's give-up floor: a slow first batch on a loaded host is not a hang). The driver then gives its
   leases back and exits (the critical Spark supervisor fails), so the orchestrator starts a fresh driver and JVM.
   Except while a fresh verdict of the leader keeps one of its leases (agent/stall_watch.py invariant 4: the fleet's
   reads stall, or that shard's at every owner): a batch reads every shard it planned, so one such shard holds the
   whole query, and a fresh driver would wait for Kinesis all the same (a plain agent's reader keeps its leases then).
   The bound then counts from the last sample that found such a lease (`observe(..., excused=True)`); `last_progress`
   is left alone (an excuse is not progress). Session 26: a 256-shard stack whose emulator answered GetRecords past
   its 5 s deadline for tens of seconds restarted both Spark drivers three times in 10 minutes (28 owner changes).
4. Pure bookkeeping on an injected clock; the Spark supervisor samples the query with `observe` at every step.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable

from shardherd.shared.clock import Clock


class QueryWatch:
    """When the query last made progress (invariant 1), and whether it has been stuck too long (invariant 3)."""

    def __init__(self, clock: Clock, exit_after: float) -> None:
        self._clock = clock
        self.exit_after = exit_after
        self._last = clock.monotonic()
        self._excused = -math.inf  # the last sample at which a verdict of the leader kept a lease (invariant 3)
        self._stages: Hashable = None
        self._active = False
        self.started = False  # a trigger ended (or a batch was committed) since the query started
        self._guard = threading.Lock()

    def observe(self, trigger_active: bool, stages: Hashable, excused: bool = False) -> None:
        """One look at the query: whether a trigger runs, and a value that changes as Spark's stages move on.

        `excused`: a fresh verdict of the leader keeps one of the driver's leases now (invariant 3).
        """
        with self._guard:
            now = self._clock.monotonic()
            if excused:
                self._excused = now
            if not trigger_active or stages != self._stages:
                self._last = now
            self.started = self.started or (self._active and not trigger_active)
            self._stages, self._active = stages, trigger_active

    def committed(self) -> None:
        """The sink committed a batch."""
        with self._guard:
            self._last = self._clock.monotonic()
            self.started = True

    @property
    def last_progress(self) -> float:
        """Monotonic time of the query's latest progress (now, until its first trigger ended: invariant 2)."""
        with self._guard:
            return self._last if self.started else self._clock.monotonic()

    def stuck_for(self) -> float:
        """Seconds since the query's latest progress (its first trigger included) or excuse (invariant 3)."""
        with self._guard:
            return self._clock.monotonic() - max(self._last, self._excused)

    def hung(self) -> bool:
        """True once the query made no progress for `exit_after` (invariant 3)."""
        return self.stuck_for() > self.exit_after
