"""CPU sources against real files and a real HTTP server on 127.0.0.1, checked against hand-computed values."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from shardherd.agent.metrics import InvalidMetricInput, MetricSourceError
from shardherd.agent.metrics.cpu_cgroup import CgroupV1Cpu, CgroupV2Cpu, count_cpus
from shardherd.agent.metrics.cpu_ecs import ECS_URI_ENV, EcsCpu
from shardherd.agent.metrics.cpu_proc import ProcStatCpu
from shardherd.agent.metrics.cpu_psutil import PsutilCpu
from shardherd.agent.metrics.cpu_tree import (
    PROC,
    ProcessTreeCpu,
    ancestors,
    cgroup_pids,
    children_listed,
    cpu_seconds,
    descendants,
    family,
    host_pids,
    shares_scope,
)
from shardherd.agent.metrics.select import select_cpu_source
from shardherd.shared.clock import ManualClock
from tests.support.cpu_fixtures import JsonServer

DOCKER_ID = "c0ffee1234"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- cpuset lists -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cpu_list", "expected"), [("0-3,6,8-10", 8), ("0", 1), ("0-1\n", 2), ("2,4", 2)])
def test_cpu_list_counts_inclusive_ranges(cpu_list: str, expected: int) -> None:
    assert count_cpus(cpu_list) == expected


@pytest.mark.parametrize("cpu_list", ["", "3-1", "a-b", "1,,2", "-1"])
def test_malformed_cpu_list_is_a_typed_error(cpu_list: str) -> None:
    with pytest.raises(MetricSourceError):
        count_cpus(cpu_list)


# --- cgroup v2 ----------------------------------------------------------------------------------------------


def v2_tree(root: Path, usage_usec: int, cpu_max: str | None, cpuset: str | None = None) -> None:
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root / "cpu.stat", f"usage_usec {usage_usec}\nuser_usec {usage_usec // 2}\nsystem_usec {usage_usec // 2}\n")
    if cpu_max is not None:
        write(root / "cpu.max", cpu_max + "\n")
    if cpuset is not None:
        write(root / "cpuset.cpus.effective", cpuset + "\n")


def test_cgroup_v2_quota_over_period(tmp_path: Path) -> None:
    clock = ManualClock()
    v2_tree(tmp_path, 1_000_000, "200000 100000")
    source = CgroupV2Cpu(clock, tmp_path)
    assert source.sample() == 0.0  # first call
    v2_tree(tmp_path, 2_500_000, "200000 100000")
    clock.advance(1.0)
    # 1.5 s of CPU in 1 s = 1.5 cores; limit 200000/100000 = 2 CPUs -> 75 %.
    assert source.sample() == pytest.approx(75.0)
    v2_tree(tmp_path, 2_800_000, "50000 100000")
    clock.advance(2.0)
    # 0.3 s in 2 s = 0.15 cores; the limit is re-read: 0.5 CPU -> 30 %.
    assert source.sample() == pytest.approx(30.0)


def test_cgroup_v2_max_means_cpuset_count(tmp_path: Path) -> None:
    clock = ManualClock()
    v2_tree(tmp_path, 0, "max 100000", "0-3,6,8-10")
    source = CgroupV2Cpu(clock, tmp_path, host_cpus=64)
    source.sample()
    v2_tree(tmp_path, 4_000_000, "max 100000", "0-3,6,8-10")
    clock.advance(1.0)
    # 4 cores of the 8 CPUs 0,1,2,3,6,8,9,10 -> 50 %; the 64 host CPUs are not used.
    assert source.sample() == pytest.approx(50.0)


def test_cgroup_v2_without_cpu_max_or_cpuset_uses_host_cpus(tmp_path: Path) -> None:
    clock = ManualClock()
    v2_tree(tmp_path, 0, None)
    source = CgroupV2Cpu(clock, tmp_path, host_cpus=4)
    source.sample()
    v2_tree(tmp_path, 1_000_000, None)
    clock.advance(0.5)
    # 1 s in 0.5 s = 2 cores of 4 host CPUs -> 50 %.
    assert source.sample() == pytest.approx(50.0)


def test_cgroup_v2_caps_at_100_and_rejects_bad_files(tmp_path: Path) -> None:
    clock = ManualClock()
    v2_tree(tmp_path, 0, "100000 100000")
    source = CgroupV2Cpu(clock, tmp_path)
    source.sample()
    v2_tree(tmp_path, 3_000_000, "100000 100000")
    clock.advance(1.0)
    assert source.sample() == 100.0  # 3 cores on a 1-CPU quota (throttling accounting lag) is capped
    write(tmp_path / "cpu.max", "lots\n")
    clock.advance(1.0)
    with pytest.raises(MetricSourceError, match=r"cpu\.max"):
        source.sample()
    write(tmp_path / "cpu.stat", "user_usec 5\n")
    with pytest.raises(MetricSourceError, match="usage_usec"):
        source.sample()


def test_cgroup_usage_going_backwards_or_no_elapsed_time_fails(tmp_path: Path) -> None:
    clock = ManualClock()
    v2_tree(tmp_path, 5_000_000, "max 100000", "0-1")
    source = CgroupV2Cpu(clock, tmp_path)
    source.sample()
    with pytest.raises(MetricSourceError, match="no time"):
        source.sample()
    v2_tree(tmp_path, 4_000_000, "max 100000", "0-1")
    clock.advance(1.0)
    with pytest.raises(MetricSourceError, match="backwards"):
        source.sample()
    v2_tree(tmp_path, 5_000_000, "max 100000", "0-1")
    clock.advance(1.0)
    # The failed read became the new baseline: 1 s of CPU in 1 s on 2 CPUs -> 50 %.
    assert source.sample() == pytest.approx(50.0)


# --- cgroup v1 ----------------------------------------------------------------------------------------------


def test_cgroup_v1_quota_over_period(tmp_path: Path) -> None:
    clock = ManualClock()
    write(tmp_path / "cpuacct" / "cpuacct.usage", "7000000000\n")
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", "50000\n")
    write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    source = CgroupV1Cpu(clock, tmp_path)
    assert source.sample() == 0.0
    write(tmp_path / "cpuacct" / "cpuacct.usage", "7250000000\n")
    clock.advance(1.0)
    # 0.25 s of CPU (250 000 000 ns) in 1 s on a 50000/100000 = 0.5 CPU quota -> 50 %.
    assert source.sample() == pytest.approx(50.0)


def test_cgroup_v1_unlimited_quota_uses_cpuset(tmp_path: Path) -> None:
    clock = ManualClock()
    base = tmp_path / "cpu,cpuacct"
    write(base / "cpuacct.usage", "0\n")
    write(base / "cpu.cfs_quota_us", "-1\n")
    write(base / "cpu.cfs_period_us", "100000\n")
    write(tmp_path / "cpuset" / "cpuset.effective_cpus", "0-3,6,8-10\n")
    source = CgroupV1Cpu(clock, tmp_path, host_cpus=64)
    source.sample()
    write(base / "cpuacct.usage", "1600000000\n")
    clock.advance(2.0)
    # 1.6 s in 2 s = 0.8 cores of the 8 CPUs 0,1,2,3,6,8,9,10 -> 10 %.
    assert source.sample() == pytest.approx(10.0)


def test_cgroup_v1_missing_usage_file_is_a_typed_error(tmp_path: Path) -> None:
    source = CgroupV1Cpu(ManualClock(), tmp_path)
    with pytest.raises(MetricSourceError, match=r"cpuacct\.usage"):
        source.sample()


# --- /proc/stat ---------------------------------------------------------------------------------------------

PROC_TAIL = "cpu0 2000 0 1100 54000 90 0 20 3 0 0\nintr 123 4 5\nctxt 99\n"


def proc_file(path: Path, cpu_line: str) -> None:
    write(path, cpu_line + "\n" + PROC_TAIL)


def test_proc_stat_counts_iowait_as_busy(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    proc_file(path, "cpu  4057 0 2241 109568 191 0 27 6 0 0")
    source = ProcStatCpu(proc_stat_path=path)
    assert source.sample() == 0.0
    # user +100, system +50, idle +250, iowait +50, irq +1000 (ignored), steal +7 (ignored).
    proc_file(path, "cpu  4157 0 2291 109818 241 1000 27 13 0 0")
    # total delta 100+0+50+250+50 = 450, idle delta 250 -> busy 200/450 = 44.444 % (33.3 % if iowait were idle).
    assert source.sample() == pytest.approx(44.444444, abs=1e-6)


def test_proc_stat_equal_line_is_zero(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    proc_file(path, "cpu  4057 0 2241 109568 191 0 27 6 0 0")
    source = ProcStatCpu(proc_stat_path=path)
    source.sample()
    assert source.sample() == 0.0


def test_proc_stat_backwards_counters_fail_then_recover(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    proc_file(path, "cpu  4057 0 2241 109568 191 0 27 6 0 0")
    source = ProcStatCpu(proc_stat_path=path)
    source.sample()
    # idle +100 but iowait -150: total delta -50 < idle delta 100, as when the kernel's iowait goes backwards.
    proc_file(path, "cpu  4057 0 2241 109668 41 0 27 6 0 0")
    with pytest.raises(MetricSourceError, match="backwards"):
        source.sample()
    proc_file(path, "cpu  4087 0 2241 109738 41 0 27 6 0 0")
    # From the new baseline: user +30, idle +70 -> 30 %.
    assert source.sample() == pytest.approx(30.0)


@pytest.mark.parametrize("first_line", ["intr 1 2 3 4 5", "cpu 1 2 x 4 5", "cpu 1 2", "cpu 1 2 3 -4 5"])
def test_proc_stat_malformed_line_is_a_typed_error(tmp_path: Path, first_line: str) -> None:
    path = tmp_path / "stat"
    proc_file(path, first_line)
    with pytest.raises(MetricSourceError):
        ProcStatCpu(proc_stat_path=path).sample()


def test_proc_stat_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(MetricSourceError, match="cannot read"):
        ProcStatCpu(proc_stat_path=tmp_path / "absent").sample()


# --- ECS task metadata endpoint v4 --------------------------------------------------------------------------


class EcsEndpoint:
    """A real HTTP server on 127.0.0.1 serving `/v4/<id>/stats` and `/v4/<id>/task` from mutable documents."""

    def __init__(self) -> None:
        self.documents: dict[str, Any] = {}
        self.server = JsonServer(self.documents.get)
        self.requests = self.server.requests
        self.uri = f"{self.server.base}/v4/{DOCKER_ID}"

    def set_stats(self, pre_total: int, pre_system: int, total: int, system: int, online_cpus: int) -> None:
        self.documents[f"/v4/{DOCKER_ID}/stats"] = {
            "read": "2026-07-01T10:00:01.000000001Z",
            "preread": "2026-07-01T10:00:00.000000001Z",
            "cpu_stats": {
                "cpu_usage": {"total_usage": total, "usage_in_kernelmode": 0, "usage_in_usermode": total},
                "system_cpu_usage": system,
                "online_cpus": online_cpus,
                "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0},
            },
            "precpu_stats": {
                "cpu_usage": {"total_usage": pre_total, "usage_in_kernelmode": 0, "usage_in_usermode": pre_total},
                "system_cpu_usage": pre_system,
                "online_cpus": online_cpus,
                "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0},
            },
        }

    def set_task(self, task_cpu: float | None, shares: dict[str, int]) -> None:
        containers = [
            {"DockerId": docker_id, "Name": f"c-{docker_id}", "Limits": {"CPU": share, "Memory": 512}}
            for docker_id, share in shares.items()
        ]
        task: dict[str, Any] = {
            "Cluster": "default",
            "TaskARN": "arn:aws:ecs:us-east-1:1:task/t",
            "Containers": containers,
        }
        if task_cpu is not None:
            task["Limits"] = {"CPU": task_cpu, "Memory": 2048}
        self.documents[f"/v4/{DOCKER_ID}/task"] = task

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def ecs() -> Iterator[EcsEndpoint]:
    endpoint = EcsEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.close()


THREE_CONTAINERS = {DOCKER_ID: 512, "sidecar": 512, "proxy": 1024}


def test_ecs_share_of_task_limit(ecs: EcsEndpoint) -> None:
    # cpu delta 1e8 over system delta 2e9 on 4 online CPUs = 0.2 cores.
    ecs.set_stats(1_000_000_000, 10_000_000_000, 1_100_000_000, 12_000_000_000, online_cpus=4)
    # Task limit 2 vCPUs; this container has 512 of 512+512+1024 = 2048 units -> 0.5 CPU. 0.2 / 0.5 -> 40 %.
    ecs.set_task(2.0, THREE_CONTAINERS)
    source = EcsCpu(ecs.uri)
    try:
        assert source.sample() == pytest.approx(40.0)
        # 0.8 cores on a 0.5 CPU share is capped at 100; the limit was read once.
        ecs.set_stats(1_000_000_000, 10_000_000_000, 1_400_000_000, 12_000_000_000, online_cpus=4)
        assert source.sample() == 100.0
        assert ecs.requests.count(f"/v4/{DOCKER_ID}/task") == 1
    finally:
        source.close()


def test_ecs_first_call_and_zero_system_delta(ecs: EcsEndpoint) -> None:
    ecs.set_task(2.0, THREE_CONTAINERS)
    source = EcsCpu(ecs.uri)
    try:
        ecs.set_stats(0, 0, 1_100_000_000, 12_000_000_000, online_cpus=4)
        assert source.sample() == 0.0  # Docker has no previous read yet
        ecs.set_stats(1_000_000_000, 12_000_000_000, 1_000_000_000, 12_000_000_000, online_cpus=4)
        assert source.sample() == 100.0  # KCL's rule when no system time passed
    finally:
        source.close()


def test_ecs_missing_task_limit_falls_back_to_online_cpus(ecs: EcsEndpoint) -> None:
    ecs.set_stats(1_000_000_000, 10_000_000_000, 1_100_000_000, 12_000_000_000, online_cpus=4)
    ecs.set_task(None, THREE_CONTAINERS)
    source = EcsCpu(ecs.uri)
    try:
        # Task limit = 4 online CPUs; this container's quarter share -> 1 CPU. 0.2 cores -> 20 %.
        assert source.sample() == pytest.approx(20.0)
    finally:
        source.close()


def test_ecs_container_not_listed_gets_the_minimum_share(ecs: EcsEndpoint) -> None:
    # cpu delta 5e5 over system delta 1e9 on 2 CPUs = 0.001 cores.
    ecs.set_stats(1_000_000_000, 10_000_000_000, 1_000_500_000, 11_000_000_000, online_cpus=2)
    ecs.set_task(1.0, {"other": 998})
    source = EcsCpu(ecs.uri)
    try:
        # Unlisted, so share 2 of 998 + 2 = 1000 units of 1 vCPU = 0.002 CPU; 0.001 cores -> 50 %.
        assert source.sample() == pytest.approx(50.0)
    finally:
        source.close()


def test_ecs_container_without_cpu_limit_counts_as_two_units(ecs: EcsEndpoint) -> None:
    # cpu delta 5e7 over system delta 1e9 on 2 CPUs = 0.1 cores.
    ecs.set_stats(1_000_000_000, 10_000_000_000, 1_050_000_000, 11_000_000_000, online_cpus=2)
    ecs.set_task(1.0, {"other": 6})
    ecs.documents[f"/v4/{DOCKER_ID}/task"]["Containers"].append({"DockerId": DOCKER_ID, "Limits": {"Memory": 512}})
    source = EcsCpu(ecs.uri)
    try:
        # 2 of 6 + 2 = 8 units of 1 vCPU = 0.25 CPU; 0.1 cores -> 40 %.
        assert source.sample() == pytest.approx(40.0)
    finally:
        source.close()


def test_ecs_endpoint_errors_are_typed(ecs: EcsEndpoint) -> None:
    source = EcsCpu(ecs.uri)
    try:
        with pytest.raises(MetricSourceError, match="404"):
            source.sample()  # no documents served yet
        ecs.documents[f"/v4/{DOCKER_ID}/stats"] = {"cpu_stats": {}, "precpu_stats": {"cpu_usage": {"total_usage": 5}}}
        with pytest.raises(MetricSourceError, match=r"cpu_stats\.cpu_usage\.total_usage"):
            source.sample()
    finally:
        source.close()


def test_ecs_endpoint_down_is_a_typed_error() -> None:
    endpoint = EcsEndpoint()
    endpoint.close()  # the port is closed again: connections are refused
    source = EcsCpu(endpoint.uri, timeout_seconds=0.5)
    try:
        with pytest.raises(MetricSourceError, match="failed"):
            source.sample()
    finally:
        source.close()


def test_ecs_uri_without_container_id_is_rejected() -> None:
    with pytest.raises(InvalidMetricInput):
        EcsCpu("not a uri")


# --- selection ----------------------------------------------------------------------------------------------


def select(tmp_path: Path, environ: dict[str, str], proc: bool = True) -> object:
    stat = tmp_path / "proc-stat"
    if proc:
        proc_file(stat, "cpu  1 0 1 1 0 0 0 0 0 0")
    # A host (or container) where this test process is the only one: every source measures it alone.
    return select_cpu_source(ManualClock(), environ=environ, cgroup_root=tmp_path / "cg", proc_stat_path=stat,
                             visible_pids=lambda: [os.getpid()])


def test_selection_prefers_ecs_v4(tmp_path: Path) -> None:
    v2_tree(tmp_path / "cg", 0, "max 100000", "0-1")
    source = select(tmp_path, {ECS_URI_ENV: f"http://127.0.0.1:9/v4/{DOCKER_ID}"})
    assert isinstance(source, EcsCpu)
    source.close()


def test_selection_order_without_ecs(tmp_path: Path) -> None:
    only_v3 = {"ECS_CONTAINER_METADATA_URI": "http://127.0.0.1:9/v3/x", ECS_URI_ENV: ""}
    assert isinstance(select(tmp_path, only_v3, proc=False), PsutilCpu)
    assert isinstance(select(tmp_path, only_v3), ProcStatCpu)
    write(tmp_path / "cg" / "cpuacct" / "cpuacct.usage", "0\n")
    assert isinstance(select(tmp_path, only_v3), CgroupV1Cpu)
    v2_tree(tmp_path / "cg", 0, "max 100000", "0-1")
    assert isinstance(select(tmp_path, only_v3), CgroupV2Cpu)


def test_disabled_metrics_select_nothing(tmp_path: Path) -> None:
    v2_tree(tmp_path, 0, "max 100000", "0-1")
    assert select_cpu_source(ManualClock(), disabled=True, environ={}, cgroup_root=tmp_path) is None


# --- agents sharing a host: their own process tree --------------------------------------------------------------


@pytest.fixture
def stranger() -> Iterator[int]:
    """A live process that is not this test's ancestor or descendant (a grandchild whose parent has exited)."""
    spawner = subprocess.run(
        [sys.executable, "-c", "import subprocess; p = subprocess.Popen(['sleep', '300'], "
         "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"],
        check=True, capture_output=True, text=True)
    pid = int(spawner.stdout)
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


