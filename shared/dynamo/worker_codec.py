"""WorkerRecord <-> `<app>-WorkerMetricStats` item (KCL's `wid`/`lut`/`sts`/`opr` plus shardherd's attributes)."""

from __future__ import annotations

from collections.abc import Mapping

from shardherd.shared.dynamo.attributes import (
    AttributeTypeError,
    integer,
    number,
    parse_decimal,
    read_bool,
    read_int,
    read_string,
    string,
)
from shardherd.shared.dynamo.expressions import AttributeValue, Expression, Item
from shardherd.shared.errors import MalformedWorker
from shardherd.shared.restart import stored_window
from shardherd.shared.row_checks import InvalidRowValue, checked_throughput, decoded
from shardherd.shared.worker import FailingBatch, LeaseProgress, PoisonReport, WorkerRecord, WorkerState

WORKER_ID = "wid"
LAST_UPDATE = "lut"
METRIC_STATS = "sts"
OPERATING_RANGE = "opr"
HEARTBEAT = "hb"
WORKER_STATE = "workerState"
LEASE_THROUGHPUT = "leaseThroughput"
DRAIN_REQUESTED = "drainRequested"
RESTART_WITHIN = "restartWithinMillis"  # a restart reservation (shared/restart.py)
LEASE_PROGRESS = "leaseProgress"


def worker_key(worker_id: str) -> dict[str, AttributeValue]:
    """The primary key of a worker item."""
    return {WORKER_ID: string(worker_id)}


def _read_map(item: Item, name: str) -> Mapping[str, AttributeValue]:
    value = item.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not isinstance(value.get("M"), dict):
        raise AttributeTypeError(f"{name} must be of type M")
    return dict(value["M"])


def _read_number(name: str, value: AttributeValue) -> float:
    if not isinstance(value, dict) or not isinstance(value.get("N"), str):
        raise AttributeTypeError(f"{name} must hold numbers")
    return float(parse_decimal(name, value["N"]))


def _read_series_map(item: Item, name: str) -> dict[str, tuple[float, ...]]:
    series: dict[str, tuple[float, ...]] = {}
    for metric, value in _read_map(item, name).items():
        if not isinstance(value, dict) or not isinstance(value.get("L"), list):
            raise AttributeTypeError(f"{name}.{metric} must be of type L")
        series[metric] = tuple(_read_number(f"{name}.{metric}", entry) for entry in value["L"])
    return series


def _read_throughput(item: Item, repairs: list[str]) -> dict[str, float]:
    """`leaseThroughput`, without (and noting in `repairs`) entries no consumer can use."""
    throughput: dict[str, float] = {}
    for key, value in _read_map(item, LEASE_THROUGHPUT).items():
        name = f"{LEASE_THROUGHPUT}.{key}"
        kbps, repaired = checked_throughput(_read_number(name, value), name)
        repairs.extend(repaired)
        if kbps is not None:
            throughput[key] = kbps
    return throughput


def _read_progress(item: Item, repairs: list[str]) -> dict[str, LeaseProgress]:
    """`leaseProgress`, without (and noting in `repairs`) entries holding negative figures."""
    progress: dict[str, LeaseProgress] = {}
    for key, value in _read_map(item, LEASE_PROGRESS).items():
        if not isinstance(value, dict) or not isinstance(value.get("M"), dict):
            raise AttributeTypeError(f"{LEASE_PROGRESS}.{key} must be of type M")
        fields = value["M"]
        lag = fields.get("lag")
        figures = (
            int(_read_number(f"{LEASE_PROGRESS}.{key}.lag", lag)) if lag is not None else None,
            int(_read_number(f"{LEASE_PROGRESS}.{key}.records", fields.get("records", {"N": "0"}))),
            int(_read_number(f"{LEASE_PROGRESS}.{key}.bytes", fields.get("bytes", {"N": "0"}))),
            int(_read_number(f"{LEASE_PROGRESS}.{key}.failures", fields.get("failures", {"N": "0"}))),
        )
        throttled = int(_read_number(f"{LEASE_PROGRESS}.{key}.throttled", fields.get("throttled", {"N": "0"})))
        refused, stalled = bool(read_bool(fields, "refused")), bool(read_bool(fields, "stalled"))
        behind = fields.get("behind")
        records_behind = int(_read_number(f"{LEASE_PROGRESS}.{key}.behind", behind)) if behind is not None else None
        try:
            progress[key] = LeaseProgress(*figures, refused=refused, records_behind=records_behind,
                                          failing=_read_failing(key, fields.get("failing")),
                                          poison=_read_poison(key, fields.get("poison")), throttled=throttled,
                                          stalled=stalled)
        except InvalidRowValue as exc:
            repairs.append(f"{LEASE_PROGRESS}.{key} {exc}: ignored")
    return progress


