"""Poison rows of a Spark micro-batch: kept out of the job's sink, quarantined or refused (decision 0031).

Rows a job's per-record check rejects never reach the job's function; under `poison_policy = quarantine` they are
written to the poison destination, under `block` they stop the batch.

The contract: a job that wants this passes `run_query(..., poison_check=check)`, where `check(data: bytes) -> None`
raises for a record its function cannot take (the usual poison: a payload that does not parse). A *poison row* is a
row whose check raises; nothing else is (a sink that fails fails the batch, as without a check). Invariants:
- The check runs on the executors, once per row; the batch is cached for the check and the sink, so its shards are
  read once (a lost cached block is read again from the batch's plan, which gives the same rows).
- `quarantine`: every poison row is written to the destination (one object per stream, shard, sequence and
  sub-sequence: a batch replayed after a crash writes the same objects again, never a second copy) before the other
  rows go to the sink; the batch's checkpoint, after the sink, covers both. A failing write fails the batch: nothing
  is skipped, and the batch is read again.
- `block`: a batch with a poison row fails before its sink runs, naming the rows; nothing is written or checkpointed.
- More than MAX_POISON_ROWS poison rows in one batch are not poison but an outage (a broken check, another schema):
  the batch fails with nothing quarantined.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shardherd.agent.progress import PoisonRecord
from shardherd.agent.quarantine import Destination, Quarantined
from shardherd.shared.errors import ShardherdError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

    from shardherd.agent.spark.commit import BatchFunction

log = logging.getLogger(__name__)

POISON_COLUMN = "_shardherd_poison"
MAX_POISON_ROWS = 1000
ERROR_CHARS = 500  # of the check's error kept with a quarantined record

Check = Callable[[bytes], None]


class PoisonRowsFailed(ShardherdError):
    """A batch's poison rows stop it: policy block, or more of them than one batch may quarantine."""


def check_error(check: Check, data: bytes | None) -> str | None:
    """What `check` raised for one record's data ("Type: message", cut), or None when it took the record."""
    try:
        check(b"" if data is None else bytes(data))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
    return None


@dataclass(frozen=True, slots=True)
class PoisonRouting:
    """The batch function that splits off a batch's poison rows before the job's own function sees the batch.

    `counted(stream, shard, record, object_url)` tells the agent of each quarantined row (metrics, worker row).
    """

    write: BatchFunction
    check: Check
    destination: Destination | None  # None: policy block
    worker_id: str
    counted: Callable[[str, str, PoisonRecord, str], None]

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Check every row; quarantine (or refuse) the poison ones; hand the others to the job's function."""
        from pyspark.sql import functions as F  # noqa: N812
        from pyspark.sql.types import StringType

        check = self.check
        verdict = F.udf(lambda data: check_error(check, data), StringType(), useArrow=False)
        marked = df.withColumn(POISON_COLUMN, verdict("data"))
        marked.persist()
        try:
            poison = marked.where(F.col(POISON_COLUMN).isNotNull()).limit(MAX_POISON_ROWS + 1).collect()
            if poison:
                self._set_apart(poison, batch_id)
            self.write(marked.where(F.col(POISON_COLUMN).isNull()).drop(POISON_COLUMN), batch_id)
        finally:
            marked.unpersist()

    def _set_apart(self, rows: list[Row], batch_id: int) -> None:
        first = f"{rows[0]['shard_id']} {rows[0]['sequence_number']}/{rows[0]['sub_sequence_number']}"
        if len(rows) > MAX_POISON_ROWS:
            raise PoisonRowsFailed(f"batch {batch_id}: more than {MAX_POISON_ROWS} rows fail the poison check (first: "
                                   f"{first}: {rows[0][POISON_COLUMN]}); not poison but a failing check: nothing "
                                   "quarantined, the batch is read again")
        if self.destination is None:
            raise PoisonRowsFailed(f"batch {batch_id}: {len(rows)} poison row(s) under poison_policy block (first: "
                                   f"{first}: {rows[0][POISON_COLUMN]}); the batch is read again")
        now = datetime.now(UTC).isoformat()
        for row in rows:
            stored = _stored(row, self.worker_id, now)
            self.destination.put(stored)
            record = PoisonRecord(stored.sequence_number, stored.sub_sequence_number)
            self.counted(stored.stream, stored.shard_id, record, f"{self.destination.url.rstrip('/')}/{stored.name}")
            log.warning("batch %d: poison row %s/%s quarantined (%s)", batch_id, stored.shard_id, record, stored.error)


def _stored(row: Row, worker_id: str, when: str) -> Quarantined:
    """A poison row as the destination keeps it (the same form a plain agent's poison record takes)."""
    arrival = row["arrival_timestamp"]
    return Quarantined(row["stream_name"], row["shard_id"], row["sequence_number"], int(row["sub_sequence_number"]),
                       row["partition_key"], None, base64.b64encode(bytes(row["data"])).decode("ascii"),
                       None if arrival is None else arrival.isoformat(), row[POISON_COLUMN], 1, worker_id, when)
