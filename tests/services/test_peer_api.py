"""A replica that does not lead asks the leader over HTTP (decision 0012): its lock version, its API snapshot.

Real servers on 127.0.0.1 (uvicorn), a real store, a virtual clock; store reads are counted by the StoreMeter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardherd.services.api import create_app
from shardherd.services.api.auth import ApiTokens
from shardherd.services.api.server import ApiServer
from shardherd.services.peer_client import PeerClient
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter, usage_total
from tests.services.harness import TOKEN, Replica
from tests.support.stores import make_store


@pytest.fixture
def meter(tmp_path: Path) -> Iterator[StoreMeter]:
    store: LeaseStore = make_store("sqlite", sqlite_path=str(tmp_path / "peer.db"))
    yield StoreMeter(store)
    store.close()


def _assignments(replica: Replica) -> dict[str, str | None]:
    body = replica.client.get("/v1/assignments?limit=1000").json()
    return {item["lease_key"]: item["owner"] for item in body["items"]}


def test_a_follower_serves_the_leaders_snapshot_without_store_reads_and_reads_when_the_leader_is_gone(
        meter: StoreMeter) -> None:
    settings: dict[str, Any] = {"api_cache_millis": 5_000, "api_token": TOKEN, "api_protect_reads": True}
    leader = Replica(meter, shards=6, **settings)
    follower = Replica(meter, shards=6, replica_id="coord-b", clock=leader.clock, **settings)
    server = ApiServer(create_app(leader.context), "127.0.0.1", 0).start()
    peers = PeerClient(ApiTokens.from_settings(follower.settings).for_peers())
    follower.context.from_leader = lambda fresh: peers.snapshot(follower.lock.holder_url() or "",
                                                                follower.lock.holder_id(), fresh)
    follower.client.headers.update(leader.auth())
    leader.client.headers.update(leader.auth())
    try:
        leader.lock.set_api_url(server.url)
        leader.join("w1")
        leader.join("w2")
        leader.step(3)
        follower.lock.tick()  # the follower reads the lock item once: holder and URL
        assert follower.lock.holder_url() == server.url and follower.lock.holder_id() == "coord-a"
        owners = leader.owners()
        meter.reset()
        assert _assignments(leader) == owners
        assert _assignments(follower) == owners
        workers = follower.client.get("/v1/workers").json()["items"]
        assert [worker["worker_id"] for worker in workers] == ["w1", "w2"]
        led = follower.client.get("/v1/leader").json()
        assert led["replica_id"] == "coord-b" and led["replica_is_leader"] is False
        assert led["lock"]["owner"] == "coord-a" and led["status"]["leader_id"] == "coord-a"
        assert follower.client.get("/metrics").status_code == 200
        api = usage_total(meter.rows(), caller="api")
        assert api.requests == 0, meter.rows()  # neither replica's API read the store
        assert follower.client.get("/v1/snapshot").status_code == 409  # a follower never passes on a copy
        hold = peers.hold(server.url)
        assert hold is not None and hold.leading and hold.replica_id == "coord-a"
        assert hold.version == meter.get_state("Leader")["recordVersionNumber"]  # type: ignore[index]
        key, owner = sorted(owners.items())[0]
        assert owner is not None and meter.checkpoint(key, owner, Checkpoint.at("77")).applied  # not in any view
        leader.clock.advance(6)  # the leader's view (and both cached snapshots) now older than api_cache_millis
        leader.lock.tick()  # still the leader
        body = follower.client.get("/v1/assignments?limit=1000").json()["items"]  # a caller with a token (issue 33)
        assert next(item["checkpoint"] for item in body if item["lease_key"] == key) == "77"
        meter.reset()
    finally:
        server.stop()
    follower.clock.advance(5)  # the follower's cached snapshot ages out; the leader no longer answers
    assert peers.hold(server.url) is None
    assert _assignments(follower) == owners
    assert usage_total(meter.rows(), caller="api", operation="scan").requests == 2  # it read the store itself
    peers.close()


def test_readiness_probes_read_the_store_only_without_recent_evidence_from_the_lock(meter: StoreMeter) -> None:
    """A Kubernetes readiness probe every 5 s used to cost a consistent read of the lock item per replica."""
    leader = Replica(meter, shards=2)
    follower = Replica(meter, shards=2, replica_id="coord-b", clock=leader.clock)
    leader.step(1)
    meter.reset()
    for _ in range(10):
        assert leader.client.get("/readyz").status_code == 200
        leader.step(1)  # runs and heartbeats: the store answers the holder all the time
    assert usage_total(meter.rows(), caller="api").requests == 0
    assert follower.client.get("/readyz").json()["detail"] == "store reachable (follower)"
    assert usage_total(meter.rows(), caller="api").read_units == 0.5  # no evidence yet: one read, half price
    for _ in range(6):
        leader.clock.advance(5.0)  # (the follower's lock keeper is not ticking here)
        assert follower.client.get("/readyz").status_code == 200
    assert usage_total(meter.rows(), caller="api").requests == 1  # that read is the evidence for 30 s and more
    leader.clock.advance(5.0)
    assert follower.client.get("/readyz").status_code == 200
    assert usage_total(meter.rows(), caller="api").requests == 2
