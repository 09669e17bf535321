"""Kinesis's per-shard limits as a pure model: which call AWS would throttle, and counts of what was served.

Invariants (docs/decisions/0029-kinesis-limits-model.md has the AWS sources and why each window is what it is):
- Every limit is per shard and shared by every caller (all consumers of the stream draw on one budget).
- Writes: a record is admitted only if the shard's last 1 s of admitted writes plus this record stay within
  1 MiB (data plus partition key) and 1,000 records; a rejected record changes no budget.
- GetRecords calls: at most 5 admitted calls in any 1 s; GetShardIterator: at most 5 admitted calls in any 1 s.
- GetRecords bytes: a call is admitted only while the shard served less than 10 MiB in the last 5 s (2 MiB/s
  averaged over 5 s); so a 10 MiB answer throttles every call for the next 5 s, as AWS documents.
- A throttled call is counted (ReadProvisionedThroughputExceeded / WriteProvisionedThroughputExceeded) and uses no
  budget. Time comes from the injected clock only; the model does no I/O.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass, field

from shardherd.shared.clock import Clock

MIB = 1024 * 1024

READ_THROTTLED = "ReadProvisionedThroughputExceeded"
WRITE_THROTTLED = "WriteProvisionedThroughputExceeded"
ITERATOR_THROTTLED = "GetShardIterator.ProvisionedThroughputExceeded"
GET_RECORDS = "GetRecords.Success"
GET_RECORDS_RECORDS = "GetRecords.Records"
GET_RECORDS_BYTES = "GetRecords.Bytes"
GET_SHARD_ITERATOR = "GetShardIterator.Success"
INCOMING_RECORDS = "IncomingRecords"
INCOMING_BYTES = "IncomingBytes"


@dataclass(frozen=True, slots=True)
class ShardLimits:
    """AWS's documented per-shard limits (provisioned mode); tests may shrink them."""

    write_bytes_per_second: int = MIB
    write_records_per_second: int = 1000
    read_calls_per_second: int = 5
    read_bytes_per_second: int = 2 * MIB
    read_bytes_window: float = 5.0
    iterator_calls_per_second: int = 5
    max_response_bytes: int = 10 * MIB
    max_response_records: int = 10_000


class SlidingWindow:
    """The sum of amounts added within the last `span` seconds (amortised O(1))."""

    def __init__(self, span: float) -> None:
        self.span = span
        self._entries: deque[tuple[float, int]] = deque()
        self._total = 0

    def total(self, now: float) -> int:
        """The sum of amounts added after `now - span`."""
        entries = self._entries
        while entries and entries[0][0] <= now - self.span:
            self._total -= entries.popleft()[1]
        return self._total

    def add(self, now: float, amount: int) -> None:
        """Add `amount` at time `now`."""
        self._entries.append((now, amount))
        self._total += amount


@dataclass(slots=True)
class _ShardBudget:
    write_bytes: SlidingWindow
    write_records: SlidingWindow
    read_calls: SlidingWindow
    read_bytes: SlidingWindow
    iterator_calls: SlidingWindow

    @classmethod
    def of(cls, limits: ShardLimits) -> _ShardBudget:
        return cls(SlidingWindow(1.0), SlidingWindow(1.0), SlidingWindow(1.0),
                   SlidingWindow(limits.read_bytes_window), SlidingWindow(1.0))


@dataclass(frozen=True, slots=True)
class ShardKey:
    """A shard of a stream."""

    stream: str
    shard: str

    def __str__(self) -> str:
        return f"{self.stream}/{self.shard}"


@dataclass
class ThrottleModel:
    """Decides admission per call (or per record for writes) and counts per shard and caller."""

    clock: Clock
    limits: ShardLimits = field(default_factory=ShardLimits)
    _budgets: dict[ShardKey, _ShardBudget] = field(default_factory=dict)
    _counts: dict[tuple[ShardKey, str], Counter[str]] = field(default_factory=dict)

    def _budget(self, key: ShardKey) -> _ShardBudget:
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = _ShardBudget.of(self.limits)
        return budget

    def count(self, key: ShardKey, caller: str, metric: str, amount: int = 1) -> None:
        """Add `amount` to `metric` of (shard, caller)."""
        counts = self._counts.get((key, caller))
        if counts is None:
            counts = self._counts[(key, caller)] = Counter()
        counts[metric] += amount

    def admit_read(self, key: ShardKey, caller: str) -> bool:
        """True if a GetRecords call on `key` may go ahead now (it then uses one call of the budget)."""
        budget, now, limits = self._budget(key), self.clock.monotonic(), self.limits
        if (budget.read_calls.total(now) >= limits.read_calls_per_second
                or budget.read_bytes.total(now) >= limits.read_bytes_per_second * limits.read_bytes_window):
            self.count(key, caller, READ_THROTTLED)
            return False
        budget.read_calls.add(now, 1)
        self.count(key, caller, GET_RECORDS)
        return True

    def served(self, key: ShardKey, caller: str, records: int, data_bytes: int) -> None:
        """Charge an admitted GetRecords call's answer (`data_bytes` of record data) to the shard's read bytes."""
        self._budget(key).read_bytes.add(self.clock.monotonic(), data_bytes)
        self.count(key, caller, GET_RECORDS_RECORDS, records)
        self.count(key, caller, GET_RECORDS_BYTES, data_bytes)

    def admit_iterator(self, key: ShardKey, caller: str) -> bool:
        """True if a GetShardIterator call on `key` may go ahead now."""
        window, now = self._budget(key).iterator_calls, self.clock.monotonic()
        if window.total(now) >= self.limits.iterator_calls_per_second:
            self.count(key, caller, ITERATOR_THROTTLED)
            return False
        window.add(now, 1)
        self.count(key, caller, GET_SHARD_ITERATOR)
        return True

    def admit_write(self, key: ShardKey, caller: str, size: int) -> bool:
        """True if one record of `size` bytes (data plus partition key) may be written to `key` now."""
        budget, now, limits = self._budget(key), self.clock.monotonic(), self.limits
        if (budget.write_records.total(now) + 1 > limits.write_records_per_second
                or budget.write_bytes.total(now) + size > limits.write_bytes_per_second):
            self.count(key, caller, WRITE_THROTTLED)
            return False
        budget.write_records.add(now, 1)
        budget.write_bytes.add(now, size)
        self.count(key, caller, INCOMING_RECORDS)
        self.count(key, caller, INCOMING_BYTES, size)
        return True

    def snapshot(self) -> dict[str, object]:
        """Counts per shard, per caller and per (shard, caller), plus the limits in force (JSON-ready)."""
        shards: dict[str, Counter[str]] = {}
        callers: dict[str, Counter[str]] = {}
        pairs = []
        for (key, caller), counts in sorted(self._counts.items(), key=lambda item: (str(item[0][0]), item[0][1])):
            shards.setdefault(str(key), Counter()).update(counts)
            callers.setdefault(caller, Counter()).update(counts)
            pairs.append({"stream": key.stream, "shard": key.shard, "caller": caller, **counts})
        return {"limits": asdict(self.limits), "shards": shards, "callers": callers, "by_shard_and_caller": pairs}
