"""One typed settings object for every process, from env vars (SHARDHERD_*) and an optional TOML file.

Names follow KCL's configuration names in snake case, with KCL's defaults, except where shardherd deliberately
differs (documented in docs/kcl-differences.md): the leader interval and leader-lock timings are much shorter so a
dead worker's or leader's shards move in seconds, not minutes.

Secrets (`api_token`, `sql_url`, which may carry a database password) are `SecretStr`: their repr and every error
message show `**********`, and code reads them with `.get_secret_value()` only where they are used. Other URL
settings must not carry a password at all (rejected without echoing it).
"""

from __future__ import annotations

import difflib
import math
import os
import socket
import tomllib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from shardherd.shared.dlq_url import parse_destination
from shardherd.shared.errors import ConfigError
from shardherd.shared.store import TableNames
from shardherd.shared.streams import ACCOUNT_PATTERN, STREAM_NAME_PATTERN

CONFIG_FILE_ENV = "SHARDHERD_CONFIG_FILE"
MIN_TOKEN_LENGTH = 16
_TABLE_NAME = r"^[A-Za-z0-9_.\-]{3,200}$"
# Upper bounds of duration settings: a typo such as 99999999999999999999 is a config error, not a stack that
# silently never assigns a shard. Generous enough for any real deployment.
MINUTE_MILLIS = 60_000
HOUR_MILLIS = 60 * MINUTE_MILLIS
DAY_MILLIS = 24 * HOUR_MILLIS


InitialPosition = Literal["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"]


