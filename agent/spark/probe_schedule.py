"""When the driver probes its shards: rounds on the query's trigger grid, each ending just before a batch plans.

A processing-time trigger starts micro-batches at whole multiples of its interval since the epoch (Spark's
ProcessingTimeExecutor), and a batch plans only the records the last probe round found. Rounds at a fixed period
from whenever the previous one ended fall anywhere between two triggers, so a record waits for a round (up to a
period) and then for a trigger (up to an interval). Rounds placed so that one ends just before each trigger make
the second wait nearly nothing: a record arriving after a trigger's round is planned by the next trigger.

A shard whose probes fail (throttled, refused, past their deadline) sits out rounds (`ProbeBackoff`): each failure in
a row doubles its wait from the probe period up to the plain reader's longest retry wait, jittered, so a throttled
shard's probes do not take the calls other consumers of the shard need, and shards throttled together do not probe
again together.
"""

from __future__ import annotations

import math
import random
import threading

LEAD_MARGIN_SECONDS = 0.03  # publish time and jitter beyond the rounds' measured duration
FIRST_LEAD_SECONDS = 0.1
EMA_WEIGHT = 0.2


class ProbeSchedule:
    """The probe rounds' timing: every `period` seconds, aligned to the trigger's grid once the trigger is known."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.trigger: float | None = None  # the query's processing-time interval in seconds; None: not aligned
        self._round_seconds = FIRST_LEAD_SECONDS

    @property
    def lead(self) -> float:
        """Seconds before a trigger its round starts: the rounds' usual duration and a margin, at most half a period."""
        return min(self.period / 2, 1.5 * self._round_seconds + LEAD_MARGIN_SECONDS)

    def round_took(self, seconds: float) -> None:
        """Record a round's duration (GetRecords calls and the snapshot's publication)."""
        self._round_seconds += EMA_WEIGHT * (seconds - self._round_seconds)

    def aligned_period(self) -> float:
        """Seconds between rounds on the trigger grid: the smallest multiple of the trigger not below the period.

        A batch plans only at a trigger, so a round between two triggers would find nothing sooner: at most one round
        per trigger (each costs an idle shard one GetRecords of Limit 1, against the shard's 5 calls a second shared
        with every consumer), never more frequent than `period`, and every round ends just before a trigger.
        """
        period, trigger = self.period, self.trigger
        if not trigger:
            return period
        return trigger * math.ceil(period / trigger - 1e-9)

    def delay(self, now: float) -> float:
        """Seconds from `now` (epoch seconds, after a round ended) to the next round's start.

        Without a trigger, `period`. With one, the next round starts `lead` before a grid point at least half a step
        away: not the point the round that just ended served, though the lead may have shrunk since it started (a
        round that overran its point by less than half a step still serves the next one).
        """
        if not self.trigger:
            return self.period
        step = self.aligned_period()
        end = (math.floor((now + step / 2) / step) + 1) * step
        return end - self.lead - now


class ProbeBackoff:
    """Per shard, when it may be probed again after failed probes: `base` x 2^(failures - 1), at most `cap`, jittered.

    The jitter is "equal": a wait is drawn from [half, all] of its step, so a shard's failed probes are at least half
    a step apart (full jitter, the plain reader's retry policy, can draw 0: a probe every round). A probe that
    answered clears the shard's failures. Times are monotonic seconds of the caller's clock. Thread-safe (the probe
    rounds and a just-acquired shard's first probe report from different threads).
    """

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base, self.cap = base, cap
        self._rng = rng or random.Random()
        self._failures: dict[str, int] = {}
        self._due: dict[str, float] = {}
        self._guard = threading.Lock()

    def due(self, shard: str, now: float) -> bool:
        """True if `shard` may be probed at `now` (no failure since its last answer, or its wait is over)."""
        with self._guard:
            return now >= self._due.get(shard, -math.inf)

    def failed(self, shard: str, now: float) -> float:
        """A probe of `shard` failed at `now`: it waits longer before the next; returns that wait."""
        with self._guard:
            failures = self._failures[shard] = self._failures.get(shard, 0) + 1
            wait = min(self.cap, self.base * 2.0 ** (failures - 1)) * self._rng.uniform(0.5, 1.0)
            self._due[shard] = now + wait
        return wait

    def answered(self, shard: str) -> None:
        """A probe of `shard` answered: the next round probes it."""
        with self._guard:
            self._failures.pop(shard, None)
            self._due.pop(shard, None)

    def keep_only(self, shards: set[str]) -> None:
        """Forget the shards no longer held (one held again starts without failures)."""
        with self._guard:
            for shard in set(self._failures) - shards:
                del self._failures[shard], self._due[shard]
