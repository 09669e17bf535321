"""The Spark pipeline's ceiling against a bare boto3 reader's, on the same stack, with and without the limits proxy.

    python -m bench.ceiling                                   # 8 shards, 2 Spark agents, steps of 15 s
    python -m bench.ceiling --rates 1000,2000,4000,8000,12000 --step-seconds 20 --modes limits

Per mode (`plain`: kinesalite as is; `limits`: the Kinesis limits proxy, services/emulators/limits_proxy.py, in
front of it) the bench makes a fresh `--shards` stream for each reader on the same moto server, kinesalite and
coordinator settings, then ramps a producer process (records of `--size` bytes, resending only what Kinesis refused)
through `--rates` (records/s, `--step-seconds` each) until the reader's lag grows, first for the bare reader, then
for the Spark pipeline:
* bare: bench/spark_pipeline.py's `bare_consume` (one process, a boto3 client and a thread per shard from LATEST,
  every record parsed, a shard's calls at least 0.25 s apart, throttled calls made again after a jittered wait);
* spark: two SparkAgents (user defaults: caps, pacing, 1 s trigger) splitting the shards by lease count, each
  running its query on one local[2] session, each batch in its share of the slots (one task: the stack's drivers
  run local[1]), a sink of one action per batch reading every row's data (`--sink`:
  Spark's noop writer with the rows observed, one stage, or the earlier global aggregation, two); a query that
  fails to start on a loaded host (Spark's fixed 10 s for its source runner) is started again before the ramp.
The two readers run one after the other, never together, so neither takes CPU from the other. The coordinator (in
this process) and the agents run at their deployed intervals; `--cadence test` gives them the tests' short ones (the
bench's only setting before session 23), `--jvm full` starts the driver's JVM with full compilation (the session
stops at C1 for a fast start), and `--count-store` prints the ramp's store calls by kind (every process's store
metered: shared/store_meter.py).
A step "holds" when the producer wrote at least 90 % of its rate and the lag (records written, not yet read),
sampled every 0.25 s after the step's first `--settle` seconds, grew by at most 10 % of the rate (least-squares
slope: a steady lag is the reader's latency, a growing one a reader that cannot keep up); the ceiling is the last
step that held before the first that did not, and the bench says why the ramp ended. Behind the proxy each shard
takes at most 1,000 records/s of writes, so past `shards x 1000` records/s the ramp ends at the write limit (the
producer falls short), whatever the reader.
Printed: each step (rate, written/s, read/s, lag, load average; behind the proxy, GetRecords calls per shard per
second of every caller), behind the proxy the ramp's payload read per payload written, each Spark driver's batches
before the ramp (its query's first batch: start-up, 10-25 s on a loaded host) apart from its last ramp batches
(median and longest seconds, median rows, Spark's phases), then the table of ceilings and Spark/bare ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ConnectionError as EndpointUnreachable
from botocore.exceptions import HTTPClientError

from bench.spark_pipeline import bare_consume
from bench.stack_cost import Totals, difference, read_meters
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.services.emulators.throttle_model import (
    GET_RECORDS,
    GET_RECORDS_BYTES,
    GET_RECORDS_RECORDS,
    INCOMING_BYTES,
    READ_THROTTLED,
    WRITE_THROTTLED,
)
from shardherd.shared.aws import make_client
from shardherd.shared.config import Settings
from shardherd.shared.store_meter import DUMP_SECONDS
from tests.support.fast_settings import FAST_SETTINGS
from tests.support.stream_stack import StreamStack

# The stack's intervals (leader runs, discovery, leader lock, shard sync) as `shardherd up` runs them: the tests'
# short ones (tests/support/fast_settings.py) make the coordinator, which runs in this process beside the Spark
# drivers' Python, scan several times a second; `--cadence test` keeps them.
DEPLOYED_CADENCE: dict[str, Any] = {name: Settings.model_fields[name].default for name in FAST_SETTINGS}
FULL_JIT = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}  # `--jvm full`: C2 as well, not only C1
HOLD_SHARE = 0.9  # a step holds only if the producer wrote this share of its rate
GROWTH_SHARE = 0.1  # and its lag grew by at most this share of the rate (a batch's sawtooth averages out)
SAMPLE_SECONDS = 0.25


@dataclass(frozen=True)
class Step:
    """One step of a ramp: the rate asked, what was written and read per second in it, and its lag after settling.

    `lag` is the mean of the samples taken after the step settled (records written, not yet read), `growth` the
    least-squares slope of those samples (records/s): a reader's latency holds a steady lag; only a reader that
    cannot keep up makes it grow.
    """

    rate: float
    written: float
    read: float
    lag: float
    growth: float
    load: float  # 1-minute load average at the step's end
    write_throttled: int = 0  # records the limits proxy refused in the step (0 without it)
    calls_per_shard: float = 0.0  # GetRecords calls answered per shard per second in the step, all callers (proxy)


def slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (time, value) samples; 0 for fewer than two distinct times."""
    if len(samples) < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_v = sum(v for _, v in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread if spread else 0.0


def verdict(step: Step) -> str | None:
    """Why `step` did not hold (the producer fell short, or the lag grew), or None if it held."""
    if step.written < HOLD_SHARE * step.rate:
        limit = f", {step.write_throttled} records refused by the write limit" if step.write_throttled else ""
        return f"producer wrote {step.written:,.0f}/s of {step.rate:,.0f}/s{limit}"
    if step.growth > GROWTH_SHARE * step.rate:
        return f"lag grew {step.growth:,.0f}/s"
    return None


def ceiling(steps: list[Step]) -> tuple[float, str]:
    """The highest rate held before the first step that did not hold, and why the ramp ended there."""
    held = 0.0
    for step in steps:
        why = verdict(step)
        if why is not None:
            return held, f"at {step.rate:,.0f}/s: {why}"
        held = step.rate
    return held, "every step held"


def produce_at(endpoint: str, stream: str, size: int, rate: Any, written: Any, ready: Any, halt: Any) -> None:
    """Producer process: put `rate.value` records/s (read each tick) until `halt`; `written` counts accepted ones.

    Records Kinesis refused (the write limit, behind the proxy) are put again before new ones, never twice; a put
    whose connection dropped is made again (kinesalite may have stored some of it: a few records read twice).
    `ready` is set once its client exists (a spawned process takes seconds to import on a loaded host).
    """
    client = make_client("kinesis", "us-east-1", endpoint)
    ready.set()
    payload = b"x" * size
    pending: list[dict[str, Any]] = []
    serial, owed, last = 0, 0.0, time.monotonic()
    while not halt.is_set():
        now = time.monotonic()
        owed = min(owed + rate.value * (now - last), 2 * rate.value + 500)  # no burst past 2 s after a stall
        last = now
        due = int(owed) - len(pending)
        if due > 0:
            pending += [{"Data": payload, "PartitionKey": f"p{serial + index}"} for index in range(due)]
            serial += due
        if not pending:
            time.sleep(0.01)
            continue
        batch = pending[:500]
        try:
            answer = client.put_records(StreamName=stream, Records=batch)
        except (EndpointUnreachable, HTTPClientError):  # an emulator on a saturated host resets some connections
            time.sleep(0.1)
            continue
        pending = pending[500:]
        refused = [entry for entry, result in zip(batch, answer["Records"], strict=True) if "ErrorCode" in result]
        accepted = len(batch) - len(refused)
        written.value += accepted
        owed -= accepted
        pending = refused + pending
        if refused:
            time.sleep(0.05)


class Ramp:
    """A producer process for one stream whose rate the caller steps; `written` is read from its shared counter."""

    def __init__(self, context: Any, endpoint: str, stream: str, size: int) -> None:
        self.rate = context.Value("d", 0.0)
        self.count = context.Value("q", 0)
        self.halt, ready = context.Event(), context.Event()
        self.process = context.Process(target=produce_at, args=(endpoint, stream, size, self.rate, self.count,
                                                                ready, self.halt), daemon=True)
        self.process.start()
        if not ready.wait(120):
            self.stop()
            raise RuntimeError("the producer process did not start in 120 s")

    def written(self) -> int:
        """Records accepted so far."""
        return int(self.count.value)

    def stop(self) -> None:
        """End the producer (killed if it does not end in 10 s)."""
        self.halt.set()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


def run_ramp(ramp: Ramp, read: Callable[[], int], rates: list[float], step_seconds: float, settle: float,
             counts: Callable[[], Counter[str]], shards: int = 1) -> list[Step]:
    """Step the producer through `rates` until a step does not hold; `read()` is the reader's records so far.

    The lag is sampled every SAMPLE_SECONDS after the first `settle` seconds of a step; `counts()` are the limits
    proxy's counts of the stream (`proxy_counts`), over `shards` shards.
    """
    steps: list[Step] = []
    for rate in rates:
        ramp.rate.value = rate
        begun, written, done, before = time.monotonic(), ramp.written(), read(), counts()
        samples: list[tuple[float, float]] = []
        while (now := time.monotonic()) - begun < step_seconds:
            if now - begun >= settle:
                samples.append((now, ramp.written() - read()))
            time.sleep(SAMPLE_SECONDS)
        seconds, during = time.monotonic() - begun, counts() - before
        step = Step(rate, (ramp.written() - written) / seconds, (read() - done) / seconds,
                    sum(lag for _, lag in samples) / max(1, len(samples)), slope(samples), os.getloadavg()[0],
                    during[WRITE_THROTTLED], during[GET_RECORDS] / shards / seconds)
        steps.append(step)
        print(f"  {rate:>7,.0f}/s  written {step.written:>8,.0f}/s  read {step.read:>8,.0f}/s  "
              f"lag {step.lag / rate:5.2f} s of production, growing {step.growth:>7,.0f}/s  load {step.load:.1f}  "
              f"GetRecords/shard/s {step.calls_per_shard:.2f}  {verdict(step) or 'held'}", flush=True)
        if verdict(step) is not None:
            break
    return steps


@dataclass
class Counted:
    """Records a reader delivered so far (its own thread or callback adds)."""

    records: int = 0
    throttled: int = 0
    batches: int = 0  # Spark batches that wrote rows (all drivers)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, records: int = 0, throttled: int = 0, batches: int = 0) -> None:
        with self.lock:
            self.records += records
            self.throttled += throttled
            self.batches += batches

    def total(self) -> int:
        with self.lock:
            return self.records


@contextlib.contextmanager
def bare_reader(context: Any, endpoint: str, stream: str) -> Iterator[Counted]:
    """The bare boto3 reader process on `stream`, its reports summed into a Counted."""
    counted = Counted()
    reports, halt = context.Queue(), context.Event()
    process = context.Process(target=bare_consume, args=(endpoint, stream, reports, halt), daemon=True)
    process.start()
    try:
        if reports.get(timeout=60)[0] != "ready":
            raise RuntimeError("the bare reader did not start")
        time.sleep(1.0)  # its LATEST iterators exist before the first record is put

        def drain() -> None:
            while not halt.is_set():
                with contextlib.suppress(queue.Empty):
                    at, records, _size, _samples = reports.get(timeout=0.2)
                    counted.add(throttled=records) if at == "throttled" else counted.add(records=records)

        threading.Thread(target=drain, daemon=True).start()
        yield counted
    finally:
        halt.set()
        process.join(5)
        if process.is_alive():
            process.kill()


SINKS = ("noop", "aggregate")


def counting_sink(counted: Counted, took: dict[int, float] | None = None, sink: str = "noop") -> Any:
    """A foreachBatch function of one action reading every row's data; it adds the batch's rows to `counted`.

    `noop`: Spark's noop writer (every row of every column materialised, nothing stored) with the rows and the data's
    bytes observed on the way: one stage, as a sink that appends to a table or a topic runs. `aggregate`: a global
    count and sum of the data's lengths (the sink before session 24): a shuffle to one partition, so two stages, and
    the second waits for a free task slot (the other driver's reads hold both of local[2]'s) - the bench's cost, not
    the pipeline's. With `took`, each batch's action (the executors' reads and the sink's work) puts its seconds there
    by batch id.
    """
    if sink not in SINKS:
        raise ValueError(f"sink must be one of {SINKS}, got {sink!r}")

    def write(df: Any, batch_id: int) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        began = time.monotonic()
        measures = (F.count(F.lit(1)).alias("n"), F.sum(F.length("data")).alias("b"))
        if sink == "noop":
            observed = Observation(f"batch-{batch_id}")
            df.observe(observed, *measures).write.format("noop").mode("overwrite").save()
            rows = int(observed.get["n"])
        else:
            row = df.agg(*measures).first()
            rows = int(row["n"]) if row is not None else 0
        if took is not None:  # before the count: a reader of the count finds this batch's action there
            took[batch_id] = time.monotonic() - began
        counted.add(records=rows, batches=1 if rows else 0)

    return write


def split_at_ramp(progress: list[dict[str, Any]], first_ramp_batch: int) -> tuple[list[dict[str, Any]],
                                                                                   list[dict[str, Any]]]:
    """Spark progress entries with rows: those of the batches before `first_ramp_batch` (the query's start and its
    warm-up records), and the ramp's.

    A query's first batch starts its executors' Python workers and their clients (10-25 s on a loaded host): it is
    start-up, written before the ramp began, and summed with the ramp's batches it reads as a stall of the ramp.
    """
    with_rows = [item for item in progress if item["numInputRows"]]
    return ([item for item in with_rows if item["batchId"] < first_ramp_batch],
            [item for item in with_rows if item["batchId"] >= first_ramp_batch])


def median(values: list[float]) -> float:
    """The upper median (0 for none)."""
    return sorted(values)[len(values) // 2] if values else 0.0


def phase_medians(progress: list[dict[str, Any]]) -> str:
    """Median milliseconds of each durationMs phase of Spark's query progress entries, longest first."""
    phases = sorted({phase for item in progress for phase in item["durationMs"]})
    medians = {phase: median([float(item["durationMs"].get(phase, 0)) for item in progress]) for phase in phases}
    return ", ".join(f"{phase} {value:.0f}" for phase, value in sorted(medians.items(), key=lambda kv: -kv[1]))


class SparkReaders:
    """`agents` Spark drivers' agents with user defaults on one stream, each running its query on `spark`.

    On a loaded host a query's source runner may fail to connect back to the JVM within Spark's fixed 10 s; a
    driver whose query ended is started again under a new worker id (up to `ATTEMPTS` rounds), until warm-up
    records put on every shard were all written by the sinks. `counted` then starts from 0.
    """

    ATTEMPTS = 4
    WARM_UP = 200

    def __init__(self, stack: StreamStack, spark: Any, agents: int, workdir: Path, sink: str = "noop") -> None:
        self.stack, self.spark, self.workdir, self.sink = stack, spark, workdir, sink
        self.counted = Counted()
        self.running: dict[int, tuple[Any, Any]] = {}  # driver index -> (SparkAgent, StreamingQuery)
        self.actions: dict[int, dict[int, float]] = {}  # driver index -> batch id -> seconds of its sink action
        self.ramp_from: dict[int, int] = {}  # driver index -> its first batch after the warm-up was written
        self.agents = agents
        # The stack runs each driver on its own local[1] (services/local_stack/stack.py): a batch is one task. Two
        # drivers sharing this session's slots would each plan its default parallelism (all the slots) and queue
        # for the other's tasks: each gets its share instead.
        self.partitions = max(1, spark.sparkContext.defaultParallelism // agents)

    def _launch(self, index: int, attempt: int) -> None:
        from shardherd.agent.spark.driver import SparkAgent

        worker = f"{self.stack.app}-spark-{index}-{attempt}"
        agent = SparkAgent(self.stack.settings(worker), channel=self.workdir / f"channel-{worker}",
                           max_partitions=self.partitions)
        self.running[index] = (agent, None)
        self.actions[index] = {}
        self.running[index] = (agent, agent.run_query(self.spark, counting_sink(self.counted, self.actions[index],
                                                                                self.sink),
                                                      str(self.workdir / f"checkpoint-{worker}")))

    def _all_active(self) -> bool:
        return all(query.isActive for _, query in self.running.values())

    def start(self) -> Counted:
        """Start the drivers, again where a query ended, until the warm-up records were written."""
        self.stack.produce(self.WARM_UP, "warm-up")
        for attempt in range(self.ATTEMPTS):
            for index in range(self.agents):
                if index not in self.running or not self.running[index][1].isActive:
                    if index in self.running:
                        self.running[index][0].stop(drain=False)
                    self._launch(index, attempt)
            deadline = time.monotonic() + 180
            while self._all_active() and self.counted.total() < self.WARM_UP and time.monotonic() < deadline:
                time.sleep(0.5)
            if self._all_active() and self.counted.total() >= self.WARM_UP:
                with self.counted.lock:
                    self.counted.records -= self.WARM_UP
                self.ramp_from = {index: max(self.actions[index], default=-1) + 1 for index in self.running}
                return self.counted
            print(f"  a Spark query ended or wrote nothing in 180 s (round {attempt + 1}); again", flush=True)
        raise RuntimeError(f"the Spark queries did not write the warm-up records in {self.ATTEMPTS} rounds")

    def stop(self) -> None:
        """Print each query's start-up batches, then its last ramp batches with records; stop all.

        Per driver: the batches written before the ramp (the query's first batch starts its executors' Python workers:
        start-up, not the ramp's), then the ramp's last 30 batches with records (seconds, rows, Spark's phases, the
        sink's action). The phases are the medians of Spark's progress `durationMs` (ms); `addBatch` is the sink: its
        action (the executors' reads and the sink's work, timed by the sink) plus the agent's commit of the batch.
        """
        for index, (agent, query) in sorted(self.running.items()):
            actions = self.actions[index]
            start_up, ramp = split_at_ramp(query.recentProgress, self.ramp_from.get(index, 0))
            for item in start_up:
                print(f"  driver {index}: batch {item['batchId']} before the ramp (query start, warm-up): "
                      f"{item['durationMs']['triggerExecution'] / 1000:.2f} s, {item['numInputRows']} rows; phases "
                      f"(ms) {phase_medians([item])}; sink action {1000 * actions.get(item['batchId'], 0.0):.0f}",
                      flush=True)
            batches = ramp[-30:]
            if batches:
                took = [item["durationMs"]["triggerExecution"] / 1000 for item in batches]
                rows = [float(item["numInputRows"]) for item in batches]
                sink = [actions[item["batchId"]] for item in batches if item["batchId"] in actions]
                print(f"  driver {index}: last {len(batches)} ramp batches with records: median {median(took):.2f} s"
                      f", longest {max(took):.2f} s, median {median(rows):.0f} rows; phases (median ms) "
                      f"{phase_medians(batches)}; sink action {1000 * median(sink):.0f}", flush=True)
            agent.stop(drain=False)


@contextlib.contextmanager
def spark_readers(stack: StreamStack, spark: Any, agents: int, workdir: Path, sink: str) -> Iterator[Counted]:
    """The Spark drivers of SparkReaders, started and warm, stopped on the way out."""
    readers = SparkReaders(stack, spark, agents, workdir, sink)
    try:
        yield readers.start()
    finally:
        readers.stop()


def proxy_counts(limits: KinesisLimits | None, stream: str) -> Callable[[], Counter[str]]:
    """The limits proxy's counts of `stream` so far, summed over its shards and callers (none without the proxy)."""

    def counts() -> Counter[str]:
        total: Counter[str] = Counter()
        if limits is not None:
            for key, shard in limits.counts()["shards"].items():
                if key.startswith(f"{stream}/"):
                    total.update({metric: int(value) for metric, value in shard.items()})
        return total

    return counts


def print_payload(counts: Counter[str]) -> None:
    """Payload read per payload written over a ramp, from the proxy's counts (records left unread lower it)."""
    if counts[INCOMING_BYTES]:
        ratio = counts[GET_RECORDS_BYTES] / counts[INCOMING_BYTES]
        print(f"  payload read per payload written over the ramp: {ratio:.3f}"
              f" ({counts[GET_RECORDS_RECORDS]:,} records read, {counts[GET_RECORDS]:,} GetRecords calls, "
              f"{counts[READ_THROTTLED]} throttled)", flush=True)


TABLE_KINDS = (("-CoordinatorState", "state"), ("-WorkerMetricStats", "workers"), ("owner-index", "owner-index"))


def store_calls(window: Totals) -> Counter[str]:
    """Requests of a meter window by `caller table operation`, a coordinator-state key by its prefix.

    `executor state get spark-end` counts the executors' reads of batch ends (agent/spark/batch_ends.py), whatever
    the hold; the lease table is `leases`.
    """
    counts: Counter[str] = Counter()
    for (caller, operation), (requests, _, _) in window.items():
        table, _, call = operation.partition(":")
        kind = next((name for suffix, name in TABLE_KINDS if table.endswith(suffix)), "leases")
        verb, _, key = call.partition(" ")
        counts[f"{caller} {kind} {verb} {key.split('/', 1)[0]}".rstrip()] += round(requests)
    return +counts


def print_store_calls(counts: Counter[str], seconds: float, batches: int) -> None:
    """The ramp's store calls by kind (`store_calls`): per second, and per Spark batch with rows."""
    total = sum(counts.values())
    print(f"  store calls in the ramp: {total:,} in {seconds:.0f} s ({total / seconds:.1f}/s), {batches} batches "
          f"with rows ({total / max(1, batches):.1f} per batch)", flush=True)
    for kind, count in counts.most_common():
        print(f"    {kind:<40} {count:>7,}  {count / seconds:6.1f}/s  {count / max(1, batches):6.2f} per batch",
              flush=True)


def measure_mode(moto: MotoServer, kinesis: Kinesalite | KinesisLimits, limits: KinesisLimits | None, spark: Any,
                 args: argparse.Namespace, workdir: Path) -> dict[str, tuple[float, str]]:
    """The bare reader's ramp, then the Spark pipeline's, each on a fresh stream; their ceilings and reasons.

    With `--count-store` every process of the stack (coordinator, drivers, executors) meters its store calls
    (shared/store_meter.py prices each call: work on every call, so a measurement of where calls go, not of the
    ceiling), printed per kind for each ramp.
    """
    context = mp.get_context("spawn")
    rates = [float(rate) for rate in args.rates.split(",")]
    results: dict[str, tuple[float, str]] = {}
    for reader in args.readers.split(","):
        with contextlib.ExitStack() as scope:
            meters = workdir / f"meter-{reader}-{time.monotonic_ns()}" if args.count_store else None
            overrides = dict(DEPLOYED_CADENCE) if args.cadence == "deployed" else {}
            if meters is not None:
                overrides["store_meter_dir"] = str(meters)
            stack = StreamStack(moto, kinesis, args.shards, prefix=f"ceiling-{reader}", failover_millis=10_000,
                                lease_assignment_strategy="lease-count", **overrides)
            scope.callback(stack.close)
            readers = (bare_reader(context, kinesis.endpoint_url, stack.app) if reader == "bare"
                       else spark_readers(stack, spark, args.agents, workdir, args.sink))
            with readers as counted:
                print(f" {reader}:", flush=True)
                ramp = Ramp(context, kinesis.endpoint_url, stack.app, args.size)
                began, batches = time.monotonic(), counted.batches
                before = read_meters(meters) if meters is not None else {}
                counts = proxy_counts(limits, stack.app)
                try:
                    steps = run_ramp(ramp, counted.total, rates, args.step_seconds, args.settle, counts, args.shards)
                finally:
                    ramp.stop()
                print_payload(counts())
                if meters is not None:
                    seconds, ramp_batches = time.monotonic() - began, counted.batches - batches
                    time.sleep(DUMP_SECONDS + 1)  # every meter has written its report since the ramp ended
                    print_store_calls(store_calls(difference(read_meters(meters), before)), seconds, ramp_batches)
                if counted.throttled:
                    print(f"  the bare reader was throttled {counted.throttled} times", flush=True)
            results[reader] = ceiling(steps)
    return results


def main() -> None:
    """Ramp both readers in each mode and print the ceilings and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--size", type=int, default=100, help="bytes per record")
    parser.add_argument("--rates", default="500,1000,1500,2000,3000,4000,6000,8000,10000",
                        help="records/s, one step each")
    parser.add_argument("--step-seconds", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of a step before its lag is sampled")
    parser.add_argument("--modes", default="plain,limits")
    parser.add_argument("--readers", default="bare,spark", help="bare, spark or both (in that order)")
    parser.add_argument("--cadence", choices=("deployed", "test"), default="deployed",
                        help="the coordinator's and agents' intervals: their defaults, or the tests' short ones")
    parser.add_argument("--jvm", choices=("fast-start", "full"), default="fast-start",
                        help="the driver JVM as agent/spark/session.py starts it (C1 only), or with full compilation")
    parser.add_argument("--sink", choices=SINKS, default="noop",
                        help="the Spark sink: one stage (noop writer, rows observed) or a global aggregation (two)")
    parser.add_argument("--count-store", action="store_true",
                        help="meter store calls by kind (costs CPU on every call: not for the ceiling itself)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from tests.support.stream_stack import local_spark

    workdir = Path(f"/tmp/bench-ceiling-{os.getpid()}")
    workdir.mkdir(parents=True, exist_ok=True)
    spark = local_spark("bench-ceiling", conf=FULL_JIT if args.jvm == "full" else None)
    table: dict[str, dict[str, tuple[float, str]]] = {}
    try:
        with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesalite:
            for mode in args.modes.split(","):
                print(f"{mode}: {args.shards} shards, {args.agents} Spark agents, {args.size} B records", flush=True)
                if mode == "limits":
                    with KinesisLimits(kinesalite.port) as limits:
                        table[mode] = measure_mode(moto, limits, limits, spark, args, workdir)
                else:
                    table[mode] = measure_mode(moto, kinesalite, None, spark, args, workdir)
    finally:
        spark.stop()
    print(f"{'mode':<7} {'bare rec/s':>10} {'spark rec/s':>11} {'spark/bare':>10}  why each ramp ended")
    for mode, result in table.items():
        (bare, bare_why), (spark_rate, spark_why) = result.get("bare", (0.0, "not run")), result.get(
            "spark", (0.0, "not run"))
        ratio = spark_rate / bare if bare else float("nan")
        print(f"{mode:<7} {bare:>10,.0f} {spark_rate:>11,.0f} {ratio:>10.2f}  bare {bare_why}; spark {spark_why}")


if __name__ == "__main__":
    main()
