"""When a held lease's lack of progress turns health red and when it is given back: bounds both sides share.

The agent's stall watch applies them (agent/stall_watch.py, invariants 2 and 3); the leader sizes its memory of
shard-wide stalls by them (coordinator/shard_stall.py). Pure: derived from the settings only.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardherd.shared.config import Settings

RED_INTERVALS = 3  # heartbeat intervals without progress before a held lease turns health red
# Failover times more before a lease whose reader still runs is given back. One was too few: on a host at load 40 a
# first GetRecords from TRIM_HORIZON took longer, and the receiver gave every lease it got back (the CI cell churned).
GIVE_UP_FAILOVERS = 3
# Failover times more before a lease whose reads only failed since its last progress is given back
# (agent/stall_watch.py, invariant 3). One was too few: in a shared outage at load 35-45 the leader's verdict reached
# the agents 7.9 s after the last progress, against a bound of 6.5 s (tests/chaos/test_fleet_stall.py gave one lease
# back per agent).
FAIL_FAILOVERS = 2


@dataclass(frozen=True, slots=True)
class StallBounds:
    """Seconds without progress before a held lease is stalled, and before it is given back.

    The rule is agent/stall_watch.py's invariant 3.

    `give_up_after` while its reader is slow, `fail_give_up_after` while its reads only failed.
    """

    red_after: float
    give_up_after: float
    fail_give_up_after: float

    @classmethod
    def from_settings(cls, settings: Settings) -> StallBounds:
        """3 heartbeat intervals to red; 3 failover times more to give back a slow reader, 2 a failing one."""
        red = RED_INTERVALS * settings.effective_heartbeat_interval_millis / 1000
        failover = settings.failover_time_millis / 1000
        return cls(red, red + GIVE_UP_FAILOVERS * failover, red + FAIL_FAILOVERS * failover)
