"""When a held lease's lack of progress is reported, turns health red and is given back: bounds both sides share.

The agent's stall watch applies them (agent/stall_watch.py, invariants 2, 3 and 5); the leader sizes its memory of
shard-wide stalls by them (coordinator/shard_stall.py). Pure: derived from the settings only.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardherd.shared.config import Settings

RED_INTERVALS = 3  # heartbeat intervals without progress before a held lease turns health red
# Heartbeat intervals without progress before a held lease is reported stalled in the worker row (the leader's
# fleet-wide and shard-wide verdicts count these reports): 1 while its reads fail, 2 whatever its reader does. Two
# intervals before red, so a verdict reaches the agents before a failing lease's give-back at red (decision 0026's
# session-23 amendment); not 1 for a slow reader, as a caught-up reader waits 1 s between calls.
FAIL_REPORT_INTERVALS = 1
REPORT_INTERVALS = 2
# Failover times more before a lease whose reader still runs, slowly, is given back. One was too few: on a host at
# load 40 a first GetRecords from TRIM_HORIZON took longer, and the receiver gave every lease it got back (the CI cell
# churned). A lease whose reads only fail is given back at red (no failover time more).
GIVE_UP_FAILOVERS = 3


@dataclass(frozen=True, slots=True)
class StallBounds:
    """Seconds without progress before a held lease is reported, stalled (red), and given back.

    The rule is agent/stall_watch.py's invariants 3 and 5: given back after `give_up_after` while its reader is slow
    (a call in flight), at `red_after` while its reads only failed since its last progress; reported to the leader
    after `fail_report_after` while they fail, `report_after` whatever the reader does.
    """

    red_after: float
    give_up_after: float
    report_after: float
    fail_report_after: float

    @classmethod
    def from_settings(cls, settings: Settings) -> StallBounds:
        """3 heartbeat intervals to red; 3 failover times more to give back a slow reader, none a failing one."""
        beat = settings.effective_heartbeat_interval_millis / 1000
        red = RED_INTERVALS * beat
        failover = settings.failover_time_millis / 1000
        return cls(red, red + GIVE_UP_FAILOVERS * failover, REPORT_INTERVALS * beat, FAIL_REPORT_INTERVALS * beat)
