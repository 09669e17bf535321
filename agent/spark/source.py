"""The `shardherd` streaming source: plans each held shard with records waiting; executors read and fix each end.

Which process runs what (PySpark 4.x): `latestOffset`/`partitions`/`commit` run in a "streaming source runner"
process the JVM spawns, which shares nothing with the driver's agent, so the reader learns the held shards from the
channel (agent/spark/channel.py). `read` runs on executors and depends only on its partition and the end its first
read recorded in the store (agent/spark/batch_ends.py), so a replayed batch reads the same records. `__init__`
runs in several processes and therefore does nothing but keep the options.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow
from typing_extensions import override

from shardherd.agent.kpl import KPL_DECODERS
from shardherd.agent.spark.channel import Ack, Snapshot, read_snapshot, write_ack
from shardherd.agent.spark.offsets import DEFAULT_MAX_RECORDS_PER_SHARD, BatchOffset, Caps, InvalidOffset, ShardPlan
from shardherd.agent.spark.planning import group_plans, partitions_to_read, plan_next
from shardherd.agent.spark.schema import schema_ddl

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.types import StructType

    from shardherd.agent.spark.kinesis_raw import RawKinesis
    from shardherd.shared.store import LeaseStore

FORMAT = "shardherd"
FIRST_PROBE_WAIT_SECONDS = 1.0  # how long a plan may wait for shards on their way here and their first probe
FIRST_PROBE_POLL_SECONDS = 0.02
_N = TypeVar("_N", int, float)


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Where executors record each batch's end: the application's store (its coordinator-state table).

    A SQL store's URL is not an option (it may hold a password): executors take it from SHARDHERD_SQL_URL.
    `meter_dir` is the driver's `store_meter_dir`: set, executors price their store calls there too, as `executor`.
    """

    application: str = "shardherd"
    backend: str = "dynamodb"
    endpoint_url: str | None = None
    meter_dir: str | None = None

    @classmethod
    def parse(cls, lower: Mapping[str, str]) -> StoreOptions:
        """From the source's options (keys lower-cased), raising InvalidOffset for an unknown backend."""
        backend = lower.get("storebackend", "dynamodb")
        if backend not in ("dynamodb", "sql"):
            raise InvalidOffset(f"storeBackend must be dynamodb or sql, got {backend!r}")
        return cls(lower.get("application", "shardherd"), backend, lower.get("storeendpoint") or None,
                   lower.get("storemeterdir") or None)

    def open(self, region: str) -> LeaseStore:
        """The store, as the driver's agent opens it (executors only: it imports boto3 or SQLAlchemy)."""
        from shardherd.shared.config import load_settings
        from shardherd.shared.store_factory import open_store

        return open_store(load_settings(application_name=self.application, store_backend=self.backend, region=region,
                                        dynamodb_endpoint_url=self.endpoint_url,
                                        store_meter_dir=self.meter_dir),
                          caller="executor")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The source's options (all strings in Spark): channel directory, stream, endpoint, caps, read pacing.

    `read_ahead_after` (option `readAheadAfterMs`; unset: off) is the span of arrivals past which a read finds the
    pipeline behind and reads the next plan's first answer ahead (agent/spark/read_ahead.py); `run_query` sets it
    to 1.5 trigger intervals.
    """

    channel: Path
    stream_name: str
    region: str = "us-east-1"
    endpoint_url: str | None = None
    caps: Caps = field(default_factory=Caps)
    min_call_interval: float = 0.2
    include_reader: bool = False
    kpl_decoder: str = "auto"
    max_partitions: int | None = None
    store: StoreOptions = field(default_factory=lambda: StoreOptions())
    read_ahead_after: float | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate Spark options (case-insensitive keys), raising InvalidOffset naming the bad one."""
        lower = {key.lower(): value for key, value in options.items()}
        missing = [name for name in ("channel", "stream") if not lower.get(name)]
        if missing:
            raise InvalidOffset(f"the shardherd source needs option(s) {missing}; use SparkAgent.source_options()")
        try:
            caps = Caps(int(lower.get("maxrecordspershard", DEFAULT_MAX_RECORDS_PER_SHARD)),
                        _optional(lower, "maxbytespershard", int))
            interval = float(lower.get("mincallintervalms", "200")) / 1000
            partitions = _optional(lower, "maxpartitions", int)
            ahead = _optional(lower, "readaheadafterms", lambda text: float(text) / 1000)
        except ValueError as exc:
            raise InvalidOffset(f"bad numeric option: {exc}") from exc
        if not interval >= 0:
            raise InvalidOffset(f"minCallIntervalMs must be >= 0, got {lower['mincallintervalms']}")
        if partitions is not None and partitions < 1:
            raise InvalidOffset(f"maxPartitions must be >= 1, got {partitions}")
        if ahead is not None and not ahead > 0:
            raise InvalidOffset(f"readAheadAfterMs must be > 0, got {lower['readaheadafterms']}")
        decoder = lower.get("kpldecoder", "auto").lower()
        if decoder not in KPL_DECODERS:
            raise InvalidOffset(f"kplDecoder must be one of {list(KPL_DECODERS)}, got {decoder!r}")
        store = StoreOptions.parse(lower)
        return cls(Path(lower["channel"]), lower["stream"], lower.get("region", "us-east-1"),
                   lower.get("endpoint") or None, caps, interval,
                   lower.get("includereader", "false").lower() == "true", decoder, partitions, store, ahead)

    def to_options(self) -> dict[str, str]:
        """The options map to pass to `spark.readStream.format("shardherd").options(...)`."""
        options = {"channel": str(self.channel), "stream": self.stream_name, "region": self.region,
                   "maxRecordsPerShard": str(self.caps.max_records),
                   "minCallIntervalMs": str(round(self.min_call_interval * 1000)),
                   "includeReader": str(self.include_reader).lower(), "kplDecoder": self.kpl_decoder,
                   "application": self.store.application, "storeBackend": self.store.backend}
        if self.store.endpoint_url:
            options["storeEndpoint"] = self.store.endpoint_url
        if self.store.meter_dir:
            options["storeMeterDir"] = self.store.meter_dir
        if self.endpoint_url:
            options["endpoint"] = self.endpoint_url
        if self.caps.max_bytes is not None:
            options["maxBytesPerShard"] = str(self.caps.max_bytes)
        if self.max_partitions is not None:
            options["maxPartitions"] = str(self.max_partitions)
        if self.read_ahead_after is not None:
            options["readAheadAfterMs"] = str(round(self.read_ahead_after * 1000))
        return options


