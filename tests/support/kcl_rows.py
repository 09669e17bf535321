"""Worker rows written exactly as Java KCL 3.x (3.0-3.4 table layout) writes them, straight through boto3.

KCL's WorkerMetricStatsDAO upserts `wid` (S), `lut` (N, epoch seconds), `sts` and `opr` (M: metric -> L of N) with an
UpdateItem that ignores nulls; a worker without a metric writes both maps empty. It never writes shardherd's `hb`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _metric_map(values: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    return {"M": {metric: {"L": [{"N": repr(float(v))} for v in series]} for metric, series in values.items()}}


def write_kcl_worker_row(client: Any, table: str, worker_id: str, lut: int,
                         sts: Mapping[str, Sequence[float]] | None = None,
                         opr: Mapping[str, Sequence[float]] | None = None) -> None:
    """Write (upsert) one KCL worker-metrics row; no `sts`/`opr` given: a "default metric" (throughput) worker."""
    client.update_item(
        TableName=table, Key={"wid": {"S": worker_id}},
        UpdateExpression="SET lut = :lut, sts = :sts, opr = :opr",
        ExpressionAttributeValues={":lut": {"N": str(lut)}, ":sts": _metric_map(sts or {}),
                                   ":opr": _metric_map(opr or {})},
    )


def read_raw_worker_row(client: Any, table: str, worker_id: str) -> dict[str, Any] | None:
    """The worker-metrics item as stored (DynamoDB JSON), or None."""
    item: dict[str, Any] | None = client.get_item(TableName=table, Key={"wid": {"S": worker_id}},
                                                  ConsistentRead=True).get("Item")
    return item


def kcl_sees_default_metric(item: Mapping[str, Any]) -> bool:
    """KCL's own test for a "default metric" worker: `sts` and `opr` both missing or empty."""
    return not item.get("sts", {}).get("M") and not item.get("opr", {}).get("M")


def kcl_sees_active(item: Mapping[str, Any], now_wall: float, reporter_seconds: float = 30.0) -> bool:
    """KCL's leader treats the worker as active: a `lut` no older than two reporter intervals."""
    return "lut" in item and now_wall - int(item["lut"]["N"]) <= 2 * reporter_seconds
