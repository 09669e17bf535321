"""A DynamoDB proxy on 127.0.0.1 that counts the store calls passing through it, by operation, table and key kind.

Put in front of the moto server (bench/ceiling.py `--count-store`), it tells a Spark batch's store round trips apart
by what they touch: the lease table's writes (renewals, checkpoints), the worker table (heartbeats), the coordinator
state table by key prefix (`spark-end/...`: the batch ends of agent/spark/batch_ends.py; the leader lock and the
coordinator's own items), and scans (the leader's). Counts only: it forwards every request unchanged.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from tests.support.faulty_proxy import Fault, FaultyProxy

TABLE_KINDS = (("-CoordinatorState", "state"), ("-WorkerMetricStats", "workers"))


def call_kind(target: str, body: bytes) -> str:
    """`Operation table[/key prefix]` of one DynamoDB request (`GetItem state/spark-end`, `UpdateItem leases`)."""
    operation = target.rpartition(".")[2] or "?"
    try:
        request: dict[str, Any] = json.loads(body or b"{}")
    except ValueError:
        return operation
    name = str(request.get("TableName", ""))
    table = next((kind for suffix, kind in TABLE_KINDS if name.endswith(suffix)), "leases")
    key = request.get("Key") or request.get("Item") or {}
    first: Any = next(iter(key.values()), {}) if isinstance(key, dict) else {}
    value = str(first.get("S", "")) if isinstance(first, dict) else ""
    prefix = value.split("/", 1)[0] if "/" in value else ""
    return f"{operation} {table}/{prefix}" if prefix else f"{operation} {table}"


class StoreCalls(FaultyProxy):
    """Forwards to moto and counts every request under `call_kind`; `reset` starts a window."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._counts_guard = threading.Lock()
        self.counts: Counter[str] = Counter()

    def _next_for(self, target: str, body: bytes) -> Fault | None:
        with self._counts_guard:
            self.counts[call_kind(target, body)] += 1
        return None

    def reset(self) -> Counter[str]:
        """The counts so far; the next window starts at 0."""
        with self._counts_guard:
            counts, self.counts = self.counts, Counter()
        with self._lock:  # the forwarder's own request log would only grow
            self.forwarded.clear()
            self.bodies.clear()
        return counts
