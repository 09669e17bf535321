"""A new leader learns who is alive before it places leases (decision 0047).

Real stores (SQLite, DynamoDB on moto server), the leader's own feed as the channel, a virtual clock. The cold start
of a stack: every agent wrote its row before the leader's term began, and one of them named its row on the channel
first. Before the rule, that one agent was the only live worker at the first assignment and got every lease, and the
next runs handed most of them on (live, 64 shards on 8 agents: all 64 to one agent, then 55 handoffs).
"""

from __future__ import annotations

from shardherd.coordinator.moves import MoveReason, UnplacedReason
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import WorkerRecord
from tests.coordinator.test_leader_loop import INTERVAL
from tests.coordinator.test_leader_scans import ListeningFleet


def _owner_changes(fleet: ListeningFleet, seconds: float) -> tuple[int, list[object]]:
    """Owner changes (a first owner included) over `seconds` of runs, and the runs' summaries."""
    changes, summaries = 0, []
    before = fleet.owners()
    for _ in range(int(seconds / INTERVAL)):
        summaries += fleet.run(INTERVAL)
        after = fleet.owners()
        changes += sum(1 for key, owner in after.items() if owner != before.get(key))
        before = after
    return changes, summaries


def test_a_cold_start_gives_every_running_agent_its_share_in_the_first_assignment(loop_store: LeaseStore) -> None:
    fleet = ListeningFleet(loop_store, 6)
    fleet.join("w1", "w2", "w3")
    fleet.listen("w1")  # only w1 reached the leader's channel before its first run
    first = fleet.run(INTERVAL)[0]
    assert first is not None and first.writes.assigned == 0
    assert first.plan is not None and {held.reason for held in first.plan.held} == {UnplacedReason.ROSTER_PENDING}
    changes, _ = _owner_changes(fleet, 30.0)
    assert fleet.counts() == {"w1": 2, "w2": 2, "w3": 2}
    assert changes == 6  # each lease placed once, none moved after


def test_a_dead_agents_row_holds_placements_one_heartbeat_and_one_interval_at_most(loop_store: LeaseStore) -> None:
    fleet = ListeningFleet(loop_store, 4)
    loop_store.upsert_worker(WorkerRecord("gone", int(fleet.clock.time()), heartbeat=7))  # never written again
    fleet.join("w1", "w2")
    bound = fleet.settings.effective_heartbeat_interval_millis / 1000 + INTERVAL
    runs = fleet.run(bound + INTERVAL)
    placing = [at * INTERVAL for at, summary in enumerate(runs) if summary is not None and summary.writes.assigned]
    assert placing and bound <= placing[0] < bound + INTERVAL  # held until then, placed by the first run past it
    assert fleet.counts() == {"w1": 2, "w2": 2}
    assert runs[-1] is not None and runs[-1].moves_by_reason() == {MoveReason.UNASSIGNED.value: 4}
