"""How long one Kinesis call on an agent's read path may wait: a deadline, so a hang is a failed read (issue 30).

Invariants:
1. A plain agent's reads and a Spark driver's probes wait for an answer at most `read` seconds per socket read
   (half the failover time, READ_FLOOR at least) and for a connection at most `connect` seconds (half of that):
   botocore's 30 s read timeout let a hung GetRecords look like a slow one for 30 s per attempt.
2. A call that hits the deadline fails like an error answer (retried by the reader's policy, reported to the stall
   watch as a failed read: agent/stall_watch.py, invariant 3), so a worker whose Kinesis hangs gives its leases
   back after the failing-read bound, not the slow-reader one.
3. The floor keeps short test timings from failing reads a loaded host's emulator answers late: a call that always
   took longer than its deadline would never succeed anywhere (the store deadline has a floor for the same reason,
   shared/config.py `effective_store_call_timeout_millis`).
"""

from __future__ import annotations

from shardherd.shared.config import Settings

READ_FLOOR = 5.0  # seconds


def kinesis_timeouts(settings: Settings) -> tuple[float, float]:
    """(connect, read) seconds for an agent's Kinesis calls (invariant 1)."""
    read = max(READ_FLOOR, settings.failover_time_millis / 2000)
    return read / 2, read
