"""What a KCL 3.x fleet of the same size pays DynamoDB per minute, from KCL's documented behaviour and defaults.

Priced with the same item-size and unit rules as shardherd's StoreMeter (shared/store_meter.py), on the lease items
of the simulated table itself, so both sides of a ratio come from one run. The model, per minute (KCL 3.x defaults):
* renewals: every lease every `failover/3 - epsilon` (3.308 s), an UpdateItem that also writes `throughputKBps`;
* application checkpoints: the same workload as shardherd's (given per shard per minute);
* worker metrics: every worker every 30 s, an UpdateItem of its WorkerMetricStats item (10-value CPU history);
* the lock: the holder heartbeats every 30 s; every other worker reads the lock (consistently) every 30 s;
* the leader's LeaseAssignmentManager every 2 x failover (20 s): a scan of the lease table and of the metrics table;
  the leases-recovery auditor scans the lease table every 2 min;
* lease discovery: every worker queries the owner index every `leaseAssignmentInterval/2 - epsilon` (9.975 s).
KCL's scans are priced as eventually consistent (the cheaper reading for KCL). Steady state: no lease moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardherd.shared.dynamo.attributes import integer, number, string
from shardherd.shared.lease import Lease
from shardherd.shared.store_meter import (
    index_entry_size,
    item_size,
    lease_size,
    paged_read_units,
    read_units,
    write_units,
)

FAILOVER_S = 10.0
EPSILON_S = 0.025
RENEW_S = FAILOVER_S / 3 - EPSILON_S
LAM_S = 2 * FAILOVER_S
DISCOVERY_S = LAM_S / 2 - EPSILON_S
METRICS_S = 30.0
LOCK_HEARTBEAT_S = 30.0
LOCK_CHECK_S = 30.0
AUDITOR_S = 120.0
HISTORY = 10


@dataclass(frozen=True, slots=True)
class KclLine:
    """One line of the KCL bill: who, what, requests, read and write units per minute."""

    caller: str
    what: str
    requests: float
    read_units: float
    write_units: float


def _metrics_item(worker_id: str) -> int:
    """Bytes of a KCL WorkerMetricStats item with a full CPU history."""
    return item_size({
        "wid": string(worker_id), "lut": integer(1_763_000_000),
        "sts": {"M": {"C": {"L": [number(42.123456) for _ in range(HISTORY)]}}},
        "opr": {"M": {"C": {"L": [number(100.0)]}}}, "sup": integer(1), "slu": integer(1_763_000_000),
    })


def _lock_item(owner: str) -> int:
    """Bytes of the lock client's `Leader` item."""
    return item_size({"key": string("Leader"), "ownerName": string(owner),
                      "leaseDuration": string("120000"), "recordVersionNumber": string("0" * 36)})


def kcl_bill(leases: Sequence[Lease], worker_ids: Sequence[str],
             checkpoints_per_shard_minute: float) -> list[KclLine]:
    """KCL 3.x's steady-state requests and units per minute for this lease table and these workers.

    `leases` are priced as KCL stores them (spread over `worker_ids`, throughput written by every renewal, without
    shardherd's progress attributes), with
    the same worker ids as the simulated shardherd fleet so item sizes compare like for like.
    """
    per_minute = 60.0
    workers = len(worker_ids)
    owned = [lease.with_changes(lease_owner=worker_ids[index % workers], checkpoint_owner=None,
                                throughput_kbps=lease.throughput_kbps or 123.456, millis_behind_latest=None,
                                records_processed=None, bytes_processed=None)
             for index, lease in enumerate(leases)]
    sizes = [lease_size(lease) for lease in owned]
    renewal_units = sum(write_units(size) for size in sizes)
    renewals = per_minute / RENEW_S
    lines = [
        KclLine("workers", "renew every lease", len(owned) * renewals, 0.0, renewal_units * renewals),
        KclLine("workers", "checkpoints", len(owned) * checkpoints_per_shard_minute, 0.0,
                renewal_units * checkpoints_per_shard_minute),
    ]
    metrics = workers * per_minute / METRICS_S
    lines.append(KclLine("workers", "worker metrics", metrics, 0.0,
                         metrics * write_units(max(_metrics_item(w) for w in worker_ids))))
    lock = _lock_item(worker_ids[0])
    lines.append(KclLine("lock", "heartbeat", per_minute / LOCK_HEARTBEAT_S, 0.0,
                         per_minute / LOCK_HEARTBEAT_S * write_units(lock)))
    checks = max(0, workers - 1) * per_minute / LOCK_CHECK_S
    lines.append(KclLine("lock", "non-leaders read the lock", checks, checks * read_units(lock, True), 0.0))
    scans = per_minute / LAM_S + per_minute / AUDITOR_S
    pages, units = paged_read_units(sizes, 10**9, consistent=False)
    lines.append(KclLine("leader", "lease table scans", scans * pages, scans * units, 0.0))
    lam = per_minute / LAM_S
    pages, units = paged_read_units([_metrics_item(w) for w in worker_ids], 10**9, consistent=False)
    lines.append(KclLine("leader", "worker metrics scans", lam * pages, lam * units, 0.0))
    per_owner: dict[str, list[int]] = {}
    for lease in owned:
        assert lease.lease_owner is not None
        per_owner.setdefault(lease.lease_owner, []).append(index_entry_size(lease.lease_key, lease.lease_owner))
    queries = per_minute / DISCOVERY_S
    query_units = sum(paged_read_units(per_owner.get(w, []), 10**9, consistent=False)[1] for w in worker_ids)
    lines.append(KclLine("workers", "owner-index discovery", workers * queries, queries * query_units, 0.0))
    return lines
