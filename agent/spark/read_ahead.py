"""Reading ahead while behind: the next plan's first GetRecords, made while the current batch is written.

A micro-batch is a chain: plan, read, hand the rows over, write, commit, plan again. While a batch is written no
read is in flight, so an executor that reads a shard only when its task starts leaves Kinesis idle for that part of
every batch (docs/spark.md, the ceiling's timeline). When the pipeline is behind, the executor that fixed a plan's end
makes the next plan's first call at once, on the NextShardIterator it recorded, and keeps the answer.

Invariants:
- A read ahead is the call the next plan's first read would make first: GetRecords on the iterator the previous read
  recorded, under the same hold. A read takes it only if its plan starts at exactly that iterator under that hold
  (the driver plans the next batch from the recorded end and its iterator), and uses the answer as its first call's:
  what the read yields and records follows from it as from any first answer, so every-record-once and deterministic
  replay are those of agent/spark/arrow_read.py. Records that arrived after the call are left for the next plan.
- Only after a first read that found the pipeline behind: its records' arrivals spanned at least the source's
  `readAheadAfterMs` (batches further apart than the trigger). A caught-up pipeline reads at each task's start as
  before, so its latency and calls per batch are unchanged; behind, the read ahead replaces the next read's first
  call, so a batch still costs about one GetRecords call per shard.
- One read ahead per hold and executor process; a newer one replaces it, a read of another plan of the hold (an
  earlier plan read again) leaves it, and one not taken within KEEP_SECONDS is dropped (a task that ran elsewhere, a
  lease that moved): such a call was made for nothing, the only extra cost.
- It keeps the shard's pacing: the call waits the source's minimum call interval after the read's last call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from shardherd.agent.reader import ReaderStats, ShardReadError
from shardherd.agent.spark.batch_ends import BatchEnd
from shardherd.agent.spark.kinesis_raw import RawKinesis

KEEP_SECONDS = 30.0  # a read ahead not taken by then is dropped (its iterator would soon expire too)
Answer = tuple[dict[str, Any], ReaderStats]


def behind(end: BatchEnd, after_seconds: float | None) -> bool:
    """True if a first read that recorded `end` found the pipeline behind.

    Its records' arrivals spanned at least `after_seconds` (None: reading ahead is off).
    """
    if after_seconds is None or end.first_arrival is None or end.last_arrival is None:
        return False
    return end.last_arrival - end.first_arrival >= after_seconds


@dataclass(frozen=True, slots=True)
class _Ahead:
    iterator: str
    answer: Future[Answer]
    made: float


class ReadAhead:
    """The read aheads of one executor process, one per hold (tenure); `clock` gives monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, _Ahead] = {}

    def start(self, kinesis: RawKinesis, tenure: str, iterator: str, limit: int, pause: float) -> None:
        """Call GetRecords(`iterator`, `limit`) on a thread of its own after `pause` s; keep the answer for `take`."""
        answer: Future[Answer] = Future()

        def call() -> None:
            time.sleep(pause)
            stats = ReaderStats()
            try:
                answer.set_result((kinesis.get_records(iterator, limit, stats), stats))
            except BaseException as exc:  # handed to the read that takes it, which then calls itself
                answer.set_exception(exc)

        now = self._clock()
        with self._lock:
            self._held = {tenure_: ahead for tenure_, ahead in self._held.items() if now - ahead.made < KEEP_SECONDS}
            self._held[tenure] = _Ahead(iterator, answer, now)
        threading.Thread(target=call, name=f"read-ahead-{tenure}", daemon=True).start()

    def take(self, tenure: str, iterator: str | None) -> Future[Answer] | None:
        """The read ahead of the hold `tenure` if it was made on `iterator` (it is then handed over once), else None.

        A read of another plan of the hold (an earlier plan read again by a retried task or a second action) leaves it
        for the plan it was made for.
        """
        with self._lock:
            ahead = self._held.get(tenure)
            if ahead is None or ahead.iterator != iterator:
                return None
            del self._held[tenure]
        return ahead.answer if self._clock() - ahead.made < KEEP_SECONDS else None

    def held(self, tenure: str) -> Future[Answer] | None:
        """The answer of the hold's read ahead, left in place (for a test or a bench that waits for it)."""
        with self._lock:
            ahead = self._held.get(tenure)
        return None if ahead is None else ahead.answer


def first_answer(kinesis: RawKinesis, iterator: str, limit: int, stats: ReaderStats,
                 ahead: Future[Answer] | None) -> dict[str, Any]:
    """A read's GetRecords answer: the read ahead's when there is one and it was answered, else a call now.

    The read ahead's calls and throttles count in `stats`, as the read's own would.
    """
    if ahead is not None:
        try:
            response, made = ahead.result()
        except ShardReadError:  # refused or failed: the read makes the call itself (and meets the error itself)
            pass
        else:
            stats.get_records_calls += made.get_records_calls
            stats.throttled += made.throttled
            return response
    return kinesis.get_records(iterator, limit, stats)


READS_AHEAD = ReadAhead()  # one per executor process: tasks of consecutive batches meet here
