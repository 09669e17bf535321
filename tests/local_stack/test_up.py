"""`shardherd up --no-spark` as a subprocess: all shards owned, an agent killed by a scenario, a clean SIGINT stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.emulators.ports import port_open
from services.local_stack.scenarios import Scenarios
from services.local_stack.state import STATE_FILE, StackNotRunning, StackState, pid_alive
from services.local_stack.status import Snapshot

pytestmark = pytest.mark.slow

FAST = {"SHARDHERD_FAILOVER_TIME_MILLIS": "2000", "SHARDHERD_DISCOVERY_INTERVAL_MILLIS": "300",
        "SHARDHERD_LEASE_ASSIGNMENT_INTERVAL_MILLIS": "300", "SHARDHERD_LEADER_LOCK_LEASE_DURATION_MILLIS": "2000",
        "SHARDHERD_LEADER_LOCK_HEARTBEAT_PERIOD_MILLIS": "400", "SHARDHERD_SHARD_SYNC_INTERVAL_MILLIS": "1000",
        "SHARDHERD_DISABLE_WORKER_METRICS": "true"}


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_state(run_dir: Path) -> StackState | None:
    try:
        return StackState.read(run_dir)
    except StackNotRunning:
        return None


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    run_dir = tmp_path / "run"
    output = tmp_path / "up.txt"
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHARDHERD_")}
    env.update(FAST)
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--no-spark", "--shards", "4", "--agents", "2",
             "--rate", "100", "--api-port", "0", "--interval", "1", "--run-dir", str(run_dir)],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    yield process, run_dir, output
    if process.poll() is None:  # the test failed before stopping it: stop it the way a user would
        process.send_signal(signal.SIGINT)
        process.wait(60)


def test_up_survives_a_killed_agent_and_stops_cleanly(
        stack: tuple[subprocess.Popen[bytes], Path, Path]) -> None:
    process, run_dir, output = stack
    wait_for(lambda: read_state(run_dir) is not None, 30, "the state file")
    state = read_state(run_dir)
    assert state is not None
    lines: list[str] = []
    scenarios = Scenarios(state, timeout=25, say=lines.append)

    def all_owned_and_flowing() -> bool:
        try:
            view: Snapshot = scenarios.snapshot()
        except Exception:
            return False
        leases = view.unfinished
        return len(leases) == 4 and view.owned == 4 and all((lease["records_processed"] or 0) > 0
                                                              for lease in leases)

    wait_for(all_owned_and_flowing, 30, "all four shards owned and processing")
    pids = {entry.name: entry.pid for entry in state.processes}
    ports = [entry.port for entry in state.processes if entry.port is not None]
    assert {"moto", "kinesalite", "coordinator-1", "coordinator-2", "agent-1", "agent-2"} <= set(pids)

    outcomes = scenarios.kill_agent(None)  # the agent holding most leases
    victim, survivor = ("agent-1", "agent-2") if lines[0].startswith("killed agent-1") else ("agent-2", "agent-1")
    assert not pid_alive(pids[victim])
    assert len(outcomes) >= 2  # four shards on two agents: the busier one held at least two
    assert all(outcome.seconds is not None and outcome.where == survivor for outcome in outcomes), lines
    assert any(f"resumed on {survivor} after" in line for line in lines)
    before = {lease["lease_key"]: lease["records_processed"] for lease in scenarios.snapshot().unfinished}
    wait_for(lambda: all((lease["records_processed"] or 0) > (before[lease["lease_key"]] or 0)
                         for lease in scenarios.snapshot().unfinished), 15, "records still flowing on the survivor")

    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 0, output.read_text()
    assert not (run_dir / STATE_FILE).exists()
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    assert [port for port in ports if port_open(port)] == []
    text = output.read_text()
    assert "startup: first lease assigned after" in text
    assert "stopped in" in text
