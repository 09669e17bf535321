"""The agent embedded in the Spark driver: holds leases, tells the source what to plan, checkpoints after the sink.

It is the plain agent (keeper thread, metrics, throughput, drain) with Spark in place of the per-shard workers:
held shards go to a ShardBook the source reads through the channel, a probing thread finds idle shards with waiting
records (GetRecords with Limit 1; or at their end, which it checkpoints as SHARD_END so children can start), the
sink checkpoints each written batch at the ends its executors recorded (agent/spark/batch_ends.py), and a supervisor
thread ties the agent and the query together: the agent losing liveness stops the query before the failover time; the
query ending (stopped or failed) drains the agent's leases; the query stuck inside a batch (no progress,
agent/spark/query_watch.py) turns the leases whose records wait red, and then gives every lease back and ends the
driver.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shardherd.agent.consumer import RecordProcessor
from shardherd.agent.heap import freeze_long_lived
from shardherd.agent.lease_keeper import LossReason, handed_over
from shardherd.agent.progress import PoisonRecord
from shardherd.agent.read_deadline import kinesis_timeouts
from shardherd.agent.read_spec import ReadLimits, StartPosition
from shardherd.agent.reader import ReaderStats
from shardherd.agent.runtime import Agent
from shardherd.agent.spark.batch_ends import BatchEnd, forget_ends, recorded_end
from shardherd.agent.spark.book import ShardBook, source_key
from shardherd.agent.spark.commit import BatchFunction, CheckpointingSink
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.agent.spark.poison_rows import Check, PoisonRouting
from shardherd.agent.spark.probe import Prober, ProbeResult
from shardherd.agent.spark.probe_schedule import ProbeBackoff, ProbeSchedule
from shardherd.agent.spark.query_watch import QueryWatch
from shardherd.agent.spark.source import ShardherdDataSource, SourceOptions, StoreOptions
from shardherd.agent.spark.spark_status import SparkMoves
from shardherd.shared.checkpoint import SHARD_END
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.errors import ShardherdError, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.store import Conflict, LeaseStore
from shardherd.shared.streams import LeaseOutOfScope, MalformedLeaseKey, read_target, stream_to_read
from shardherd.shared.supervision import GIVE_UP_FLOOR_SECONDS, Kind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

SUPERVISE_SECONDS = 0.1
SPARK_SUPERVISOR = "spark-supervisor"
PROBE_THREADS = 8
COMMIT_THREADS = 8
CHECKPOINT_WAIT_SECONDS = 10.0  # on stop, how long the last batch's checkpoints may still take
READ_AHEAD_TRIGGERS = 1.5  # executors read ahead once a batch's records span this many trigger intervals


@dataclass(frozen=True, slots=True)
class _Advance:
    """A written plan's shard moved on in the book: its lease, its recorded end, lag and records behind after it."""

    key: str
    end: BatchEnd
    lag: int | None
    behind: int | None


class QueryHung(ShardherdError):
    """The query made no progress for the bound of agent/spark/query_watch.py: the driver gives up and exits."""


class NoRecordProcessor(ShardherdError):
    """The Spark agent hands shards to Spark; it never runs a record processor itself."""


def _no_processor() -> RecordProcessor:
    raise NoRecordProcessor("the Spark agent processes records through Spark, not through record processors")


def register_source(spark: SparkSession) -> None:
    """Register the `shardherd` format with a session (once per session is enough)."""
    spark.dataSource.register(ShardherdDataSource)


