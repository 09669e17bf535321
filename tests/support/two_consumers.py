"""Two shardherd applications reading one stream through the Kinesis limits proxy, for tests and benches.

Each application is a coordinator and one agent with its own lease table: application "b" a plain agent (user
defaults for reads unless the caller passes limits) writing a ledger; application "a" the same, or, given a
SparkSession, a Spark driver's agent (user defaults: caps, pacing, 1 s trigger) whose query's sink keeps what it
wrote. Both read a warm-up record first (a Spark query's first batch starts its Python workers), then a paced
producer writes through the same proxy. The result says whether both kept up (every record delivered
to each application soon after the producer stopped), how often each polled per shard per second and was throttled
(each agent's own /metrics: a Spark driver counts its probes and, once a batch is committed, its executors' reads),
the proxy's counts, and for Spark its batches' timing: the longest gap between two batches that read records, the
longest batch, and the longest delay of a batch past the moment Spark could start it (a processing-time trigger
starts a batch at the next trigger after the previous one started, or at once when the previous one ran longer than
the interval): a throttled planning read or a stalled probe delays a batch; a loaded host only lengthens batches.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from shardherd.agent.read_spec import ReadLimits
from shardherd.agent.runtime import Agent
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_CALLS = re.compile(r'^shardherd_shard_(get_records_calls|read_throttled)_total\{lease="[^"]+"\} ([0-9.e+]+)$', re.M)
TICK = 0.1
TRIGGER_SECONDS = 1.0  # the Spark query's processing-time trigger (run_query's default)
WARM_UP = b"warm-up-"  # a record both applications read before the producer starts (not among its payloads)


@dataclass(frozen=True)
class AppFigures:
    """One application's reads over the producing window."""

    calls_per_shard_second: float  # GetRecords calls per shard per second (see the module's docstring)
    throttled: int  # calls Kinesis throttled (its agent's /metrics, as calls_per_shard_second)
    drain_seconds: float  # from the producer's stop until every record was delivered


@dataclass(frozen=True)
class BatchTiming:
    """Seconds, over the Spark batches that read records in the window (see the module's docstring)."""

    gap_max: float  # between the starts of two consecutive batches
    longest: float  # a batch's own duration (Spark's triggerExecution)
    delay_max: float  # a batch's start past max(previous start + trigger, previous end)


def batch_timing(progress: list[dict[str, Any]], since: float, trigger: float) -> BatchTiming | None:
    """The timing of the batches in Spark's `progress` that read records and started after `since` (epoch s)."""
    spans = [(datetime.fromisoformat(item["timestamp"].replace("Z", "+00:00")).timestamp(),
              item["durationMs"]["triggerExecution"] / 1000) for item in progress if item["numInputRows"]]
    spans = [span for span in spans if span[0] >= since]
    if len(spans) < 2:
        return None
    pairs = list(itertools.pairwise(spans))
    return BatchTiming(max(later[0] - earlier[0] for earlier, later in pairs), max(took for _, took in spans),
                       max(later[0] - max(earlier[0] + trigger, earlier[0] + earlier[1]) for earlier, later in pairs))


@dataclass(frozen=True)
class TwoConsumers:
    """What one run measured."""

    apps: dict[str, AppFigures]
    written: int
    seconds: float
    proxy_calls: int  # GetRecords calls the proxy admitted on the stream in the window, both applications
    proxy_throttled: int  # GetRecords calls it throttled (ReadProvisionedThroughputExceeded)
    write_throttled: int
    iterators: int  # GetShardIterator calls the proxy answered in the window, both applications (leases held before)
    spark_batches: BatchTiming | None = None  # Spark: its batches in the window (trigger 1 s)

    @property
    def throttled_fraction(self) -> float:
        """Throttled GetRecords calls per GetRecords call made, both applications."""
        return self.proxy_throttled / max(1, self.proxy_calls + self.proxy_throttled)


