"""The leader scans rarely while every live worker listens on the channel, yet reacts at once to what matters.

Real stores (SQLite and DynamoDB on moto server) metered per caller, the leader's own feed as the channel, a virtual
clock. Each test fails if the leader scans every run, or if it waits for its full-scan interval before acting on a
dropped connection, an agent's news, or a worker that does not listen.
"""

from __future__ import annotations

import dataclasses

from shardherd.coordinator.assignment_feed import NEWS, REPOLL_GRACE_SECONDS
from shardherd.coordinator.liveness import decode_sightings
from shardherd.coordinator.scan_policy import CADENCE
from shardherd.services.leader_status import STATUS_KEY, LeaderWatch
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter, acting_as, usage_total
from shardherd.shared.worker import WorkerState
from tests.coordinator.test_leader_loop import INTERVAL, Fleet, _even_shards
from tests.support.stores import worker_record

FULL_SCAN = 20.0


class ListeningFleet(Fleet):
    """Workers that heartbeat through the store, keep a long-poll open on the leader's feed and finish the handoffs
    the leader starts from them (a listening worker's row is alive before a silent one's: decision 0038)."""

    def __init__(self, store: LeaseStore, shards: int) -> None:
        self.meter = StoreMeter(store, consistent_reads=False, default_caller="agent")
        super().__init__(self.meter, _even_shards(shards))
        self.draining: set[str] = set()
        self.listening: set[str] = set()  # each asks again every step (the leader answers within its hold)

    def listen(self, *workers: str) -> None:
        for worker in workers:
            self.loop.feed.connect(worker)
            self.listening.add(worker)

    def heartbeat(self) -> None:
        super().heartbeat()
        for worker in sorted(self.listening):  # answered (the hold ended), and asked again at once
            self.loop.feed.disconnect(worker, dropped=False)
            self.loop.feed.connect(worker)
            record = worker_record(self.store, worker)  # the request names the row the agent last wrote
            assert record is not None
            self.loop.feed.report_beat(worker, record.heartbeat, record.last_update)
        for lease in self.store.scan_leases().leases:
            if lease.checkpoint_owner in self.alive:  # the old owner checkpointed and lets go
                assert self.store.complete_handoff(lease.lease_key, lease.checkpoint_owner).applied
        for worker in sorted(self.draining & self.alive):
            record = worker_record(self.store, worker)
            assert record is not None
            self.store.upsert_worker(dataclasses.replace(record, state=WorkerState.DRAINING))

    def leader_scans(self) -> int:
        return int(usage_total(self.meter.rows(), caller="leader", operation="scan").requests)


def _settled(store: LeaseStore, *listening: str) -> ListeningFleet:
    fleet = ListeningFleet(store, 4)
    fleet.join("w1", "w2")
    fleet.listen(*listening)
    fleet.run(30.0)
    assert fleet.counts() == {"w1": 2, "w2": 2}
    fleet.meter.reset()
    return fleet


def test_with_every_worker_listening_the_leader_scans_only_every_full_scan_interval(loop_store: LeaseStore) -> None:
    fleet = _settled(loop_store, "w1", "w2")
    summaries = fleet.run(2 * FULL_SCAN)
    full = [s for s in summaries if s is not None and s.scanned]
    assert [s.scan_reason for s in full] == [CADENCE, CADENCE]
    assert fleet.leader_scans() == 2 * len(full)  # the lease table and the worker table, twice in 20 ticks
    assert all(s is not None and s.ok for s in summaries)
    assert fleet.counts() == {"w1": 2, "w2": 2}


def test_a_worker_that_does_not_listen_keeps_the_leader_scanning_every_run(loop_store: LeaseStore) -> None:
    fleet = _settled(loop_store, "w1")  # w2 has no coordinator_url (or is a Java KCL worker)
    summaries = fleet.run(5 * INTERVAL)
    assert all(s is not None and s.scan_reason == "not on the channel: w2" for s in summaries)
    assert fleet.leader_scans() == 2 * 5


def test_a_dropped_connection_makes_the_leader_watch_and_fail_the_dead_worker_over_in_time(
        loop_store: LeaseStore) -> None:
    fleet = _settled(loop_store, "w1", "w2")
    fleet.run(INTERVAL)  # a quiet tick
    victims = {key for key, owner in fleet.owners().items() if owner == "w2"}
    fleet.alive.discard("w2")  # kill -9: no more heartbeats, and its long-poll's socket closes
    fleet.listening.discard("w2")
    fleet.loop.feed.disconnect("w2", dropped=True)
    first = fleet.run(INTERVAL)[0]
    assert first is not None and first.scan_reason == "dropped: w2"
    moved_after = None
    for step in range(1, 20):
        fleet.run(INTERVAL)
        if all(fleet.owners()[key] == "w1" for key in victims):
            moved_after = step * INTERVAL
            break
    failover = fleet.settings.failover_time_millis / 1000
    # As with the leader scanning every run: failover counted from the first scan after the drop, plus a run.
    assert moved_after is not None and moved_after <= failover + 2 * INTERVAL, moved_after
    assert [s.scan_reason for s in fleet.run(6 * INTERVAL) if s is not None].count(None) >= 4  # quiet again


