"""The timeline of one shard across its agent's restart, for bench/rolling_restart.py's worst shards.

From SIGTERM (time 0, seconds on the bench's monotonic clock) it places: the shard's last record processed before
it, the old process's exit (the stack's `restart` answered: the new process is spawned right after), the new
process's log lines (running, its first heartbeat, the lease acquired, the lease's first read answered, as
agent/runtime.py, agent/lease_keeper.py and agent/shard_worker.py log them), the first record processed after, and
the records the producer put to the shard in between (their ApproximateArrivalTimestamp, read back from the stream):
whether there was anything to read while nobody read.

Invariants: reading the stream back is the only call it makes (AT_TIMESTAMP, a few pages per traced shard); agent
log times are wall clock, turned into the bench's monotonic time with one offset taken when the trace is made.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
PAGES = 5  # GetRecords pages read back per traced shard (a page holds up to 10,000 records)


@dataclass(frozen=True)
class Event:
    """One point of a timeline: seconds after SIGTERM and what happened."""

    at: float
    what: str


def log_events(log: Path, shard: str, since: float, offset: float) -> list[Event]:
    """The agent log's lines about the restart, after monotonic `since` (wall = monotonic + `offset`)."""
    wanted = (("running on stream", "new process running"), ("first heartbeat of", "first heartbeat written"),
              (f"acquired {shard} at", "lease acquired"), (f"{shard}: first read answered", "first read answered"))
    events, seen = [], set[str]()
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = LOG_TIME.match(line)
        if match is None:
            continue
        at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - offset  # logging: local time
        if at < since:
            continue
        for needle, what in wanted:
            if needle in line and what not in seen:
                seen.add(what)
                detail = line.rsplit(": ", 1)[-1] if what == "first read answered" else ""
                events.append(Event(at - since, f"{what}{f' ({detail})' if detail else ''}"))
    return events


def arrivals(kinesis: Any, stream: str, shard: str, start: float, end: float) -> list[float]:
    """Wall times of the records put to `shard` from `start` to `end` (wall seconds), as the stream stamped them."""
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="AT_TIMESTAMP",
                                          Timestamp=datetime.fromtimestamp(start, UTC))["ShardIterator"]
    found: list[float] = []
    for _ in range(PAGES):
        page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
        stamps = [record["ApproximateArrivalTimestamp"].timestamp() for record in page["Records"]]
        found += [stamp for stamp in stamps if start <= stamp <= end]
        iterator = page.get("NextShardIterator")
        if not iterator or not stamps or stamps[-1] > end or not page.get("MillisBehindLatest"):
            break
    return found


@dataclass(frozen=True)
class ShardTrace:
    """What the bench knows of one shard at its agent's restart (monotonic seconds)."""

    shard: str
    agent: str
    beyond: float  # unread from SIGTERM beyond the restart's own seconds
    from_last: float  # the same counted from the last record processed before SIGTERM
    restart: float  # the agent's restart: SIGTERM to its first record processed again
    sent: float  # SIGTERM
    exited: float | None  # the old process exited (the new one spawned)
    last_before: float | None  # the shard's last record processed before SIGTERM
    first_after: float | None  # its first record processed after

    def timeline(self, log: Path, kinesis: Any, stream: str) -> list[str]:
        """Printable lines: the events in order, then the records put while the shard went unread."""
        offset = time.time() - time.monotonic()
        events = [Event(0.0, "SIGTERM")]
        if self.last_before is not None:
            events.append(Event(self.last_before - self.sent, "last record processed"))
        if self.exited is not None:
            events.append(Event(self.exited - self.sent, "old process exited"))
        events += log_events(log, self.shard, self.sent, offset)
        if self.first_after is not None:
            events.append(Event(self.first_after - self.sent, "first record processed"))
        events.sort(key=lambda event: event.at)
        lines = [f"{self.shard} ({self.agent}): unread {self.beyond:.2f} s beyond its agent's {self.restart:.2f} s "
                 f"restart from SIGTERM, {self.from_last:.2f} s from its last record processed before",
                 "  " + " | ".join(f"{event.at:+.2f} {event.what}" for event in events)]
        if self.last_before is not None and self.first_after is not None:
            put = arrivals(kinesis, stream, self.shard, self.last_before + offset, self.first_after + offset)
            lines.append(f"  records put from the last processed to the first processed: {len(put)}"
                         + (f", at {_seconds(put, self.sent + offset)}" if put else ""))
        return lines


def _seconds(stamps: Sequence[float], zero: float) -> str:
    shown = [f"{stamp - zero:+.1f}" for stamp in stamps[:12]]
    return " ".join(shown) + (f" ... ({len(stamps) - 12} more)" if len(stamps) > 12 else "")
