"""`shardherd up` as a subprocess, plain and Spark agents: all shards owned, an agent killed, a clean SIGINT stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from shardherd.services.emulators.ports import port_open
from shardherd.services.local_stack.control_scenarios import ControlScenarios
from shardherd.services.local_stack.pipeline import distinct_records, records_dir
from shardherd.services.local_stack.poison_scenario import PoisonScenario
from shardherd.services.local_stack.scenarios import ScenarioFailed, Scenarios
from shardherd.services.local_stack.stack import PIPELINE_DIR, PLAIN_RECORDS_DIR
from shardherd.services.local_stack.state import STATE_FILE, StackNotRunning, StackState, pid_alive
from shardherd.services.local_stack.status import Snapshot
from tests.support.fast_settings import fast_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

FAST = fast_env(disable_worker_metrics=True)


@dataclass(frozen=True)
class Mode:
    """How the stack runs its agents, and the time limits that fit (Spark drivers need a JVM each)."""

    flag: str
    flowing: float  # seconds from the state file to every shard owned and processing
    resumed: float  # seconds for the killed agent's shards to resume on the survivor
    again: float  # seconds for every shard to report more records after that
    env: dict[str, str]
    args: tuple[str, ...] = ()  # more `up` options


# Plain agents quarantine poison records into the run directory, so `scenario poison` counts its way (decision 0031).
PLAIN = Mode("--no-spark", 30, 25, 15, {}, ("--poison-policy", "quarantine"))
# Two JVMs starting on two cores can delay a heartbeat past 2 s; a Spark agent that stops being live stops its query.
# One local[1] driver reads four shards in one micro-batch, a few seconds each on a busy machine.
SPARK = Mode("--spark", 100, 40, 40, {"SHARDHERD_FAILOVER_TIME_MILLIS": "4000"})



def running(process: psutil.Process) -> bool:
    """Still there and not a zombie its new parent has yet to reap."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_state(run_dir: Path) -> StackState | None:
    try:
        return StackState.read(run_dir)
    except StackNotRunning:
        return None


@pytest.fixture(params=[pytest.param(PLAIN, id="plain"), pytest.param(SPARK, id="spark", marks=pytest.mark.spark)])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path, Mode]]:
    mode: Mode = request.param
    if mode is SPARK:
        pytest.importorskip("pyspark")
    run_dir = tmp_path / "run"
    output = tmp_path / "up.txt"
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHARDHERD_")}
    env.update({**FAST, **mode.env})
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "shardherd", "up", mode.flag, *mode.args, "--shards", "4", "--agents", "2",
             "--rate", "100", "--api-port", "0", "--interval", "1", "--run-dir", str(run_dir)],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    failed_before = request.session.testsfailed
    yield process, run_dir, output, mode
    if process.poll() is None:  # the test failed before stopping it: stop it the way a user would
        process.send_signal(signal.SIGINT)
        process.wait(60)
    if request.session.testsfailed > failed_before:  # say what the stack's processes did (CI keeps no run dir)
        print_log_tails([output, *sorted((run_dir / "logs").glob("*.log"))])


def print_log_tails(paths: list[Path], lines: int = 60) -> None:
    """Print the last lines of each log (without Java stack frames), so a failed CI run shows what happened."""
    for path in paths:
        if path.exists():
            tail = [line for line in path.read_text(errors="replace").splitlines()
                    if not line.startswith("\tat ")][-lines:]  # Java stack frames crowd out the rest
            print(f"----- {path.name} (last {len(tail)} lines)", *tail, sep="\n")


def checkpoints_move(scenarios: Scenarios, timeout: float, what: str) -> None:
    """Wait until every unfinished lease's checkpoint differs from what the API shows now."""
    before = {lease["lease_key"]: lease["checkpoint"] for lease in scenarios.snapshot().unfinished}
    wait_for(lambda: all(lease["checkpoint"] != before[lease["lease_key"]]
                         for lease in scenarios.snapshot().unfinished), timeout, what)