def test_an_agents_news_of_a_drain_starts_its_handoffs_at_the_next_tick(loop_store: LeaseStore) -> None:
    fleet = _settled(loop_store, "w1", "w2")
    quiet = fleet.run(INTERVAL)[0]
    assert quiet is not None and quiet.scan_reason is None
    fleet.draining.add("w2")
    fleet.heartbeat()  # the row says DRAINING ...
    fleet.loop.feed.signal("w2", NEWS)  # ... and the agent says so on the channel
    summary = fleet.run(INTERVAL)[0]
    assert summary is not None and summary.scan_reason == "news: w2"
    assert summary.writes.handoffs_started == 2
    assert all(lease.checkpoint_owner == "w2" for lease in fleet.store.scan_leases().leases
               if lease.lease_owner != "w1" or lease.checkpoint_owner is not None)


def test_quiet_ticks_keep_the_leader_fresh_without_publishing_its_status(loop_store: LeaseStore) -> None:
    fleet = _settled(loop_store, "w1", "w2")
    watch = LeaderWatch(fleet.store, "coord-a", fleet.clock, min_interval=0.0)
    watch.on_lock_change(True, fleet.lock.epoch())
    for summary in fleet.run(FULL_SCAN):  # up to a full run and quiet ticks: the status is published once
        assert summary is not None
        with acting_as("status"):
            watch.on_run(summary)
    published = fleet.store.get_state(STATUS_KEY)
    assert published is not None
    fleet.meter.reset()
    ticks = [s for s in fleet.run(3 * INTERVAL) if s is not None]
    assert ticks and all(not s.scanned for s in ticks)
    for summary in ticks:
        watch.on_run(summary)
    assert watch.last_success_wall() == ticks[-1].started_at
    assert usage_total(fleet.meter.rows(), caller="status").write_units == 0
    assert fleet.store.get_state(STATUS_KEY) == published


def test_a_frozen_agent_whose_request_stays_open_is_watched_and_failed_over_in_time(loop_store: LeaseStore) -> None:
    """SIGSTOP (a long GC pause): no heartbeat, no new request, but the socket of its last request stays open.

    Before the hold, that open request counted as presence for the whole 20 s wait: the leader kept ticking on its
    view and moved nothing while the agent was stopped (the fault matrix's SIGSTOP cell: never moved).
    """
    fleet = _settled(loop_store, "w1", "w2")
    fleet.run(INTERVAL)
    victims = {key for key, owner in fleet.owners().items() if owner == "w2"}
    fleet.alive.discard("w2")  # frozen: no heartbeat, and its request neither ends nor is asked again
    fleet.listening.discard("w2")
    heartbeat = fleet.settings.effective_heartbeat_interval_millis / 1000
    scans: list[float] = []
    moved_after = None
    for step in range(1, 60):
        summary = fleet.run(INTERVAL)[0]
        if summary is not None and summary.scan_reason == "not on the channel: w2" and not scans:
            scans.append(step * INTERVAL)
        if all(fleet.owners()[key] == "w1" for key in victims):
            moved_after = step * INTERVAL
            break
    assert scans and scans[0] <= heartbeat + REPOLL_GRACE_SECONDS + INTERVAL, scans
    failover = fleet.settings.failover_time_millis / 1000
    # Its last row was named on the channel just before it froze: silent since then, not since the scan.
    assert moved_after is not None and moved_after <= failover + 2 * INTERVAL, (scans, moved_after)


def test_the_published_sightings_stay_as_fresh_as_the_channel_between_full_scans(loop_store: LeaseStore) -> None:
    """A successor starts from them: rows sighted at the last full scan (up to 20 s ago) no longer match a row that
    beat since, and it had to watch that worker for a whole failover time from zero."""
    fleet = _settled(loop_store, "w1", "w2")
    summaries = fleet.run(FULL_SCAN / 2)
    assert not any(s is not None and s.scanned for s in summaries[1:])  # ticks on the view: no scan
    published = fleet.loop.published_sightings(1000)
    assert published is not None
    rows = [record for worker in ("w1", "w2") if (record := worker_record(fleet.store, worker)) is not None]
    silences = decode_sightings(published).silences(rows)
    assert set(silences) == {"w1", "w2"} and max(silences.values()) <= INTERVAL + 0.1, silences


def test_rows_named_on_the_channel_are_alive_at_the_terms_first_run(loop_store: LeaseStore) -> None:
    """A new stack: every agent wrote its row and named it on the channel before the leader's term began. Those rows
    are alive at the first run (only a running agent names its row), so the leases spread over every agent at once;
    before, the first run counted none alive and the next gave every lease to the one agent whose row changed first."""
    fleet = ListeningFleet(loop_store, 8)
    fleet.join("w1", "w2", "w3", "w4")
    fleet.listen("w1", "w2", "w3", "w4")
    fleet.heartbeat()  # rows written and named before the term
    fleet.lock.tick()
    summary = fleet.loop.run_once()
    assert summary is not None and summary.active_workers == 4
    assert fleet.counts() == {"w1": 2, "w2": 2, "w3": 2, "w4": 2}
