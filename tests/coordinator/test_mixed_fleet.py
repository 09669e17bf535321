"""A mixed fleet in `lease` mode: shardherd agents and Java KCL 3.x workers on one table (DynamoDB on the moto server).

KCL workers are played by their table traffic, shaped as KCL writes it: worker rows without `hb` (`lut` every 30 s,
empty `sts`/`opr`: KCL's "default metric"), and a lease assigned to it renewed for the first time 12-13 s after the
assignment (KCL's discoverer queries the owner index every 9 975 ms and its renewer renews every 3 308 ms: up to
13.3 s; the issue measured 10-11 s). shardherd agents write their rows (with `hb`) every heartbeat and
renew their leases. The leader is the real LeaderLoop on a virtual clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from shardherd.agent.lease_keeper import LeaseKeeper
from shardherd.agent.metrics.sampler import MetricsSampler
from shardherd.agent.runtime import MetricsReporter
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.deciders.kcl_variance import KclVarianceDecider
from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.moves import MoveReason
from shardherd.coordinator.run_summary import RunSummary
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import new_lease
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import CPU_METRIC, WorkerRecord
from tests.agent.test_lease_keeper import Events
from tests.agent.test_metrics_sampler import ScriptedCpu
from tests.support.kcl_rows import (
    kcl_sees_active,
    kcl_sees_default_metric,
    read_raw_worker_row,
    write_kcl_worker_row,
)
from tests.support.stores import make_store, worker_record

STEP = 2.0  # the leader interval; agents heartbeat and renew every step
KCL_FIRST_RENEWAL = 11.0  # from the first step that lists the lease under the worker
KCL_REPORT = 30.0
KBPS = 100.0
LEASES = [f"shardId-{index:012d}" for index in range(8)]


@pytest.fixture
def moto_store(moto_server: MotoServer) -> Iterator[LeaseStore]:
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
    yield store
    store.close()


@dataclass
class KclWorker:
    """What a Java KCL worker does to the tables: report every 30 s, renew a lease some time after it was assigned."""

    worker_id: str
    next_report: float = 0.0
    listed: dict[str, float] = field(default_factory=dict)  # lease key -> when first listed as this worker's
    renewed: set[str] = field(default_factory=set)


class MixedFleet:
    def __init__(self, store: LeaseStore, moto_url: str) -> None:
        self.store = store
        self.client = make_client("dynamodb", "us-east-1", moto_url)
        self.clock = ManualClock()
        self.settings = load_settings(application_name="mixed-test", liveness_mode="lease")
        self.lock = LeaderLock(store, "coord-a", self.clock, self.settings.leader_lock_lease_duration_millis,
                               self.settings.leader_lock_heartbeat_period_millis)
        self.loop = LeaderLoop(store, self.lock, self.settings, self.clock)
        self.agents: dict[str, int] = {}  # live shardherd agents -> heartbeat counter
        self.kcl: dict[str, KclWorker] = {}
        self.summaries: list[tuple[float, RunSummary]] = []
        for key in LEASES:
            store.create_lease(new_lease(key, TRIM_HORIZON))

    def elapsed(self) -> float:
        return self.clock.monotonic() - 1_000.0

    def _agent(self, agent: str) -> None:
        self.agents[agent] += 1
        self.store.upsert_worker(WorkerRecord(agent, int(self.clock.time()), {CPU_METRIC: (40.0, 40.0)},
                                              {CPU_METRIC: (100.0,)}, heartbeat=self.agents[agent]))
        for lease in self.store.scan_leases().leases:
            if lease.checkpoint_owner == agent:
                self.store.complete_handoff(lease.lease_key, agent)
            elif lease.lease_owner == agent and lease.checkpoint_owner is None:
                self.store.renew(lease.lease_key, agent, lease.lease_counter, KBPS)

    def _kcl(self, worker: KclWorker) -> None:
        now = self.clock.monotonic()
        if now >= worker.next_report:
            worker.next_report = now + KCL_REPORT
            write_kcl_worker_row(self.client, self.store.tables.worker_metrics, worker.worker_id,
                                 int(self.clock.time()))
        owned = set(self.store.list_owned_keys(worker.worker_id))
        worker.listed = {key: worker.listed.get(key, now) for key in owned}
        worker.renewed &= owned
        for key, since in sorted(worker.listed.items()):
            if now < since + KCL_FIRST_RENEWAL:
                continue
            lease = self.store.get_lease(key)
            if lease is None:
                continue
            if lease.checkpoint_owner == worker.worker_id:
                self.store.complete_handoff(key, worker.worker_id)
            elif lease.checkpoint_owner is not None:
                worker.listed[key] = now  # still draining from its old owner: KCL's discoverer skips it
            elif self.store.renew(key, worker.worker_id, lease.lease_counter, KBPS).applied:
                worker.renewed.add(key)

    def run(self, seconds: float) -> None:
        elapsed = 0.0
        while elapsed < seconds:
            for agent in sorted(self.agents):
                self._agent(agent)
            for worker in self.kcl.values():
                self._kcl(worker)
            self.lock.tick()
            summary = self.loop.run_once()
            if summary is not None:
                self.summaries.append((self.elapsed(), summary))
            self.clock.advance(STEP)
            elapsed += STEP

    def owners(self) -> dict[str, str | None]:
        return {lease.lease_key: lease.actual_owner for lease in self.store.scan_leases().leases}

    def count(self, worker: str) -> int:
        return sum(1 for owner in self.owners().values() if owner == worker)


def test_a_kcl_worker_joining_a_shardherd_led_fleet_gets_leases(moto_store: LeaseStore,
                                                                moto_server: MotoServer) -> None:
    # Issue 18: the KCL worker reports throughput only, the agent CPU; each metric's average was one worker's own
    # value, nothing looked out of balance and the KCL worker got no lease in 150 s.
    fleet = MixedFleet(moto_store, moto_server.endpoint_url)
    fleet.agents["agent-a"] = 0
    fleet.run(4 * STEP)
    assert fleet.count("agent-a") == len(LEASES)
    fleet.summaries.clear()
    fleet.kcl["kcl-b"] = KclWorker("kcl-b")
    fleet.run(150.0)
    assert fleet.count("kcl-b") == fleet.count("agent-a") == len(LEASES) // 2
    balancing = [summary for _, summary in fleet.summaries if summary.plan and summary.plan.moves]
    assert balancing and all(move.reason.is_balancing for s in balancing for move in s.plan.moves)  # type: ignore[union-attr]


def test_leases_are_never_handed_back_to_a_killed_agent(moto_store: LeaseStore, moto_server: MotoServer) -> None:
    # Issue 18: 20 s after kill -9 of an agent the leader judged the leases just handed to the KCL worker expired
    # (it had not discovered them yet) and gave them back to the dead agent, which still counted as alive for 60 s.
    fleet = MixedFleet(moto_store, moto_server.endpoint_url)
    for index, key in enumerate(LEASES):  # a spread fleet, as a finished migration step leaves it
        assert moto_store.assign(key, "agent-a" if index % 2 else "kcl-b", None, None).applied
    fleet.agents["agent-a"] = 0
    fleet.kcl["kcl-b"] = KclWorker("kcl-b")
    fleet.run(70.0)  # the leader has watched both rows change
    assert fleet.count("agent-a") == fleet.count("kcl-b") == len(LEASES) // 2
    victims = {key for key, owner in fleet.owners().items() if owner == "agent-a"}
    killed_at = fleet.elapsed()
    del fleet.agents["agent-a"]  # kill -9: no more row writes, no more renewals
    fleet.summaries.clear()
    fleet.run(14.0)
    # Recognised as dead from its own row (hb silent for the failover time), not after KCL's 60 s row expiry.
    assert [s.active_workers for _, s in fleet.summaries][-1:] == [1]
    fleet.run(66.0)
    moves = [(at - killed_at, move) for at, summary in fleet.summaries if summary.plan
             for move in summary.plan.moves]
    assert [move for _, move in moves if move.to_worker == "agent-a"] == []
    assert {move.lease_key for _, move in moves} == victims  # each victim moved once, to the KCL worker
    assert all(move.reason is MoveReason.EXPIRED and move.to_worker == "kcl-b" for _, move in moves)
    assert all(at <= 10.0 + 2 * STEP for at, _ in moves)
    assert fleet.count("kcl-b") == len(LEASES)
    # The KCL worker discovered and renewed them (no leader write since) and the dead agent is no longer active.
    assert fleet.kcl["kcl-b"].renewed == set(LEASES)
    assert fleet.loop.history.recent()[-1].active_workers == 1


def test_no_lease_is_balanced_onto_a_killed_kcl_worker_whose_row_still_looks_fresh(moto_store: LeaseStore,
                                                                                    moto_server: MotoServer) -> None:
    # A CI run of the interop suite: a leader run placed a killed KCL worker's expired leases on the agent and, in the
    # same run, balanced one of the agent's leases onto the KCL worker, whose row (written every 30 s) still looked
    # fresh. A worker that let a lease lapse receives nothing until its row changes.
    fleet = MixedFleet(moto_store, moto_server.endpoint_url)
    for index, key in enumerate(LEASES):
        assert moto_store.assign(key, "agent-a" if index % 2 else "kcl-b", None, None).applied
    fleet.agents["agent-a"] = 0
    fleet.kcl["kcl-b"] = KclWorker("kcl-b")
    fleet.run(70.0)
    assert fleet.count("agent-a") == fleet.count("kcl-b") == len(LEASES) // 2
    del fleet.kcl["kcl-b"]  # kill -9: no more row writes, no more renewals
    fleet.summaries.clear()
    fleet.run(90.0)
    moves = [move for _, summary in fleet.summaries if summary.plan for move in summary.plan.moves]
    assert [move for move in moves if move.to_worker == "kcl-b"] == []
    assert fleet.count("agent-a") == len(LEASES)


@dataclass
class _Holder:
    keeper: LeaseKeeper
    reporter: MetricsReporter


def _agent_with_cpu(store: LeaseStore, clock: ManualClock, worker: str) -> _Holder:
    settings = load_settings(application_name="mixed-test", liveness_mode="lease", worker_id=worker)
    sampler = MetricsSampler(ScriptedCpu([35.0, 45.0]), history_size=10)
    reporter = MetricsReporter(sampler, clock, settings.worker_metrics_reporter_freq_millis / 1000,
                               fleet=lambda: store.scan_workers().workers, me=worker)
    keeper = LeaseKeeper(store, settings, clock, Events(), metrics=reporter)
    sampler.sample()
    sampler.sample()
    return _Holder(keeper, reporter)


def _kcl_plan(store: LeaseStore, owner: str) -> list[Any]:
    """KCL's own decider (variance balancing as KCL runs it, no shardherd basis rule) on the rows as stored."""
    leases = [LeaseView(key, lease_owner=owner, throughput_kbps=KBPS) for key in LEASES]
    workers = [WorkerView.from_record(record) for record in store.scan_workers().workers]
    config = DeciderConfig(strategy=Strategy.KCL_VARIANCE, dampening_percentage=60)
    return list(KclVarianceDecider().plan(Snapshot.of(leases, workers), config, True).moves)


