"""The operator API on every store backend: workers, assignments, explain, leader, drain, plan, readiness."""

from __future__ import annotations

import pytest

from shardherd.coordinator.assignment_feed import NEWS
from shardherd.coordinator.moves import MoveReason
from shardherd.services.api.assignments import encode_cursor
from shardherd.services.leader_status import STATUS_KEY, VERSION_ATTRIBUTE, read_status
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import FailingBatch, LeaseProgress, PoisonReport, WorkerRecord
from tests.services.harness import INTERVAL, TOKEN, Replica, even_shards
from tests.support.stores import worker_record


@pytest.fixture
def replica(store: LeaseStore) -> Replica:
    replica = Replica(store, shards=6, api_token=TOKEN)
    replica.client.headers.update(replica.auth())  # an operator: reads as fresh as the store (anonymous: test_auth)
    replica.join("w1", cpu=30.0)
    replica.join("w2", cpu=70.0)
    replica.step(2)
    return replica


def test_workers_show_state_cpu_and_leases(replica: Replica) -> None:
    body = replica.client.get("/v1/workers").json()
    workers = {w["worker_id"]: w for w in body["items"]}
    assert set(workers) == {"w1", "w2"}
    assert body["malformed"] == []
    owners = replica.owners()
    for wid, worker in workers.items():
        assert worker["state"] == "active"
        assert worker["lease_count"] == sum(1 for owner in owners.values() if owner == wid)
        assert worker["cpu_history"] == [replica.cpu[wid]] * 2
        assert worker["cpu_ema"] == pytest.approx(replica.cpu[wid])
        assert worker["operating_range"] == {"C": [100.0]}
        assert worker["heartbeat"] == replica.beats[wid]
    assert sum(w["lease_count"] for w in workers.values()) == 6


def test_worker_that_stops_heartbeating_turns_expired_with_its_leases(replica: Replica) -> None:
    replica.client.get("/v1/workers")  # this replica sees the current heartbeats
    replica.leave("w2")
    replica.clock.advance(replica.context.timing.grace.agent + 1)
    replica.heartbeat()
    workers = {w["worker_id"]: w for w in replica.client.get("/v1/workers").json()["items"]}
    assert workers["w2"]["state"] == "expired"
    assert workers["w2"]["heartbeat_age_seconds"] > replica.context.timing.grace.agent
    assert workers["w1"]["state"] == "active"
    expired = replica.client.get("/v1/assignments", params={"state": "expired"}).json()["items"]
    assert {lease["owner"] for lease in expired} == {"w2"}
    assert len(expired) == sum(1 for owner in replica.owners().values() if owner == "w2")


def test_assignments_filters_and_pages(replica: Replica) -> None:
    everything = replica.client.get("/v1/assignments").json()
    assert everything["total"] == 6 and everything["next_cursor"] is None
    assert all(lease["state"] == "owned" for lease in everything["items"])
    keys, cursor = [], None
    while True:
        params: dict[str, str | int] = {"limit": 4}
        if cursor:
            params["cursor"] = cursor
        page = replica.client.get("/v1/assignments", params=params).json()
        keys += [lease["lease_key"] for lease in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert keys == sorted(replica.owners())
    mine = replica.client.get("/v1/assignments", params={"worker": "w1"}).json()
    assert {lease["lease_key"] for lease in mine["items"]} == {k for k, o in replica.owners().items() if o == "w1"}
    assert replica.client.get("/v1/assignments", params={"stream": "other"}).json()["total"] == 0
    assert replica.client.get("/v1/assignments", params={"state": "unassigned"}).json()["items"] == []
    last = sorted(replica.owners())[-1]
    assert replica.client.get("/v1/assignments", params={"cursor": encode_cursor(last)}).json()["items"] == []


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"state": "sleeping"},
                                    {"cursor": "%%%"}, {"cursor": "_w"}, {"explain": "perhaps"}])
def test_bad_parameters_are_4xx_with_a_message(replica: Replica, params: dict[str, object]) -> None:
    response = replica.client.get("/v1/assignments", params=params)
    assert 400 <= response.status_code < 500
    assert response.json()["detail"]


