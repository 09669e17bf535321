"""A Kinesis outage for every agent is a wait, not churn (decision 0039), in real processes.

One coordinator and two agents (`shardherd coordinator`, `shardherd agent`), each reaching Kinesis through its own
chaos proxy, at the chaos suite's short timings (failover 3 s: red after 3.5 s, given back after 12.5 s). Every
proxy hangs for the give-up bound and 3 s more: the agents report their stalled leases, the leader judges the fleet
stalled, and no lease is given back or changes owner; health stays green. Healed, every shard is read again.
That one agent alone still gives its stalled leases back is tested without processes (tests/agent/test_stall_watch.py,
tests/agent/test_shard_failures.py) and the leader's judgement of one of two in tests/services/test_api.py.

About 25 s at load 2.6 (the processes' start and the give-up bound itself, which the outage must outlast): the one
live test of it.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.stall_bounds import StallBounds
from tests.chaos.analysis import owner_changes
from tests.chaos.cluster import ChaosCluster, Member
from tests.chaos.ledgers import read_deliveries
from tests.chaos.scenario import METRICS_OFF, SHORT_INTERVALS
from tests.support.chaos_proxy import CALM, Chaos
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

OUTLAST_SECONDS = 3.0  # the outage lasts this much past the give-up bound


def metric(member: Member, name: str) -> float:
    """One unlabelled sample of the agent's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{member.port}/metrics", timeout=5).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"{name} ")))


@pytest.mark.timeout(240)
def test_every_agent_stalling_gives_nothing_back_and_health_stays_green(
        moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> None:
    cluster = ChaosCluster(moto_server.endpoint_url, kinesalite.endpoint_url, tmp_path, shards=4,
                           overrides={**SHORT_INTERVALS, **METRICS_OFF}, channel_slots=1, proxy_kinesis=True)
    bounds = StallBounds.from_settings(cluster.settings)
    try:
        cluster.start_coordinator()
        wait_for(lambda: cluster.leader() is not None, 120, "a leader")
        agents = cluster.start_probed_agents(2)
        cluster.start_background(20.0)
        wait_for(cluster.all_leases_owned_by_live_agents, 120, "both agents reading", period=0.5)
        wait_for(lambda: all(metric(agent, "shardherd_fleet_stall_verdict") == 0 for agent in agents), 30,
                 "the agents hearing the leader")

        start = time.time()
        for member in cluster.members.values():
            assert member.kinesis_proxy is not None
            member.kinesis_proxy.set(Chaos(hang=True))
        heard = wait_for(lambda: all(metric(agent, "shardherd_fleet_stall_verdict") == 1 for agent in agents),
                         bounds.give_up_after, "every agent hearing that the fleet stalls")
        time.sleep(max(0.0, start + bounds.give_up_after + OUTLAST_SECONDS - time.time()))
        given_up = [metric(agent, "shardherd_leases_given_up_total") for agent in agents]
        health = [httpx.get(f"http://127.0.0.1:{agent.port}/healthz", timeout=5) for agent in agents]
        healed = time.time()
        changes = owner_changes(cluster.samples, start, healed)
        for member in cluster.members.values():
            assert member.kinesis_proxy is not None
            member.kinesis_proxy.set(CALM)
        shards = set(cluster.leases())
        read_again = wait_for(lambda: {d.shard for d in read_deliveries(tmp_path) if d.time > healed} >= shards,
                              60, "every shard read again after the heal", period=0.25)
        print(f"\nevery agent's Kinesis hung {healed - start:.1f} s (give-up bound {bounds.give_up_after:.1f} s): "
              f"verdict heard after {heard:.1f} s, given up {given_up}, owner changes {changes}, "
              f"every shard read again {read_again:.1f} s after the heal")
        assert given_up == [0.0, 0.0] and changes == 0
        assert all(answer.status_code == 200 and "fleet-wide stall" in answer.json()["detail"] for answer in health)
    finally:
        cluster.close()
