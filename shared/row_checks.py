"""The value rules every decoded row satisfies, and the one place stored rows that break them are reported.

A row a codec hands out must never make a consumer fail (the leader's snapshot, the agent's throughput recorder, the
API's JSON, the /metrics exposition). So each backend's decoder checks every number against these rules:

* a measurement (a lease's `throughputKBps`, a worker's `leaseThroughput` entry or `leaseProgress` figures, a CPU
  sample) that breaks them is *repaired*: dropped (throughput, progress) or marked as a failed sample (-1, which the
  decider already reads as "no valid sample"). The owner rewrites these on its next renewal or heartbeat, and the row
  is otherwise sound, so its shard keeps being processed;
* anything unreadable (wrong type, a bad checkpoint, an unknown state) *rejects* the row: it is reported with its key
  (MalformedLease / MalformedWorker), left in the table untouched, and never overwritten (shard sync's create is
  conditional on the key being absent, the leader never assigns it, and the agent does not take it).

Both kinds are logged once per row and problem (`report_row`), counted by the API's /metrics and listed by the API.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from shardherd.shared.errors import MalformedRow

log = logging.getLogger(__name__)

# KiB/s. A Kinesis shard reads at most 2 MiB/s per consumer; anything above this is garbage, and the bound keeps
# every sum the decider forms over any fleet finite.
MAX_THROUGHPUT_KBPS = 1e12
# Distinct (table, key, problem) reports remembered so each is logged once; beyond it, the oldest are forgotten.
REPORTS_REMEMBERED = 10_000


def throughput_problem(value: float) -> str | None:
    """Why `value` cannot be a throughput in KiB/s (None if it can): it must be finite, >= 0 and plausible."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r} is not a number"
    if not math.isfinite(value) or value < 0 or value > MAX_THROUGHPUT_KBPS:
        return f"{value!r} is not a finite number in [0, {MAX_THROUGHPUT_KBPS:g}] KiB/s"
    return None


def count_problem(value: int | None, allow_none: bool = False) -> str | None:
    """Why `value` cannot be a count (records, bytes, milliseconds behind): it must be an integer >= 0."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{value!r} is not an integer >= 0"
    return None


def checked_throughput(value: float | None, attribute: str) -> tuple[float | None, tuple[str, ...]]:
    """A stored throughput as decoders hand it out: the value, or None with the repair made when it is unusable."""
    problem = None if value is None else throughput_problem(value)
    if problem is None:
        return value, ()
    return None, (f"{attribute} {problem}: ignored",)


def checked_counts(values: Mapping[str, int | None]) -> tuple[dict[str, int | None], tuple[str, ...]]:
    """Stored counts (attribute -> value) as decoders hand them out: each value, or None with a repair if negative."""
    kept: dict[str, int | None] = {}
    repairs: list[str] = []
    for attribute, value in values.items():
        problem = count_problem(value, allow_none=True)
        kept[attribute] = None if problem else value
        if problem:
            repairs.append(f"{attribute} {problem}: ignored")
    return kept, tuple(repairs)


class InvalidRowValue(ValueError):
    """A Lease or WorkerRecord was built with a value no consumer can use (a decoder bug if it came from a row)."""


class Repairable(Protocol):
    """A decoded row that notes what its decoder repaired."""

    @property
    def repairs(self) -> tuple[str, ...]:
        """What the decoder dropped or marked failed."""
        ...


RowT = TypeVar("RowT", bound=Repairable)


def decoded(table: str, decode: Callable[[], RowT], key: Callable[[RowT], str]) -> RowT:
    """Run a decoder and report (`report_row`) the row it rejects (MalformedRow, re-raised) or repairs."""
    try:
        row = decode()
    except MalformedRow as exc:
        report_row(table, exc.key, "rejected", exc.reason)
        raise
    for repair in row.repairs:
        report_row(table, key(row), "repaired", repair)
    return row


_reported: dict[tuple[str, str, str], None] = {}
_guard = threading.Lock()


def report_row(table: str, key: str | None, action: str, problem: str) -> None:
    """Log a stored row that was repaired or rejected, once per (table, key, problem) so scans do not flood logs."""
    entry = (table, str(key), problem)
    with _guard:
        if entry in _reported:
            return
        _reported[entry] = None
        if len(_reported) > REPORTS_REMEMBERED:
            del _reported[next(iter(_reported))]
    log.warning("%s row %r %s: %s", table, key, action, problem)