def test_explain_gives_the_reasons_of_recent_runs(replica: Replica) -> None:
    body = replica.client.get("/v1/assignments", params={"explain": "true"}).json()
    for lease in body["items"]:
        reasons = lease["explanation"]
        assert reasons, lease["lease_key"]
        assert reasons[0]["kind"] == "move" and reasons[0]["reason"] == MoveReason.UNASSIGNED.value
        assert reasons[0]["to_worker"] == lease["owner"]
    assert replica.client.get("/v1/assignments").json()["items"][0]["explanation"] is None


def test_leader_shows_lock_epoch_runs_and_freshness(replica: Replica) -> None:
    body = replica.client.get("/v1/leader").json()
    assert body["lock"]["owner"] == "coord-a" and body["lock"]["epoch"] == 1
    assert body["replica_is_leader"] is True and body["stale"] is False
    status = body["status"]
    assert status["leader_id"] == "coord-a" and len(status["runs"]) == 2
    assert status["totals"]["runs"] == 2
    assert status["totals"]["moves_by_reason"] == {"UNASSIGNED": 6}
    assert body["last_success_age_seconds"] == pytest.approx(INTERVAL)  # the second run started one interval ago


def test_drain_sets_the_flag_and_the_leader_moves_the_leases(replica: Replica) -> None:
    before = {k for k, o in replica.owners().items() if o == "w2"}
    assert before
    response = replica.client.post("/v1/workers/w2/drain", headers=replica.auth())
    assert response.status_code == 200 and response.json() == {"worker_id": "w2", "drain_requested": True}
    assert replica.loop.feed.take_signals() == [("w2", NEWS)]  # the leader scans at once, not at its next full scan
    record = worker_record(replica.store, "w2")
    assert record is not None and record.drain_requested
    assert {w["worker_id"]: w["state"] for w in replica.client.get("/v1/workers").json()["items"]}["w2"] == "draining"
    summaries = replica.step(1)
    assert summaries[0] is not None and summaries[0].moves_by_reason() == {"DRAIN": len(before)}
    moved = {lease["lease_key"]: lease for lease in replica.client.get("/v1/assignments").json()["items"]}
    assert all(moved[key]["owner"] == "w1" and moved[key]["checkpoint_owner"] == "w2" for key in before)
    assert all(moved[key]["state"] == "handoff" for key in before)
    explained = replica.client.get("/v1/assignments", params={"explain": "true", "worker": "w2"}).json()["items"]
    assert {lease["explanation"][0]["reason"] for lease in explained} == {"DRAIN"}
    undo = replica.client.post("/v1/workers/w2/undrain", headers=replica.auth())
    assert undo.json()["drain_requested"] is False
    record = worker_record(replica.store, "w2")
    assert record is not None and not record.drain_requested


def test_drain_of_unknown_worker_is_404(replica: Replica) -> None:
    response = replica.client.post("/v1/workers/nobody/drain", headers=replica.auth())
    assert response.status_code == 404 and "nobody" in response.json()["detail"]


def test_restart_reservation_over_the_api_keeps_a_dead_workers_leases_for_the_window(replica: Replica) -> None:
    held = {k for k, o in replica.owners().items() if o == "w2"}
    assert held
    response = replica.client.post("/v1/workers/w2/restart", params={"within": "40s"}, headers=replica.auth())
    assert response.status_code == 200 and response.json() == {"worker_id": "w2", "restart_within_ms": 40_000}
    assert replica.loop.feed.take_signals() == [("w2", NEWS)]
    replica.leave("w2")  # the pod stops
    replica.step(12)  # 24 s: past the failover time, within the window
    assert {k for k, o in replica.owners().items() if o == "w2"} == held
    workers = {w["worker_id"]: w for w in replica.client.get("/v1/workers").json()["items"]}
    assert workers["w2"]["state"] == "restarting" and workers["w2"]["restart_within_ms"] == 40_000
    states = {lease["lease_key"]: lease["state"] for lease in replica.client.get("/v1/assignments").json()["items"]}
    assert {key for key, state in states.items() if state == "reserved"} == held
    assert f'shardherd_leases_by_state{{state="reserved"}} {len(held)}.0' in replica.client.get("/metrics").text
    cleared = replica.client.delete("/v1/workers/w2/restart", headers=replica.auth())
    assert cleared.status_code == 200 and cleared.json()["restart_within_ms"] is None
    replica.step(2)  # no reservation: a row silent past the failover time fails over at once
    assert "w2" not in replica.owners().values()


