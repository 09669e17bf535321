"""GET /v1/scale and the desired-worker gauges: the leader's figure over the API harness (a real store, lock and
leader loop; a virtual clock), the same figure on a replica that does not lead, the read-token check, and a count
that rises after the scale-out window once the workers' reports show more load than the fleet carries at 70 %, and
falls once, after the scale-in window, when the load drops. About 3 s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardherd.shared.store import LeaseStore
from tests.services.harness import INTERVAL, TOKEN, Replica
from tests.support.stores import make_store

SHARDS = 6


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[LeaseStore]:
    store = make_store("sqlite", sqlite_path=str(tmp_path / "scale.db"))
    yield store
    store.close()


def _gauges(replica: Replica) -> dict[str, float]:
    response = replica.client.get("/metrics", headers=replica.auth())
    assert response.status_code == 200
    return {s.name: s.value for f in text_string_to_metric_families(response.text) for s in f.samples
            if s.name in ("shardherd_desired_workers", "shardherd_current_workers")}


def _load(replica: Replica, per_shard: float, cpu: float, runs: int) -> list[int]:
    """`runs` runs with every worker carrying `per_shard` KiB/s on each lease it owns at about `cpu` %.

    A new CPU reading each run, as an agent's report each heartbeat: the leader pairs each report with the load
    carried before it (coordinator/leader_loop.py `_throughput_histories`). The published count after each run.
    """
    counts = []
    owners = replica.owners()
    for run in range(runs):
        for worker in replica.cpu:
            replica.cpu[worker] = cpu + 0.1 * (run % 2)
            replica.lease_throughput[worker] = {key: per_shard for key, owner in owners.items() if owner == worker}
        replica.step()
        counts.append(replica.client.get("/v1/scale", headers=replica.auth()).json()["desired_workers"])
    return counts


def test_the_leaders_count_is_served_by_every_replica_and_rises_with_load(sqlite_store: LeaseStore) -> None:
    settings: dict[str, Any] = {"api_token": TOKEN, "api_protect_reads": True, "scale_max_workers": 8,
                                "scale_out_after_millis": int(3 * INTERVAL * 1000),
                                "scale_in_after_millis": int(10 * INTERVAL * 1000)}
    leader = Replica(sqlite_store, shards=SHARDS, publish_every=0.0, **settings)
    follower = Replica(sqlite_store, shards=SHARDS, replica_id="coord-b", clock=leader.clock, **settings)
    assert leader.client.get("/v1/scale", headers=leader.auth()).status_code == 503  # nothing published yet
    leader.join("w1")
    leader.join("w2")
    leader.step(3)
    assert set(_load(leader, per_shard=100.0, cpu=50.0, runs=6)) == {2}  # 300 KiB/s at 50 % each: room at 70 %
    assert leader.client.get("/v1/scale").status_code == 401  # reads are protected: the token is needed
    calm = leader.client.get("/v1/scale", headers=leader.auth()).json()
    assert calm["desired_workers"] == calm["current_workers"] == 2, calm
    assert calm["remove_first"] in ("w1", "w2") and calm["load_kbps"] == pytest.approx(SHARDS * 100.0)
    assert _gauges(leader) == {"shardherd_desired_workers": 2, "shardherd_current_workers": 2}

    counts = _load(leader, per_shard=300.0, cpu=95.0, runs=12)  # three times the load, near the top of the range
    hot = leader.client.get("/v1/scale", headers=leader.auth()).json()
    assert hot["desired_workers"] > 2, (counts, hot)
    expected = min(8, math.ceil(hot["load_kbps"] / hot["capacity_kbps"] - 1e-9))
    assert hot["desired_workers"] == expected, hot
    first = counts.index(hot["desired_workers"])
    assert first >= 2, counts  # not before the scale-out window (3 runs) has passed
    assert len(set(counts[first:])) == 1, counts  # and no flapping after
    assert _gauges(leader)["shardherd_desired_workers"] == hot["desired_workers"]
    follower.heartbeat()
    follower.lock.tick()
    assert follower.loop.run_once() is None  # it does not lead
    served = follower.client.get("/v1/scale", headers=follower.auth()).json()
    assert served == hot
    assert _gauges(follower)["shardherd_desired_workers"] == hot["desired_workers"]

    quiet = _load(leader, per_shard=50.0, cpu=30.0, runs=16)  # the load drops to a sixth
    drop = [i for i, (a, b) in enumerate(itertools.pairwise([hot["desired_workers"], *quiet])) if a != b]
    assert quiet[-1] < hot["desired_workers"] and len(drop) == 1, quiet  # one change down, no flapping
    assert drop[0] + 1 >= 10, quiet  # not before the scale-in window (10 runs)


def test_a_new_leader_continues_the_published_count(sqlite_store: LeaseStore) -> None:
    """The leader dies while its count is above the worker count: the replica that takes over serves the same count
    from its first run on (before: it started again from the workers it saw, 2, and rose only after the scale-out
    window: an autoscaler removed and re-added workers at every leader change)."""
    settings: dict[str, Any] = {"api_token": TOKEN, "api_protect_reads": True, "scale_max_workers": 8,
                                "scale_out_after_millis": int(3 * INTERVAL * 1000),
                                "scale_in_after_millis": int(30 * INTERVAL * 1000)}  # longer than the takeover
    leader = Replica(sqlite_store, shards=SHARDS, publish_every=0.0, **settings)
    follower = Replica(sqlite_store, shards=SHARDS, replica_id="coord-b", clock=leader.clock, publish_every=0.0,
                       **settings)
    leader.join("w1")
    leader.join("w2")
    leader.step(3)
    _load(leader, per_shard=300.0, cpu=95.0, runs=12)
    hot = leader.client.get("/v1/scale", headers=leader.auth()).json()
    assert hot["desired_workers"] > hot["current_workers"] == 2, hot

    # The leader's replica dies (no more lock heartbeats); the same workers go on, now heartbeating through the
    # follower's harness, with the same load.
    follower.cpu, follower.beats, follower.lease_throughput = leader.cpu, leader.beats, leader.lease_throughput
    leader.clock.advance(1.5 * leader.settings.leader_lock_lease_duration_millis / 1000)
    counts = _load(follower, per_shard=300.0, cpu=95.0, runs=12)
    assert follower.lock.is_leader()
    served = follower.client.get("/v1/scale", headers=follower.auth()).json()
    assert served["current_workers"] == 2 and served["computed_at"] > hot["computed_at"], served  # its own figure
    assert counts == [hot["desired_workers"]] * len(counts), counts
