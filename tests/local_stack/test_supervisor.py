"""The stack's supervisor with real processes: SIGTERM reaches the child alone; nothing it started outlives it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from shardherd.services.local_stack.emulators import Emulators
from shardherd.services.local_stack.supervisor import Child, Supervisor
from shardherd.shared.config import load_settings


def spawn_tree(supervisor: Supervisor, directory: Path) -> tuple[Child, list[psutil.Process]]:
    child = supervisor.spawn("tree", "agent", "tests.local_stack.tree_child", [str(directory)], dict(os.environ),
                             grace=10.0)
    pids = directory / "pids.json"
    deadline = time.monotonic() + 30
    while not pids.exists():
        assert child.alive, (directory / "logs" / "tree.log").read_text()
        assert time.monotonic() < deadline, "the child did not start its sleepers"
        time.sleep(0.05)
    return child, [psutil.Process(pid) for pid in json.loads(pids.read_text(encoding="utf-8"))]


def gone(processes: list[psutil.Process]) -> bool:
    return not any(process.is_running() and process.status() != psutil.STATUS_ZOMBIE for process in processes)


def make_supervisor(tmp_path: Path) -> Supervisor:
    (tmp_path / "logs").mkdir()
    return Supervisor(tmp_path / "logs")


def test_stop_terms_the_child_alone_then_kills_what_it_left(tmp_path: Path) -> None:
    supervisor = make_supervisor(tmp_path)
    child, sleepers = spawn_tree(supervisor, tmp_path)
    supervisor.stop([child], grace=20)
    assert child.process.returncode == -signal.SIGTERM
    assert gone(sleepers)
    assert sorted(path.name for path in tmp_path.glob("term-*")) == []  # SIGTERM went to the child only


def test_sigkill_takes_the_child_and_what_it_started_in_other_groups(tmp_path: Path) -> None:
    supervisor = make_supervisor(tmp_path)
    child, sleepers = spawn_tree(supervisor, tmp_path)
    supervisor.kill("tree", signal.SIGKILL)
    assert child.process.wait(10) == -signal.SIGKILL
    assert gone(sleepers)
    assert supervisor.unexpected_exits() == []


def test_the_stack_reports_kinesalite_exiting_by_itself_once_with_its_log(tmp_path: Path) -> None:
    settings = load_settings(store_backend="sql", stream_name="reports")  # SQL store: no moto, only kinesalite
    emulators = Emulators(settings, make_supervisor(tmp_path), use_aws=False)
    endpoints = emulators.start()
    try:
        assert emulators.kinesis_exit() is None  # running
        # By default every Kinesis client of the stack goes through the limits proxy (decision 0029).
        assert emulators.limits is not None and endpoints.kinesis == emulators.limits.endpoint_url
        assert emulators.limits.counts()["limits"]["read_calls_per_second"] == 5
        kinesalite = emulators.kinesalite
        assert kinesalite is not None and kinesalite.pid is not None
        os.kill(kinesalite.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (line := emulators.kinesis_exit()) is None:
            assert time.monotonic() < deadline, "the exit was not reported"
            time.sleep(0.05)
        assert line == f"kinesalite exited on its own (code -9); log: {tmp_path / 'logs' / 'kinesalite.log'}"
        assert emulators.kinesis_exit() is None  # reported once
    finally:
        emulators.stop()
