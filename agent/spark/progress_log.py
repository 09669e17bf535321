"""Where a micro-batch's time goes, one log line per batch: Spark's own phase durations from the query's progress.

A hand-off's gap at the receiving driver is mostly micro-batches (docs/spark.md, How it works), so the stack's
drivers log each batch's phases: `latestOffset` (our plan from the snapshot), `queryPlanning`, `walCommit` (the
offset log write), `addBatch` (the foreachBatch sink: read tasks, the user's write and the lease checkpoints) and
`commitOffsets` (the commit log write), with the rows read and the batch's wall time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

log = logging.getLogger(__name__)

PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def phase_line(batch_id: int, rows: int, durations: Mapping[str, int]) -> str:
    """One batch's figures: rows, wall time, each known phase in ms and what no phase accounts for."""
    total = durations.get("triggerExecution", 0)
    parts = [f"{phase} {durations[phase]}" for phase in PHASES if phase in durations]
    other = total - sum(durations.get(phase, 0) for phase in PHASES)
    return f"batch {batch_id}: {rows} rows in {total} ms ({', '.join(parts)}, other {other})"


class BatchTimingLog(StreamingQueryListener):
    """A query listener logging `phase_line` for every batch that read rows (idle triggers are left out)."""

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802 - Spark's name
        """Nothing to log."""

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802 - Spark's name
        """Log the batch's phases (runs on a py4j callback thread of the driver, after the batch)."""
        progress = event.progress
        if progress.numInputRows:
            log.info("%s", phase_line(progress.batchId, progress.numInputRows, progress.durationMs))

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802 - Spark's name
        """Nothing to log."""

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802 - Spark's name
        """Nothing to log."""
