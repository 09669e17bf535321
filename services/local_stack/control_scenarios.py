"""`scenario pause` and `scenario rewind`: the operator controls of issue 34 on the running stack, timed and counted.

Plain agents (`up --no-spark`) write one key per delivered record (services/local_stack/processor.py), Spark agents
one Parquet row per delivered record (services/local_stack/pipeline.py, no de-duplication); these scenarios count
them per record against what the stream holds (read back from the emulator with arrival times), so "0 lost",
"delivered exactly once more" and "0 records while paused" are counted, not assumed. A Parquet file is counted once
it is in place (Spark writes it under `_temporary` and renames it when the batch's write completes).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shardherd.agent.kpl import BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_aggregate
from shardherd.coordinator.rewind_probe import unthrottled
from shardherd.services.local_stack.control import request
from shardherd.services.local_stack.pipeline import KEY
from shardherd.services.local_stack.processor import KEYS_SUFFIX
from shardherd.services.local_stack.scenarios import POLL_SECONDS, Outcome, ScenarioFailed, Scenarios
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import SHARD_END
from shardherd.shared.clock import SystemClock
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.lease import Lease
from shardherd.shared.store import TableNames

Key = tuple[str, str]  # (shard, "sequence sub-sequence") as the counting processor writes it


def sink_counts(directory: Path) -> Counter[Key]:
    """How often each record was delivered, over every agent's key files (or every Spark driver's Parquet files)."""
    counts: Counter[Key] = Counter()
    for path in directory.glob(f"*/*{KEYS_SUFFIX}"):
        shard = path.name.removesuffix(KEYS_SUFFIX)
        counts.update((shard, line) for line in path.read_text(encoding="ascii").splitlines() if line)
    for path in directory.glob("*/*.parquet"):
        counts.update(parquet_keys(path))
    return counts


def parquet_keys(path: Path) -> list[Key]:
    """The record keys of one Parquet file of the Spark pipeline, one per row (duplicates kept)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    table = pq.read_table(path, columns=KEY)
    columns = [table.column(name).to_pylist() for name in KEY]
    return [(shard, f"{sequence} {sub}") for shard, sequence, sub in zip(*columns, strict=True)]


def stream_keys(kinesis: Any, stream: str, shards: list[str]) -> dict[Key, float]:
    """Every user record the stream holds now in `shards`, with its arrival time (epoch seconds)."""
    keys: dict[Key, float] = {}
    for shard in shards:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard,
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            response = _get_records(kinesis, iterator)
            for record in response["Records"]:
                arrived = record["ApproximateArrivalTimestamp"].timestamp()
                for sub in range(_user_records(record["Data"])):
                    keys[(shard, f"{record['SequenceNumber']} {sub}")] = arrived
            iterator = response.get("NextShardIterator")
            if not response["Records"] and response.get("MillisBehindLatest", 0) == 0:
                break
    return keys


def _get_records(kinesis: Any, iterator: str) -> Any:
    """One GetRecords call, asked again while the shard's read limit (5/s, the agents' reads too) throttles it."""
    return unthrottled(lambda: kinesis.get_records(ShardIterator=iterator, Limit=10_000), SystemClock())


def _user_records(data: bytes) -> int:
    if not is_aggregate(data):
        return 1
    try:
        return len(decode_aggregate(data))
    except BrokenAggregate:
        return 1