def test_an_agent_next_to_kcl_workers_reports_what_kcl_can_compare(moto_store: LeaseStore,
                                                                   moto_server: MotoServer) -> None:
    # Issue 18, the other direction: in a KCL-led fleet the agent got no lease in 150 s because KCL's leader
    # averaged its CPU alone. Next to a KCL worker without metrics the agent now reports none either.
    client = make_client("dynamodb", "us-east-1", moto_server.endpoint_url)
    table = moto_store.tables.worker_metrics
    clock = ManualClock()
    write_kcl_worker_row(client, table, "kcl-b", int(clock.time()))
    agent = _agent_with_cpu(moto_store, clock, "agent-a")
    clock.advance(2.0)  # the first metrics report
    agent.keeper.tick()
    item = read_raw_worker_row(client, table, "agent-a")
    assert item is not None
    assert kcl_sees_default_metric(item) and kcl_sees_active(item, clock.time())
    moves = _kcl_plan(moto_store, "kcl-b")
    assert moves and {move.to_worker for move in moves} == {"agent-a"}


def test_an_agent_keeps_reporting_cpu_when_the_fleet_shares_it(moto_store: LeaseStore,
                                                               moto_server: MotoServer) -> None:
    client = make_client("dynamodb", "us-east-1", moto_server.endpoint_url)
    table = moto_store.tables.worker_metrics
    clock = ManualClock()
    # A KCL worker with a CPU metric, and an old KCL row (its worker gone for minutes) without one.
    write_kcl_worker_row(client, table, "kcl-b", int(clock.time()), {CPU_METRIC: [50.0, 50.0]},
                         {CPU_METRIC: [100.0]})
    write_kcl_worker_row(client, table, "kcl-gone", int(clock.time()) - 600)
    agent = _agent_with_cpu(moto_store, clock, "agent-a")
    clock.advance(2.0)
    agent.keeper.tick()
    record = worker_record(moto_store, "agent-a")
    assert record is not None and record.metric_stats == {CPU_METRIC: (40.0,)}
    # The KCL worker switches to the default metric (e.g. restarted off AWS): at the next report the agent follows.
    write_kcl_worker_row(client, table, "kcl-b", int(clock.time()))
    clock.advance(30.0)
    agent.keeper.tick()
    record = worker_record(moto_store, "agent-a")
    assert record is not None and record.uses_default_metric
