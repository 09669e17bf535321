"""POST /v1/pause, /v1/resume, /v1/rewind and GET /v1/rewinds on a replica (memory store, virtual clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shardherd.coordinator.assignment_feed import NEWS
from shardherd.shared.assignment_channel import PAUSED_MARK
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from tests.services.harness import TOKEN, Replica

KEY = "shardId-000000000001"


@pytest.fixture
def replica() -> Replica:
    replica = Replica(MemoryLeaseStore(TableNames.for_application("api-test")), shards=4, api_token=TOKEN,
                      stream_name="controls")
    replica.join("w1")
    replica.step(2)
    return replica


def test_pause_and_resume_a_shard(replica: Replica) -> None:
    owner = replica.owners()[KEY]
    assert owner is not None
    response = replica.client.post("/v1/pause", params={"shard": KEY, "reason": "bad deploy"}, headers=replica.auth())
    assert response.status_code == 200, response.text
    assert response.json() == {"leases": [{"lease_key": KEY, "owner": owner, "paused": "bad deploy"}]}
    assert replica.loop.feed.take_signals() == [(owner, NEWS)]
    replica.step(1)
    assert replica.loop.feed.position(owner).leases[KEY].endswith(PAUSED_MARK)  # the owner hears of it
    listed = {lease["lease_key"]: lease for lease in replica.client.get("/v1/assignments").json()["items"]}
    assert listed[KEY]["paused"] == "bad deploy" and listed[KEY]["owner"] == owner
    replica.client.post("/v1/resume", params={"shard": KEY}, headers=replica.auth())
    row = replica.store.get_lease(KEY)
    assert row is not None and not row.is_paused


def test_bad_requests_are_one_line_and_write_nothing(replica: Replica) -> None:
    before = replica.store.scan_leases().leases
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for path, params, said in (("/v1/pause", {"shard": "shardId-9"}, "no lease for shard 'shardId-9'"),
                               ("/v1/pause", {}, "name at least one shard or stream"),
                               ("/v1/pause", {"shard": KEY, "reason": "a\nb"}, "one line"),
                               ("/v1/rewind", {"to": future}, "in the future"),
                               ("/v1/rewind", {"to": "2026-01-01T00:00:00Z", "shard": "nope"}, "no lease")):
        response = replica.client.post(path, params=params, headers=replica.auth())
        assert response.status_code == 400 and said in response.json()["detail"], response.text
    assert replica.store.scan_leases().leases == before
    assert replica.client.get("/v1/rewinds", headers=replica.auth()).json() == []


def test_controls_need_the_admin_token(replica: Replica) -> None:
    for path in ("/v1/pause", "/v1/resume", "/v1/rewind"):
        assert replica.client.post(path, params={"shard": KEY}).status_code in (401, 403)
    row = replica.store.get_lease(KEY)
    assert row is not None and not row.is_paused