class ControlScenarios:
    """Pause and rewind scenarios over the stack that `scenarios` acts on; `records` is the plain agents' output."""

    def __init__(self, scenarios: Scenarios, records: Path) -> None:
        self.base = scenarios
        self.say = scenarios.say
        self.records = records
        self.counting = records.is_dir()
        state = scenarios.state
        self._store = DynamoLeaseStore(make_client("dynamodb", state.region, state.dynamodb_endpoint_url),
                                       TableNames.for_application(state.application_name))

    def _client(self) -> OperatorClient:
        return OperatorClient(self.base.state.api_urls(), self.base.state.api_token(), timeout=60.0)

    def _call(self, path: str, **params: Any) -> Any:
        client = self._client()
        try:
            return client.call("POST", path, **params)
        except ApiError as exc:
            raise ScenarioFailed(f"{path}: {exc}") from exc
        finally:
            client.close()

    def _row(self, key: str) -> Lease:
        """The lease row as stored now (the API's view may be a scan old)."""
        row = self._store.get_lease(key)
        if row is None:
            raise ScenarioFailed(f"no lease {key}")
        return row

    def _wait(self, what: str, started: float, done: Any) -> float | None:
        while time.monotonic() - started < self.base.timeout:
            if done():
                elapsed = time.monotonic() - started
                self.say(f"{what} after {elapsed:.1f} s")
                return elapsed
            time.sleep(POLL_SECONDS)
        self.say(f"not {what} within {self.base.timeout:.0f} s")
        return None

    def _delivered(self, shard: str) -> int:
        return sum(count for (name, _), count in sink_counts(self.records).items() if name == shard)

    # ------------------------------------------------------------------ pause
    def pause(self, shard: str | None, chaos: bool) -> list[Outcome]:
        """Pause a shard, kill the leader and the owner (SIGKILL), check nothing is delivered, resume, count."""
        key = shard or sorted(lease["lease_key"] for lease in self.base.snapshot().unfinished)[0]
        self._call("/v1/pause", shard=[key], reason="scenario pause")
        started = time.monotonic()
        self.say(f"paused {key} (owner {self._row(key).actual_owner})")
        acknowledged = self._wait(f"{key}: its owner stopped and acknowledged", started,
                                  lambda: self._row(key).pause_acknowledged)
        outcomes = [Outcome(key, self._row(key).actual_owner, acknowledged)]
        frozen = self._delivered(key) if self.counting else 0
        if chaos:
            outcomes += self.base.kill_leader()
            owner = self._row(key).actual_owner
            request(self.base.state.control_socket, "kill", name=owner, signal="SIGKILL")
            killed = time.monotonic()
            self.say(f"killed {owner} (SIGKILL), the paused shard's owner")
            moved = self._wait(f"{key}: a new owner holds it, paused", killed,
                               lambda: self._row(key).actual_owner not in (None, owner)
                               and self._row(key).pause_acknowledged)
            outcomes.append(Outcome(key, self._row(key).actual_owner, moved))
        time.sleep(2.0)
        if self.counting:
            extra = self._delivered(key) - frozen
            self.say(f"{key} delivered {extra} records while paused ({time.monotonic() - started:.0f} s)")
            if extra:
                outcomes.append(Outcome(f"{key} delivered while paused", None, None))
        return outcomes + self._resume(key)

    def _resume(self, key: str) -> list[Outcome]:
        before = self._delivered(key) if self.counting else 0
        self._call("/v1/resume", shard=[key])
        started = time.monotonic()
        self.say(f"resumed {key}")
        first = self._wait(f"{key}: records delivered again", started,
                           lambda: not self.counting or self._delivered(key) > before)
        outcomes = [Outcome(f"{key} resumed", self._row(key).actual_owner, first)]
        if self.counting:
            time.sleep(3.0)
            lost = self._missing(key, str(self._row(key).checkpoint))
            self.say(f"{key}: {lost} records up to its checkpoint missing from the output")
            if lost:
                outcomes.append(Outcome(f"{key} lost records", None, None))
        return outcomes

    def _missing(self, key: str, checkpoint: str) -> int:
        """Records of the shard at or before its checkpoint that the output does not have."""
        upto = int(checkpoint.split("/")[0]) if checkpoint[:1].isdigit() else None
        held = sink_counts(self.records)
        kinesis = self.base._kinesis()
        shard = self._row(key).shard
        return sum(1 for record in stream_keys(kinesis, self.base.state.stream_name, [shard])
                   if (upto is None or int(record[1].split()[0]) <= upto) and not held[record])

    # ------------------------------------------------------------------ rewind
    def rewind(self, ago: float, shards: list[str]) -> list[Outcome]:
        """Rewind every shard (or `shards`) to `ago` s back; time each shard's redelivery and count every record.

        The shards watched and counted are the rewind's own rows: they include parents whose leases had been cleaned
        up and are created again (a time before a merge), which the lease table did not list when the command began;
        a shard left at SHARD_END (it ended before the time) has nothing to deliver again.
        """
        chosen = shards
        to = datetime.now(UTC) - timedelta(seconds=ago)
        watch = RedeliveryWatch(self.records) if self.counting else None
        before = watch.counts.copy() if watch is not None else Counter()
        asked = time.time()
        started = time.monotonic()
        if watch is not None:
            watch.start()
        try:
            record = self._call("/v1/rewind", to=to.isoformat(), shard=shards, who="scenario rewind")
            self.say(f"rewind {record['rewind_id']} to {to.isoformat(timespec='seconds')} {record['outcome']} "
                     f"after {time.monotonic() - started:.1f} s (planned {_since(record, 'planned_at')}, owners "
                     f"stopped {_since(record, 'stopped_at')}, rewritten and resumed {_since(record, 'finished_at')}):")
            for row in record["rows"]:
                self.say(f"  {row['shard']}: {row['before']} -> {row['after']} ({row['note']})")
            chosen = shards or sorted({row["shard"] for row in record["rows"] if row["after"] != str(SHARD_END)})
            if watch is None:
                return [Outcome("rewind", None, time.monotonic() - started)]
            self._wait("every shard delivers records again", started, lambda: set(chosen) <= watch.first.keys())
        finally:
            if watch is not None:
                watch.stop()
        outcomes = []
        for shard in chosen:
            seconds = watch.first[shard] - started if shard in watch.first else None
            self.say(f"{shard}: first record delivered again " + (f"{seconds:.1f} s after the command"
                                                                  if seconds is not None else "not seen"))
            outcomes.append(Outcome(shard, None, seconds))
        return outcomes + self._count_rewind(chosen, to.timestamp(), asked, before)

    def _count_rewind(self, shards: list[str], to: float, asked: float, before: Counter[Key]) -> list[Outcome]:
        """After catching up: records in [time, command) delivered exactly once more, none skipped, none thrice."""
        kinesis = self.base._kinesis()
        deadline = time.monotonic() + self.base.timeout
        while True:
            counts = RewindCounts.of(stream_keys(kinesis, self.base.state.stream_name, shards),
                                     before, sink_counts(self.records), to, asked)
            if not counts.short or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        self.say(f"records from the time to the command: {counts.window}; delivered exactly once more: "
                 f"{counts.once_more}; not again: {counts.short}; delivered twice or more again: {counts.thrice}; "
                 f"records before the time delivered again: {counts.earlier}; records never delivered: "
                 f"{counts.skipped}")
        bad = counts.short + counts.thrice + counts.skipped
        return [Outcome("rewind counts", None if bad else "ok", None if bad else 0.0)]