def test_a_cgroup_with_another_agents_process_is_not_this_agents(tmp_path: Path, stranger: int) -> None:
    v2_tree(tmp_path, 0, "max 100000", "0-1")
    write(tmp_path / "cgroup.procs", f"{os.getppid()}\n")  # an ancestor (what started the agent) is fine
    write(tmp_path / "agents" / "a" / "cgroup.procs", f"{os.getpid()}\n")
    assert cgroup_pids(tmp_path) == {os.getppid(), os.getpid()}
    assert isinstance(select_cpu_source(ManualClock(), environ={}, cgroup_root=tmp_path), CgroupV2Cpu)
    write(tmp_path / "agents" / "b" / "cgroup.procs", f"{stranger}\n")
    assert shares_scope(cgroup_pids(tmp_path))
    assert isinstance(select_cpu_source(ManualClock(), environ={}, cgroup_root=tmp_path), ProcessTreeCpu)


def test_host_wide_sources_give_way_to_the_process_tree_on_a_shared_host(tmp_path: Path, stranger: int) -> None:
    stat = tmp_path / "proc-stat"
    proc_file(stat, "cpu  1 0 1 1 0 0 0 0 0 0")
    source = select_cpu_source(ManualClock(), environ={}, cgroup_root=tmp_path / "none", proc_stat_path=stat,
                               visible_pids=lambda: [os.getpid(), stranger])
    assert isinstance(source, ProcessTreeCpu)


