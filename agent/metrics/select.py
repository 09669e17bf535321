"""Choose this worker's CPU source in the order of what the host offers (ECS, cgroup v2, cgroup v1, /proc, psutil).

Unlike KCL's selector, any host gets a CPU metric, not only EKS, ECS and EC2, and no cloud endpoint is probed: the
choice looks only at the environment and local files. Disabled metrics give None, so the worker reports empty maps and
the leader balances it by throughput.

A cgroup, /proc/stat or psutil figure is the agent's own only if nothing else runs in what it measures. When other
processes do (several agents on one host, no container each), the agent measures its own process tree instead
(agent/metrics/cpu_tree.py) and says so in its log: every agent reporting the same host figure made the leader move
leases for nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from shardherd.agent.metrics import CpuSource
from shardherd.agent.metrics.cpu_cgroup import CGROUP_ROOT, CgroupV1Cpu, CgroupV2Cpu
from shardherd.agent.metrics.cpu_ecs import ECS_URI_ENV, EcsCpu
from shardherd.agent.metrics.cpu_proc import PROC_STAT_PATH, ProcStatCpu
from shardherd.agent.metrics.cpu_psutil import PsutilCpu
from shardherd.agent.metrics.cpu_tree import PidSource, ProcessTreeCpu, cgroup_pids, host_pids, shares_scope
from shardherd.shared.clock import Clock

log = logging.getLogger(__name__)


def select_cpu_source(
    clock: Clock,
    *,
    disabled: bool = False,
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_stat_path: Path = PROC_STAT_PATH,
    visible_pids: PidSource = host_pids,
) -> CpuSource | None:
    """The first CPU source this host offers (this process tree's if that source is shared), or None if disabled.

    `visible_pids` lists the host's processes (what /proc/stat and psutil measure).
    """
    if disabled:
        return None
    env = os.environ if environ is None else environ
    source: CpuSource
    scope: Iterable[int]
    if env.get(ECS_URI_ENV):
        source = EcsCpu(env[ECS_URI_ENV])
        log.info("worker CPU metric source: %s", source.name)
        return source  # the task metadata measures this container alone
    v1_usage = CgroupV1Cpu.usage_file(cgroup_root)
    if CgroupV2Cpu.present(cgroup_root):
        source, scope = CgroupV2Cpu(clock, cgroup_root), cgroup_pids(cgroup_root)
    elif v1_usage is not None:
        source, scope = CgroupV1Cpu(clock, cgroup_root), cgroup_pids(v1_usage.parent)
    elif os.access(proc_stat_path, os.R_OK):
        source, scope = ProcStatCpu(proc_stat_path), visible_pids()
    else:
        source, scope = PsutilCpu(), visible_pids()
    if shares_scope(scope):
        log.warning("worker CPU metric: %s would include processes other than this agent's (no cgroup of its own); "
                    "measuring this agent's process tree instead", source.name)
        return ProcessTreeCpu(clock)
    log.info("worker CPU metric source: %s", source.name)
    return source