@dataclass(frozen=True, slots=True)
class RewindCounts:
    """How a rewind's records were delivered, from the stream's records and the sink's counts before and after."""

    window: int  # records that arrived from the time to the command, delivered before it
    once_more: int  # of them, delivered exactly once more
    short: int  # of them, not delivered again (yet)
    thrice: int  # records delivered before the command and twice or more since
    earlier: int  # records from before the time delivered again
    skipped: int  # records (older than a second before the command) never delivered at all

    @classmethod
    def of(cls, held: dict[Key, float], before: Counter[Key], after: Counter[Key], to: float,
           asked: float) -> RewindCounts:
        """Count: `held` maps each record in the stream to its arrival time (seconds)."""
        again = {k: after[k] - before[k] for k in held}  # deliveries since the command
        window = [again[k] for k, arrived in held.items() if to <= arrived < asked and before[k]]
        # Delivered twice or more again though it had been delivered before the command (a record still in flight
        # then is delivered once late and once by the rewind: not a third time).
        thrice = sum(1 for k, more in again.items() if more >= 2 and before[k])
        return cls(len(window), window.count(1), sum(1 for more in window if more < 1), thrice,
                   *_outside_the_window(held, again, after, to, asked))


def _outside_the_window(held: dict[Key, float], again: dict[Key, int], after: Counter[Key], to: float,
                        asked: float) -> tuple[int, int]:
    """Records from before the time delivered again, and records (older than a second) never delivered."""
    earlier = sum(1 for k, arrived in held.items() if arrived < to and again[k] > 0)
    skipped = sum(1 for k, arrived in held.items() if arrived < asked - 1 and not after[k])
    return earlier, skipped

class RedeliveryWatch:
    """Tails the agents' key files (or Parquet files) on a thread: when each shard first redelivers a record."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._offsets: dict[Path, int] = {}
        self.counts: Counter[Key] = Counter()
        self.first: dict[str, float] = {}  # shard -> monotonic time of its first redelivery
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redelivery-watch", daemon=True)
        self._read(record=False)

    def start(self) -> None:
        """Watch from now on."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the counts stay as read)."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._read(record=True)

    def _read(self, record: bool) -> None:
        for path in sorted(set(self._directory.glob("*/*.parquet")) - self._offsets.keys()):
            self._offsets[path] = 0  # read whole, once
            self._count(parquet_keys(path), record)
        for path in self._directory.glob(f"*/*{KEYS_SUFFIX}"):
            shard = path.name.removesuffix(KEYS_SUFFIX)
            with path.open("rb") as keys:
                keys.seek(self._offsets.get(path, 0))
                chunk = keys.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            self._count([(shard, line) for line in complete.decode("ascii").splitlines()], record)

    def _count(self, keys: list[Key], record: bool) -> None:
        for key in keys:
            if record and self.counts[key] and key[0] not in self.first:
                self.first[key[0]] = time.monotonic()
            self.counts[key] += 1


def _since(record: dict[str, Any], field: str) -> str:
    """A rewind record's phase time as seconds after its request."""
    value = record.get(field)
    return "-" if value is None else f"+{value - record['requested_at']:.1f} s"
