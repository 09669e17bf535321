"""The newest dry run of the decider, shared by every caller of POST /v1/plan for a while.

Invariant: a replica makes at most one dry run (two full scans and a full decide) per `min_gap` seconds, however
many callers ask; they share the newest plan (docs/decisions/0021-api-credentials-and-load.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from shardherd.coordinator.moves import Plan
from shardherd.shared.clock import Clock


class PlanCache:
    """The newest dry run, made again only once it is `min_gap` seconds old (one at a time)."""

    def __init__(self, dry_run: Callable[[], Plan], clock: Clock, min_gap: float) -> None:
        self._dry_run = dry_run
        self._clock = clock
        self.min_gap = min_gap
        self._guard = threading.Lock()
        self._plan: Plan | None = None
        self._made = 0.0

    def get(self) -> Plan:
        """The cached plan while it is younger than `min_gap`, else a new dry run."""
        with self._guard:
            now = self._clock.monotonic()
            if self._plan is None or now - self._made >= self.min_gap:
                self._plan, self._made = self._dry_run(), now
            return self._plan