@pytest.mark.parametrize("listing", ["kernel", "psutil"])
def test_process_tree_counts_this_process_and_its_children_not_others(stranger: int, listing: str,
                                                                       tmp_path: Path) -> None:
    clock = ManualClock()
    source = ProcessTreeCpu(clock, cpus=1, proc=PROC if listing == "kernel" else tmp_path)  # an empty /proc: psutil
    assert source.sample() == 0.0
    # A child burns 0.4 s of CPU and then sleeps; the stranger sleeps; 1 virtual second passes.
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\n"
                              "while time.process_time() < end: pass\ntime.sleep(60)"])
    try:
        waited = 0.0
        while waited < 30.0 and _cpu_seconds(child.pid) < 0.4:
            time.sleep(0.05)
            waited += 0.05
        clock.advance(1.0)
        value = source.sample()
    finally:
        child.kill()
        child.wait()
    # At least the child's 0.4 CPU seconds in 1 s on 1 CPU (plus what this test process used meanwhile).
    assert 40.0 <= value <= 100.0
    clock.advance(1.0)
    assert source.sample() < 40.0  # the child is gone; nothing of the stranger counts


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def test_the_kernels_children_lists_give_the_tree_psutil_gives(stranger: int) -> None:
    # A child with two children of its own (a shell running two sleeps); the stranger is nobody's descendant here.
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"])
    try:
        sleeps: list[int] = []
        for _ in range(200):
            sleeps = sorted(child.pid for child in psutil.Process(shell.pid).children(recursive=True))
            if len(sleeps) == 2:
                break
            time.sleep(0.05)
        assert children_listed(os.getpid())
        assert len(sleeps) == 2 and sorted(descendants(shell.pid)) == sleeps
        mine = set(descendants(os.getpid()))  # the test run's other children (emulators) as well
        assert mine == {child.pid for child in psutil.Process().children(recursive=True)}
        assert {shell.pid, *sleeps} <= mine and stranger not in mine
    finally:
        for child in psutil.Process(shell.pid).children(recursive=True):
            child.kill()
        shell.kill()
        shell.wait()