def _optional(lower: Mapping[str, str], key: str, convert: Callable[[str], _N]) -> _N | None:
    """Option `key` (lower case) converted, None if absent or empty."""
    text = lower.get(key)
    return convert(text) if text else None


class ShardPartition(InputPartition):
    """One read task of a batch: the plans of its shards (fixed first and last records) and where Kinesis is."""

    def __init__(self, plans: tuple[ShardPlan, ...], options: SourceOptions) -> None:
        super().__init__(",".join(plan.shard_id for plan in plans))
        self.plans = plans
        self.stream_name = options.stream_name
        self.region = options.region
        self.endpoint_url = options.endpoint_url
        self.min_call_interval = options.min_call_interval
        self.read_ahead_after = options.read_ahead_after
        self.include_reader = options.include_reader
        self.kpl_decoder = options.kpl_decoder
        self.store = options.store


_clients: dict[tuple[str, str | None], RawKinesis] = {}
_stores: dict[tuple[StoreOptions, str], LeaseStore] = {}
_clients_guard = threading.Lock()


def _client(region: str, endpoint_url: str | None) -> RawKinesis:
    """One Kinesis client per executor process and endpoint (creating one costs more than a small read)."""
    with _clients_guard:
        client = _clients.get((region, endpoint_url))
        if client is None:
            from shardherd.agent.spark.kinesis_raw import (
                RawKinesis,  # executors only: the runner never loads boto3 or pyarrow
            )

            client = RawKinesis(region, endpoint_url)
            _clients[(region, endpoint_url)] = client
        return client


def _store(options: StoreOptions, region: str) -> LeaseStore:
    """One store client per executor process and store."""
    with _clients_guard:
        store = _stores.get((options, region))
        if store is None:
            store = _stores[(options, region)] = options.open(region)
        return store