@pytest.mark.parametrize(("path", "within", "code", "says"), [
    ("/v1/workers/w2/restart", "soon", 400, "is not a duration"),
    ("/v1/workers/w2/restart", "100ms", 400, "between 1 s and 60 min"),
    ("/v1/workers/w2/restart", "x" * 40, 422, "at most 32 characters"),
    ("/v1/workers/nobody/restart", "60s", 404, "no worker 'nobody'"),
])
def test_restart_reservation_refuses_bad_input_and_writes_nothing(replica: Replica, path: str, within: str,
                                                                  code: int, says: str) -> None:
    response = replica.client.post(path, params={"within": within}, headers=replica.auth())
    assert response.status_code == code and says in str(response.json()["detail"]), response.json()
    record = worker_record(replica.store, "w2")
    assert record is not None and record.restart_within_ms is None
    assert worker_record(replica.store, "nobody") is None


def test_restart_reservation_needs_the_admin_token(replica: Replica) -> None:
    assert replica.client.post("/v1/workers/w2/restart", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_plan_is_a_dry_run(replica: Replica) -> None:
    replica.join("w3", cpu=5.0)
    replica.heartbeat()  # w3's first row, new in the leader's term: alive at once (decision 0038); no run yet
    before = replica.store.scan_leases().leases
    body = replica.client.post("/v1/plan").json()
    assert body["replica_is_leader"] is True
    assert {w["worker_id"] for w in body["workers"]} == {"w1", "w2", "w3"}
    assert body["moves"], body
    assert all(move["to_worker"] == "w3" and move["reason"].startswith("BALANCE") for move in body["moves"])
    assert replica.store.scan_leases().leases == before


def test_readyz_fails_for_a_stalled_leader_and_recovers(replica: Replica) -> None:
    assert replica.client.get("/readyz").status_code == 200
    limit = replica.context.stall_limit_seconds
    replica.clock.advance(limit)  # the loop thread hangs: no run for k intervals, while the lock stays held
    replica.heartbeat()
    replica.lock.tick()
    stalled = replica.client.get("/readyz")
    assert stalled.status_code == 503
    assert "without a successful run" in stalled.json()["detail"]
    assert replica.client.get("/v1/leader").json()["stale"] is True
    replica.step(1)
    assert replica.client.get("/readyz").status_code == 200
    assert replica.client.get("/healthz").json()["status"] == "ok"


def test_follower_is_ready_and_reads_what_the_leader_published(replica: Replica) -> None:
    follower = Replica(replica.store, replica_id="coord-b", clock=replica.clock)
    follower.lock.tick()
    assert not follower.lock.is_leader()
    assert follower.client.get("/readyz").json()["detail"] == "store reachable (follower)"
    leader = follower.client.get("/v1/leader").json()
    assert leader["replica_is_leader"] is False and leader["lock"]["owner"] == "coord-a"
    assert leader["status"]["totals"]["runs"] == 2
    explained = follower.client.get("/v1/assignments", params={"explain": "true"}).json()["items"]
    assert all(lease["explanation"][0]["reason"] == "UNASSIGNED" for lease in explained)


def test_malformed_status_is_reported_not_a_500(replica: Replica) -> None:
    # A replica that does not lead reads the status item (the leader serves the status it published itself).
    follower = Replica(replica.store, shards=6, replica_id="coord-b", clock=replica.clock, api_token=TOKEN)
    follower.client.headers.update(follower.auth())
    replica.store.put_state(STATUS_KEY, {VERSION_ATTRIBUTE: 1, "status": "{not json"})
    body = follower.client.get("/v1/leader").json()
    assert body["status"] is None and "LeaderStatus" in body["status_error"]
    explain = follower.client.get("/v1/assignments", params={"explain": "true"})
    assert explain.status_code == 503 and "cannot explain" in explain.json()["detail"]
    assert follower.client.get("/metrics").status_code == 200


def test_checkpoint_age_counts_from_the_last_move_this_replica_saw(replica: Replica) -> None:
    def ages() -> dict[str, float]:
        items = replica.client.get("/v1/assignments").json()["items"]
        return {lease["lease_key"]: lease["checkpoint_age_seconds"] for lease in items}

    assert set(ages().values()) == {0.0}  # first look
    replica.clock.advance(7.5)
    assert set(ages().values()) == {7.5}
    key, owner = sorted(replica.owners().items())[0]
    assert owner is not None
    assert replica.store.checkpoint(key, owner, Checkpoint("49590338271490256608559692538361571095921575989136588898")
                                    ).applied
    assert ages()[key] == 0.0  # seen moving now
    replica.clock.advance(1.0)
    moved = ages()
    assert moved.pop(key) == 1.0
    assert set(moved.values()) == {8.5}


def test_checkpoint_age_counts_from_the_time_the_owner_stored_with_it(replica: Replica) -> None:
    """Issue 33: an age from the stored time is right however late a replica scans; a checkpoint whose stored time
    did not change with it (a KCL worker's write leaves shardherd's attribute) counts from the replica's first look."""
    def age(key: str) -> float:
        items = replica.client.get("/v1/assignments").json()["items"]
        return float(next(lease["checkpoint_age_seconds"] for lease in items if lease["lease_key"] == key))

    key, owner = sorted(replica.owners().items())[0]
    assert owner is not None
    written = replica.clock.time() - 4.0  # written 4 s before this replica's scan
    stamped = LeaseProgress(records=10, checkpointed_at_millis=int(written * 1000))
    assert replica.store.checkpoint(key, owner, Checkpoint("4959033827149025660855969253836157109592157598913"
                                                           "6588898"), progress=stamped).applied
    assert age(key) == pytest.approx(4.0, abs=0.01)
    replica.clock.advance(2.0)
    assert age(key) == pytest.approx(6.0, abs=0.01)
    assert replica.store.checkpoint(key, owner, Checkpoint("4959033827149025660855969253836157109592157598913"
                                                           "6588899"), progress=stamped).applied  # same stamp
    assert age(key) == 0.0  # a new value without a new time: from this replica's look


def test_a_failing_shard_sync_is_reported_while_leases_are_still_failed_over(replica: Replica) -> None:
    victims = {key for key, owner in replica.owners().items() if owner == "w2"}
    assert victims
    replica.shards = replica.shards[1:]  # ListShards returns a listing that does not tile the hash key space
    replica.leave("w2")
    follower = Replica(replica.store, replica_id="coord-b", clock=replica.clock)
    for _ in range(30):
        replica.step(1)
        if replica.client.get("/readyz").status_code == 503:
            break
    ready = replica.client.get("/readyz")
    assert ready.status_code == 503 and "shard sync failing" in ready.json()["detail"]
    assert "hash key space" in ready.json()["detail"]
    follower.lock.tick()
    assert follower.client.get("/readyz").status_code == 200  # only the leader's readiness reflects its sync
    status = follower.client.get("/v1/leader").json()["status"]
    assert "hash key space" in status["shard_sync_error"] and status["shard_sync_failing_since"] is not None
    assert all(run["ok"] for run in status["runs"])
    assert any("hash key space" in (run["shard_sync_error"] or "") for run in status["runs"])
    assert all(owner == "w1" for key, owner in replica.owners().items() if key in victims)  # failed over anyway
    metrics = follower.client.get("/metrics", headers=replica.auth()).text
    assert _sample(metrics, "shardherd_leader_shard_sync_failures_total") >= 2
    assert _sample(metrics, "shardherd_leader_shard_sync_failing_seconds") > replica.context.stall_limit_seconds
    assert _sample(metrics, "shardherd_leader_failed_runs_total") == 0

    replica.shards = even_shards(6)  # ListShards answers properly again
    for _ in range(10):
        replica.step(1)
        if replica.client.get("/readyz").status_code == 200:
            break
    assert replica.client.get("/readyz").status_code == 200
    assert replica.client.get("/v1/leader").json()["status"]["shard_sync_failing_since"] is None
    assert _sample(replica.client.get("/metrics", headers=replica.auth()).text,
                   "shardherd_leader_shard_sync_failing_seconds") == 0


def _sample(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_api_and_leader_judge_agents_and_kcl_workers_by_one_rule(store: LeaseStore) -> None:
    # Issue 20: the API had its own grace. In lease mode a KCL worker (row without `hb`, rewritten every 30 s) is
    # alive for two reporter intervals, a shardherd agent (row with `hb`, every heartbeat) for the failover time:
    # the leader and the API now say the same about both.
    replica = Replica(store, shards=4, liveness_mode="lease")
    replica.join("agent-a")

    def states() -> dict[str, str]:
        return {w["worker_id"]: w["state"] for w in replica.client.get("/v1/workers").json()["items"]}

    for step in range(20):  # 40 s: the KCL row changes twice (every 30 s), the agent's every step
        if step % 15 == 0:
            store.upsert_worker(WorkerRecord("kcl-b", int(replica.clock.time())))
        states()
        replica.step()
    replica.leave("agent-a")  # kill -9
    summaries = []
    for _ in range(7):  # 14 s: longer than the failover time, shorter than the KCL row's 60 s
        states()
        summaries += replica.step()
    assert states() == {"agent-a": "expired", "kcl-b": "active"}
    assert summaries[-1] is not None and summaries[-1].active_workers == 1


def test_a_shard_stuck_on_a_failing_batch_shows_in_assignments_and_metrics(replica: Replica) -> None:
    """Decision 0022: the owner's row carries the stuck batch (every backend's codec), the API and /metrics show it."""
    key, owner = next((key, owner) for key, owner in sorted(replica.owners().items()) if owner == "w1")
    since = replica.clock.time() - 40
    replica.lease_progress["w1"] = {key: LeaseProgress(failing=FailingBatch(since, 6, "ValueError: bad record 17"))}
    replica.heartbeat()
    row = worker_record(replica.store, "w1")
    assert row is not None and row.lease_progress[key].failing == FailingBatch(float(int(since)), 6,
                                                                                "ValueError: bad record 17")
    (lease,) = [item for item in replica.client.get("/v1/assignments").json()["items"] if item["lease_key"] == key]
    assert (lease["failing_since"], lease["failing_attempts"], lease["failing_error"]) == (
        float(int(since)), 6, "ValueError: bad record 17")
    metrics = replica.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert f'shardherd_lease_failing_batch_attempts{{lease="{key}",worker="{owner}"}} 6.0' in metrics
    others = [item for item in replica.client.get("/v1/assignments").json()["items"] if item["lease_key"] != key]
    assert all(item["failing_attempts"] is None for item in others)


def test_a_throttled_shard_shows_its_throttled_reads_in_assignments_and_metrics(replica: Replica) -> None:
    """Issue 32: the owner's row carries each shard's read calls throttled in the last minute (every backend's
    codec); the API and /metrics show it, 0 for the owner's other shards."""
    key, other = sorted(key for key, owner in replica.owners().items() if owner == "w1")[:2]
    replica.lease_progress["w1"] = {key: LeaseProgress(throttled=17)}
    replica.heartbeat()
    row = worker_record(replica.store, "w1")
    assert row is not None and row.lease_progress[key].throttled == 17
    items = {item["lease_key"]: item for item in replica.client.get("/v1/assignments").json()["items"]}
    assert (items[key]["read_throttled"], items[other]["read_throttled"]) == (17, 0)
    metrics = replica.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert f'shardherd_lease_read_throttled{{lease="{key}"}} 17.0' in metrics


def test_poison_records_show_per_shard_in_assignments_and_the_poison_summary(replica: Replica) -> None:
    """Decision 0031: the owner's row carries, per lease, the poison record it is blocked on and the records it
    quarantined (the newest by position and object: bounded); every backend's codec keeps them; the API lists them."""
    blocked_key, quarantined_key = sorted(key for key, owner in replica.owners().items() if owner == "w1")[:2]
    since = replica.clock.time() - 12
    sequence = "49590338271490256608559692538361571095921575989136588898"
    blocked = LeaseProgress(failing=FailingBatch(since, 4, f"poison record {sequence}/0: ValueError: not JSON"),
                            poison=PoisonReport(blocked_on=f"{sequence}/0"))
    stored_at = f"file:///dlq/s/shardId-000000000001/{sequence}-00003.json"
    quarantined = LeaseProgress(poison=PoisonReport(None, 2, f"{sequence}/3", stored_at))
    replica.lease_progress["w1"] = {blocked_key: blocked, quarantined_key: quarantined}
    replica.heartbeat()
    row = worker_record(replica.store, "w1")
    assert row is not None
    assert row.lease_progress[blocked_key].poison == PoisonReport(blocked_on=f"{sequence}/0")
    assert row.lease_progress[quarantined_key].poison == PoisonReport(None, 2, f"{sequence}/3", stored_at)
    leases = {item["lease_key"]: item for item in replica.client.get("/v1/assignments").json()["items"]}
    assert (leases[blocked_key]["poison_blocked_on"], leases[blocked_key]["quarantined_records"]) == (
        f"{sequence}/0", 0)
    assert [leases[quarantined_key][field] for field in ("poison_blocked_on", "quarantined_records",
                                                         "last_quarantined", "last_quarantined_object")] == [
        None, 2, f"{sequence}/3", stored_at]
    poison = replica.client.get("/v1/poison").json()["items"]
    assert poison == [
        {"lease_key": blocked_key, "shard_id": leases[blocked_key]["shard_id"], "owner": "w1",
         "blocked_on": f"{sequence}/0", "blocked_since": float(int(since)),
         "error": f"poison record {sequence}/0: ValueError: not JSON", "quarantined": 0, "last_quarantined": None,
         "last_object": None},
        {"lease_key": quarantined_key, "shard_id": leases[quarantined_key]["shard_id"], "owner": "w1",
         "blocked_on": None, "blocked_since": None, "error": None, "quarantined": 2,
         "last_quarantined": f"{sequence}/3", "last_object": stored_at},
    ]
    replica.lease_progress["w1"] = {}
    replica.heartbeat()
    assert replica.client.get("/v1/poison").json()["items"] == []


def test_the_favicon_a_browser_asks_for_is_served(replica: Replica) -> None:
    icon = replica.client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert b"<svg" in icon.content


def test_moves_a_killed_leader_made_after_its_last_publication_are_shown_and_kept(replica: Replica) -> None:
    """Under churn the leader publishes at most once per MIN_PUBLISH_SECONDS, so its newest moves may be on their
    lease rows only (`lastMove`) when it is killed: a follower's API shows them, and the next leader publishes them."""
    store = replica.store
    replica = Replica(store, shards=6, replica_id="coord-c", clock=replica.clock, publish_every=3600.0)
    replica.client.headers.update({"Authorization": f"Bearer {TOKEN}"})
    replica.clock.advance(replica.settings.leader_lock_lease_duration_millis / 1000 + INTERVAL)
    replica.join("w1", cpu=30.0)
    replica.join("w2", cpu=70.0)
    replica.join("w3", cpu=50.0)
    replica.step(3)  # leads, w3 gets leases: moves, published with the burst's tokens (the bucket refills hourly)
    replica.leave("w2")
    for _ in range(12):  # w2's leases expire and move on: news the bucket does not publish
        replica.step(1)
    moved = {lease.lease_key for lease in replica.store.scan_leases().leases if lease.last_move is not None}
    published = read_status(store)
    assert published is not None and published.leader_id == "coord-c"
    expired_rows = {lease.lease_key: lease.lease_owner for lease in replica.store.scan_leases().leases
                    if lease.last_move is not None and '"r":"EXPIRED"' in lease.last_move}
    assert expired_rows and not {m.lease_key for m in published.recent_moves if m.reason == "EXPIRED"}, \
        "the precondition: the newest moves are not published yet"
    # The leader is killed (it never runs again); a follower serves the API before it leads.
    follower = Replica(replica.store, replica_id="coord-b", clock=replica.clock)
    follower.client.headers.update(replica.auth())
    shown = follower.client.get("/v1/leader").json()["status"]["recent_moves"]
    assert {(m["lease_key"], m["to_worker"]) for m in shown if m["reason"] == "EXPIRED"} == set(expired_rows.items())
    assert moved <= {m["lease_key"] for m in shown}  # every lease row's last move
    explained = follower.client.get("/v1/assignments", params={"explain": "true"}).json()["items"]
    assert {lease["lease_key"] for lease in explained if lease["explanation"]
            and lease["explanation"][0]["reason"] == "EXPIRED"} == set(expired_rows)
    # It takes over; its first run publishes the moves its predecessor never did.
    follower.lock.tick()  # sees the lock item; it takes it once that stayed unchanged a lock duration
    replica.clock.advance(replica.settings.leader_lock_lease_duration_millis / 1000 + INTERVAL)
    follower.cpu, follower.beats = {"w1": 30.0, "w3": 50.0}, dict(replica.beats)
    follower.step(1)
    assert follower.lock.is_leader()
    status = read_status(replica.store)
    assert status is not None and status.leader_id == "coord-b"
    assert {(m.lease_key, m.to_worker) for m in status.recent_moves if m.reason == "EXPIRED"} \
        == set(expired_rows.items())


def test_the_leaders_last_good_run_is_its_newest_run_not_the_last_heartbeat(replica: Replica) -> None:
    """The lock heartbeat (written before each run here) lags a run; the leader replica knows its newest run itself."""
    replica.step(3)  # runs that change nothing: the status is not published again
    body = replica.client.get("/v1/leader").json()
    assert body["replica_is_leader"] and body["last_success_age_seconds"] == pytest.approx(INTERVAL)


def test_a_fleet_wide_stall_is_judged_by_the_leader_and_carried_on_the_assignment_channel(replica: Replica) -> None:
    """Decision 0039: both lease-holding workers report a stalled lease in their rows (every backend's codec): the
    leader's next full run judges the fleet stalled, every long-poll answer says so and /metrics shows it; one of two
    stalling is a local fault."""
    owners = replica.owners()
    mine = {worker: sorted(key for key, owner in owners.items() if owner == worker)[0] for worker in ("w1", "w2")}

    def channel_says() -> bool:
        answer = replica.client.get("/v1/workers/w1/assignments/changes", params={"wait": 0})
        assert answer.status_code == 200
        return bool(answer.json()["fleet_stalls"])

    def metric() -> str:
        text: str = replica.client.get("/metrics").text
        return next(line for line in text.splitlines() if line.startswith("shardherd_fleet_stalled "))

    assert not channel_says() and metric() == "shardherd_fleet_stalled 0.0"
    replica.lease_progress["w1"] = {mine["w1"]: LeaseProgress(stalled=True)}
    replica.step()
    assert not channel_says()  # one of two: a local fault, given back as before
    replica.lease_progress["w2"] = {mine["w2"]: LeaseProgress(stalled=True)}
    replica.step()
    assert worker_record(replica.store, "w2").lease_progress[mine["w2"]].stalled  # type: ignore[union-attr]
    assert channel_says() and metric() == "shardherd_fleet_stalled 1.0"
    items = replica.client.get("/v1/assignments").json()["items"]
    assert {item["lease_key"] for item in items if item["read_stalled"]} == set(mine.values())
    assert replica.owners() == owners  # the verdict moves no lease
    replica.lease_progress.clear()  # reads came back
    replica.step()
    assert not channel_says() and metric() == "shardherd_fleet_stalled 0.0"


def test_a_lease_stalled_at_two_workers_is_judged_by_the_leader_and_told_to_its_owner_alone(replica: Replica) -> None:
    """Decision 0043: w2's row reports a lease stalled (it held it before), then given back; now its owner w1 reports
    it stalled too. The leader's next full run judges it shard-stalled: w1's long-poll answer names it, w2's does not
    (not its lease), /metrics counts it, /v1/assignments marks it; no lease moves, and (one of two workers stalling
    now) no fleet-wide stall is said."""
    owners = replica.owners()
    hot = sorted(key for key, owner in owners.items() if owner == "w1")[0]

    def told(worker: str) -> list[str]:
        answer = replica.client.get(f"/v1/workers/{worker}/assignments/changes", params={"wait": 0})
        assert answer.status_code == 200 and not answer.json()["fleet_stalls"]
        return list(answer.json()["shard_stalls"])

    def metric() -> str:
        text: str = replica.client.get("/metrics").text
        return next(line for line in text.splitlines() if line.startswith("shardherd_shard_stalled_leases "))

    replica.lease_progress["w2"] = {hot: LeaseProgress(stalled=True)}
    replica.step()
    assert told("w1") == [] and metric() == "shardherd_shard_stalled_leases 0.0"  # one worker: its own fault
    replica.lease_progress["w2"] = {hot: LeaseProgress(refused=True)}
    replica.lease_progress["w1"] = {hot: LeaseProgress(stalled=True)}
    replica.step()
    assert told("w1") == [hot] and told("w2") == [] and metric() == "shardherd_shard_stalled_leases 1.0"
    items = replica.client.get("/v1/assignments").json()["items"]
    assert {item["lease_key"] for item in items if item["shard_stalled"]} == {hot}
    assert all(item["shard_stalled"] is not None for item in items)  # the leading replica knows
    assert replica.owners() == owners  # the verdict moves no lease
