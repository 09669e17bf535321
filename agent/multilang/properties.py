"""The MultiLangDaemon's `.properties` file as shardherd settings, processor command and read limits.

Invariants: every key of the file is either mapped (to a setting, a read limit or a protocol option), ignored with a
logged reason (it tunes something shardherd does differently or not at all, and ignoring it loses nothing), or
refused: an unknown or unsupported key is a ConfigError naming each such key and why, never silently dropped. Values
are checked here or by Settings (load_settings), so a bad value is an error before anything starts.

The file format is java.util.Properties' (the daemon loads it with that class): `key = value`, `key: value` or
`key value`, `#` and `!` comments, a trailing backslash continues the line, backslash escapes.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shardherd.shared.errors import ConfigError

log = logging.getLogger(__name__)

# Credential provider names the daemon accepts (AWS SDK v1 and v2 names) that boto3's default chain covers: it looks
# at the environment, web identity tokens, the shared config/credentials files, the container and instance metadata.
CHAIN_PROVIDERS = frozenset({
    "DefaultCredentialsProvider", "DefaultAWSCredentialsProviderChain", "EnvironmentVariableCredentialsProvider",
    "EnvironmentVariableCredentialsProviderV1", "InstanceProfileCredentialsProvider",
    "ContainerCredentialsProvider", "EC2ContainerCredentialsProviderWrapper", "WebIdentityTokenFileCredentialsProvider",
    "WebIdentityTokenCredentialsProvider", "ProfileCredentialsProvider",
})
CREDENTIAL_KEYS = ("awscredentialsprovider", "awscredentialsproviderdynamodb", "awscredentialsprovidercloudwatch")

# Keys that map one to one onto a shardherd setting (same meaning, same unit).
SETTINGS_KEYS: dict[str, str] = {
    "applicationName": "application_name",
    "tableName": "lease_table_name",
    "workerId": "worker_id",
    "workerIdentifier": "worker_id",
    "regionName": "region",
    "kinesisEndpoint": "kinesis_endpoint_url",
    "dynamoDBEndpoint": "dynamodb_endpoint_url",
    "failoverTimeMillis": "failover_time_millis",
    "shardSyncIntervalMillis": "shard_sync_interval_millis",
    "maxLeasesForWorker": "max_leases_for_worker",
    "initialLeaseTableReadCapacity": "initial_lease_table_read_capacity",
    "initialLeaseTableWriteCapacity": "initial_lease_table_write_capacity",
    "leaseAssignmentIntervalMillis": "lease_assignment_interval_millis",
    "gracefulLeaseHandoffTimeoutMillis": "graceful_lease_handoff_timeout_millis",
    "isGracefulLeaseHandoffEnabled": "graceful_lease_handoff_enabled",
    "inMemoryWorkerMetricsCaptureFrequencyMillis": "in_memory_worker_metrics_capture_frequency_millis",
    "workerMetricsReporterFreqInMillis": "worker_metrics_reporter_freq_millis",
    "noOfPersistedMetricsPerWorkerMetrics": "no_of_persisted_metrics_per_worker_metrics",
    "disableWorkerMetrics": "disable_worker_metrics",
    "maxThroughputPerHostKBps": "max_throughput_per_host_kbps",
    "dampeningPercentage": "dampening_percentage",
    "reBalanceThresholdPercentage": "rebalance_threshold_percentage",
    "allowThroughputOvershoot": "allow_throughput_overshoot",
    "varianceBalancingFrequency": "variance_balancing_frequency",
    "workerMetricsEMAAlpha": "worker_metrics_ema_alpha",
}

# Keys accepted and not acted on, with the reason (logged once at start).
IGNORED_KEYS: dict[str, str] = {
    "processingLanguage": "only part of the daemon's user agent",
    "maxActiveThreads": "shardherd runs one thread per held shard",
    "metricsLevel": "shardherd publishes no CloudWatch metrics (it serves Prometheus metrics on its operator API)",
    "metricsBufferTimeMillis": "no CloudWatch metrics", "metricsMaxQueueSize": "no CloudWatch metrics",
    "metricsEnabledDimensions": "no CloudWatch metrics", "cloudWatchRegionName": "no CloudWatch metrics",
    "taskBackoffTimeMillis": "shardherd backs off 1 s, doubling to 30 s, after a failed shard attempt",
    "validateSequenceNumberBeforeCheckpointing": "checkpoints are always checked against the records delivered",
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "the coordinator's shard sync runs on its own schedule",
    "cleanupLeasesUponShardCompletion": "finished leases are always cleaned up as KCL does by default",
    "parentShardPollIntervalMillis": "children start when the leader sees their parents' SHARD_END checkpoints",
    "maxLeaseRenewalThreads": "one heartbeat thread renews every lease",
    "maxLeasesToStealAtOneTime": "the leader balances leases (KCL 3.x's assignment, not lease stealing)",
    "listShardsBackoffTimeInMillis": "shard listing retries with shardherd's own backoff",
    "maxListShardsRetryAttempts": "shard listing retries with shardherd's own backoff",
    "schedulerInitializationBackoffTimeMillis": "no scheduler initialisation step",
    "logWarningForTaskAfterMillis": "the operator API reports each shard's progress instead",
    "clientVersionConfig": "shardherd writes KCL 3.x's tables (no 2.x compatibility mode)",
    "retrievalMode": "polling is the only retrieval (POLLING/DEFAULT accepted; FANOUT is refused)",
}

# Keys refused, with the reason.
UNSUPPORTED_KEYS: dict[str, str] = {
    "dynamoDBRegionName": "shardherd uses regionName for both Kinesis and DynamoDB",
    "shardPrioritization": "the leader decides which worker takes which shard",
    "ignoreUnexpectedChildShards": "unexpected child shards are always handled as KCL's default does",
    "consumerArn": "enhanced fan-out is not supported (polling only)",
    "consumerName": "enhanced fan-out is not supported (polling only)",
    "streamArns": "use shardherd's multi-stream settings (SHARDHERD_STREAMS)",
}

# KCL 3.x's own table options (names, billing, tags...): shardherd names and creates these tables itself.
TABLE_OPTION_PREFIXES = ("coordinatorState", "workerMetrics")
TABLE_OPTIONS_REASON = ("shardherd creates and names <applicationName>-CoordinatorState and "
                        "<applicationName>-WorkerMetricStats itself (on demand billing)")

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_SEPARATOR = re.compile(r"(?<!\\)(\s*[=:]\s*|\s+)")
_ARN = re.compile(r"^arn:[\w-]+:kinesis:[\w-]+:(\d{12}):stream/([A-Za-z0-9_.\-]{1,128})$")


@dataclass
class MultiLangConfig:
    """What a properties file asks for: the processor command, shardherd settings, read limits, protocol options."""

    command: tuple[str, ...]
    settings: dict[str, Any]
    workdir: Path
    records_per_call: int | None = None
    idle_between_reads: float | None = None  # seconds
    call_process_records_for_empty: bool = False
    shutdown_grace_millis: int | None = None
    timeout_seconds: float | None = None
    profile: str | None = None
    ignored: dict[str, str] = field(default_factory=dict)


def parse_properties(text: str) -> dict[str, str]:
    """The key/value pairs of a java.util.Properties text (last one wins, as Properties.load does)."""
    pairs: dict[str, str] = {}
    for logical in _logical_lines(text):
        match = _SEPARATOR.search(logical)
        key, value = (logical[:match.start()], logical[match.end():]) if match else (logical, "")
        pairs[_unescape(key)] = _unescape(value)
    return pairs


def _logical_lines(text: str) -> Iterator[str]:
    """Non-comment lines with continuations joined and leading blanks removed."""
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _unescape(text: str) -> str:
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            nxt = text[index + 1]
            if nxt == "u" and index + 6 <= len(text):
                out.append(chr(int(text[index + 2:index + 6], 16)))
                index += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out).strip()


def load_multilang_config(path: Path) -> MultiLangConfig:
    """Read and check a MultiLangDaemon properties file; ConfigError naming every bad, unknown or unsupported key."""
    try:
        pairs = parse_properties(path.read_text(encoding="latin-1"))
    except FileNotFoundError as exc:
        raise ConfigError(f"properties file {path} does not exist") from exc
    return build_config(pairs, path.resolve().parent)


def build_config(pairs: dict[str, str], workdir: Path) -> MultiLangConfig:
    """Map parsed properties onto a MultiLangConfig; every problem is collected into one ConfigError."""
    problems: list[str] = []
    config = MultiLangConfig(command=(), settings={}, workdir=workdir)
    for key, value in pairs.items():
        try:
            _apply(config, key, value)
        except (ValueError, KeyError) as exc:
            problems.append(f"{key}: {exc}")
    problems.extend(_missing(pairs, config))
    if problems:
        raise ConfigError("properties file not usable by shardherd multilang:\n  " + "\n  ".join(problems))
    return config


def _missing(pairs: dict[str, str], config: MultiLangConfig) -> list[str]:
    problems = []
    if not config.command:
        problems.append("executableName is required (e.g. executableName = sample_kclpy_app.py)")
    if "application_name" not in config.settings:
        problems.append("applicationName is required")
    if "stream_name" not in config.settings:
        problems.append("streamName or streamArn is required")
    if not any(key.lower() == CREDENTIAL_KEYS[0] for key in pairs):
        problems.append("AWSCredentialsProvider is required (e.g. DefaultCredentialsProvider: boto3's default chain)")
    if config.settings.get("initial_position_in_stream") == "AT_TIMESTAMP" and "initial_timestamp" not in \
            config.settings:
        problems.append("initialPositionInStream AT_TIMESTAMP needs initialPositionInStreamExtended (epoch seconds)")
    return problems


def _apply(config: MultiLangConfig, key: str, value: str) -> None:
    """Apply one key, raising ValueError with the reason it cannot be used."""
    if key.lower() in CREDENTIAL_KEYS[:2]:
        config.profile = _credentials(value) or config.profile
        return
    handler = _HANDLERS.get(key)
    if handler is not None:
        handler(config, value)
    elif key in SETTINGS_KEYS:
        config.settings[SETTINGS_KEYS[key]] = value
    elif key in IGNORED_KEYS:
        config.ignored[key] = IGNORED_KEYS[key]
    elif key.lower() == CREDENTIAL_KEYS[2]:
        config.ignored[key] = "no CloudWatch metrics"
    elif key in UNSUPPORTED_KEYS:
        raise ValueError(f"not supported: {UNSUPPORTED_KEYS[key]}")
    elif key.startswith(TABLE_OPTION_PREFIXES):
        raise ValueError(f"not supported: {TABLE_OPTIONS_REASON}")
    else:
        raise ValueError("unknown key (not a MultiLangDaemon property shardherd knows; check its spelling)")


def _credentials(value: str) -> str | None:
    """Check a provider list (`A,B` or `Name|arg`); the profile named by ProfileCredentialsProvider|name, if any."""
    profile = None
    for entry in value.split(","):
        name, _, argument = entry.strip().partition("|")
        short = name.rsplit(".", 1)[-1]
        if short not in CHAIN_PROVIDERS:
            raise ValueError(f"credentials provider {short} is not supported: shardherd uses boto3's default chain "
                             f"({', '.join(sorted(CHAIN_PROVIDERS))}); assume a role through a profile's role_arn")
        if short == "ProfileCredentialsProvider" and argument:
            profile = argument.split("|")[0]
    return profile


def _executable(config: MultiLangConfig, value: str) -> None:
    command = tuple(shlex.split(value))
    if not command:
        raise ValueError("must name the record processor's executable")
    config.command = command


def _stream_name(config: MultiLangConfig, value: str) -> None:
    config.settings.setdefault("stream_name", value)


def _stream_arn(config: MultiLangConfig, value: str) -> None:
    if not value:
        return
    match = _ARN.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
    config.settings["stream_name"] = match.group(2)  # the ARN takes precedence over streamName, as in the daemon


def _initial_position(config: MultiLangConfig, value: str) -> None:
    position = value.upper()
    if position not in ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"):
        raise ValueError(f"must be TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {value!r}")
    config.settings.setdefault("initial_position_in_stream", position)


def _initial_position_extended(config: MultiLangConfig, value: str) -> None:
    config.settings["initial_position_in_stream"] = "AT_TIMESTAMP"
    config.settings["initial_timestamp"] = datetime.fromtimestamp(int(value), UTC)


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"must be >= 0, got {number}")
    return number


def _max_records(config: MultiLangConfig, value: str) -> None:
    config.records_per_call = _non_negative_int(value)


def _idle_time(config: MultiLangConfig, value: str) -> None:
    config.idle_between_reads = _non_negative_int(value) / 1000


def _call_empty(config: MultiLangConfig, value: str) -> None:
    config.call_process_records_for_empty = _boolean(value)


def _shutdown_grace(config: MultiLangConfig, value: str) -> None:
    config.shutdown_grace_millis = _non_negative_int(value)


def _timeout(config: MultiLangConfig, value: str) -> None:
    seconds = _non_negative_int(value)
    config.timeout_seconds = float(seconds) if seconds else None


def _retrieval_mode(config: MultiLangConfig, value: str) -> None:
    if value.upper() not in ("POLLING", "DEFAULT"):
        raise ValueError(f"{value} is not supported: shardherd reads by polling (POLLING)")
    config.ignored["retrievalMode"] = IGNORED_KEYS["retrievalMode"]


def _boolean(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"must be true or false, got {value!r}")
    return lowered == "true"


_HANDLERS: dict[str, Callable[[MultiLangConfig, str], None]] = {
    "executableName": _executable,
    "streamName": _stream_name,
    "streamArn": _stream_arn,
    "initialPositionInStream": _initial_position,
    "initialPositionInStreamExtended": _initial_position_extended,
    "maxRecords": _max_records,
    "idleTimeBetweenReadsInMillis": _idle_time,
    "callProcessRecordsEvenForEmptyRecordList": _call_empty,
    "shutdownGraceMillis": _shutdown_grace,
    "timeoutInSeconds": _timeout,
    "retrievalMode": _retrieval_mode,
}