def test_proc_gives_the_cpu_seconds_parents_and_processes_psutil_gives(stranger: int) -> None:
    me = psutil.Process()
    assert ancestors(os.getpid()) == [parent.pid for parent in me.parents()]
    assert family(os.getpid()) == {me.pid, *(p.pid for p in me.parents()), *(p.pid for p in me.children(True))}
    assert {1, os.getpid(), stranger} <= set(host_pids())
    before = _cpu_seconds(os.getpid())
    mine = cpu_seconds(os.getpid())
    assert before <= mine + 0.02 and mine <= _cpu_seconds(os.getpid()) + 0.02  # clock ticks: 10 ms
    with pytest.raises(OSError):
        cpu_seconds(stranger + 10_000_000)


def test_the_tree_walk_reads_only_the_trees_lists_and_skips_what_exited(tmp_path: Path) -> None:
    # Process 1's two threads started 2 and 3; 2 started 4 and has a thread that exited (no list); 3 exited.
    write(tmp_path / "1" / "task" / "1" / "children", "2 ")
    write(tmp_path / "1" / "task" / "7" / "children", "3 ")
    write(tmp_path / "2" / "task" / "2" / "children", "4 ")
    (tmp_path / "2" / "task" / "8").mkdir(parents=True)
    write(tmp_path / "4" / "task" / "4" / "children", "")
    write(tmp_path / "9" / "task" / "9" / "children", "10 ")  # another process's tree: never read
    assert children_listed(1, tmp_path) and not children_listed(5, tmp_path)
    assert sorted(descendants(1, tmp_path)) == [2, 3, 4]
