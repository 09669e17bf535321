"""/metrics in the Prometheus text format: fleet gauges from the store, leader counters from the published status.

Every replica answers from the same store data, so any replica can be scraped. Written with prometheus_client
(docs/decisions/0003-operator-api.md); the families are built by a collector on a private registry, the fleet's
once per judged fleet, the rest per scrape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.fleet import Fleet
from shardherd.services.api.leader import last_success_at
from shardherd.services.leader_status import LeaderStatus
from shardherd.shared.supervision_report import supervision_families

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_read_token)])

_STATES = ("owned", "unassigned", "handoff", "finished", "expired", "reserved")
_WORKER_STATES = ("active", "draining", "expired", "restarting")


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def fleet_families(fleet: Fleet) -> list[Metric]:
    """Gauges describing leases and workers as stored now."""
    open_leases = [lease for lease in fleet.leases if lease.state != "finished"]
    return [
        _gauge("shardherd_total_leases", "Lease rows in the lease table", len(fleet.leases)),
        _gauge("shardherd_total_shards", "Shards still being read (leases not finished)", len(open_leases)),
        _gauge("shardherd_unclaimed_leases", "Open leases without a live owner (unassigned or expired)",
               sum(1 for lease in open_leases if lease.state in ("unassigned", "expired"))),
        *_lease_families(fleet), *_worker_families(fleet), *_row_families(fleet),
    ]


def _lease_families(fleet: Fleet) -> list[Metric]:
    """Leases per state, and each lease's reported throughput, lag and totals."""
    by_state = GaugeMetricFamily("shardherd_leases_by_state", "Leases per state", labels=["state"])
    for state in _STATES:
        by_state.add_metric([state], sum(1 for lease in fleet.leases if lease.state == state))
    lease_tp = GaugeMetricFamily("shardherd_lease_throughput_kbps", "Throughput of a lease as reported (KiB/s)",
                                 labels=["lease"])
    lag = GaugeMetricFamily("shardherd_lease_millis_behind_latest",
                            "MillisBehindLatest per lease as its owner last reported it", labels=["lease"])
    behind = GaugeMetricFamily("shardherd_lease_records_behind",
                               "Records waiting after the owner's position, where it knows (read up to the tip)",
                               labels=["lease"])
    records = GaugeMetricFamily("shardherd_lease_records", "Records the lease's owner handled since taking it",
                                labels=["lease", "worker"])
    size = GaugeMetricFamily("shardherd_lease_bytes", "Bytes the lease's owner handled since taking it",
                             labels=["lease", "worker"])
    throttled = GaugeMetricFamily("shardherd_lease_read_throttled",
                                  "The owner's read calls Kinesis throttled on the shard in the last minute",
                                  labels=["lease"])
    for lease in fleet.leases:
        holder = lease.checkpoint_owner or lease.owner or ""
        for family, value, labels in ((lease_tp, lease.throughput_kbps, [lease.lease_key]),
                                      (lag, lease.millis_behind_latest, [lease.lease_key]),
                                      (behind, lease.records_behind, [lease.lease_key]),
                                      (throttled, lease.read_throttled, [lease.lease_key]),
                                      (records, lease.records_processed, [lease.lease_key, holder]),
                                      (size, lease.bytes_processed, [lease.lease_key, holder])):
            if value is not None:
                family.add_metric(labels, value)
    return [by_state, lease_tp, lag, behind, throttled, records, size]


def _worker_families(fleet: Fleet) -> list[Metric]:
    """Each worker's leases, CPU, throughput and heartbeat age, and workers per state."""
    per_worker = GaugeMetricFamily("shardherd_worker_leases", "Leases each worker processes", labels=["worker"])
    cpu = GaugeMetricFamily("shardherd_worker_cpu_ema_percent", "Moving average of worker CPU", labels=["worker"])
    worker_tp = GaugeMetricFamily("shardherd_worker_throughput_kbps", "Sum of a worker's lease throughput (KiB/s)",
                                  labels=["worker"])
    age = GaugeMetricFamily("shardherd_worker_heartbeat_age_seconds",
                            "Seconds since this replica saw the worker's heartbeat change", labels=["worker"])
    for worker in fleet.workers:
        per_worker.add_metric([worker.worker_id], worker.lease_count)
        worker_tp.add_metric([worker.worker_id], worker.throughput_kbps)
        age.add_metric([worker.worker_id], worker.heartbeat_age_seconds)
        if worker.cpu_ema is not None:
            cpu.add_metric([worker.worker_id], worker.cpu_ema)
    workers = GaugeMetricFamily("shardherd_workers", "Workers per state", labels=["state"])
    for state in _WORKER_STATES:
        workers.add_metric([state], sum(1 for worker in fleet.workers if worker.state == state))
    return [per_worker, cpu, worker_tp, age, workers]


def _row_families(fleet: Fleet) -> list[Metric]:
    """Stored rows that could not be read, or were read with unusable values ignored."""
    malformed = GaugeMetricFamily("shardherd_malformed_rows", "Stored rows that cannot be read", labels=["table"])
    malformed.add_metric(["leases"], len(fleet.malformed_leases))
    malformed.add_metric(["workers"], len(fleet.malformed_workers))
    repaired = GaugeMetricFamily("shardherd_repaired_rows", "Stored rows read with unusable values ignored",
                                 labels=["table"])
    repaired.add_metric(["leases"], len(fleet.repaired_leases))
    repaired.add_metric(["workers"], len(fleet.repaired_workers))
    return [malformed, repaired]


