"""A Kinesis proxy on 127.0.0.1 that counts what its clients read and write, per shard (bench/spark_read_cost.py).

It forwards every request to kinesalite and reads both sides: GetShardIterator calls per shard (the iterator it
answers is noted as that shard's), GetRecords calls per shard split into probes (Limit 1) and reads, the records and
payload bytes they returned, and the records and payload bytes PutRecord(s) wrote. Iterators are followed from
answer to answer (NextShardIterator), so every GetRecords call is charged to its shard. Counts are per second of the
bench's clock, so the busiest second shows too.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from typing import Any

from tests.support.faulty_proxy import FaultyProxy


def payload_bytes(encoded: str) -> int:
    """Bytes of a base64 payload."""
    return len(base64.b64decode(encoded))


class KinesisCounter(FaultyProxy):
    """Forwards to kinesalite and counts calls, records and payload bytes per operation and shard."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._guard = threading.Lock()
        self._shard_of: dict[str, str] = {}  # iterator -> shard
        self.counts: Counter[tuple[str, str]] = Counter()  # (what, shard) -> count
        self.per_second: Counter[tuple[int, str]] = Counter()  # (second, shard) -> GetRecords calls

    def reset(self) -> None:
        """Forget the counts (not the iterators): the measured window starts now."""
        with self._guard:
            self.counts.clear()
            self.per_second.clear()

    def total(self, what: str) -> int:
        """The sum of one count over all shards."""
        with self._guard:
            return sum(value for (name, _), value in self.counts.items() if name == what)

    def busiest_second(self) -> int:
        """The most GetRecords calls one shard took in one second of the window."""
        with self._guard:
            return max(self.per_second.values(), default=0)

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list[Any], bytes]:
        status, answer_headers, payload = super()._forward(method, path, headers, body)
        target = headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
        if status == 200:
            self._count(target, json.loads(body or b"{}"), json.loads(payload or b"{}"))
        return status, answer_headers, payload

    def _count(self, operation: str, request: dict[str, Any], answer: dict[str, Any]) -> None:
        with self._guard:
            if operation == "GetShardIterator":
                shard = str(request["ShardId"])
                self._shard_of[answer["ShardIterator"]] = shard
                self.counts[("iterators", shard)] += 1
            elif operation == "GetRecords":
                self._count_read(request, answer)
            elif operation == "PutRecords":
                for record in request["Records"]:
                    self.counts[("written records", "")] += 1
                    self.counts[("written bytes", "")] += payload_bytes(record["Data"])
            elif operation == "PutRecord":
                self.counts[("written records", "")] += 1
                self.counts[("written bytes", "")] += payload_bytes(request["Data"])

    def _count_read(self, request: dict[str, Any], answer: dict[str, Any]) -> None:
        shard = self._shard_of.get(request["ShardIterator"], "?")
        following = answer.get("NextShardIterator")
        if following:
            self._shard_of[following] = shard
        kind = "probe" if request.get("Limit") == 1 else "read"
        records = answer.get("Records", [])
        self.counts[(f"{kind} calls", shard)] += 1
        self.counts[(f"{kind} records", shard)] += len(records)
        self.counts[(f"{kind} bytes", shard)] += sum(payload_bytes(record["Data"]) for record in records)
        self.per_second[(int(time.time()), shard)] += 1
