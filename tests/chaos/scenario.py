"""One chaos run end to end: bring the cluster up, inject every fault kind on a schedule, settle, then analyse."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.analysis import Report, RunData, Timing, analyse
from tests.chaos.cluster import AgentCommand, ChaosCluster, plain_agent_command
from tests.chaos.faults import FAULT_KINDS, FaultPlan, FaultRunner
from tests.chaos.ledgers import read_deliveries
from tests.support.fast_settings import fast_env
from tests.support.waiting import wait_for

# The tests' short intervals with failover 3 s (a fleet of agent processes under faults on a loaded host) and CPU
# metrics on (the default users run; each agent reads its own driven fixture).
SHORT_INTERVALS = fast_env(failover_time_millis=3000)
METRICS_OFF = {"SHARDHERD_DISABLE_WORKER_METRICS": "true"}


@dataclass
class SoakConfig:
    """Fleet size, settings and schedule of a run; `minutes` None means one pass over every fault kind."""

    agents: int = 3
    coordinators: int = 2
    shards: int = 4
    overrides: dict[str, str] = field(default_factory=lambda: dict(SHORT_INTERVALS))
    spacing: float = 7.0  # seconds between two faults
    minutes: float | None = None
    plan: FaultPlan = field(default_factory=FaultPlan)
    rate: float = 40.0
    sample_period: float = 0.25
    seed: int = 7
    agent_command: AgentCommand = plain_agent_command


def run_soak(moto_url: str, kinesis_url: str, workdir: Path, config: SoakConfig,
             log: Callable[[str], None] = lambda line: None) -> Report:
    """Run the schedule on a fresh cluster and return the analysed report (the cluster is closed afterwards)."""
    cluster = ChaosCluster(moto_url, kinesis_url, workdir, config.shards, config.overrides, config.seed,
                           config.agent_command)
    settings = cluster.settings
    timing = Timing(settings.failover_time_millis / 1000, settings.lease_assignment_interval_millis / 1000,
                    config.sample_period)
    try:
        for _ in range(config.coordinators):
            cluster.start_coordinator()
        wait_for(lambda: cluster.leader() is not None, 60, "a leader")
        for _ in range(config.agents):
            cluster.start_agent()
        cluster.start_background(config.rate, sample_period=config.sample_period)
        wait_for(cluster.all_leases_owned_by_live_agents, 90, "every lease owned by a live agent", period=0.5)
        runner = FaultRunner(cluster, config.plan)
        deadline = time.monotonic() + (config.minutes or 0) * 60
        passes = 0
        while passes == 0 or time.monotonic() < deadline:
            kinds = list(FAULT_KINDS)
            if passes:
                cluster.rng.shuffle(kinds)
            for kind in kinds:
                log(f"{time.strftime('%H:%M:%S')} fault {kind}")
                runner.apply(kind)
                time.sleep(config.spacing)
            passes += 1
        runner.heal()
        log("healed; settling")
        time.sleep(timing.failover + 2)
        cluster.stop_producer()
        produced = {p.data for p in cluster.producer.read()}
        try:
            wait_for(lambda: produced <= {d.data for d in read_deliveries(workdir)}, 120,
                     "every produced record delivered", period=1.0)
        except AssertionError as exc:
            log(str(exc))  # the no-loss check reports what is missing
        cluster.stop_sampler()
        return analyse(RunData.collect(cluster, timing))
    finally:
        cluster.close()
