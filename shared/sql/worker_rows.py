"""WorkerRecord <-> SQL row of `<app>-WorkerMetricStats`: typed columns, metric maps as JSON text."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from shardherd.shared.errors import MalformedWorker
from shardherd.shared.restart import stored_window
from shardherd.shared.row_checks import InvalidRowValue, checked_throughput, decoded
from shardherd.shared.sql.values import read_int, read_json, read_optional_str
from shardherd.shared.worker import (
    FAILED_SAMPLE,
    FailingBatch,
    LeaseProgress,
    PoisonReport,
    WorkerRecord,
    WorkerState,
)


def worker_values(record: WorkerRecord) -> dict[str, Any]:
    """Column values of every worker-owned attribute (never `drain_requested`, which operators own)."""
    return {
        "wid": record.worker_id,
        "lut": record.last_update,
        "sts": json.dumps({metric: list(values) for metric, values in record.metric_stats.items()}),
        "opr": json.dumps({metric: list(values) for metric, values in record.operating_range.items()}),
        "hb": record.heartbeat,
        "worker_state": record.state.value,
        "lease_throughput": json.dumps(dict(record.lease_throughput)),
        "lease_progress": json.dumps({key: _progress_entry(value) for key, value in record.lease_progress.items()}),
    }


def _progress_entry(progress: LeaseProgress) -> dict[str, Any]:
    """One lease's progress as stored: lag, records, bytes, plus failures, throttles, flags and behind when set."""
    entry: dict[str, Any] = {"lag": progress.millis_behind_latest, "records": progress.records, "bytes": progress.bytes}
    if progress.failures:
        entry["failures"] = progress.failures
    if progress.throttled:
        entry["throttled"] = progress.throttled
    if progress.refused:
        entry["refused"] = True
    if progress.stalled:
        entry["stalled"] = True
    if progress.records_behind is not None:
        entry["behind"] = progress.records_behind
    if progress.failing is not None:
        failing = progress.failing
        entry["failing"] = {"since": int(failing.since), "attempts": failing.attempts, "error": failing.last_error}
    if progress.poison is not None:
        poison = progress.poison
        entry["poison"] = {"blocked": poison.blocked_on, "quarantined": poison.quarantined,
                           "last": poison.last_quarantined, "object": poison.last_object}
    return entry


def _metric_map(value: object, attribute: str, repairs: list[str]) -> dict[str, tuple[float, ...]]:
    """Map metric -> list of numbers, from JSON text (NULL = no metrics).

    JSON text may hold NaN or Infinity, which DynamoDB cannot: such a sample counts as failed (-1), as the decider
    reads a sampling failure, and is noted in `repairs`.
    """
    parsed = read_json(value)
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object of metric -> list of numbers")
    result: dict[str, tuple[float, ...]] = {}
    for metric, samples in parsed.items():
        if not isinstance(samples, list) or not all(_is_number(sample) for sample in samples):
            raise ValueError(f"metric {metric!r} is not a list of numbers")
        values = tuple(float(sample) for sample in samples)
        if not all(math.isfinite(sample) for sample in values):
            repairs.append(f"{attribute}.{metric} has non-finite samples: counted as failed (-1)")
            values = tuple(sample if math.isfinite(sample) else FAILED_SAMPLE for sample in values)
        result[metric] = values
    return result


def _throughput_map(value: object, repairs: list[str]) -> dict[str, float]:
    """Map lease key -> KiB/s, from JSON text (NULL = none reported), without unusable entries (noted in `repairs`)."""
    parsed = read_json(value)
    if parsed is None:
        return {}
    if not isinstance(parsed, dict) or not all(_is_number(kbps) for kbps in parsed.values()):
        raise ValueError("expected a JSON object of lease key -> number")
    throughput: dict[str, float] = {}
    for lease_key, kbps in parsed.items():
        checked, repaired = checked_throughput(float(kbps), f"leaseThroughput.{lease_key}")
        repairs.extend(repaired)
        if checked is not None:
            throughput[lease_key] = checked
    return throughput


