"""`shardherd up` as a new user meets it: a run dir in use, a taken port, bad settings, emulator limits, no agents.

Each case runs the real command in a subprocess and checks what the terminal shows and what is left running.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.services.local_stack.state import CONTROL_SOCKET, STATE_FILE, StackState
from tests.local_stack.test_up import FAST, read_state
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHARDHERD_")}
    return {**env, **FAST, **extra}


def _shardherd(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardherd", *args], env=env or _env(), capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture
def first_stack(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "shardherd", "up", "--no-spark", "--shards", "2", "--agents", "2", "--rate", "50",
         "--interval", "1", "--run-dir", str(run_dir)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    yield process, run_dir
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(60)


def test_a_run_dir_in_use_is_refused_and_the_operator_cli_uses_it(
        first_stack: tuple[subprocess.Popen[str], Path]) -> None:
    process, run_dir = first_stack
    wait_for(lambda: read_state(run_dir) is not None, 60, "the first stack's state file")
    state = read_state(run_dir)
    assert state is not None and state.supervisor_pid == process.pid

    second = _shardherd("up", "--no-spark", "--duration", "5", "--run-dir", str(run_dir), timeout=60)
    assert second.returncode == 2
    assert f"is in use by another `shardherd up` (pid {process.pid})" in second.stderr
    assert StackState.read(run_dir).supervisor_pid == process.pid  # nothing of the first stack was touched
    assert (run_dir / CONTROL_SOCKET).exists()

    def every_lease_owned() -> bool:
        status = _shardherd("status", "--run-dir", str(run_dir), timeout=30)
        return status.returncode == 0 and status.stdout.count(" owned ") == 2

    wait_for(every_lease_owned, 60, "both leases owned, as `shardherd status --run-dir` shows")
    status = _shardherd("status", "--run-dir", str(run_dir), env={**_env(), "COLUMNS": "200"})
    assert max(len(line) for line in status.stdout.splitlines()) <= 80, status.stdout
    drained = _shardherd("drain", "agent-1", "--run-dir", str(run_dir))
    assert (drained.returncode, drained.stdout.strip()) == (0, "drain requested for agent-1"), drained.stderr
    undone = _shardherd("drain", "agent-1", "--undo", "--run-dir", str(run_dir))
    assert (undone.returncode, undone.stdout.strip()) == (0, "drain cleared for agent-1"), undone.stderr

    # A poison record under the default policy (block), as a user runs the scenario (decision 0031).
    logs = [run_dir / "logs" / f"agent-{n}.log" for n in (1, 2)]
    before_poison = "".join(path.read_text() for path in logs)
    blocks_on_a_poison_record(run_dir)
    after_poison = [path.stat().st_size for path in logs]

    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output
    assert not (run_dir / STATE_FILE).exists()
    match = re.search(r"produced (\d+) records .*; processed (\d+) distinct records over (\d+) shards", output)
    assert match is not None, output
    produced, processed = int(match[1]), int(match[2])
    assert produced > 0 and processed <= produced
    # Before the poison record and from the stop on (the poison record's own warnings are the scenario's).
    agent_logs = before_poison + "".join(path.read_bytes()[size:].decode() for path, size in zip(logs, after_poison,
                                                                                                  strict=True))
    assert "stopping with the fleet, no drain" in agent_logs
    assert "drain:" not in agent_logs and " WARNING " not in agent_logs  # a normal stop is no trouble

    again = _shardherd("up", "--no-spark", "--agents", "0", "--duration", "4", "--run-dir", str(run_dir))
    assert again.returncode == 0, again.stdout + again.stderr  # the lock was released; logs rotate per run
    assert (run_dir / "logs.previous" / "agent-1.log").exists() and not (run_dir / "logs" / "agent-1.log").exists()


def blocks_on_a_poison_record(run_dir: Path) -> None:
    """`shardherd scenario poison` on a stack blocking on poison records: named, 0 skipped, rewound past it."""
    poisoned = _shardherd("scenario", "poison", "--run-dir", str(run_dir), "--timeout", "60")
    assert poisoned.returncode == 0, poisoned.stdout + poisoned.stderr
    said = poisoned.stdout
    assert "policy block" in said and "(bisected down to it) and named by the API after" in said, said
    assert re.search(r"the alert: shard \S+ stuck on poison record \d+/0, last error: (poison record \d+/0: )?"
                     r"NotAProducerRecord: record \d+", said), said  # the error shortened as the row holds it
    assert ": records after the poison one delivered while blocked: 0; records before it missing from the output: 0" \
        in said, said
    assert re.search(r": the next record delivered after [\d.]+ s", said), said


def test_bad_settings_and_emulator_limits_fail_in_one_line(tmp_path: Path) -> None:
    huge = _shardherd("up", "--no-spark", "--duration", "5", "--run-dir", str(tmp_path / "a"),
                      env=_env(SHARDHERD_FAILOVER_TIME_MILLIS="99999999999999999999"))
    assert huge.returncode == 2
    assert "SHARDHERD_FAILOVER_TIME_MILLIS: Input should be less than or equal to 3600000" in huge.stderr
    too_many = _shardherd("up", "--no-spark", "--duration", "5", "--shards", "100000", "--run-dir",
                          str(tmp_path / "b"))
    assert too_many.returncode == 2, too_many.stdout
    assert "Traceback" not in too_many.stderr and len(too_many.stderr.strip().splitlines()) == 1, too_many.stderr
    assert "refused CreateStream of stream shardherd-local (100000 shards): LimitExceededException" in too_many.stderr
    skewed = _shardherd("up", "--no-spark", "--duration", "5", "--key-skew", "-1", "--run-dir", str(tmp_path / "c"))
    assert skewed.returncode == 2, skewed.stdout
    assert "Traceback" not in skewed.stderr and len(skewed.stderr.strip().splitlines()) == 1, skewed.stderr
    assert "--key-skew is between 0 (every shard alike) and 10 (got -1)" in skewed.stderr


def test_a_taken_api_port_fails_up_loudly(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = _shardherd("up", "--no-spark", "--duration", "30", "--api-port", str(port), "--run-dir",
                            str(tmp_path / "run"))
    assert result.returncode == 2
    assert time.monotonic() - started < 90
    assert f"coordinator-1 API on port {port} exited before it was ready" in result.stderr
    assert "Address already in use" in result.stderr
    assert "dashboard:" not in result.stdout  # no URL pointing at the other program


def test_no_agents_and_duration_from_the_start(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _shardherd("up", "--no-spark", "--agents", "0", "--duration", "6", "--run-dir", str(tmp_path / "run"))
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "no agents: the 8 shards stay unassigned" in result.stdout
    assert elapsed < 6 + 50  # start-up time counts into --duration; the rest is the stop


def test_duration_counts_from_the_command_not_from_the_shell_chain_before_it(tmp_path: Path) -> None:
    """In `bash -c "... && shardherd up"` the process is the shell's (exec): its create time is the chain's start."""
    command = f"{sys.executable} -c 'import time; time.sleep(8)' && exec {sys.executable} -m shardherd up " \
              f"--no-spark --agents 0 --duration 15 --interval 1 --run-dir {tmp_path / 'run'}"
    began = time.monotonic()
    result = subprocess.run(["bash", "-c", command], env=_env(), capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    # Counted from the chain's start, the stack would stop 15 s after it (7 s after its own start).
    assert time.monotonic() - began >= 8 + 15, result.stdout
    shown = [int(seconds) for seconds in re.findall(r"^up (\d+) s", result.stdout, re.M)]
    assert all(seconds <= 16 for seconds in shown), result.stdout  # `up N s` counts from the command too