def _read_failing(key: str, value: AttributeValue | None) -> FailingBatch | None:
    """A `failing` entry of leaseProgress (since, attempts, error), if any."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("M"), dict):
        raise AttributeTypeError(f"{LEASE_PROGRESS}.{key}.failing must be of type M")
    fields = value["M"]
    error = fields.get("error", {"S": ""})
    if not isinstance(error, dict) or not isinstance(error.get("S"), str):
        raise AttributeTypeError(f"{LEASE_PROGRESS}.{key}.failing.error must be of type S")
    return FailingBatch(float(_read_number(f"{LEASE_PROGRESS}.{key}.failing.since", fields.get("since"))),
                        int(_read_number(f"{LEASE_PROGRESS}.{key}.failing.attempts", fields.get("attempts"))),
                        error["S"])


def _read_poison(key: str, value: AttributeValue | None) -> PoisonReport | None:
    """A `poison` entry of leaseProgress (blocked, quarantined, last, object: shardherd-only), if any."""
    if value is None:
        return None
    name = f"{LEASE_PROGRESS}.{key}.poison"
    if not isinstance(value, dict) or not isinstance(value.get("M"), dict):
        raise AttributeTypeError(f"{name} must be of type M")
    fields = value["M"]
    texts: list[str | None] = []
    for part in ("blocked", "last", "object"):
        text = fields.get(part)
        if text is not None and (not isinstance(text, dict) or not isinstance(text.get("S"), str)):
            raise AttributeTypeError(f"{name}.{part} must be of type S")
        texts.append(None if text is None else text["S"])
    count = int(_read_number(f"{name}.quarantined", fields.get("quarantined", {"N": "0"})))
    return PoisonReport(texts[0], count, texts[1], texts[2])


def _poison_map(poison: PoisonReport) -> AttributeValue:
    fields: dict[str, AttributeValue] = {"quarantined": integer(poison.quarantined)}
    for part, text in (("blocked", poison.blocked_on), ("last", poison.last_quarantined),
                       ("object", poison.last_object)):
        if text is not None:
            fields[part] = {"S": text}
    return {"M": fields}


def _progress_map(progress: Mapping[str, LeaseProgress]) -> AttributeValue:
    entries: dict[str, AttributeValue] = {}
    for key, value in progress.items():
        fields: dict[str, AttributeValue] = {"records": integer(value.records), "bytes": integer(value.bytes)}
        if value.millis_behind_latest is not None:
            fields["lag"] = integer(value.millis_behind_latest)
        if value.records_behind is not None:
            fields["behind"] = integer(value.records_behind)
        if value.failures:
            fields["failures"] = integer(value.failures)
        if value.throttled:
            fields["throttled"] = integer(value.throttled)
        if value.refused:
            fields["refused"] = {"BOOL": True}
        if value.stalled:
            fields["stalled"] = {"BOOL": True}
        if value.failing is not None:
            fields["failing"] = {"M": {"since": integer(int(value.failing.since)),
                                       "attempts": integer(value.failing.attempts),
                                       "error": {"S": value.failing.last_error}}}
        if value.poison is not None:
            fields["poison"] = _poison_map(value.poison)
        entries[key] = {"M": fields}
    return {"M": entries}


def decode_worker(item: Item, table: str = "worker") -> WorkerRecord:
    """Read a worker item; MalformedWorker (with the id when there is one) if any attribute is unreadable.

    Lease throughputs and progress figures no consumer can use are dropped and noted in `repairs`; both cases are
    reported (shared/row_checks.py).
    """
    return decoded(table, lambda: _decode_worker(item), lambda record: record.worker_id)


def _decode_worker(item: Item) -> WorkerRecord:
    worker_id: str | None = None
    repairs: list[str] = []
    try:
        worker_id = read_string(item, WORKER_ID)
        if worker_id is None:
            raise AttributeTypeError(f"{WORKER_ID} is missing")
        last_update = read_int(item, LAST_UPDATE)
        if last_update is None:
            raise AttributeTypeError(f"{LAST_UPDATE} is missing")
        state_text = read_string(item, WORKER_STATE) or WorkerState.ACTIVE.value
        if state_text not in WorkerState.__members__:
            allowed = list(WorkerState.__members__)
            raise AttributeTypeError(f"{WORKER_STATE} {state_text[:40]!r} is not one of {allowed}")
        return WorkerRecord(
            worker_id=worker_id,
            last_update=last_update,
            metric_stats=_read_series_map(item, METRIC_STATS),
            operating_range=_read_series_map(item, OPERATING_RANGE),
            heartbeat=read_int(item, HEARTBEAT) or 0,
            state=WorkerState(state_text),
            lease_throughput=_read_throughput(item, repairs),
            drain_requested=bool(read_bool(item, DRAIN_REQUESTED)),
            lease_progress=_read_progress(item, repairs),
            restart_within_ms=stored_window(read_int(item, RESTART_WITHIN), repairs),
            repairs=tuple(repairs),
        )
    except AttributeTypeError as exc:
        raise MalformedWorker(worker_id, str(exc)) from None


def _series_map(series: Mapping[str, tuple[float, ...]]) -> AttributeValue:
    return {"M": {metric: {"L": [number(value) for value in values]} for metric, values in series.items()}}


def worker_attributes(record: WorkerRecord) -> dict[str, AttributeValue]:
    """Every worker-owned attribute of the item (never `drainRequested`, never the key)."""
    return {
        LAST_UPDATE: integer(record.last_update),
        METRIC_STATS: _series_map(record.metric_stats),
        OPERATING_RANGE: _series_map(record.operating_range),
        HEARTBEAT: integer(record.heartbeat),
        WORKER_STATE: string(record.state.value),
        LEASE_THROUGHPUT: {"M": {key: number(value) for key, value in record.lease_throughput.items()}},
        LEASE_PROGRESS: _progress_map(record.lease_progress),
    }


def encode_worker(record: WorkerRecord) -> dict[str, AttributeValue]:
    """The whole item as stored (key, worker-owned attributes, the drain flag and restart reservation when set)."""
    item = {**worker_key(record.worker_id), **worker_attributes(record)}
    if record.drain_requested:
        item[DRAIN_REQUESTED] = {"BOOL": True}
    if record.restart_within_ms is not None:
        item[RESTART_WITHIN] = integer(record.restart_within_ms)
    return item


def worker_upsert(record: WorkerRecord) -> Expression:
    """The update that writes every worker-owned attribute (never `drainRequested`), creating the item if needed."""
    expression = Expression()
    for name, value in worker_attributes(record).items():
        expression.set(name, value)
    return expression


def worker_unchanged(last_update: int, heartbeat: int) -> Expression:
    """The condition that a worker item still has the `lut` and `hb` read earlier (hb 0 also matches an absent hb)."""
    expression = Expression().require_equal(LAST_UPDATE, integer(last_update))
    if heartbeat == 0:
        return expression.require_absent_or_equal(HEARTBEAT, integer(0))
    return expression.require_equal(HEARTBEAT, integer(heartbeat))
