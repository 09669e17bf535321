"""Balance a mixed fleet on a metric basis every worker reports (pure; applied to each snapshot before deciding)."""

from __future__ import annotations

import dataclasses

from shardherd.coordinator.snapshot import Snapshot, WorkerView
from shardherd.shared.worker import common_metric_kinds
from shardherd.shared.worker_metrics import WorkerStatus, classify


def on_common_basis(snapshot: Snapshot) -> Snapshot:
    """The snapshot with each balanced worker's metrics cut down to the kinds all balanced workers report.

    Balanced workers are those with valid, non-failing metrics that are not draining (the others are not balanced,
    so they neither set the basis nor change). With no common kind (some worker reports only throughput, as a Java
    KCL worker without a CPU metric does) every balanced worker is balanced by its throughput share, as KCL does.
    A fleet that already shares its kinds comes back unchanged.
    """
    balanced = [worker for worker in snapshot.workers
                if not worker.draining and classify(worker) is WorkerStatus.ACTIVE]
    kinds = common_metric_kinds(worker.metric_stats for worker in balanced)
    if all(set(worker.metric_stats) == kinds for worker in balanced):
        return snapshot
    keep = {worker.worker_id for worker in balanced}
    workers = [_restricted(worker, kinds) if worker.worker_id in keep else worker for worker in snapshot.workers]
    return dataclasses.replace(snapshot, workers=tuple(workers))


def _restricted(worker: WorkerView, kinds: frozenset[str]) -> WorkerView:
    """The worker with only the metric kinds in `kinds` (none: a throughput-share worker)."""
    return dataclasses.replace(
        worker,
        metric_stats={m: h for m, h in worker.metric_stats.items() if m in kinds},
        operating_range={m: r for m, r in worker.operating_range.items() if m in kinds},
        throughput_history=worker.throughput_history if kinds else (),
    )
