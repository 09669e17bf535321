"""One thread per owned shard: read with ShardReader, hand batches to the processor, follow the lease's fate.

A shard this worker cannot process (the processor factory or `initialize()` raises, the shard is not found, there is
no start position, reading fails unexpectedly) is retried with exponential backoff; after `attempts` failures the
lease is given back (released, logged, and reported as refused in the worker record so the leader gives it to another
worker if there is one). It is never held without being processed.

Each step of the worker's loop (a read that returned, a step of a backoff wait; not a read that failed) is progress
(`ShardContext.progressed`); a read that failed (an error answer, throttling or its deadline) is reported
(`ShardContext.failed`, saying whether it failed on this worker's credentials); `running` is False while its thread
is dead or waiting for a restart. The agent's StallWatch (agent/stall_watch.py) turns health red and gives the lease
back from those. Reads that keep failing are retried from the last delivered position for as long as the lease is
held (no attempt count: with Kinesis calls' deadlines, ten retries last a minute, and a shared outage must stay a
wait, decision 0039); the stall watch decides when the lease goes.

A batch the processor keeps failing, and a shard end whose SHARD_END checkpoint the processor does not store, block the
shard (nothing is skipped, the children of an ended shard wait) and are retried with a growing wait, the shard shown
stuck (`failing` on the progress board) until they go through.

Poison records (docs/decisions/0031-operator-controls.md): after `poison_attempts` failures a batch is bisected
(`_narrow`): each piece is delivered once, in order, and a piece that fails is split again, down to single records;
every piece that goes through is delivered exactly as a batch is (the processor's own checkpoints). A single record
that fails `poison_attempts` times on its own is the poison record: with no quarantine destination (policy `block`)
the shard stays on it, retried with the growing wait, the progress board naming it; with one (`quarantine`) it is
written there and only then checkpointed past (`_quarantine`). Nothing after the poison record is delivered before
it is delivered or quarantined. Self-fencing, stop requests and progress work throughout as for any batch.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shardherd.agent.consumer import Checkpointer, LeaseLost, RecordProcessor
from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.agent.prefetch import Prefetcher
from shardherd.agent.progress import PoisonRecord, ProgressBoard
from shardherd.agent.quarantine import Destination, Quarantined
from shardherd.agent.read_spec import ReadLimits, StartPosition
from shardherd.agent.reader import ReaderStats, ShardNotFound, ShardReader, ShardReadError, own_fault
from shardherd.agent.records import Record
from shardherd.shared.checkpoint import Sentinel
from shardherd.shared.clock import Clock
from shardherd.shared.errors import ShardherdError, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.streams import stream_to_read
from shardherd.shared.supervision import Supervisor
from shardherd.shared.worker import FailingBatch

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

    from shardherd.agent.lease_keeper import LeaseKeeper

log = logging.getLogger(__name__)

ProcessorFactory = Callable[[], RecordProcessor]


class ShardEndNotCheckpointed(ShardherdError):
    """`shard_ended` returned without the SHARD_END checkpoint stored (it is asked again, with backoff)."""


class Outcome(enum.Enum):
    """How retrying a step ended."""

    DONE = "done"
    STOPPED = "stopped"  # a stop request ended the retries
    FAILING = "failing"  # the tries given ran out, the step still failing


class Stop(enum.Enum):
    """Why a shard worker stops."""

    HANDOFF = "handoff"
    LOST = "lost"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class ShardContext:
    """What every shard worker of an agent shares."""

    keeper: LeaseKeeper
    kinesis: KinesisClient
    stream_name: str | None  # a single-stream application's stream; None in a multi-stream application
    factory: ProcessorFactory
    throughput: ThroughputRecorder
    progress: ProgressBoard
    clock: Clock
    limits: ReadLimits
    initial_timestamp: datetime | None
    retry_delay: float = 1.0
    attempts: int = 3  # failed attempts at a shard before its lease is given back
    max_backoff: float = 30.0
    stream_names: frozenset[str] = frozenset()  # the streams of a multi-stream application
    stream_timestamps: Mapping[str, datetime | None] = field(default_factory=dict)  # per-stream AT_TIMESTAMP
    prefetch: bool = False  # read the next batch while the processor handles the current one (agent/prefetch.py)
    reads: dict[str, ReaderStats] = field(default_factory=dict)  # per lease: GetRecords calls, throttles (/metrics)
    progressed: Callable[[str], None] = lambda lease_key: None  # a step of a lease's worker completed
    # A read failed; True: on this worker's credentials (agent/stall_watch.py).
    failed: Callable[[str, str, bool], None] = lambda lease_key, why, own: None
    poison_attempts: int = 3  # failures of one batch (or record) before it is bisected (or judged poison)
    quarantine: Destination | None = None  # poison_policy quarantine: where poison records go; None: block on them
    worker_id: str = ""

    def stream_of(self, lease: Lease) -> str:
        """The Kinesis stream to read `lease` from; LeaseOutOfScope for a lease of another stream or key format."""
        return stream_to_read(lease, self.stream_name, self.stream_names)


def start_position(lease: Lease, initial_timestamp: datetime | None) -> StartPosition:
    """Where to resume a lease: after its checkpoint, or at the application's initial timestamp."""
    if lease.checkpoint.sentinel is Sentinel.AT_TIMESTAMP:
        if initial_timestamp is None:
            raise ValueError(f"{lease.lease_key} is at AT_TIMESTAMP but no initial_timestamp is configured")
        return StartPosition.at_timestamp(initial_timestamp.timestamp())
    return StartPosition.after(lease.checkpoint)