def quarantines_a_poison_record(controls: ControlScenarios, lines: list[str]) -> None:
    """`scenario poison` on a stack quarantining into its run directory: every effect seen, counted (decision 0031)."""
    poisoned = PoisonScenario(controls).run(None)
    assert all(outcome.seconds is not None for outcome in poisoned), lines
    delay = next(outcome.seconds for outcome in poisoned if outcome.subject.endswith(" delay"))
    assert delay is not None and delay < 30, lines  # the bound on the shard's delay
    assert any(line.startswith("the destination holds it 1 time(s); ") and ", 0 missing; the poison record in "
               "the output: no" in line for line in lines), lines
    assert any(" bisecting the " in line for line in lines), lines  # the agent's log says when it bisected


def restarted(run_dir: Path, name: str, old_pid: int) -> int | None:
    """The pid the state file names for `name` once it is another process than `old_pid`."""
    state = read_state(run_dir)
    pid = next((entry.pid for entry in state.processes if entry.name == name), None) if state else None
    return pid if pid not in (None, old_pid) else None


def test_up_survives_a_killed_agent_and_stops_cleanly(
        stack: tuple[subprocess.Popen[bytes], Path, Path, Mode]) -> None:
    process, run_dir, output, mode = stack
    wait_for(lambda: read_state(run_dir) is not None, 30, "the state file")
    state = read_state(run_dir)
    assert state is not None
    lines: list[str] = []
    scenarios = Scenarios(state, timeout=mode.resumed, say=lines.append)

    def all_owned_and_flowing() -> bool:
        try:
            view: Snapshot = scenarios.snapshot()
        except Exception:
            return False
        leases = view.unfinished
        return len(leases) == 4 and view.owned == 4 and all((lease["records_processed"] or 0) > 0
                                                              for lease in leases)

    wait_for(all_owned_and_flowing, mode.flowing, "all four shards owned and processing")
    state = read_state(run_dir)  # the stack rewrites it as children start: read it once all are up
    assert state is not None
    # The scenarios pick their victim among the agents the state names: the first read may predate the second agent
    # (CI: the leader gave all four shards to agent-2 before agent-1 reported, and agent-1, the only agent the early
    # state named, was killed holding none).
    scenarios = Scenarios(state, timeout=mode.resumed, say=lines.append)
    pids = {entry.name: entry.pid for entry in state.processes}
    ports = [entry.port for entry in state.processes if entry.port is not None]
    assert {"moto", "kinesalite", "coordinator-1", "coordinator-2", "agent-1", "agent-2"} <= set(pids)
    descendants = psutil.Process(process.pid).children(recursive=True)  # Spark JVMs and Python workers included

    outcomes = scenarios.kill_agent(None)  # the agent holding most leases
    victim, survivor = ("agent-1", "agent-2") if lines[0].startswith("killed agent-1") else ("agent-2", "agent-1")
    assert not pid_alive(pids[victim])
    assert len(outcomes) >= 2  # four shards on two agents: the busier one held at least two
    assert all(outcome.seconds is not None and outcome.where == survivor for outcome in outcomes), lines
    assert any(f"resumed on {survivor} after" in line for line in lines)
    # Each checkpoint moving shows the survivor still processing; `records_processed` would not: it counts from the
    # new owner's takeover, so it can stay below the victim's last figure for a while.
    checkpoints_move(scenarios, mode.again, "records still flowing on the survivor")

    if mode is PLAIN:  # a crash (not a scenario's kill): the stack starts the survivor again under its name
        os.kill(pids[survivor], signal.SIGKILL)
        wait_for(lambda: restarted(run_dir, survivor, pids[survivor]) is not None, 30, f"{survivor} started again")
        pids[f"{survivor} again"] = restarted(run_dir, survivor, pids[survivor]) or 0
        # Twice: the API's view may predate the crash, so one change could be the crashed agent's last checkpoint.
        for _ in range(2):
            checkpoints_move(scenarios, mode.resumed + mode.again, "records flowing again after the crash")
        assert all(lease["owner"] == survivor for lease in scenarios.snapshot().unfinished)
        text = output.read_text()
        assert f"! {survivor} exited on its own (code -9); starting it again in 1 s" in text, text
        assert f"* {survivor} started again (pid {pids[f'{survivor} again']})" in text, text

    if mode is PLAIN:  # a hot shard for a few seconds: no move that soon, and the scenario says why and what still runs
        lines.clear()
        hot = sorted(scenarios.snapshot().unfinished, key=lambda lease: lease["lease_key"])[0]["lease_key"]
        assert scenarios.hot_shard(hot, 50, 2) == []
        assert any(line.startswith("why no move: the leader's plan now") for line in lines), lines
        assert f"the extra 50 records/s to {hot} keep running; `scenario hot-shard {hot} --rate 0` ends them" in lines

    if mode is PLAIN:  # operator controls (decision 0031): a pause, then a rewind of every shard, counted per record
        lines.clear()
        controls = ControlScenarios(scenarios, run_dir / PLAIN_RECORDS_DIR)
        paused = controls.pause(None, chaos=False)
        assert all(outcome.seconds is not None for outcome in paused), lines
        assert any(" delivered 0 records while paused" in line for line in lines), lines
        assert any(": 0 records up to its checkpoint missing from the output" in line for line in lines), lines
        lines.clear()
        rewound = controls.rewind(5.0, [])
        assert all(outcome.seconds is not None for outcome in rewound), lines
        assert any("not again: 0; delivered twice or more again: 0" in line and "never delivered: 0" in line
                   for line in lines), lines
        lines.clear()  # last: the quarantined record stays in the stream, never delivered (rewind would count it)
        quarantines_a_poison_record(controls, lines)
    else:  # Spark agents do not bisect or quarantine: the scenario says so in one line and writes nothing
        with pytest.raises(ScenarioFailed, match="needs plain agents"):
            PoisonScenario(ControlScenarios(scenarios, run_dir / PLAIN_RECORDS_DIR)).run(None)

    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 0, output.read_text()
    assert not (run_dir / STATE_FILE).exists()
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    wait_for(lambda: not any(running(child) for child in descendants), 10, "every process the stack started to end")
    assert [port for port in ports if port_open(port)] == []
    text = output.read_text()
    assert "startup: first lease assigned after" in text
    memory = re.search(r"startup: .* (\d+) MiB in \d+ processes, agents (\d+) MiB \((\d+), (\d+)\)", text)
    assert memory is not None, text  # two agents, each with its own figure (with Spark: JVM and workers included)
    assert int(memory[1]) >= int(memory[2]) >= int(memory[3]) >= int(memory[4]) > 20  # the agents within the total
    assert f"- {victim} ended on purpose (code -9); not started again" in text, text
    shown = [int(count) for count in re.findall(r"\| (\d+) records in the agents' output", text)]
    assert shown and shown == sorted(shown), "the output only grows"
    assert "stopped in" in text
    if mode is SPARK:  # the pipeline's Parquet: the survivor wrote records of the shards it took over
        moved = {outcome.subject for outcome in outcomes}
        assert moved <= set(distinct_records(records_dir(run_dir / PIPELINE_DIR, survivor)))
        assert "distinct records over 4 shards in Parquet" in text
        counts = subprocess.run([sys.executable, "-m", "examples.shard_counts", "--counts", "--run-dir", str(run_dir)],
                                capture_output=True, text=True, timeout=180, check=False)  # the stack has stopped
        assert counts.returncode == 0, counts.stderr[-2000:]
        assert f"{sum(distinct_records(run_dir / PIPELINE_DIR / 'records').values())} distinct records" in counts.stdout
    else:  # plain agents keep their record keys: produced against processed is printed too
        assert re.search(r"produced \d+ records .*; processed \d+ distinct records over 4 shards", text), text
