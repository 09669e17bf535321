"""One shard whose reads fail at every owner is kept, not handed round the fleet (decision 0043), in real processes.

One coordinator and three agents (`shardherd coordinator`, `shardherd agent`), each reaching Kinesis through its own
chaos proxy, at the tests' short timings (failover 2 s). Every agent's proxy answers every read of one shard with a
500 (GetShardIterator naming it, GetRecords on its iterators: the proxy follows the chains) while the other shards
pass. The first owner gives the lease back at its bound for failing reads; the next one stalls too, the leader
judges the shard stalled at two workers and tells its owner, which keeps it past its bound with /healthz green. Over
several give-up spans the lease changes owner at most once, the other shards keep flowing, and once the fault heals
every record produced is delivered. That a lease stalling at one worker alone is still given back is tested without
processes (tests/agent/test_stall_watch.py, tests/coordinator/test_shard_stall.py).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx
import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.stall_bounds import StallBounds
from tests.chaos.cluster import ChaosCluster, Member, Sample
from tests.chaos.ledgers import read_deliveries
from tests.chaos.scenario import METRICS_OFF
from tests.support.chaos_proxy import CALM, Chaos
from tests.support.fast_settings import fast_env
from tests.support.faulty_proxy import INTERNAL_ERROR
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

SPANS = 3  # the fault lasts this many give-up spans of failing reads


def metric(member: Member, name: str) -> float:
    """One unlabelled sample of a process's /metrics (an agent's health port, the coordinator's API port)."""
    text = httpx.get(f"http://127.0.0.1:{member.port}/metrics", timeout=5).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"{name} ")))


def owners_of(samples: list[Sample], key: str, since: float, until: float) -> list[str]:
    """The lease's processing workers in turn between the samples in [since, until] (a release in between skipped)."""
    seen = (sample.leases[key] for sample in samples if since <= sample.time <= until and key in sample.leases)
    owners = (row.checkpoint_owner or row.owner for row in seen)
    return [owner for owner, _ in itertools.groupby(owner for owner in owners if owner is not None)]


@pytest.mark.timeout(180)
def test_a_shard_failing_at_every_owner_moves_at_most_once_and_the_rest_flows(
        moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> None:
    cluster = ChaosCluster(moto_server.endpoint_url, kinesalite.endpoint_url, tmp_path, shards=6,
                           overrides={**fast_env(), **METRICS_OFF}, channel_slots=1, proxy_kinesis=True)
    bounds = StallBounds.from_settings(cluster.settings)
    try:
        coordinator = cluster.start_coordinator()
        wait_for(lambda: cluster.leader() is not None, 120, "a leader")
        agents = cluster.start_probed_agents(3)
        cluster.start_background(20.0)
        wait_for(cluster.all_leases_owned_by_live_agents, 120, "every agent reading", period=0.5)
        hot = min(cluster.leases())
        first = cluster.leases()[hot].actual_owner
        wait_for(lambda: {d.shard for d in read_deliveries(tmp_path)} >= set(cluster.leases()), 60,
                 "every shard delivering", period=0.25)

        start = time.time()
        for agent in agents:
            assert agent.kinesis_proxy is not None
            agent.kinesis_proxy.set(Chaos(shard=hot, reply=INTERNAL_ERROR))
        kept = wait_for(lambda: metric(coordinator, "shardherd_shard_stalled_leases") == 1,
                        3 * bounds.red_after, "the leader judging the shard stalled at two workers")
        time.sleep(max(0.0, start + SPANS * bounds.red_after - time.time()))
        owner = cluster.leases()[hot].actual_owner
        holder = next(agent for agent in agents if agent.name == owner)
        health = httpx.get(f"http://127.0.0.1:{holder.port}/healthz", timeout=5)
        held = metric(holder, "shardherd_shard_stall_held_leases")
        page = httpx.get(f"http://127.0.0.1:{coordinator.port}/v1/assignments", timeout=5).json()
        given_up = sum(metric(agent, "shardherd_leases_given_up_total") for agent in agents)
        healed = time.time()
        owners = owners_of(cluster.samples, hot, start, healed)
        late = {d.shard for d in read_deliveries(tmp_path) if d.time > healed - bounds.red_after}
        for agent in agents:
            assert agent.kinesis_proxy is not None
            agent.kinesis_proxy.set(CALM)
        read_again = wait_for(lambda: any(d.shard == hot and d.time > healed for d in read_deliveries(tmp_path)),
                              30, "the hot shard read again after the heal", period=0.25)
        cluster.stop_producer()
        produced = {p.data for p in cluster.producer.read()}
        wait_for(lambda: produced <= {d.data for d in read_deliveries(tmp_path)}, 60, "every record delivered",
                 period=0.5)
        print(f"\nshard {hot} failing at every agent for {healed - start:.1f} s ({SPANS} spans of "
              f"{bounds.red_after:.1f} s): owners {owners} (first {first}), shard-wide verdict after "
              f"{kept:.1f} s, given up {given_up:.0f}, read again {read_again:.1f} s after the heal, "
              f"{len(produced)} records, 0 lost")
        assert owners[0] == first and len(owners) <= 2  # at most one move, not round the fleet
        assert given_up <= 1
        assert late >= set(cluster.leases()) - {hot}  # the other shards kept flowing to the end of the fault
        assert health.status_code == 200 and hot in health.json()["detail"] and held == 1
        assert {item["lease_key"] for item in page["items"] if item["shard_stalled"]} == {hot}
    finally:
        cluster.close()