class ShardWorker:
    """Processes one lease until it ends, is handed off, is lost, or the agent shuts down."""

    def __init__(self, lease: Lease, context: ShardContext, previous: ShardWorker | None = None) -> None:
        self.lease = lease
        self._ctx = context
        self._previous = previous  # this shard's last worker in this process, maybe still finishing its batch
        self._stop: Stop | None = None
        self._reader: ShardReader | Prefetcher | None = None
        self._guard = threading.Lock()
        self._running = False
        self._hand_over = False  # the processing side finished a handoff (or pause): tell the keeper once stopped
        self._blocked_on = ""  # "poison record SEQ/SUB: " while the shard is blocked on one (prefixes its errors)
        self._last_error = ""  # the full text of the latest delivery failure (what a quarantined record carries)
        self.checkpointer = Checkpointer(context.keeper, lease.lease_key)
        self._taken: float | None = context.clock.monotonic()  # until the first read answered (logged once)
        self.thread = threading.Thread(target=self._run, name=f"shard-{lease.shard}", daemon=True)

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Start processing in the worker's thread (under `supervisor`: restarted after an unexpected failure)."""
        self._running = True  # from now until the body ends or fails
        if supervisor is None:
            self.thread.start()
        else:
            self.thread = supervisor.thread(self.thread.name, self._body)

    @property
    def running(self) -> bool:
        """True while the worker's body runs (False once it ended, failed and awaits a restart, or its thread died)."""
        return self._running and self.thread.is_alive()

    def _body(self) -> None:
        """The supervised body: `_run`, with `running` telling whether it is inside it."""
        self._running = True
        try:
            self._run()
        finally:
            self._running = False

    def _beat(self) -> None:
        self._ctx.progressed(self.lease.lease_key)

    def request_stop(self, why: Stop) -> None:
        """Ask the thread to stop after the current batch (a sleeping read wakes at once)."""
        with self._guard:
            if self._stop is None or why is Stop.LOST:
                self._stop = why
            reader = self._reader
        if reader is not None:
            reader.stop()

    def _run(self) -> None:
        key = self.lease.lease_key
        self._await_previous()
        while True:
            self._beat()
            failure = self._attempt()
            if failure is None or self._stop is not None:
                break
            failed = self._ctx.progress.fail(key)
            if failed >= self._ctx.attempts:
                log.error("%s: %d attempts failed (last: %s); giving the lease back", key, failed, failure)
                self._ctx.progress.refuse(key)
                self._ctx.keeper.give_back(key)
                break
            delay = min(self._ctx.max_backoff, self._ctx.retry_delay * 2 ** (failed - 1))
            log.error("%s: attempt %d of %d failed (%s); retrying in %.1f s", key, failed, self._ctx.attempts,
                      failure, delay)
            self._pause(delay)
        self._ctx.throughput.drop(key)
        self._ctx.progress.drop(key)
        if self._hand_over:  # last: a paused lease may be resumed at once, and its new worker's figures must stay
            self._ctx.keeper.finish_handoff(key)

    def _await_previous(self) -> None:
        """Wait until this shard's previous worker in this process has ended (told to stop, it finishes its batch).

        Its last checkpoint is then in the keeper's row, which `_attempt` starts from: started at once, this worker
        read from the row as it was before that checkpoint and delivered again records it covered (issue 30's
        covered duplicates under DynamoDB 5xx: a lease fenced and taken up again while its batch was checkpointed).
        Not progress: a previous worker that never ends leaves the lease stalled, and the stall watch gives it back.
        """
        previous, self._previous = self._previous, None
        while previous is not None and previous.thread.is_alive() and self._stop is None:
            previous.thread.join(0.1)

    def _pause(self, seconds: float) -> None:
        """Wait before the next attempt, in short steps so a stop request ends the wait."""
        until = self._ctx.clock.monotonic() + seconds
        while self._stop is None and (left := until - self._ctx.clock.monotonic()) > 0:
            self._beat()  # waiting under a retry policy is progress
            self._ctx.clock.sleep(min(0.1, left))

    def _attempt(self) -> str | None:
        """One go at the shard from its latest checkpoint: None once it ended, stopped or was lost; else why not."""
        lease = self._ctx.keeper.held().get(self.lease.lease_key)
        if lease is None:
            return None  # lost meanwhile
        self.lease = lease
        early: Prefetcher | None = None
        try:
            stream = self._ctx.stream_of(lease)
            processor = self._ctx.factory()
            position = start_position(lease, self._ctx.stream_timestamps.get(stream, self._ctx.initial_timestamp))
            if self._ctx.prefetch and not position.at_shard_end:
                # The first batch is read while the processor initializes (a MultiLang child starting an interpreter:
                # most of the time from a takeover to the first record processed).
                early = Prefetcher(self._reader_at(stream, position), f"prefetch-{lease.shard}")
            processor.initialize(lease.shard, lease.checkpoint)
        except Exception as exc:  # any failure of user code or configuration is retried, then the lease given back
            if early is not None:
                early.stop()
            return f"{type(exc).__name__}: {exc}"
        try:
            ended = self._loop(processor, stream, position, early)
        except LeaseLost:
            ended = False
            with self._guard:
                self._stop = Stop.LOST
        except Exception as exc:  # shard not found, an unexpected read or processor error
            self._finish(processor, False, Stop.SHUTDOWN)  # let it checkpoint what it completed
            return f"{type(exc).__name__}: {exc}"
        finally:
            if early is not None:
                early.stop()  # a reader the loop never took (stopped first) reads nothing more
        self._finish(processor, ended)
        return None

    def _reader_at(self, stream: str, position: StartPosition) -> ShardReader:
        return ShardReader(self._ctx.kinesis, stream, self.lease.shard, position, self._ctx.limits, self._ctx.clock,
                           stats=self._ctx.reads.setdefault(self.lease.lease_key, ReaderStats()),
                           failed=lambda exc: self._read_failed(f"{type(exc).__name__}: {exc}", own_fault(exc)))

    def _read_failed(self, why: str, own: bool = False) -> None:
        self._ctx.failed(self.lease.lease_key, why, own)

    def _loop(self, processor: RecordProcessor, stream: str, position: StartPosition,
              early: Prefetcher | None = None) -> bool:
        """Read and process until stopped (starting with `early`'s batches, if given); True when the shard ended."""
        while self._stop is None:
            if position.at_shard_end:
                return True
            with self._guard:
                if self._stop is not None:
                    return False
                reader: ShardReader | Prefetcher
                if early is not None:
                    reader, early = early, None
                else:
                    plain = self._reader_at(stream, position)
                    reader = Prefetcher(plain, f"prefetch-{self.lease.shard}") if self._ctx.prefetch else plain
                self._reader = reader
            try:
                while self._stop is None:
                    batch = reader.read_batch()
                    self._beat()
                    self._first_read(len(batch.records))
                    if self._stop is not None:
                        break  # a batch read after a stop request is not delivered: the next owner reads it
                    self._deliver(processor, batch.records, batch.millis_behind_latest)
                    position = batch.next_position
                    if batch.shard_ended:
                        return True
            except ShardNotFound:
                raise
            except (ShardReadError, StoreUnavailable) as exc:  # StoreUnavailable: the reader's retries ran out
                log.warning("%s: read failed, reopening from %s: %s", self.lease.lease_key, position, exc)
                self._read_failed(str(exc))
                self._ctx.clock.sleep(self._ctx.retry_delay)
            finally:
                reader.stop()  # nothing reads ahead for a reader left behind
        return False

    def _first_read(self, records: int) -> None:
        """Log once how long after the lease was taken its first read answered (a takeover's or restart's gap)."""
        taken, self._taken = self._taken, None
        if taken is not None:
            log.info("%s: first read answered %.2f s after the lease was taken: %d records", self.lease.lease_key,
                     self._ctx.clock.monotonic() - taken, records)

    def _deliver(self, processor: RecordProcessor, records: list[Record], lag: int | None) -> None:
        """Hand one batch over; retry it (never skip it) while the processor raises (see `_until_done`)."""
        size = sum(len(record.data) for record in records)
        # Counted once as handed over, before the processor's checkpoints, which carry these figures onto the lease
        # (counted after, a lease's stored progress would trail by a batch and stay behind once the shard goes quiet).
        # A batch that reached the stream's tip leaves nothing behind once processed; otherwise the count is unknown.
        self._ctx.progress.record(self.lease.lease_key, len(records), size, lag, 0 if lag == 0 else None)
        outcome = self._until_done(lambda: processor.process_records(records, self.checkpointer, lag),
                                   f"process_records failed on the same {len(records)} records",
                                   "delivering them again", self._ctx.poison_attempts if records else None)
        if outcome is Outcome.FAILING:
            outcome = self._narrow(processor, records, lag)
        if outcome is not Outcome.DONE:
            return
        if records:
            self.checkpointer.last_delivered = records[-1]
            arrivals = [record.approximate_arrival_timestamp for record in records
                        if record.approximate_arrival_timestamp is not None]
            self._ctx.throughput.record(self.lease.lease_key, size, min(arrivals).timestamp() if arrivals else None,
                                        max(arrivals).timestamp() if arrivals else None)
        elif lag == 0:  # read up to now and nothing arrived: the shard is quiet until now, not merely unread
            self._ctx.throughput.record(self.lease.lease_key, 0, last_arrival=self._ctx.clock.time())

    def _until_done(self, attempt: Callable[[], None], failing_what: str, again: str,
                    tries: int | None = None) -> Outcome:
        """Run `attempt` until it returns (DONE), a stop request ends retries (STOPPED) or `tries` ran out (FAILING).

        While it raises, the shard blocks on it (nothing skipped), visibly: each failure is one log line and counts on
        the progress board (`failing`: the worker row, the agent's and the coordinator's /metrics and the dashboard
        show the shard stuck since when, after how many attempts, with the last error), and the next attempt comes
        after 1, 2, 4 ... s (capped at `max_backoff`). Nothing is attempted once the lease's liveness deadline has
        passed (self-fencing): the shard may already be someone else's.
        """
        key = self.lease.lease_key
        failed = 0
        while True:
            self._fence()
            try:
                attempt()
                break
            except LeaseLost:
                raise
            except Exception as exc:  # the shard blocks on this step (never skipped), visibly, with a growing wait
                failing = self._failed(exc)
                failed += 1
                if tries is not None and failed >= tries:
                    log.error("%s: %s %d times (last: %s); no more tries", key, failing_what, failed,
                              failing.last_error)
                    return Outcome.FAILING
                delay = min(self._ctx.max_backoff, self._ctx.retry_delay * 2 ** (failing.attempts - 1))
                log.error("%s: %s %d times (last: %s); %s in %.1f s", key, failing_what, failing.attempts,
                          failing.last_error, again, delay)
                self._pause(delay)
                if self._stop is not None:
                    return Outcome.STOPPED
        self._ctx.progress.batch_delivered(key)
        return Outcome.DONE

    def _fence(self) -> None:
        """LeaseLost once the lease's liveness deadline passed: the shard may already be someone else's."""
        key = self.lease.lease_key
        if not self._ctx.keeper.lease_live(key):
            log.error("%s: liveness deadline passed; stopping without delivering", key)
            raise LeaseLost(f"{key}: self-fenced")

    def _failed(self, exc: Exception) -> FailingBatch:
        """Count one failed delivery on the progress board (naming the poison record the shard is blocked on)."""
        self._last_error = f"{type(exc).__name__}: {exc}"
        return self._ctx.progress.batch_failed(self.lease.lease_key, self._blocked_on + self._last_error)

    def _narrow(self, processor: RecordProcessor, records: list[Record], lag: int | None) -> Outcome:
        """Bisect a batch that kept failing: deliver each piece once, in order, splitting a piece that fails.

        A piece that goes through counts as a delivered batch (`last_delivered`); a single record goes to `_poison`.
        DONE once every record was delivered or quarantined; STOPPED on a stop request (nothing after the piece in
        hand delivered: the next owner reads it from the checkpoint).
        """
        log.warning("%s: bisecting the %d records that keep failing", self.lease.lease_key, len(records))
        pending = [records]  # pieces still to deliver, the next one last
        judged = len(records) == 1  # a batch of one that failed `poison_attempts` times is already the poison record
        while pending:
            if self._stop is not None:
                return Outcome.STOPPED
            piece = pending.pop()
            if len(piece) == 1:
                outcome = self._poison(processor, piece[0], lag, judged)
                if outcome is not Outcome.DONE:
                    return outcome
            elif piece is records or not self._once(processor, piece, lag):
                half = len(piece) // 2
                pending.extend((piece[half:], piece[:half]))
        self._ctx.progress.batch_delivered(self.lease.lease_key)
        return Outcome.DONE

    def _once(self, processor: RecordProcessor, piece: list[Record], lag: int | None) -> bool:
        """One delivery of a piece of a bisected batch; True when it went through."""
        self._beat()  # each step of a bisection is progress
        self._fence()
        try:
            processor.process_records(piece, self.checkpointer, lag)
        except LeaseLost:
            raise
        except Exception as exc:  # the piece is split further
            self._failed(exc)
            return False
        self.checkpointer.last_delivered = piece[-1]
        return True

    def _poison(self, processor: RecordProcessor, record: Record, lag: int | None, judged: bool) -> Outcome:
        """Deliver one record of a bisected batch; one that fails `poison_attempts` times blocks or is quarantined."""
        key = self.lease.lease_key
        poison = PoisonRecord(record.sequence_number, record.sub_sequence_number)
        where = str(poison)

        def deliver() -> None:
            processor.process_records([record], self.checkpointer, lag)

        outcome = Outcome.FAILING
        if not judged:
            self._ctx.progress.batch_delivered(key)  # the record's own failures are counted from here
            outcome = self._until_done(deliver, f"process_records failed on record {where}", "delivering it again",
                                       self._ctx.poison_attempts)
        if outcome is Outcome.FAILING:
            self._ctx.progress.poison(key, poison)
            self._blocked_on = f"poison record {where}: "
            destination = self._ctx.quarantine
            log.error("%s: poison record %s (%s); %s", key, where, self._last_error,
                      "blocking on it" if destination is None else f"quarantining it to {destination.url}")
            try:
                outcome = (self._until_done(deliver, f"process_records failed on poison record {where}",
                                            "delivering it again") if destination is None
                           else self._quarantine(record, poison, destination))
            finally:
                self._blocked_on = ""
                self._ctx.progress.poison(key, None)
        if outcome is Outcome.DONE:
            self.checkpointer.last_delivered = record
        return outcome

    def _quarantine(self, record: Record, poison: PoisonRecord, destination: Destination) -> Outcome:
        """Write the poison record to `destination`, then checkpoint past it; retried (never skipped) until both did.

        The checkpoint is written only when everything before the record is checkpointed (a processor that
        checkpoints later carries past it with its own next checkpoint: `last_delivered` is this record).
        """
        key = self.lease.lease_key
        failing = self._ctx.progress.failing().get(key)
        stored = Quarantined.of(record, self._ctx.stream_of(self.lease), self._last_error,
                                failing.attempts if failing is not None else 0, self._ctx.worker_id,
                                datetime.fromtimestamp(self._ctx.clock.time(), UTC))
        due = self._before_checkpointed()
        self._ctx.progress.batch_delivered(key)  # the write's own failures are counted (and waited for) from here

        def write() -> None:
            destination.put(stored)
            if due:
                self.checkpointer.checkpoint(record)

        outcome = self._until_done(write, f"quarantining poison record {stored.name} failed", "writing it again")
        if outcome is Outcome.DONE:
            self._ctx.progress.quarantine(key, poison, f"{destination.url.rstrip('/')}/{stored.name}")
            log.warning("%s: poison record %s quarantined to %s%s", key, poison, destination.url, "" if due else
                        " (checkpointed past with the processor's next checkpoint)")
        return outcome

    def _before_checkpointed(self) -> bool:
        """True when every record delivered before the current one is checkpointed."""
        before = self.checkpointer.last_delivered
        if before is None:
            return True  # the record follows the lease's stored checkpoint
        stored = self.checkpointer.last_written or self.lease.checkpoint
        return stored >= before.checkpoint

    def _end_shard(self, processor: RecordProcessor) -> None:
        """Call `shard_ended` until the SHARD_END checkpoint is stored (the shard's children wait for it).

        A processor that returns without checkpointing SHARD_END (or raises) is asked again with backoff, the shard
        shown stuck meanwhile (`_until_done`), instead of the lease staying held with nothing processing it.
        """
        def attempt() -> None:
            processor.shard_ended(self.lease.shard, self.checkpointer)
            if not self._shard_end_stored():
                raise ShardEndNotCheckpointed("shard_ended returned without checkpointing SHARD_END")

        self._until_done(attempt, "shard_ended did not store SHARD_END (the shard's children wait for it)",
                         "asking again")

    def _shard_end_stored(self) -> bool:
        written = self.checkpointer.last_written
        held = self._ctx.keeper.held().get(self.lease.lease_key)
        return (written is not None and written.is_shard_end) or (held is not None and held.checkpoint.is_shard_end)

    def _finish(self, processor: RecordProcessor, ended: bool, stop: Stop | None = None) -> None:
        """Tell the processor how its shard ends (`stop` overrides the stop requested, for a failed attempt)."""
        shard = self.lease.shard
        stop = stop or self._stop
        try:
            if stop is Stop.LOST:
                processor.lease_lost(shard)
            elif ended:
                self._end_shard(processor)
            elif stop in (Stop.HANDOFF, Stop.SHUTDOWN):
                processor.shutdown_requested(shard, self.checkpointer)
        except LeaseLost:
            processor.lease_lost(shard)
        except Exception:
            log.exception("%s: processor failed while finishing", self.lease.lease_key)
        self._hand_over = stop is Stop.HANDOFF and self._stop is Stop.HANDOFF