def leader_families(status: LeaderStatus | None, readable: bool, now: float,
                    last_success: float | None) -> list[Metric]:
    """Counters and gauges from the leader's published status (continued across failovers)."""
    families: list[Metric] = [_gauge("shardherd_leader_status_readable", "1 if the published status is readable",
                                     1 if readable else 0)]
    if status is None:
        return families
    totals = status.totals
    durations = SummaryMetricFamily("shardherd_leader_run_duration_seconds", "Duration of leader runs",
                                    count_value=totals.runs, sum_value=totals.duration_ms_sum / 1000)
    moves = CounterMetricFamily("shardherd_leader_moves", "Moves decided by leader runs", labels=["reason"])
    for reason, count in sorted(totals.moves_by_reason.items()):
        moves.add_metric([reason], count)
    writes = CounterMetricFamily("shardherd_leader_writes", "Store writes by leader runs", labels=["kind"])
    for kind, count in sorted(totals.writes.items()):
        writes.add_metric([kind], count)
    families += [
        CounterMetricFamily("shardherd_leader_runs", "Leader runs", value=totals.runs),
        CounterMetricFamily("shardherd_leader_failed_runs", "Leader runs that failed", value=totals.failed_runs),
        CounterMetricFamily("shardherd_leader_shard_sync_failures",
                            "Leader runs whose shard sync failed (the run still assigned leases)",
                            value=totals.shard_sync_failures),
        CounterMetricFamily("shardherd_leader_balancing_failures",
                            "Leader runs whose balancing failed (the run still assigned leases)",
                            value=totals.balancing_failures),
        _gauge("shardherd_leader_shard_sync_failing_seconds",
               "Seconds shard sync has been failing (0 while it works; wall clocks compared)",
               0.0 if status.shard_sync_failing_since is None else max(0.0, now - status.shard_sync_failing_since)),
        durations, moves, writes,
        _gauge("shardherd_leader_epoch", "Epoch of the leader that published last (+1 per leader change)",
               status.epoch),
    ]
    if status.scale is not None:
        families += [_gauge("shardherd_desired_workers", "Workers the fleet needs for its load at the target "
                            "utilisation (GET /v1/scale)", status.scale.desired),
                     _gauge("shardherd_current_workers", "Live, not draining workers the leader counted with it",
                            status.scale.current)]
    if status.runs:
        families.append(_gauge("shardherd_leader_last_run_duration_seconds", "Duration of the newest leader run",
                               status.runs[-1].duration_ms / 1000))
    if last_success is not None:
        families.append(_gauge("shardherd_leader_last_success_age_seconds",
                               "Seconds since the newest successful leader run started (wall clocks compared)",
                               max(0.0, now - last_success)))
    return families


def stuck_families(fleet: Fleet) -> list[Metric]:
    """Leases whose owner is stuck on a batch its processor keeps failing: attempts so far (the shard blocks)."""
    stuck = GaugeMetricFamily("shardherd_lease_failing_batch_attempts",
                              "Failed deliveries of the batch the lease's owner is stuck on (0 leases: none stuck)",
                              labels=["lease", "worker"])
    for lease in fleet.leases:
        if lease.failing_attempts:
            stuck.add_metric([lease.lease_key, lease.checkpoint_owner or lease.owner or ""], lease.failing_attempts)
    return [stuck]


def replica_families(ctx: ApiContext) -> list[Metric]:
    """What this replica alone knows: whether it leads, lock changes, its threads' health, its stall verdicts."""
    changes = CounterMetricFamily("shardherd_leader_lock_changes", "Leader lock changes on this replica",
                                  labels=["change"])
    for change, count in sorted(ctx.watch.lock_changes().items()):
        changes.add_metric([change], count)
    supervised = [] if ctx.supervisor is None else supervision_families(ctx.supervisor)
    return [_gauge("shardherd_replica_is_leader", "1 if this replica holds the leader lock",
                   1 if ctx.lock.is_leader() else 0), changes, *supervised,
            _gauge("shardherd_fleet_stalled", "1 while this replica leads and its latest full run found most "
                   "lease-holding workers reporting stalled leases (agents keep them: decision 0039)",
                   1 if ctx.loop.feed.fleet_stalls else 0),
            _gauge("shardherd_shard_stalled_leases", "Leases whose reads stalled at two workers or more, as this "
                   "replica's latest full run judged while it leads: the shard's fault, their owners keep them "
                   "(decision 0043)", len(ctx.loop.feed.shard_stalls))]


class _Families(Collector):
    """A collector that yields families computed beforehand (one scrape)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        """The families of this scrape."""
        return self._families


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}},
                                                            **AUTH_RESPONSES},
            summary="Prometheus metrics (text format)")
def metrics(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> Response:
    """Fleet gauges, leader counters and this replica's lock changes.

    The fleet's families are a function of the judged fleet alone: rendered once per fleet (services/api/rendered.py)
    and followed by the rest, rendered per scrape (ages as of now, this replica's counters).
    """
    snapshot = ctx.snapshot(access_of(request))
    fleet, status = snapshot.fleet, snapshot.status
    rendered = ctx.rendered.get(fleet, "metrics", lambda: _exposition([*fleet_families(fleet),
                                                                        *stuck_families(fleet)]))
    live = _exposition([*leader_families(status, snapshot.status_problem is None, ctx.clock.time(),
                                         last_success_at(status, snapshot.lock)), *replica_families(ctx)])
    return Response(rendered + live, media_type=CONTENT_TYPE_LATEST)


def _exposition(families: list[Metric]) -> bytes:
    """The text format of `families`, in order (the format is one family after another, so renderings concatenate)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
