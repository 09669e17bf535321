"""Failover figures on real processes with shardherd's DEFAULT timings: distributions over several trials.

- agent kill -9 -> every shard it held is read again by another agent (target < 15 s; KCL 3.x 20-50 s)
- leader kill -9 -> the next assignment write (a lease given back at the kill gets a new owner; target < 15 s,
  KCL 3.x about 150 s); also the new leader's takeover
- graceful drain (SIGTERM) -> per shard, time without processing (target < 2 s) and duplicates (target 0)
- leader and agent kill -9 together (KCL's case of a leader host that also held shards) -> the first assignment
  write of the dead agent's leases (target < 15 s) and the new leader's takeover

Starts its own moto server and kinesalite on 127.0.0.1, 2 coordinator replicas and N agents through chaos proxies
(left calm), and a producer.
Agents long-poll the coordinators for assignment changes (coordinator_url lists both replicas) unless --no-channel.
Usage: python -m bench.failover [--trials 5] [--agents 3] [--shards 6] [--short] [--together-only] [--no-channel]
(`--short` uses the CI's seconds-scale timings instead of the defaults; `--together-only` runs only the last case).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.moto_server import MotoServer
from tests.chaos.analysis import summary
from tests.chaos.cluster import ChaosCluster, Member
from tests.chaos.ledgers import read_deliveries
from tests.chaos.scenario import SHORT_INTERVALS
from tests.support.waiting import wait_for


def busiest(cluster: ChaosCluster) -> Member:
    """The live agent processing the most leases."""
    return max(cluster.agents(), key=lambda m: len(cluster.owned_by(m.name)))


def settle(cluster: ChaosCluster, timeout: float = 60.0) -> None:
    """Wait (best effort) until every lease is read by a live agent, none in handoff (balance is the leader's call)."""
    def settled() -> bool:
        leases = [lease for lease in cluster.leases().values() if not lease.is_finished]
        live = {m.name for m in cluster.agents()}
        return bool(leases) and all(lease.actual_owner in live and not lease.in_handoff for lease in leases)

    try:
        wait_for(settled, timeout, "a settled fleet", period=0.5)
        time.sleep(2)
    except AssertionError as exc:
        print(f"  ({exc}; going on)", flush=True)


def first_elsewhere(cluster: ChaosCluster, keys: list[str], worker: str, after: dict[str, float],
                    timeout: float) -> dict[str, float]:
    """Per key, the first delivery time by another worker after `after[key]` (waits up to `timeout`)."""
    found: dict[str, float] = {}

    def done() -> bool:
        for delivery in read_deliveries(cluster.workdir):
            key = delivery.shard
            if key in keys and delivery.worker != worker and delivery.time > after[key]:
                found[key] = min(found.get(key, delivery.time), delivery.time)
        return set(found) >= set(keys)

    wait_for(done, timeout, f"shards of {worker} read elsewhere", period=0.25)
    return found


def agent_kill(cluster: ChaosCluster) -> float:
    victim = busiest(cluster)
    keys = cluster.owned_by(victim.name)
    killed = cluster.kill(victim).time
    found = first_elsewhere(cluster, keys, victim.name, dict.fromkeys(keys, killed), 120)
    cluster.start_agent()
    return max(found.values()) - killed


def watch_failover(cluster: ChaosCluster, killed_leader: str, killed: float, moved: Callable[[], bool],
                   what: str) -> tuple[float, float]:
    """Seconds from `killed` until `moved()` holds, and until another coordinator holds the lock."""
    took_over: float | None = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if took_over is None and cluster.leader() not in (None, killed_leader):
            took_over = time.time() - killed
        if moved():
            assigned = time.time() - killed
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"no assignment within 300 s of the {what}")
    wait_for(lambda: cluster.leader() not in (None, killed_leader), 120, "a new leader")
    return assigned, took_over if took_over is not None else assigned


def leader_kill(cluster: ChaosCluster) -> tuple[float, float]:
    leader = cluster.leader()
    victim = next(m for m in cluster.coordinators() if m.name == leader)
    key, lease = next((k, lease) for k, lease in sorted(cluster.leases().items())
                      if lease.lease_owner and not lease.in_handoff and not lease.is_finished)
    killed = cluster.kill(victim).time
    assert lease.lease_owner is not None
    cluster.store.release(key, lease.lease_owner)
    cluster.note("release", key, "given back at the leader kill")

    def assigned() -> bool:
        current = cluster.store.get_lease(key)
        return current is not None and current.lease_owner is not None

    result = watch_failover(cluster, victim.name, killed, assigned, "leader kill")
    cluster.start_coordinator()
    return result


