"""Choose this worker's CPU source in the order of what the host offers (ECS, cgroup v2, cgroup v1, /proc, psutil).

Unlike KCL (reference 7), any host gets a CPU metric, not only EKS, ECS and EC2, and no cloud endpoint is probed: the
choice looks only at the environment and local files. Disabled metrics give None, so the worker reports empty maps and
the leader balances it by throughput.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from agent.metrics import CpuSource
from agent.metrics.cpu_cgroup import CGROUP_ROOT, CgroupV1Cpu, CgroupV2Cpu
from agent.metrics.cpu_ecs import ECS_URI_ENV, EcsCpu
from agent.metrics.cpu_proc import PROC_STAT_PATH, ProcStatCpu
from agent.metrics.cpu_psutil import PsutilCpu
from shared.clock import Clock

log = logging.getLogger(__name__)


def select_cpu_source(
    clock: Clock,
    *,
    disabled: bool = False,
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_stat_path: Path = PROC_STAT_PATH,
) -> CpuSource | None:
    """The first CPU source this host offers, or None when worker metrics are disabled."""
    if disabled:
        return None
    env = os.environ if environ is None else environ
    source: CpuSource
    if env.get(ECS_URI_ENV):
        source = EcsCpu(env[ECS_URI_ENV])
    elif CgroupV2Cpu.present(cgroup_root):
        source = CgroupV2Cpu(clock, cgroup_root)
    elif CgroupV1Cpu.present(cgroup_root):
        source = CgroupV1Cpu(clock, cgroup_root)
    elif os.access(proc_stat_path, os.R_OK):
        source = ProcStatCpu(proc_stat_path)
    else:
        source = PsutilCpu()
    log.info("worker CPU metric source: %s", source.name)
    return source