def _failing(key: str, value: object) -> FailingBatch | None:
    """A `failing` entry (since, attempts, error), if any."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"progress of {key!r}: failing must be an object")
    since, attempts, error = value.get("since"), value.get("attempts"), value.get("error", "")
    if not isinstance(since, int) or not isinstance(attempts, int) or not isinstance(error, str):
        raise ValueError(f"progress of {key!r}: failing needs integers since and attempts and a text error")
    return FailingBatch(float(since), attempts, error)


def _poison(key: str, value: object) -> PoisonReport | None:
    """A `poison` entry (blocked, quarantined, last, object), if any."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"progress of {key!r}: poison must be an object")
    texts: list[str | None] = []
    for part in ("blocked", "last", "object"):
        text = value.get(part)
        if text is not None and not isinstance(text, str):
            raise ValueError(f"progress of {key!r}: poison.{part} must be a text")
        texts.append(text)
    count = value.get("quarantined", 0)
    if not isinstance(count, int) or isinstance(count, bool):
        raise ValueError(f"progress of {key!r}: poison.quarantined must be an integer")
    return PoisonReport(texts[0], count, texts[1], texts[2])


def _progress_map(value: object, repairs: list[str]) -> dict[str, LeaseProgress]:
    """Map lease key -> {lag, records, bytes}, from JSON text (NULL = none reported), without negative figures."""
    parsed = read_json(value)
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object of lease key -> progress")
    progress = {}
    for key, entry in parsed.items():
        if not isinstance(entry, dict):
            raise ValueError(f"progress of {key!r} is not an object")
        lag, records, size = entry.get("lag"), entry.get("records", 0), entry.get("bytes", 0)
        failures, refused, behind = entry.get("failures", 0), entry.get("refused", False), entry.get("behind")
        throttled = entry.get("throttled", 0)
        counts = (records, size, failures, throttled)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts) or not all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (lag, behind)):
            raise ValueError(f"progress of {key!r} must hold integers")
        stalled = entry.get("stalled", False)
        if not isinstance(refused, bool) or not isinstance(stalled, bool):
            raise ValueError(f"progress of {key!r}: refused and stalled must be booleans")
        try:
            progress[key] = LeaseProgress(lag, records, size, failures, refused, behind,
                                          _failing(key, entry.get("failing")), _poison(key, entry.get("poison")),
                                          throttled=throttled, stalled=stalled)
        except InvalidRowValue as exc:
            repairs.append(f"leaseProgress.{key} {exc}: ignored")
    return progress


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def decode_worker(row: Mapping[Any, Any], table: str = "worker") -> WorkerRecord:
    """The record a row holds; MalformedWorker naming the worker and the attribute if a column is unreadable.

    Values no consumer can use are dropped or marked failed and noted in `repairs`; both cases are reported
    (shared/row_checks.py).
    """
    return decoded(table, lambda: _decode_worker(row), lambda record: record.worker_id)


def _decode_worker(row: Mapping[Any, Any]) -> WorkerRecord:
    worker_id = row["wid"]
    if not isinstance(worker_id, str) or not worker_id:
        raise MalformedWorker(None, f"wid is missing or not a string: {worker_id!r}")
    attribute = "lut"
    repairs: list[str] = []
    try:
        last_update = read_int(row["lut"])
        attribute = "sts"
        metric_stats = _metric_map(row["sts"], "sts", repairs)
        attribute = "opr"
        operating_range = _metric_map(row["opr"], "opr", repairs)
        attribute = "hb"
        heartbeat = read_int(row["hb"], 0)
        attribute = "workerState"
        state_text = read_optional_str(row["worker_state"])
        state = WorkerState(state_text) if state_text is not None else WorkerState.ACTIVE
        attribute = "leaseThroughput"
        lease_throughput = _throughput_map(row["lease_throughput"], repairs)
        attribute = "leaseProgress"
        lease_progress = _progress_map(row["lease_progress"], repairs)
    except ValueError as exc:
        raise MalformedWorker(worker_id, f"{attribute}: {exc}") from exc
    return WorkerRecord(
        worker_id=worker_id,
        last_update=last_update,
        metric_stats=metric_stats,
        operating_range=operating_range,
        heartbeat=heartbeat,
        state=state,
        lease_throughput=lease_throughput,
        drain_requested=bool(row["drain_requested"]),
        lease_progress=lease_progress,
        restart_within_ms=stored_window(row.get("restart_within_ms"), repairs),
        repairs=tuple(repairs),
    )