def leader_and_agent_kill(cluster: ChaosCluster) -> tuple[float, float]:
    """kill -9 of the leader and the busiest agent at once: (first write moving one of its leases, new leader)."""
    leader = cluster.leader()
    coordinator = next(m for m in cluster.coordinators() if m.name == leader)
    agent = busiest(cluster)
    keys = cluster.owned_by(agent.name)
    cluster.kill(agent)
    killed = cluster.kill(coordinator).time

    def moved() -> bool:
        leases = cluster.leases()
        return any(leases[key].actual_owner != agent.name for key in keys if key in leases)

    result = watch_failover(cluster, coordinator.name, killed, moved, "leader and agent kill")
    standby = cluster.start_coordinator()
    cluster.start_agent()
    # The next trial's takeover must not include this replica's start-up (seconds under load).
    wait_for(lambda: b" running (application" in (cluster.workdir / f"{standby.name}.log").read_bytes(), 120,
             f"{standby.name} running")
    return result


def graceful_drain(cluster: ChaosCluster) -> tuple[list[float], int]:
    victim = busiest(cluster)
    keys = cluster.owned_by(victim.name)
    began = time.time()  # the ledgers' clock
    cluster.terminate(victim)
    victim.process.wait(120)
    mine = [d for d in read_deliveries(cluster.workdir) if d.worker == victim.name and d.shard in keys]
    last = {key: max(d.time for d in mine if d.shard == key) for key in keys}
    found = first_elsewhere(cluster, keys, victim.name, last, 60)
    # A duplicate of the drain is a record of the victim's that another worker delivered again after the drain
    # began; records the victim itself re-read after an earlier kill or take are that event's, not the drain's.
    theirs = {(d.shard, d.data) for d in read_deliveries(cluster.workdir)
              if d.worker != victim.name and d.shard in keys and d.time >= began}
    duplicates = sum(1 for d in mine if (d.shard, d.data) in theirs)
    cluster.start_agent()
    return [found[key] - last[key] for key in keys], duplicates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--short", action="store_true", help="the CI's seconds-scale timings")
    parser.add_argument("--together-only", action="store_true",
                        help="only the leader-and-agent kill (the other cases are skipped)")
    parser.add_argument("--no-channel", action="store_true",
                        help="agents without coordinator_url (they poll the owner index; the leader scans every run)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the processes' logs and ledgers in this directory (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    overrides = dict(SHORT_INTERVALS) if args.short else {}
    kills: list[float] = []
    assignments: list[float] = []
    takeovers: list[float] = []
    gaps: list[float] = []
    duplicates: list[float] = []
    together: list[tuple[float, float]] = []  # (first write moving the agent's leases, new leader)
    with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesis, tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        # Agents get both coordinator replicas as coordinator_url, as `shardherd up` and the Helm chart give theirs.
        cluster = ChaosCluster(moto.endpoint_url, kinesis.endpoint_url, workdir, args.shards, overrides,
                               channel_slots=0 if args.no_channel else 2)
        try:
            for _ in range(2):
                cluster.start_coordinator()
            wait_for(lambda: cluster.leader() is not None, 60, "a leader")
            for _ in range(args.agents):
                cluster.start_agent()
            cluster.start_background()
            s = cluster.settings
            print(f"settings: failover {s.failover_time_millis} ms, assignment interval "
                  f"{s.lease_assignment_interval_millis} ms, discovery {s.discovery_interval_millis} ms, "
                  f"leader lock {s.leader_lock_lease_duration_millis}/{s.leader_lock_heartbeat_period_millis} ms",
                  flush=True)
            for trial in range(args.trials):
                if args.together_only:
                    settle(cluster)
                    together.append(leader_and_agent_kill(cluster))
                    print(f"trial {trial + 1}: leader and agent kill -9 -> new leader {together[-1][1]:.2f} s, "
                          f"first write moving the agent's leases {together[-1][0]:.2f} s", flush=True)
                    continue
                settle(cluster)
                kills.append(agent_kill(cluster))
                print(f"trial {trial + 1}: agent kill -9 -> read elsewhere {kills[-1]:.2f} s", flush=True)
                settle(cluster)
                assigned, took_over = leader_kill(cluster)
                assignments.append(assigned)
                takeovers.append(took_over)
                print(f"trial {trial + 1}: leader kill -9 -> new leader {took_over:.2f} s, next assignment "
                      f"{assigned:.2f} s", flush=True)
                settle(cluster)
                shard_gaps, dups = graceful_drain(cluster)
                gaps.extend(shard_gaps)
                duplicates.append(dups)
                print(f"trial {trial + 1}: graceful drain gaps {[round(g, 2) for g in shard_gaps]} s, "
                      f"{dups} duplicates", flush=True)
        finally:
            cluster.close()
    print("\nfailover report (seconds)")
    if args.together_only:
        print(f"  leader and agent kill -9 -> new leader: {summary([t for _, t in together])}")
        print(f"  leader and agent kill -9 -> first write moving the agent's leases (target < 15): "
              f"{summary([a for a, _ in together])}")
        return 0
    print(f"  agent kill -9 -> all its shards read elsewhere (target < 15): {summary(kills)}")
    print(f"  leader kill -9 -> new leader: {summary(takeovers)}")
    print(f"  leader kill -9 -> next assignment write (target < 15, KCL ~150): {summary(assignments)}")
    print(f"  graceful drain, per shard time without processing (target < 2): {summary(gaps)}")
    print(f"  graceful drain duplicates per drain (target 0): {summary(duplicates)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
