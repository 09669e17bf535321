"""The fault schedule: every kind of fault the chaos run injects, applied one step at a time to a ChaosCluster.

Kills and graceful stops are followed by a replacement process so the fleet keeps its size; throttling bursts and
partitions switch the proxies and heal by themselves after their duration (a timer), so the schedule keeps going.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tests.chaos.cluster import ChaosCluster, Member
from tests.support.chaos_proxy import CALM, Chaos

FAULT_KINDS = ("agent_kill", "throttle", "split", "agent_term", "partition", "leader_kill", "merge", "skew",
               "rolling_deploy")
BURST = Chaos(latency=0.02, throttle_rate=0.5, error_rate=0.1, drop_rate=0.05, lost_reply_rate=0.05)


@dataclass(frozen=True)
class FaultPlan:
    """How hard each fault hits: burst settings and durations in seconds, skew of a skewed agent's wall clock."""

    burst: Chaos = BURST
    burst_seconds: float = 4.0
    partition_seconds: float = 8.0
    skew_seconds: float = 300.0


class FaultRunner:
    """Applies faults by kind to a cluster; timers heal bursts and partitions."""

    def __init__(self, cluster: ChaosCluster, plan: FaultPlan) -> None:
        self.cluster = cluster
        self.plan = plan
        self._timers: list[threading.Timer] = []
        self._skews = 0

    def _busiest_agent(self, exclude_skewed: bool = False) -> Member:
        # Over a long soak every agent may have been replaced by a skewed one: then any agent will do. An agent still
        # starting (not yet usable by the leader) is not a victim while a ready one exists: it holds nothing yet.
        live = [m for m in self.cluster.agents() if m.ready is not None] or self.cluster.agents()
        agents = [m for m in live if not (exclude_skewed and m.skew)] or live
        counts = {m.name: 0 for m in agents}
        for lease in self.cluster.leases().values():
            if lease.actual_owner in counts and not lease.is_finished:
                counts[lease.actual_owner] += 1
        return max(agents, key=lambda m: (counts[m.name], self.cluster.rng.random()))

    def _sampled_victim(self, exclude_skewed: bool = False) -> Member:
        """The busiest agent, once the lease-table sampler has seen it hold a lease (waiting up to 10 s).

        The analysis measures a kill or a partition from the victim's leases in the last sample before it, and a lease
        assigned a moment ago is not in a sample yet; without the wait such a fault measures nothing.
        """
        deadline = time.monotonic() + 10.0
        victim = self._busiest_agent(exclude_skewed)
        while victim.name not in self.cluster.lease_holders() and time.monotonic() < deadline:
            time.sleep(0.1)
            victim = self._busiest_agent(exclude_skewed)
        return victim

    def _later(self, seconds: float, members: list[Member], kind: str) -> None:
        timer = threading.Timer(seconds, self.cluster.set_chaos, args=(members, CALM, kind))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def apply(self, kind: str) -> None:
        """Inject one fault of `kind` (one of FAULT_KINDS)."""
        cluster = self.cluster
        if kind == "agent_kill":
            cluster.kill(self._sampled_victim())
            cluster.start_agent()
        elif kind == "agent_term":
            cluster.terminate(self._busiest_agent())
            cluster.start_agent()
        elif kind == "rolling_deploy":
            # A deploy replaces a pod: the replacement starts, and the old one is told to stop before the new one
            # has sent its first heartbeat (let alone a CPU report), so the old one drains into a fleet where the
            # newcomer reports no metric yet.
            old = self._busiest_agent()
            new = cluster.start_agent()
            cluster.note("rolling_deploy", f"{old.name}->{new.name}")
            cluster.terminate(old)
        elif kind == "leader_kill":
            leader = cluster.leader()
            victims = [m for m in cluster.coordinators() if m.name == leader]
            if victims:
                cluster.kill(victims[0])
                cluster.start_coordinator()
        elif kind == "throttle":
            members = [m for m in cluster.members.values() if m.alive]
            cluster.set_chaos(members, self.plan.burst, "throttle")
            self._later(self.plan.burst_seconds, members, "throttle_end")
        elif kind == "partition":
            victim = self._sampled_victim(exclude_skewed=True)
            cluster.set_chaos([victim], Chaos(partitioned=True), "partition")
            self._later(self.plan.partition_seconds, [victim], "partition_end")
        elif kind == "split":
            cluster.split()
        elif kind == "merge":
            cluster.merge()
        elif kind == "skew":
            self._skews += 1
            cluster.terminate(self._busiest_agent(exclude_skewed=True))
            cluster.start_agent(skew=self.plan.skew_seconds * (1 if self._skews % 2 else -1))
        else:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")

    def heal(self) -> None:
        """Cancel pending timers and calm every proxy."""
        for timer in self._timers:
            timer.cancel()
        for member in self.cluster.members.values():
            member.proxy.set(CALM)
        self.cluster.note("healed")