class SparkAgent(Agent):
    """The driver's agent; `start()`, build the query with `source_options()` and `sink()`, then `supervise()`."""

    def __init__(self, settings: Settings, channel: Path | None = None, caps: Caps | None = None,
                 probe_interval: float = 0.5, min_call_interval: float = 0.2, include_reader: bool = False,
                 store: LeaseStore | None = None, clock: Clock | None = None,
                 max_partitions: int | None = None, exit: Callable[[int], None] | None = None) -> None:
        super().__init__(settings, _no_processor, clock=clock, store=store, exit=exit)
        self.channel = channel or Path(tempfile.mkdtemp(prefix="shardherd-spark-"))
        # The source's stream option names a single-stream application's stream; a multi-stream source key names
        # its own (the option then lists the streams, for the record).
        streams = settings.stream_name or ",".join(settings.stream_names)
        self.options = SourceOptions(self.channel, streams, settings.region,
                                     settings.kinesis_endpoint_url, caps or Caps(), min_call_interval, include_reader,
                                     settings.kpl_decoder, max_partitions,
                                     StoreOptions(settings.application_name, settings.store_backend,
                                                  settings.dynamodb_endpoint_url, settings.store_meter_dir))
        self.book = ShardBook(settings.worker_id, self.channel, settings.initial_timestamp)
        # One attempt per probe, with the read deadline: the probe rounds are the retries, and a hung call is a failed
        # probe within the deadline rather than after 8 attempts of 30 s (agent/read_deadline.py).
        self._prober = Prober(RawKinesis(settings.region, settings.kinesis_endpoint_url, attempts=1,
                                         timeouts=kinesis_timeouts(settings)), streams)
        self.probe_schedule = ProbeSchedule(probe_interval)
        # A shard whose probes fail waits from one probe period up to the plain reader's longest retry wait.
        self.probe_backoff = ProbeBackoff(probe_interval, ReadLimits().retry_max_delay)
        self._probe_pool = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="shard-probe")
        self._commit_pool = ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="shard-checkpoint")
        self._pending: list[Future[None]] = []  # the last committed batch's checkpoints being stored
        self._pending_guard = threading.Lock()
        self._first_batch_done = False
        self._query: StreamingQuery | None = None
        self._moves: SparkMoves | None = None  # the query's Spark work (its job group is its runId)
        self.query_watch = QueryWatch(self.clock, max(self.stalls.bounds.give_up_after, GIVE_UP_FLOOR_SECONDS))
        self._sink: CheckpointingSink | None = None
        self._halt = threading.Event()
        self._wake_prober = threading.Event()  # set on stop: the probe loop ends without waiting for its next round
        self._stopping = threading.Lock()
        self._stopped = False
        self._was_live = False  # the agent was live once since the query started
        self._ending = False  # the query ended and the agent is stopping: supervision has nothing left to do
        self._spark_threads: list[threading.Thread] = []
        self.stopped_because: str | None = None

    # ------------------------------------------------------------------ LeaseListener
    def lease_acquired(self, lease: Lease) -> None:
        """Plan the shard from its lease checkpoint (a finished shard is held but never planned).

        A lease of a stream this application does not read is given back at once and reported as refused.
        """
        try:
            stream_to_read(lease, self.settings.stream_name, frozenset(self.settings.stream_names))
        except (LeaseOutOfScope, MalformedLeaseKey) as exc:
            log.error("%s; giving the lease back", exc)
            self.progress.refuse(lease.lease_key)
            self.keeper.give_back(lease.lease_key)
            return
        self.throughput.track(lease.lease_key)
        if lease.throughput_kbps is not None:
            self.throughput.seed(lease.lease_key, lease.throughput_kbps)
        if not lease.is_finished:
            self.book.acquired(lease)
            if not self._halt.is_set():  # this shard alone, at once; the other shards keep the trigger-timed rounds
                self._probe_pool.submit(self._probe_first, source_key(lease))

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        """Tell the runner which leases are on their way here: its next plan may wait for them (source.py)."""
        self.book.expect(lease_keys)

    def handoff_requested(self, lease: Lease) -> None:
        """Stop planning and writing the shard; transfer it now, or right after the sink write in flight checkpointed.

        No wait for a batch boundary or the runner: a batch planned with the shard but not yet writing drops its rows
        (the next owner reads them from our checkpoint), so the gap is at most the write in flight.
        """
        if not self.book.handing_off(lease.lease_key):
            self.keeper.finish_handoff(lease.lease_key)

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        """Stop planning the shard at once; its rows in a running batch are not written, its checkpoint refused."""
        self._forget_hold(self.book.lost(lease_key))
        self.throughput.drop(lease_key)
        self.progress.drop(lease_key)

    # ------------------------------------------------------------------ what the query uses
    def source_options(self) -> dict[str, str]:
        """Options for `spark.readStream.format("shardherd").options(**...)`."""
        return self.options.to_options()

    def sink(self, write: BatchFunction, checkpoint_location: str) -> CheckpointingSink:
        """Wrap a foreachBatch function so each batch is checkpointed into the lease table after it was written.

        `checkpoint_location` is the query's: the sink reads each batch's plan from Spark's offset log there.
        """
        self._sink = CheckpointingSink(self, write, checkpoint_location)
        return self._sink

    def held_shards(self) -> set[str]:
        """Shards whose rows may be written now."""
        return self.book.held_shards()

    def begin_write(self, plans: list[ShardPlan]) -> list[ShardPlan]:
        """The plans whose rows the sink may write (held under their tenure, not handing off), marked in flight.

        A lease past its liveness deadline is not written either, although the book still holds it: a driver frozen
        (SIGSTOP, a long pause) past the failover time resumes inside its batch before the keeper thread has fenced,
        and another worker may already have read and checkpointed those rows.
        """
        keys = [self.book.lease_key(plan.shard_id) for plan in plans]
        return self.book.begin_write([plan for plan, key in zip(plans, keys, strict=True)
                                      if key is not None and self.keeper.lease_live(key)])

    def end_write(self, plans: list[ShardPlan]) -> None:
        """The sink's write of `plans` ended: complete the handoffs that waited for it."""
        for key in self.book.end_write(plans):
            self.keeper.finish_handoff(key)

    def commit_progress(self, batch_id: int, plans: list[ShardPlan]) -> None:
        """Move each written plan's shard on to the plan's end now, and store the checkpoints in the background.

        The next batch plans from the new ends at once instead of waiting for the store: a round trip of every batch
        (0.3 s median of a 1.4 s batch at load 28), and with it of every handoff's gap at both drivers. The batch's
        checkpoints, fenced by ownership, go out together (shards under handoff first); each plan's write ends right
        after its own checkpoint was stored, which completes a handoff waiting for it, so a shard is released only
        once its written end is stored; the last write a handoff waits for stores its checkpoint and the release in
        one write. The previous batch's checkpoints are awaited first: one shard's checkpoints
        are stored in order. A checkpoint that fails is logged, never raised: the shard's next checkpoint covers it,
        and a crash before that reads the batch again (at least once, as a crash between write and checkpoint).
        """
        self.await_checkpoints()
        if not self._first_batch_done:  # PySpark's imports and objects of a query's first batch live on too
            self._first_batch_done = True
            freeze_long_lived("after the first micro-batch")
        ordered = sorted(plans, key=lambda plan: not self.book.is_handing_off(plan.shard_id))
        self.query_watch.committed()
        ends = list(self._commit_pool.map(self._recorded_end, ordered))
        staged = [(plan, self._advance(batch_id, plan, end)) for plan, end in zip(ordered, ends, strict=True)]
        futures = [self._commit_pool.submit(self._store_checkpoint, batch_id, plan, advance)
                   for plan, advance in staged]
        with self._pending_guard:
            self._pending = futures

    def await_checkpoints(self, timeout: float | None = None) -> None:
        """Wait until the checkpoints of the last committed batch are stored (or failed), at most `timeout` s."""
        with self._pending_guard:
            pending = list(self._pending)
        wait(pending, timeout)

    def _recorded_end(self, plan: ShardPlan) -> BatchEnd | None:
        """Where the executors' read of a written plan stopped (None: not recorded, or the store failed)."""
        try:
            return recorded_end(self.store, plan.tenure, plan.run, plan.number)
        except Exception as exc:  # the batch is read again from the unchanged checkpoint
            log.error("the recorded end of %s (plan %d) could not be read: %s: %s", plan.shard_id, plan.number,
                      type(exc).__name__, exc)
            return None

    def _advance(self, batch_id: int, plan: ShardPlan, end: BatchEnd | None) -> _Advance | None:
        """Move the book past a written plan (the next plan starts after its recorded end); None if nothing to store.

        Nothing is stored for a shard no longer held under the plan's tenure, or a plan without a recorded end (its
        records are read again from the unchanged checkpoint). Lag and records behind are taken as of the recorded
        end, so the checkpoint carries its own batch's figures.
        """
        key = self.book.lease_key(plan.shard_id)
        if key is None or not self.book.holds(plan.shard_id, plan.tenure):
            log.warning("batch %d: %s is no longer held; its checkpoint is not written", batch_id, plan.shard_id)
            return None
        self.book.checkpointed(plan.shard_id, plan.tenure, end)
        if end is None:
            log.warning("batch %d: no end recorded for %s; its records are read again", batch_id, plan.shard_id)
            return None
        stats = self._read_stats(plan.shard_id)
        if stats is not None:  # the executors' calls, in the shard's /metrics as a plain agent's reader counts its own
            stats.get_records_calls += end.calls
            stats.throttled += end.throttled
        return _Advance(key, end, end.behind_millis, 0 if end.caught_up else None)

    def _store_checkpoint(self, batch_id: int, plan: ShardPlan, advance: _Advance | None) -> None:
        """Store one plan's checkpoint (a commit pool thread), then end its write: a waiting handoff completes."""
        try:
            if advance is not None:
                self._checkpoint_plan(batch_id, plan, advance)
        except Exception:
            log.exception("batch %d: checkpoint of %s failed (the shard's next checkpoint covers it)", batch_id,
                          plan.shard_id)
        finally:
            self.end_write([plan])

    def _checkpoint_plan(self, batch_id: int, plan: ShardPlan, advance: _Advance) -> None:
        """Checkpoint one plan's end with the lease's progress, this batch counted.

        The checkpoint carries records and bytes with this batch added, and lag and records behind as of its end, so
        the stored figures do not trail by a batch; the batch is counted for the heartbeat only once its checkpoint
        is stored.
        """
        key, end, lag, behind = advance.key, advance.end, advance.lag, advance.behind
        if end.end is None:
            self.progress.record(key, 0, 0, lag, behind)
            return
        try:
            outcome = self.keeper.checkpoint(key, end.end,
                                             progress=self.progress.preview(key, end.records, end.bytes, lag, behind),
                                             hand_over=self.book.last_write_of_handoff(plan.shard_id))
        except StoreUnavailable as exc:
            log.error("batch %d: checkpoint of %s failed (the next one covers it; a crash before then reads the batch "
                      "again): %s", batch_id, key, exc)
            return
        if handed_over(outcome, self.keeper.worker_id):  # its figures rode on the lease; the lease is gone here
            log.info("batch %d: %s checkpointed at %s and handed over in one write", batch_id, key, end.end)
        elif outcome.applied:
            self._record_arrivals(key, end)
            self.progress.record(key, end.records, end.bytes, lag, behind)
            self.stalls.progressed(key)
        elif outcome.conflict is Conflict.STALE_CHECKPOINT:
            log.info("batch %d: %s already checkpointed past %s", batch_id, key, end.end)
        else:
            log.warning("batch %d: lease %s lost (%s); checkpoint %s not written", batch_id, key,
                        outcome.conflict.value, end.end)

    def _record_arrivals(self, key: str, end: BatchEnd) -> None:
        """Book a committed batch's bytes over the arrival times of its first and last records, where known.

        Booked at commit time instead, over the time since the previous commit, a shard's figure follows the
        batches' irregular spacing (sd/mean 0.5-0.7 in steady state against 0.04-0.08 for plain agents).
        """
        if end.first_arrival is None or end.last_arrival is None:
            self.throughput.record(key, end.bytes)  # arrival times unknown: spread since the previous commit
            return
        self.throughput.record(key, end.bytes, end.first_arrival, end.last_arrival)

    def _forget_hold(self, tenure: str | None) -> None:
        """Delete an ended hold's recorded batch end (nothing reads it any more): in the background, inline on stop."""
        if tenure is None:
            return

        def forget() -> None:
            try:
                forget_ends(self.store, tenure)
            except Exception as exc:  # an item left behind is only an item
                log.warning("recorded batch end of hold %s not deleted: %s: %s", tenure, type(exc).__name__, exc)

        try:
            self._commit_pool.submit(forget)
        except RuntimeError:  # the pool is shut down: the driver is stopping and gives its leases back now
            forget()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> SparkAgent:
        """Start the keeper, metrics sampling and the probing thread."""
        super().start()
        # Restartable: a probe that fails is a failed probe (Prober.probe), anything else restarts the loop.
        self._spark_threads.append(self.supervisor.thread("shard-prober", self._probe_loop))
        return self

    def supervise(self, query: StreamingQuery, spark: SparkSession | None = None) -> None:
        """Tie the agent to a running query: each one's end ends the other; a query stuck in a batch ends both.

        With the query's `spark` session, the query's Spark jobs and stages moving on count as its progress too (a
        long batch that works is not stuck); without it only completed triggers do (agent/spark/query_watch.py).
        """
        self._moves = SparkMoves(spark, str(query.runId)) if spark is not None else None
        self._query = query
        failover = self.settings.failover_time_millis / 1000
        # Critical: a query that cannot be asked whether it runs (a dead JVM: py4j raises) gives the leases back
        # and ends the driver (decision 0022).
        self._spark_threads.append(self.supervisor.loop(SPARK_SUPERVISOR, self._supervise_step, SUPERVISE_SECONDS,
                                                        Kind.CRITICAL, 2 * failover, self._halt))

    def run_query(self, spark: SparkSession, write: BatchFunction, checkpoint_location: str,
                  processing_time: str = "1 second", available_now: bool = False,
                  poison_check: Check | None = None) -> StreamingQuery:
        """The one call: register the source, start the query with the checkpointing sink and the agent, supervise.

        A continuous query starts first (it plans nothing until the agent holds shards): a driver takes leases only
        once it can read them, so a shard handed to a starting driver is not idle while its JVM sets the query up
        (seconds, more under load). `available_now` reads what arrived before the start, then the query finishes;
        its agent starts first, as such a query ends at its first empty plan. Unless the agent was given
        `max_partitions`, a batch reads in at most the session's default parallelism of tasks (its cores), each
        reading its shards at once: a task per shard beyond the cores costs a Python worker round trip each, in waves.
        With a processing-time trigger, a read whose records span READ_AHEAD_TRIGGERS intervals (the pipeline is
        behind) makes the next batch's first call while its batch is written (agent/spark/read_ahead.py).
        With `poison_check`, rows it raises for are kept out of `write` and quarantined or refused per
        `poison_policy` (agent/spark/poison_rows.py).
        """
        if poison_check is not None:
            write = PoisonRouting(write, poison_check, self._context.quarantine, self.settings.worker_id,
                                  self._quarantined_row)
        register_source(spark)
        if available_now and not self.running():
            self.start()
        options = self.source_options()
        if self.options.max_partitions is None:
            options["maxPartitions"] = str(spark.sparkContext.defaultParallelism)
        if not available_now:  # Spark's own parser of the interval: probe rounds end just before each trigger
            jvm = spark._jvm
            assert jvm is not None
            interval_ms = int(jvm.org.apache.spark.sql.streaming.Trigger.ProcessingTime(processing_time).intervalMs())
            self.probe_schedule.trigger = interval_ms / 1000
            if interval_ms > 0:  # a read whose records span this much finds the pipeline behind: it reads ahead
                options["readAheadAfterMs"] = str(round(READ_AHEAD_TRIGGERS * interval_ms))
        stream = spark.readStream.format(ShardherdDataSource.name()).options(**options).load()
        sink = self.sink(write, checkpoint_location)
        writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint_location)
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_time)
        query = writer.start()
        if not self.running():
            self.start()
        self.supervise(query, spark)
        return query

    def _quarantined_row(self, stream: str, shard: str, record: PoisonRecord, stored_at: str) -> None:
        """Count a quarantined poison row against the lease of its shard (the shard id if no longer held)."""
        default = self.settings.stream_name or ""
        held = [source for source in self.book.held_shards() if read_target(source, default) == (stream, shard)]
        key = self.book.lease_key(held[0]) if held else None
        self.progress.quarantine(key or shard, record, stored_at)

    def stop(self, drain: bool = True, drain_timeout: float | None = None, restart_ms: int | None = None) -> None:
        """Drain (while a running query finishes the handoffs), stop the query, then stop the agent.

        A stop for a restart (see Agent.stop) drains nothing: the query stops, its checkpoints are stored, and the
        agent reserves the leases for the driver coming back with the same worker id.

        The drain comes first because stopping a query interrupts a batch in flight: one already written but not
        yet checkpointed would be read again by the next owner. Leases the drain did not move are given back after
        the query stopped. Safe to call more than once and from several threads (later calls wait for the first).
        """
        with self._stopping:
            if self._stopped:
                return
            query = self._query
            active = query is not None and _answers(query)
            if drain and restart_ms is None:
                restart_ms = self._restart_window()
            if drain and restart_ms is None and query is not None and active and self.running():
                self._drain(drain_timeout)
                drain = False  # what the drain did not move is given back below
            self._stop_query(query if active else None)
            if self.running():
                super().stop(drain, drain_timeout, restart_ms)
            self._stopped = True

    def _stop_query(self, query: StreamingQuery | None) -> None:
        """Stop probing and the query (None: it no longer runs), store what was written, end the threads and pools.

        The sink finishes its write first, so stopping the query interrupts none.
        """
        self._halt.set()
        self._wake_prober.set()
        if self._sink is not None:  # the stop interrupts no write (no `_temporary` directory left behind)
            self._sink.close(CHECKPOINT_WAIT_SECONDS)
        if query is not None and _answers(query):
            query.stop()
        self.await_checkpoints(CHECKPOINT_WAIT_SECONDS)  # what was written is stored before leases are given back
        current = threading.current_thread()
        for thread in self._spark_threads:
            if thread is not current:
                thread.join(10)
        self._probe_pool.shutdown(wait=False, cancel_futures=True)
        self._commit_pool.shutdown(wait=False)

    def _probe_loop(self) -> None:
        """Probe every owned shard in parallel on the probe schedule (a shard just acquired: `_probe_first`).

        A round costs about one GetRecords whatever the shard count; with a processing-time trigger each round ends
        just before a trigger (agent/spark/probe_schedule.py).
        """
        while True:
            self._wake_prober.wait(self.probe_schedule.delay(time.time()))
            self._wake_prober.clear()
            if self._halt.is_set():
                return
            began = time.monotonic()
            self.probe_round()
            self.probe_schedule.round_took(time.monotonic() - began)

    def probe_round(self) -> None:
        """Probe, in parallel, every owned shard not known to have records waiting, but those backing off.

        A shard whose probes failed sits out rounds (`ProbeBackoff`): its lease stays failing for the stall watch
        until a probe answers (or a batch reads it), so a throttled shard is given back on a plain agent's bounds.
        """
        targets = self.book.to_probe()
        held = self.book.held_shards()
        self._ahead(held - {shard for shard, _, _ in targets})
        self.probe_backoff.keep_only(held)
        now = self.clock.monotonic()
        due = [target for target in targets if self.probe_backoff.due(target[0], now)]
        results = self._probe_pool.map(self._probe_one, due)
        for (shard, position, _), result in zip(due, results, strict=True):
            self._probed(shard, position, result)

    def _ahead(self, shards: set[str]) -> None:
        """Held shards that were not probed (records known to wait for the next batch) progress as the query does.

        The next batch reads them, so their leases made progress when the query last did (agent/spark/query_watch.py):
        a query stuck inside a batch turns them red and gives them back as a plain agent's hung reader would.
        """
        last = self.query_watch.last_progress if self._query is not None else None  # no query yet: not stuck
        for shard in shards:
            key = self.book.lease_key(shard)
            if key is not None:
                self.stalls.progressed(key, last)

    def _probe_one(self, target: tuple[str, StartPosition, str | None]) -> ProbeResult:
        return self._prober.probe(*target, self._read_stats(target[0]))

    def _read_stats(self, shard: str) -> ReaderStats | None:
        """The held shard's read counters in /metrics (probes and committed reads count in them), None if not held."""
        key = self.book.lease_key(shard)
        return None if key is None else self._context.reads.setdefault(key, ReaderStats())

    def _probe_first(self, shard: str) -> None:
        """Probe a shard just acquired at once, not after the round in progress: the next plan waits for this probe.

        The probe loop may probe the shard at the same time; the book applies only the first result from a frontier.
        """
        try:
            for target in self.book.to_probe():
                if target[0] == shard:
                    self._probed(shard, target[1], self._probe_one(target))
        except Exception as exc:  # a pool task: nothing else would see it; the probe rounds cover the shard
            log.error("first probe of %s failed (the probe rounds cover it): %s: %s", shard, type(exc).__name__, exc)

    def _probed(self, shard: str, position: StartPosition, result: ProbeResult) -> None:
        """Apply one probe: whether records wait, SHARD_END at a closed shard's end, the lease's lag."""
        if self.book.probed(shard, position, result):
            self._finish_shard(shard)
        if result.failed:
            self.probe_backoff.failed(shard, self.clock.monotonic())
        else:
            self.probe_backoff.answered(shard)
        key = self.book.lease_key(shard)
        if key is not None:
            if not result.failed:  # a probe that answered is the lease's progress; reads that only fail (throttled
                self.stalls.progressed(key)  # too) give it back at red (agent/stall_watch.py)
            else:
                self.stalls.failed(key, result.failure or "probe failed", result.own)
            self.progress.record(key, 0, 0, self.book.lag_millis(shard, time.time()), self.book.records_behind(shard))

    def _finish_shard(self, shard: str) -> None:
        """The shard is closed and everything up to its end is checkpointed: store SHARD_END so children start."""
        key = self.book.lease_key(shard)
        if key is None:
            return
        try:
            outcome = self.keeper.checkpoint(key, SHARD_END)
        except StoreUnavailable as exc:
            log.warning("SHARD_END checkpoint of %s failed, will retry: %s", key, exc)
            return
        if outcome.applied:
            log.info("%s read to its end: checkpointed SHARD_END", key)
            self._forget_hold(self.book.lost(key))  # still held (the leader cleans it up), never planned again

    def _supervise_step(self) -> None:
        """One look at the query and the agent (every SUPERVISE_SECONDS): each one's end ends the other.

        `query.isActive` raising (py4j: the JVM is gone) fails this critical loop, and so does a query stuck in a batch
        for the query watch's bound (`QueryHung`): the driver gives up its leases and exits instead of heartbeating
        for shards nothing reads.
        """
        query = self._query
        if query is None or self._ending:
            return
        if not query.isActive:
            failure = query.exception()
            self._end(f"query failed: {failure}" if failure else "query stopped", drain=True)
            log.warning("%s: draining the agent's leases", self.stopped_because)
            return
        self._watch_query(query)
        live = self.keeper.is_live() and self.running()
        self._was_live = self._was_live or live
        if self._was_live and not live:
            log.error("the agent stopped renewing: stopping the query before its shards fail over")
            query.stop()
            self._end("agent lost liveness", drain=False)

    def _watch_query(self, query: StreamingQuery) -> None:
        """Sample the query's progress (agent/spark/query_watch.py); raise QueryHung once it is stuck too long.

        Not while the leader's fresh verdict keeps a lease of this driver (the fleet's or the shard's reads stall).
        """
        active = bool(query.status["isTriggerActive"])
        self.query_watch.observe(active, self._moves.now() if active and self._moves is not None else None,
                                 excused=bool(self.stalls.held()))
        if self.query_watch.hung():
            raise QueryHung(f"the query made no progress for {self.query_watch.stuck_for():.1f} s inside a batch "
                            f"(bound {self.query_watch.exit_after:.1f} s)")

    def _end(self, why: str, drain: bool) -> None:
        self._ending = True
        self.stopped_because = why
        threading.Thread(target=self.stop, kwargs={"drain": drain}, name="spark-agent-stop", daemon=True).start()


def _answers(query: StreamingQuery) -> bool:
    """True if the query is active; False if it is not, or its JVM no longer answers (it cannot be stopped then)."""
    try:
        return bool(query.isActive)
    except Exception as exc:  # py4j: the JVM is gone
        log.warning("the query does not answer (its JVM is gone?): %s: %s", type(exc).__name__, exc)
        return False
