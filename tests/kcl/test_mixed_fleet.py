"""A mixed fleet in `lease` liveness mode: a Java KCL worker and shardherd agents, a shardherd coordinator leading.

shardherd agents run as users run them (CPU metrics on); the KCL worker reports what KCL reports on this host. The
fleet must spread the leases over both kinds of worker, and survive `kill -9` of either side without losing a record
(a killed worker's shards resume from their last checkpoint elsewhere; only its unfinished batch may be read again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.kcl.harness import InteropStack, timed
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kcl, pytest.mark.slow, pytest.mark.timeout(240)]

RECORDS = 200


def counters_of(stack: InteropStack, worker: str) -> dict[str, str]:
    """`leaseCounter` of each lease `worker` owns: a new (key, counter) pair after its death is a new assignment."""
    return {key: item["leaseCounter"]["N"] for key, item in stack.leases().items()
            if item.get("leaseOwner", {}).get("S") == worker}


def wait_without_assignments_to(stack: InteropStack, dead: str, done: Callable[[], bool], what: str) -> None:
    """Wait (60 s) for `done` while asserting that no lease is assigned to the killed worker `dead` meanwhile."""
    held_when_killed = set(counters_of(stack, dead).items())  # read after the kill: no renewal can follow it
    handed_to_dead: set[tuple[str, str]] = set()

    def check() -> bool:
        handed_to_dead.update(set(counters_of(stack, dead).items()) - held_when_killed)
        return done()

    wait_for(check, 60, what)
    assert not handed_to_dead, f"leases assigned to the killed worker {dead}: {sorted(handed_to_dead)}"


def holds(stack: InteropStack, worker: str) -> int:
    """How many leases `worker` owns (settled, not in a handoff)."""
    return sum(1 for owner in stack.owners().values() if owner == worker)


@pytest.mark.parametrize("interop", ["lease"], indirect=True)
def test_shardherd_led_mixed_fleet_spreads_and_survives_kill_9(interop: InteropStack) -> None:
    stack, figures = interop, dict[str, float]()
    stack.produce(RECORDS, "a")
    stack.start_coordinator()
    stack.start_agent("agent-1")
    wait_for(lambda: holds(stack, "agent-1") == 4 and stack.all_delivered("a-"), 60, "agent-1 reads every shard")

    started = time.monotonic()
    kcl = stack.start_kcl("kcl-1")
    wait_for(lambda: holds(stack, "kcl-1") >= 1 or not kcl.running, 60, "the KCL worker receives a lease")
    assert kcl.running, kcl.log_tail()
    wait_for(lambda: holds(stack, "kcl-1") == 2 and holds(stack, "agent-1") == 2, 30, "leases spread 2 / 2")
    timed("kcl join to leases spread", started, figures)
    assert stack.leader() == "coordinator"  # the KCL worker never takes the lock from a live coordinator
    stack.produce(RECORDS, "b")
    wait_for(lambda: stack.all_delivered("b-"), 30, "both kinds of worker read")
    assert {entry[3] for entry in stack.entries() if entry[5].startswith("b-")} == {"agent-1", "kcl-1"}

    # kill -9 of the shardherd side: the KCL worker takes its shards, and none is handed back to the dead agent.
    stack.kill_agent("agent-1")
    started = time.monotonic()
    stack.produce(RECORDS, "c")
    wait_without_assignments_to(stack, "agent-1", lambda: stack.all_delivered("c-"),
                                "the KCL worker reads the killed agent's shards")
    timed("agent kill -9 to all read", started, figures)
    assert holds(stack, "kcl-1") == 4

    # A replacement agent joins; then kill -9 of the KCL side: shardherd takes its shards.
    stack.start_agent("agent-2")
    wait_for(lambda: holds(stack, "agent-2") >= 1, 60, "the new agent receives leases")
    kcl.kill()
    started = time.monotonic()
    stack.produce(RECORDS, "d")
    wait_without_assignments_to(stack, "kcl-1", lambda: stack.all_delivered("d-") and holds(stack, "agent-2") == 4,
                                "the agent reads the killed KCL worker's shards")
    timed("kcl kill -9 to all read", started, figures)

    counts = stack.delivered()
    lost = set(stack.produced) - set(counts)
    repeated = [data for data, count in counts.items() if count > 1]
    print(f"mixed fleet, shardherd leading: {figures}; lost {len(lost)}, re-delivered {len(repeated)}")
    assert not lost


@pytest.mark.parametrize("interop", ["lease"], indirect=True)
def test_kcl_led_mixed_fleet_spreads_leases_to_shardherd_agents(interop: InteropStack) -> None:
    """A shardherd agent joins a fleet whose leader is a KCL worker; KCL's leader must spread the leases.

    kill -9 of the KCL leader is not run here: KCL 3.1's lock lease is 120 s (not configurable before 3.2), so a
    shardherd coordinator takes the lock from a dead KCL leader only after two minutes.
    """
    stack, figures = interop, dict[str, float]()
    # shardherd creates the leases and stops (deleting the lock), so the KCL worker starts on a table with leases:
    # on an empty table KCL first waits a random 1-30 s.
    stack.start_coordinator()
    wait_for(lambda: len(stack.leases()) == 4, 30, "the leases exist")
    stack.stop_coordinator()
    stack.produce(RECORDS, "a")
    kcl = stack.start_kcl("kcl-1")
    wait_for(lambda: (holds(stack, "kcl-1") == 4 and stack.all_delivered("a-")) or not kcl.running, 90,
             "the KCL worker leads and reads every shard")
    assert kcl.running and stack.leader() == "kcl-1", kcl.log_tail()

    with stack.steady_load("load"):
        started = time.monotonic()
        stack.start_coordinator()
        stack.start_agent("agent-1")
        wait_for(lambda: holds(stack, "agent-1") == 2 and holds(stack, "kcl-1") == 2, 30,
                 "KCL's leader spreads the leases 2 / 2")
        timed("agent join to leases spread", started, figures)
        assert stack.leader() == "kcl-1"  # a live KCL leader keeps the lock

        # kill -9 of the shardherd agent: KCL's leader gives its shards back to the KCL worker.
        stack.kill_agent("agent-1")
        started = time.monotonic()
        wait_for(lambda: holds(stack, "kcl-1") == 4, 60, "the KCL worker takes the killed agent's shards")
        timed("agent kill -9 to KCL owning all", started, figures)
    wait_for(stack.all_delivered, 30, "every record read")
    lost = set(stack.produced) - set(stack.delivered())
    print(f"mixed fleet, KCL leading: {figures}; lost {len(lost)}")
    assert not lost