def _agent_calls(agent: Agent) -> tuple[float, int]:
    """GetRecords calls and throttled calls a plain agent made so far, from its /metrics."""
    assert agent.health is not None
    text = httpx.get(f"http://127.0.0.1:{agent.health.port}/metrics", timeout=5).text
    totals = {"get_records_calls": 0.0, "read_throttled": 0.0}
    for name, value in _CALLS.findall(text):
        totals[name] += float(value)
    return totals["get_records_calls"], int(totals["read_throttled"])


def _stream_counts(limits: KinesisLimits, stream: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for key, counts in limits.counts()["shards"].items():
        if key.startswith(f"{stream}/"):
            for metric, value in counts.items():
                totals[metric] = totals.get(metric, 0) + int(value)
    return totals


def _produce(kinesis: Any, stream: str, rate: float, size: int, seconds: float) -> int:
    """Put `rate` records/s of `size` bytes for `seconds`, resending throttled ones; the records written."""
    written, owed = 0, 0.0
    pending: list[dict[str, Any]] = []
    started = last = time.monotonic()
    serial = 0
    while (now := time.monotonic()) - started < seconds or pending:
        owed += rate * (now - last) if now - started < seconds else 0.0
        last = now
        due = int(owed)
        owed -= due
        for _ in range(due):
            pending.append({"Data": f"{serial:08d}".encode().ljust(size, b"."), "PartitionKey": f"k{serial % 97}"})
            serial += 1
        rejected: list[dict[str, Any]] = []
        for start in range(0, len(pending), 500):
            batch = pending[start:start + 500]
            answer = kinesis.put_records(StreamName=stream, Records=batch)
            written += sum(1 for entry in answer["Records"] if "SequenceNumber" in entry)
            rejected += [entry for entry, result in zip(batch, answer["Records"], strict=True) if "ErrorCode" in result]
        pending = rejected
        time.sleep(TICK)
    return written


class Application(Protocol):
    """One application of the pair: its stack, started agent, and what it delivered."""

    stack: StreamStack

    def start(self) -> None:
        """Start its agent (and query)."""

    def ready(self) -> bool:
        """It holds every shard (and its query is running)."""

    def delivered(self) -> int:
        """Distinct records it delivered so far."""

    def reads(self) -> tuple[float, int]:
        """GetRecords calls and throttled calls so far, from its agent's /metrics."""

    def stop(self) -> None:
        """Stop its agent and coordinator."""


@dataclass
class PlainApplication:
    """A coordinator and one plain agent writing every record to a ledger."""

    stack: StreamStack
    worker: str
    read_limits: ReadLimits | None
    ledger: Ledger = field(default_factory=Ledger)
    agent: Agent | None = None

    def start(self) -> None:
        """Start the agent with its health server (its /metrics count the reads)."""
        self.agent = Agent(self.stack.settings(self.worker, agent_health_port=0),
                           functools.partial(LedgerProcessor, self.ledger, self.worker),
                           limits=self.read_limits).start()

    def ready(self) -> bool:
        """The agent owns every lease."""
        return set(self.stack.owners().values()) == {self.worker}

    def delivered(self) -> int:
        """Records processed."""
        return len(self.ledger.payloads())

    def reads(self) -> tuple[float, int]:
        """From the agent's /metrics."""
        assert self.agent is not None
        return _agent_calls(self.agent)

    def stop(self) -> None:
        """Stop without draining, then the coordinator."""
        if self.agent is not None:
            self.agent.stop(drain=False)
        self.stack.close()


@dataclass
class SparkApplication:
    """A coordinator and one Spark driver's agent with user defaults; the sink keeps each record's first 8 bytes."""

    stack: StreamStack
    worker: str
    spark: SparkSession
    workdir: Path
    written: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    agent: Any = None
    query: Any = None

    def start(self) -> None:
        """Start the agent and its query (1 s trigger)."""
        from shardherd.agent.spark.driver import SparkAgent

        def write(df: Any, batch_id: int) -> None:
            from pyspark.sql import functions as F  # noqa: N812

            heads = {bytes(row[0]) for row in df.select(F.substring("data", 1, 8)).collect()}
            with self.lock:
                self.written |= heads

        self.agent = SparkAgent(self.stack.settings(self.worker, agent_health_port=0),
                                channel=self.workdir / f"channel-{self.worker}")
        self.query = self.agent.run_query(self.spark, write, str(self.workdir / f"checkpoint-{self.worker}"))

    def ready(self) -> bool:
        """The agent owns every lease and its query runs."""
        if not self.query.isActive:
            raise AssertionError(f"application {self.worker}'s query ended: {self.query.exception()}")
        return set(self.stack.owners().values()) == {self.worker}

    def delivered(self) -> int:
        """Distinct records written by the sink."""
        with self.lock:
            return len(self.written)

    def reads(self) -> tuple[float, int]:
        """From the driver's agent's /metrics."""
        return _agent_calls(self.agent)

    def batch_timing(self, since: float) -> BatchTiming | None:
        """Its batches' timing since `since` (epoch s), from the query's recent progress."""
        return batch_timing(self.query.recentProgress, since, TRIGGER_SECONDS)

    def stop(self) -> None:
        """Stop the agent (its query with it), then the coordinator."""
        if self.agent is not None:
            self.agent.stop(drain=False)
        self.stack.close()


def _delivered(app: Application, count: int) -> bool:
    return app.delivered() >= count


def run_two_consumers(moto: MotoServer, limits: KinesisLimits, shards: int, rate: float, size: int,
                      seconds: float, read_limits: ReadLimits | None = None, spark: SparkSession | None = None,
                      workdir: Path | None = None, failover_millis: int = 2000) -> TwoConsumers:
    """Two applications on one `shards`-shard stream written at `rate` records/s of `size` bytes for `seconds`.

    With `spark` (and a `workdir` for its channel and checkpoint), application "a" is a Spark pipeline. A bench on a
    saturated host passes a longer `failover_millis`, so a slow heartbeat does not stop an agent mid-run.
    """
    first_stack = StreamStack(moto, limits, shards, prefix="beside-a", failover_millis=failover_millis)
    second_stack = StreamStack(moto, limits, 1, prefix="beside-b", stream_name=first_stack.app,
                               failover_millis=failover_millis)
    first: Application = (PlainApplication(first_stack, "a-1", read_limits) if spark is None
                          else SparkApplication(first_stack, "a-1", spark, workdir or Path("/tmp")))
    apps: dict[str, Application] = {"a": first, "b": PlainApplication(second_stack, "b-1", read_limits)}
    try:
        for app in apps.values():
            app.start()
        for name, app in apps.items():
            wait_for(app.ready, 90, f"application {name} owns every lease")
        kinesis = make_client("kinesis", "us-east-1", limits.endpoint_url)
        kinesis.put_record(StreamName=first_stack.app, Data=WARM_UP, PartitionKey="warm-up")
        for name, app in apps.items():  # a Spark query's first batch starts its Python workers: seconds under load
            wait_for(functools.partial(_delivered, app, 1), 90, f"application {name} read the warm-up record")
        time.sleep(1.5)  # both caught up
        before = {name: app.reads() for name, app in apps.items()}
        counts_before = _stream_counts(limits, first_stack.app)
        started, wall_started = time.monotonic(), time.time()
        written = _produce(kinesis, first_stack.app, rate, size, seconds)
        window = time.monotonic() - started
        after = {name: app.reads() for name, app in apps.items()}
        counts_after = _stream_counts(limits, first_stack.app)
        drains = {name: wait_for(functools.partial(_delivered, app, written + 1), 30,
                                 f"application {name} delivered all {written} records")
                  for name, app in apps.items()}
        timing = first.batch_timing(wall_started) if isinstance(first, SparkApplication) else None
    finally:
        for app in apps.values():
            app.stop()

    def delta(metric: str) -> int:
        return counts_after.get(metric, 0) - counts_before.get(metric, 0)

    figures = {name: AppFigures((after[name][0] - before[name][0]) / shards / window,
                                after[name][1] - before[name][1], drains[name]) for name in apps}
    return TwoConsumers(figures, written, window, delta("GetRecords.Success"),
                        delta("ReadProvisionedThroughputExceeded"), delta("WriteProvisionedThroughputExceeded"),
                        delta("GetShardIterator.Success"), timing)