def read_partition(partition: ShardPartition) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of one partition: exactly the records its plans name (their recorded ends)."""
    from shardherd.agent.kpl_decoding import use
    from shardherd.agent.spark.arrow_read import read_plans

    use(partition.kpl_decoder)  # the driver's choice, in whichever executor process reads the partition
    return read_plans(_client(partition.region, partition.endpoint_url), _store(partition.store, partition.region),
                      partition.stream_name, partition.plans, partition.include_reader, partition.min_call_interval,
                      partition.read_ahead_after)


class ShardherdStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches from the agent's snapshot; offsets are plans (agent/spark/offsets.py), progress is elsewhere."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._until: float | None = None
        self._seen: set[str] = set()  # tenures of the last snapshot planned from: each hold is waited for once
        self._expected: frozenset[str] = frozenset()  # leases on their way here already waited for once
        self._run = uuid.uuid4().hex[:8]  # the plans' run if Spark's checkpoint is fresh (planning.plan_next)

    @override
    def initialOffset(self) -> dict[str, Any]:
        """Nothing planned yet (idempotent: Spark calls it twice)."""
        return BatchOffset().to_json()

    @override
    def getDefaultReadLimit(self) -> ReadLimit:
        """Admission control: at most `maxRecordsPerShard` records per shard per batch."""
        return ReadMaxRows(self._options.caps.max_records)

    @override
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next plan from the agent's snapshot, or `start` unchanged (no batch) when nothing waits."""
        snapshot = self._snapshot_probed()
        end = plan_next(BatchOffset.from_json(start), snapshot, self._caps(limit), self._until, self._run)
        if snapshot is not None:
            write_ack(self._options.channel, Ack(snapshot.version, os.getpid()))
        return end.to_json()

    def _snapshot_probed(self) -> Snapshot | None:
        """The agent's snapshot, once the shards on their way here arrived and were probed (at most a short wait).

        A shard the agent just took (a handoff or a failover) has no probed records yet, and a plan made now would
        leave it out: it would wait for the whole next micro-batch (1-2 s under load), the larger part of a handoff's
        gap. The agent probes a new shard at once, so the plan waits for that probe. Likewise a lease handed to this
        driver whose previous owner is finishing its last write (the snapshot's `incoming`) is released within a
        store round trip of that write's checkpoint: the plan waits for it too, instead of leaving it to the next
        trigger (half an interval on average). Both waits end after FIRST_PROBE_WAIT_SECONDS in all, and each hold
        and each incoming lease is waited for once (a shard whose probes keep failing, or a previous owner that takes
        long, never holds up later plans).
        """
        snapshot = read_snapshot(self._options.channel)
        deadline = time.monotonic() + FIRST_PROBE_WAIT_SECONDS
        while snapshot is not None and time.monotonic() < deadline and (
                snapshot.incoming - self._expected
                or any(view.unprobed and view.tenure not in self._seen for view in snapshot.shards.values())):
            time.sleep(FIRST_PROBE_POLL_SECONDS)
            snapshot = read_snapshot(self._options.channel)
        if snapshot is not None:
            self._seen = {view.tenure for view in snapshot.shards.values()}
            self._expected = snapshot.incoming
        return snapshot

    def _caps(self, limit: ReadLimit) -> Caps:
        caps = self._options.caps
        if isinstance(limit, ReadMaxRows):
            return Caps(limit.max_rows, caps.max_bytes)
        if isinstance(limit, ReadMaxBytes):
            return Caps(caps.max_records, limit.max_bytes)
        return caps

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The planned shards still held, each from no earlier than its lease checkpoint, in `maxPartitions` tasks.

        Without that option one partition per shard (planning.group_plans).
        """
        plans = partitions_to_read(BatchOffset.from_json(end), read_snapshot(self._options.channel))
        return [ShardPartition(group, self._options) for group in group_plans(plans, self._options.max_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one shard's plan (on an executor)."""
        if not isinstance(partition, ShardPartition):
            raise InvalidOffset(f"unexpected partition {partition!r}")
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress is checkpointed into the lease table by the driver after the sink write."""

    @override
    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: read only records that arrived before now, then let the query finish."""
        self._until = time.time()


class ShardherdDataSource(DataSource):
    """`spark.readStream.format("shardherd")`: the shards the driver's agent holds, as a stream of rows."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> str:
        """The documented row schema (agent/spark/schema.py)."""
        return schema_ddl(SourceOptions.parse(self.options).include_reader)

    @override
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A stream reader over the options (cheap: it runs in several processes)."""
        return ShardherdStreamReader(SourceOptions.parse(self.options))
