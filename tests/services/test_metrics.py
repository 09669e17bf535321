"""/metrics parses as Prometheus text and counts what the store and the published status say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import LeaseProgress
from tests.services.harness import Replica
from tests.support.stores import make_store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[LeaseStore]:
    store = make_store("sqlite", sqlite_path=str(tmp_path / "metrics.db"))
    yield store
    store.close()


def _scrape(replica: Replica) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = replica.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_count_leases_workers_runs_and_moves(sqlite_store: LeaseStore) -> None:
    replica = Replica(sqlite_store, shards=5)
    replica.join("w1", cpu=40.0)
    replica.join("w2", cpu=10.0)
    replica.step(3)
    owners = replica.owners()
    hot = "shardId-000000000000"
    replica.lease_throughput[str(owners[hot])] = {hot: 123.5}
    replica.lease_progress[str(owners[hot])] = {hot: LeaseProgress(millis_behind_latest=750, records=42, bytes=4096,
                                                                          records_behind=17)}
    replica.heartbeat()
    samples = _scrape(replica)
    assert samples[("shardherd_total_leases", ())] == 5
    assert samples[("shardherd_total_shards", ())] == 5
    assert samples[("shardherd_unclaimed_leases", ())] == 0
    for worker in ("w1", "w2"):
        assert samples[("shardherd_worker_leases", (("worker", worker),))] == sum(o == worker for o in owners.values())
    assert samples[("shardherd_worker_cpu_ema_percent", (("worker", "w1"),))] == pytest.approx(40.0)
    assert samples[("shardherd_lease_throughput_kbps", (("lease", hot),))] == 123.5
    assert samples[("shardherd_worker_throughput_kbps", (("worker", str(owners[hot])),))] == 123.5
    assert samples[("shardherd_leader_runs_total", ())] == 3
    assert samples[("shardherd_leader_run_duration_seconds_count", ())] == 3
    assert samples[("shardherd_leader_moves_total", (("reason", "UNASSIGNED"),))] == 5
    assert samples[("shardherd_leader_epoch", ())] == 1
    assert samples[("shardherd_replica_is_leader", ())] == 1
    assert samples[("shardherd_leader_lock_changes_total", (("change", "acquired"),))] == 1
    assert samples[("shardherd_workers", (("state", "active"),))] == 2
    assert samples[("shardherd_lease_millis_behind_latest", (("lease", hot),))] == 750
    assert samples[("shardherd_lease_records", (("lease", hot), ("worker", str(owners[hot]))))] == 42
    assert samples[("shardherd_lease_bytes", (("lease", hot), ("worker", str(owners[hot]))))] == 4096
    assert samples[("shardherd_lease_records_behind", (("lease", hot),))] == 17
    assert sum(name == "shardherd_lease_millis_behind_latest" for name, _ in samples) == 1  # only what was reported
    assert sum(name == "shardherd_lease_records_behind" for name, _ in samples) == 1


def test_metrics_before_any_leader_run(sqlite_store: LeaseStore) -> None:
    replica = Replica(sqlite_store, shards=1)
    samples = _scrape(replica)
    assert samples[("shardherd_total_leases", ())] == 0
    assert samples[("shardherd_leader_status_readable", ())] == 1
    assert ("shardherd_leader_runs_total", ()) not in samples