class StreamSpec(BaseModel):
    """One stream of a multi-stream application (KCL 3.x's multi-stream mode: lease keys carry the stream).

    `account_id` and `creation_epoch` make up KCL's stream identifier `account:name:creationEpoch`; left out, the
    coordinator reads them from DescribeStreamSummary (the ARN's account, the creation timestamp in seconds), which
    is what KCL derives for a stream given by ARN. Set them to continue a KCL table written with other values.
    The initial position defaults to the application's `initial_position_in_stream` / `initial_timestamp`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=f"^{STREAM_NAME_PATTERN}$")
    account_id: str | None = Field(None, pattern=f"^{ACCOUNT_PATTERN}$")
    creation_epoch: int | None = Field(None, ge=0)
    initial_position: InitialPosition | None = None
    initial_timestamp: datetime | None = None


def default_worker_id() -> str:
    """`hostname:pid`, unique per process on a host and readable in the lease table."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of shardherd; validated on construction, with a ConfigError naming each bad value."""

    model_config = SettingsConfigDict(env_prefix="SHARDHERD_", extra="forbid", frozen=True)

    # Where things live.
    application_name: str = Field("shardherd", pattern=_TABLE_NAME)
    stream_name: str | None = Field(None, pattern=f"^{STREAM_NAME_PATTERN}$")
    # Multi-stream applications: several streams, lease keys `account:stream:creationEpoch:shardId` (exclusive
    # with stream_name, which keeps single-stream keys). Env: SHARDHERD_STREAMS as a JSON list of objects.
    streams: tuple[StreamSpec, ...] = ()
    region: str = "us-east-1"
    dynamodb_endpoint_url: str | None = None
    kinesis_endpoint_url: str | None = None
    store_backend: Literal["dynamodb", "sql"] = "dynamodb"
    # When set, every process prices its store calls in DynamoDB capacity units by caller and writes them as JSON
    # into this directory every few seconds (shared/store_meter.py; bench/stack_cost.py reads them).
    store_meter_dir: str | None = None
    sql_url: SecretStr = SecretStr("sqlite:///shardherd.db")
    lease_table_name: str | None = Field(None, pattern=_TABLE_NAME)
    billing_mode: Literal["PAY_PER_REQUEST", "PROVISIONED"] = "PAY_PER_REQUEST"
    initial_lease_table_read_capacity: int = Field(10, ge=1)
    initial_lease_table_write_capacity: int = Field(10, ge=1)
    worker_id: str = Field(default_factory=default_worker_id, min_length=1, max_length=256)

    # Liveness and failover.
    liveness_mode: Literal["worker", "lease"] = "worker"
    failover_time_millis: int = Field(10_000, ge=100, le=HOUR_MILLIS)
    epsilon_millis: int = Field(25, ge=0, le=MINUTE_MILLIS)
    heartbeat_interval_millis: int | None = Field(None, ge=10, le=HOUR_MILLIS)
    discovery_interval_millis: int = Field(1_000, ge=10, le=HOUR_MILLIS)
    # Owner-index polling while the coordinator tells the agent of changes (coordinator_url set and answering).
    discovery_fallback_interval_millis: int = Field(30_000, ge=10, le=HOUR_MILLIS)
    lease_assignment_interval_millis: int = Field(2_000, ge=10, le=HOUR_MILLIS)
    shard_sync_interval_millis: int = Field(10_000, ge=10, le=DAY_MILLIS)
    # The leader's full scans of both tables while every live worker listens on the coordinator channel and nothing
    # is pending (KCL's leader scans every 2 x failover); otherwise it scans every assignment interval. Decision 0010.
    leader_full_scan_interval_millis: int = Field(20_000, ge=10, le=DAY_MILLIS)
    leader_lock_lease_duration_millis: int = Field(6_000, ge=100, le=HOUR_MILLIS)
    leader_lock_heartbeat_period_millis: int = Field(1_500, ge=10, le=HOUR_MILLIS)
    leader_failure_threshold: int = Field(3, ge=1)
    # Fenced assignment writes the leader has in flight at once: each waits on one store round trip, so a cold start
    # placing 10,000 leases takes minutes one at a time. 8 keeps within the SQL backend's default pool (10) and the
    # lock item's transaction-conflict retries on DynamoDB; 1 writes one after another.
    leader_write_threads: int = Field(8, ge=1, le=64)
    # After releasing the lock for failed runs, the replica stays out of the election this long, so another replica
    # leads (one whose store and network may work); alone, it takes the lock back afterwards. 0: no stand-down.
    leader_stand_down_millis: int = Field(6_000, ge=0, le=HOUR_MILLIS)
    # The deadline of one store call (connect plus answer; retries come on top, each under its caller's deadline).
    # Unset: the smaller of the failover time and the leader lock's duration (6 s at the defaults; 1 s at least), so
    # a call
    # that hangs fails in time for the caller to act before its leases or the lock are taken from it.
    store_call_timeout_millis: int | None = Field(None, ge=100, le=HOUR_MILLIS)
    graceful_lease_handoff_enabled: bool = True
    # What an agent does on SIGTERM: `drain` hands its leases to other workers first; `restart` checkpoints, stops
    # reading and keeps them reserved for `restart_window_millis` for the process with the same worker id (decision
    # 0035, shared/restart.py).
    shutdown_mode: Literal["drain", "restart"] = "drain"
    restart_window_millis: int = Field(60_000, ge=1_000, le=HOUR_MILLIS)
    graceful_lease_handoff_timeout_millis: int = Field(30_000, ge=0, le=HOUR_MILLIS)
    consistent_reads: bool = False

    # Assignment.
    lease_assignment_strategy: Literal["variance", "lease-count"] = "variance"
    max_leases_for_worker: int = Field(2**31 - 1, ge=1)
    max_throughput_per_host_kbps: float = Field(math.inf, gt=0)
    dampening_percentage: int = Field(60, ge=1, le=100)
    rebalance_threshold_percentage: int = Field(10, ge=1, le=100)
    allow_throughput_overshoot: bool = True
    variance_balancing_frequency: int = Field(3, ge=1)
    worker_metrics_ema_alpha: float = Field(0.5, gt=0, le=1)
    rebalance_dead_band_percentage: float = Field(2.0, ge=0, le=100)
    rebalance_min_band_points: float = Field(2.0, ge=0, le=100)
    # A balancing move's receiver must end at least this much (and the dead-band) below the giver's value before the
    # move, so the next run cannot move the lease back (a donor's own step may be smaller: decision 0033).
    rebalance_min_gain_kbps: float = Field(0.5, ge=0)
    rebalance_min_gain_points: float = Field(2.0, ge=0, le=100)
    # Balancing acts on a worker's metric only as far from the average as each of its reports of this long showed it
    # (caught up to the load carried now): a few seconds of CPU spike move nothing (decision 0013). 0: the newest
    # report alone (KCL); with reports `worker_metrics_reporter_freq_millis` apart (lease mode) that is the same.
    rebalance_persistence_millis: int = Field(30_000, ge=0, le=HOUR_MILLIS)
    # Band balancing, when no worker is out of its metric's band: a worker far below the throughput band (a new or
    # idle one, by what it holds now) is filled on throughput (decisions 0014, 0046).
    rebalance_fill_on_throughput: bool = True
    allow_receiver_above_average: bool = True
    variance_balancing: Literal["band", "kcl"] = "band"

    # Desired workers for autoscalers (coordinator/scale_model.py, GET /v1/scale): the fleet's count at this share of
    # each worker's operating range; it rises once more were asked for over `scale_out_after_millis` and falls once
    # fewer were over `scale_in_after_millis`.
    scale_target_utilisation_percentage: int = Field(70, ge=1, le=100)
    scale_min_workers: int = Field(1, ge=1, le=100_000)
    scale_max_workers: int = Field(1_000, ge=1, le=100_000)
    scale_out_after_millis: int = Field(60_000, ge=0, le=HOUR_MILLIS)
    scale_in_after_millis: int = Field(300_000, ge=0, le=DAY_MILLIS)

    # Worker metrics.
    disable_worker_metrics: bool = False
    # Where the CPU source looks: the cgroup mount, and the ECS task metadata v4 endpoint (default: the
    # ECS_CONTAINER_METADATA_URI_V4 variable ECS sets). Tests point each worker at its own fixture.
    cgroup_root: str = "/sys/fs/cgroup"
    ecs_metadata_uri: str | None = None
    in_memory_worker_metrics_capture_frequency_millis: int = Field(1_000, ge=10, le=HOUR_MILLIS)
    worker_metrics_reporter_freq_millis: int = Field(30_000, ge=10, le=HOUR_MILLIS)
    no_of_persisted_metrics_per_worker_metrics: int = Field(10, ge=1, le=100)
    lease_throughput_window_millis: int = Field(30_000, ge=100, le=HOUR_MILLIS)
    stale_worker_metrics_entry_cleanup_seconds: int = Field(86_400, ge=60, le=30 * 86_400)

    # Operator API (served by every coordinator replica).
    api_host: str = "127.0.0.1"
    api_port: int = Field(8080, ge=0, le=65535)
    # Two credentials (docs/decisions/0021-api-credentials-and-load.md): the admin token (drain, undrain; reads too)
    # and the read token agents send (reads, the assignment channel); each at least MIN_TOKEN_LENGTH characters.
    api_token: SecretStr | None = None
    api_token_file: str | None = None
    api_read_token: SecretStr | None = None
    api_read_token_file: str | None = None
    api_protect_reads: bool = False
    # Where the other coordinator replicas reach this replica's API (e.g. http://<pod IP>:8080); default: the bound
    # address, which only works when `api_host` is an address they can reach (not 0.0.0.0).
    api_advertise_url: str | None = None
    # Agents: the coordinator replicas' API, one URL (e.g. a Service) or a comma-separated list of replicas; the
    # assignment watch asks the next one when a replica does not lead or does not answer.
    coordinator_url: str | None = None
    # How long a replica serves one snapshot of the tables to every request, page and scrape (the leader serves
    # its newest run's scans instead, whenever they are this fresh). 1 s keeps a dashboard's checkpoint ages within
    # 2 s of the truth (issue 33; 1.5 s left 2.3 s with the store write's and the request's own latency) at one scan
    # of both tables per refresh while a dashboard with a token is open; anonymous callers never cause a read (they
    # get the leader's view, up to a full-scan interval old). A caller finding the tables older than half of it is
    # served them while the supervised `api-refresh` thread reads new ones, so callers coming at least that often never
    # wait on a read (decision 0003).
    api_cache_millis: int = Field(1_000, ge=0, le=HOUR_MILLIS)

    # Agents (plain and Spark drivers): a small HTTP endpoint with /healthz (503 once a critical thread fails or
    # stalls, decision 0022) and /metrics (thread restarts, shards stuck on a failing batch). Off unless a port is
    # set (several agents share a host in the local stack); the Helm chart sets 8081 and host 0.0.0.0.
    agent_health_port: int | None = Field(None, ge=0, le=65535)
    agent_health_host: str = "127.0.0.1"

    # KPL de-aggregation: auto (the protobuf runtime's C decoder when installed, else pure Python) or python (force
    # the pure-Python decoder). agent/kpl_decoding.py; Spark executors get it with their partitions.
    kpl_decoder: Literal["auto", "python"] = "auto"

    # Poison records (docs/decisions/0031-operator-controls.md): failures of one batch before the shard worker bisects
    # it down to the record that fails; what happens to that record (block: the shard stays on it, the alert naming
    # it; quarantine: it is written to poison_destination, file:///dir or s3://bucket/prefix, then checkpointed past).
    poison_attempts: int = Field(3, ge=1, le=1000)
    poison_policy: Literal["block", "quarantine"] = "block"
    poison_destination: str | None = None
    s3_endpoint_url: str | None = None  # an S3 emulator (tests, the local stack)

    # Where a new stream is read from.
    initial_position_in_stream: InitialPosition = "TRIM_HORIZON"
    initial_timestamp: datetime | None = None

    @field_validator("api_token", "api_read_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"must have at least {MIN_TOKEN_LENGTH} characters")
        return value

    @field_validator("poison_destination")
    @classmethod
    def _destination_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_destination(value)  # BadDestination (a ValueError) names what a destination URL looks like
        return value

    @field_validator("dynamodb_endpoint_url", "kinesis_endpoint_url", "coordinator_url", "ecs_metadata_uri",
                     "api_advertise_url", "s3_endpoint_url")
    @classmethod
    def _no_password_in_url(cls, value: str | None) -> str | None:
        if value is not None and any(urlsplit(part.strip()).password is not None for part in value.split(",")):
            raise ValueError("must not carry a password (it would show in logs); use the service's own credentials")
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> Settings:
        problems: list[str] = []
        if self.initial_position_in_stream == "AT_TIMESTAMP" and self.initial_timestamp is None:
            problems.append("initial_timestamp is required when initial_position_in_stream is AT_TIMESTAMP")
        problems.extend(self._stream_problems())
        if self.effective_heartbeat_interval_millis >= self.failover_time_millis:
            problems.append(
                f"heartbeat_interval_millis ({self.effective_heartbeat_interval_millis}) must be shorter than "
                f"failover_time_millis ({self.failover_time_millis})"
            )
        if self.leader_lock_heartbeat_period_millis * 2 > self.leader_lock_lease_duration_millis:
            problems.append(
                "leader_lock_heartbeat_period_millis must be at most half of leader_lock_lease_duration_millis "
                f"(got {self.leader_lock_heartbeat_period_millis} and {self.leader_lock_lease_duration_millis})"
            )
        if 0 < self.leader_stand_down_millis < 2 * self.leader_lock_heartbeat_period_millis:
            problems.append(
                f"leader_stand_down_millis ({self.leader_stand_down_millis}) must be 0 or at least two "
                f"leader_lock_heartbeat_period_millis ({self.leader_lock_heartbeat_period_millis}): other replicas "
                "try to take the lock once per heartbeat period"
            )
        if self.scale_min_workers > self.scale_max_workers:
            problems.append(f"scale_min_workers ({self.scale_min_workers}) must be at most scale_max_workers "
                            f"({self.scale_max_workers})")
        if self.poison_policy == "quarantine" and self.poison_destination is None:
            problems.append("poison_policy quarantine needs a poison_destination (file:///dir or s3://bucket/prefix)")
        if self.store_backend == "sql" and not self.sql_url.get_secret_value():
            problems.append("sql_url is required when store_backend is sql")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _stream_problems(self) -> list[str]:
        problems = []
        if self.streams and self.stream_name is not None:
            problems.append("stream_name and streams are exclusive (one stream, or a multi-stream application)")
        names = [spec.name for spec in self.streams]
        if len(set(names)) != len(names):
            problems.append(f"streams names each stream once, got {names}")
        for spec in self.streams:
            if self.initial_position_for(spec.name)[0] == "AT_TIMESTAMP" and not self.initial_position_for(
                    spec.name)[1]:
                problems.append(f"stream {spec.name}: AT_TIMESTAMP needs an initial_timestamp")
        return problems

    @property
    def multi_stream(self) -> bool:
        """True for a multi-stream application (`streams` set): lease keys carry the stream identifier."""
        return bool(self.streams)

    @property
    def stream_names(self) -> tuple[str, ...]:
        """Every stream the application reads: the `streams` names, or `stream_name` alone."""
        if self.streams:
            return tuple(spec.name for spec in self.streams)
        return (self.stream_name,) if self.stream_name is not None else ()

    def initial_position_for(self, stream: str | None) -> tuple[InitialPosition, datetime | None]:
        """Where a new lease of `stream` starts: the stream's own position if it sets one, else the application's."""
        for spec in self.streams:
            if spec.name == stream and spec.initial_position is not None:
                return spec.initial_position, spec.initial_timestamp or self.initial_timestamp
        return self.initial_position_in_stream, self.initial_timestamp

    @property
    def coordinator_urls(self) -> tuple[str, ...]:
        """The coordinator replicas' API base URLs from `coordinator_url` (empty when unset)."""
        return tuple(part.strip() for part in (self.coordinator_url or "").split(",") if part.strip())

    @property
    def effective_heartbeat_interval_millis(self) -> int:
        """The renew/heartbeat period: configured, else `failover/3 - epsilon` (lease) or `2 x failover/5 - epsilon`.

        Lease renewals keep KCL's period, which Java KCL leaders in a mixed fleet judge by. A `worker`-mode heartbeat
        is judged only by shardherd's leader; the agent fences itself `failover - margin` after its last successful
        write whatever the period, so the longer period costs only how long a store outage may last unnoticed
        (failover - margin - period: 5.0 s instead of 5.7 s at the defaults) and saves a sixth of the heartbeat
        writes (docs/store-cost.md).
        """
        if self.heartbeat_interval_millis is not None:
            return self.heartbeat_interval_millis
        share = self.failover_time_millis // 3 if self.liveness_mode == "lease" else self.failover_time_millis * 2 // 5
        return max(10, share - self.epsilon_millis)

    @property
    def effective_store_call_timeout_millis(self) -> int:
        """One store call's deadline: configured, else min(failover time, leader lock duration), 1 s at least.

        The floor keeps very short test timings from failing calls a loaded host's emulator answers late.
        """
        if self.store_call_timeout_millis is not None:
            return self.store_call_timeout_millis
        return max(1000, min(self.failover_time_millis, self.leader_lock_lease_duration_millis))

    @property
    def effective_metrics_report_millis(self) -> int:
        """How often an agent closes a CPU interval into its `sts` history: every heartbeat in `worker` mode.

        The heartbeat rewrites the worker row every few seconds anyway, and the history holds a fixed number of
        values, so a figure per heartbeat costs no write and no byte more than one per reporter period
        (`worker_metrics_reporter_freq_millis`, 30 s, KCL's value), while the leader sees a move in its owners' CPU
        within seconds instead of a minute (decision 0011). `lease` mode keeps the reporter period: Java KCL leaders
        may read those rows and expect KCL's spacing of the history. An interval spans at least two CPU samples
        (`in_memory_worker_metrics_capture_frequency_millis`): one without a sample would be a failed report (-1).
        """
        report = self.worker_metrics_reporter_freq_millis
        if self.liveness_mode == "lease":
            return report
        two_samples = 2 * self.in_memory_worker_metrics_capture_frequency_millis
        return min(report, max(self.effective_heartbeat_interval_millis, two_samples))

    @property
    def table_names(self) -> TableNames:
        """The lease, worker-metrics and coordinator-state table names (KCL naming)."""
        base = TableNames.for_application(self.application_name)
        if self.lease_table_name:
            return TableNames(self.lease_table_name, base.worker_metrics, base.coordinator_state)
        return base

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Explicit arguments win over env vars, which win over the config file."""
        return (init_settings, env_settings, _TomlFileSource(settings_cls))


class _TomlFileSource(PydanticBaseSettingsSource):
    """Reads the TOML file named by SHARDHERD_CONFIG_FILE (a `[shardherd]` table or top-level keys)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get(CONFIG_FILE_ENV)
        return read_config_file(Path(path)) if path else {}


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML file, raising ConfigError if it is missing or not valid TOML."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    section = data.get("shardherd", data)
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [shardherd] must be a table")
    return section


SECRET_SETTINGS = frozenset({"api_token", "api_read_token", "sql_url"})
URL_SETTINGS = frozenset({"dynamodb_endpoint_url", "kinesis_endpoint_url", "coordinator_url", "ecs_metadata_uri",
                          "api_advertise_url", "s3_endpoint_url"})
ENV_PREFIX = "SHARDHERD_"
# SHARDHERD_* variables that are not settings, with who reads them: any other is a misspelling.
OTHER_VARIABLES = frozenset({
    CONFIG_FILE_ENV,  # this module: the TOML file
    "SHARDHERD_RUN_DIR",  # services/local_stack/state.py: the `shardherd up` run directory
    "SHARDHERD_UP_RECORDS_DIR",  # services/local_stack/processor.py: the stack's record-key files
    "SHARDHERD_TEST_LEDGER",  # tests/support/file_ledger.py: the test ledger of agent subprocesses
    "SHARDHERD_SCREENSHOT_DIR",  # tests/services/test_service.py: where the dashboard test keeps its screenshots
})


def _closest(name: str, known: list[str], prefix: str = "") -> str:
    """` (did you mean X?)` for the known name closest to `name` (compared without `prefix`), or nothing."""
    bare = {item.removeprefix(prefix): item for item in known}
    matches = difflib.get_close_matches(name.removeprefix(prefix), list(bare), n=1, cutoff=0.6)
    return f" (did you mean {bare[matches[0]]}?)" if matches else ""


def unknown_names(environ: Mapping[str, str], file_keys: list[str]) -> list[str]:
    """One line per SHARDHERD_* variable and config-file key that is no setting, with the closest name if any.

    An error rather than a warning: a misspelled timing or endpoint otherwise runs with the default, which is
    exactly what the user meant to change, and nothing in the running system shows it.
    """
    fields = sorted(Settings.model_fields)
    variables = sorted({ENV_PREFIX + name.upper() for name in fields} | OTHER_VARIABLES)
    lines = [f"{name}: not a shardherd variable{_closest(name.upper(), variables, ENV_PREFIX)}"
             for name in sorted(environ) if name.upper().startswith(ENV_PREFIX) and name.upper() not in variables]
    lines.extend(f"{_file_label()} key {key}: not a shardherd setting{_closest(key, fields)}"
                 for key in file_keys if key not in Settings.model_fields)
    return lines


def _file_label() -> str:
    return f"config file {os.environ.get(CONFIG_FILE_ENV)}"


def _where(field: str, overrides: dict[str, Any], file_keys: list[str]) -> str:
    """How the user wrote setting `field`: the argument, the SHARDHERD_* variable, or the config file's key."""
    if field in overrides or field not in Settings.model_fields:
        return field
    variable = ENV_PREFIX + field.upper()
    if any(name.upper() == variable for name in os.environ):
        return variable
    return f"{_file_label()} key {field}" if field in file_keys else field


def load_settings(**overrides: Any) -> Settings:
    """Build Settings from arguments, env and file; every invalid value and unknown name is in one ConfigError.

    Each problem names what the user wrote (the SHARDHERD_* variable, the file's key, or the argument). The message
    shows each bad value except secrets and URLs (which may hold a password): those are named only. The pydantic
    error is not chained, so a traceback does not print the values either.
    """
    path = os.environ.get(CONFIG_FILE_ENV)
    file_keys = list(read_config_file(Path(path))) if path else []
    lines = unknown_names(os.environ, file_keys)
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        lines.extend(_error_lines(exc, overrides, file_keys))
    if lines:
        raise ConfigError("invalid shardherd configuration:\n  " + "\n  ".join(lines))
    return settings


def _error_lines(exc: ValidationError, overrides: dict[str, Any], file_keys: list[str]) -> list[str]:
    lines = []
    for error in exc.errors():
        parts = [str(part) for part in error["loc"]]
        if error["type"] == "extra_forbidden" and parts and parts[0] in file_keys:
            continue  # an unknown file key: already named, with the closest setting
        where = ".".join([_where(parts[0], overrides, file_keys), *parts[1:]]) if parts else "settings"
        hidden = set(parts) & (SECRET_SETTINGS | URL_SETTINGS)
        shown = "value hidden" if hidden or not parts else f"got {error.get('input')!r}"
        lines.append(f"{where}: {error['msg']} ({shown})")
    return lines
