"""The README's commands for a running stack, run as written, one after another, from the directory the README means.

Over 20 s (7.5 minutes at a load average of 15-38 on 2 cores): the only test that runs these lines as a user types
them, so it starts its own `shardherd up` (plain agents, default 8 shards at 100 records/s, the tests' short timings
with a 4 s failover) in a fresh directory whose `.shardherd/up` is then the default run directory, with the
virtualenv's `bin` on PATH as the README assumes. The Spark driver's line (`python -m examples.shard_counts`, which
runs until Ctrl-C) gets a SIGINT once it holds a lease and wrote a batch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardherd.services.local_stack.pipeline import records_dir
from shardherd.services.local_stack.stack import PIPELINE_DIR
from shardherd.services.local_stack.state import StackNotRunning, StackState
from shardherd.services.status_cli import OperatorClient
from tests.docs.test_citations import ROOT
from tests.support.fast_settings import fast_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BLOCK = re.compile(r"```sh\n(shardherd scenario kill-agent.*?)```", re.S)
UNTIL_CTRL_C = "python -m examples.shard_counts"  # the one line that runs until Ctrl-C


def readme_lines() -> list[str]:
    """The commands of the README's block for a running stack, comments removed."""
    found = BLOCK.search((ROOT / "README.md").read_text())
    assert found, "README.md shows the scenario commands in one ```sh block"
    return [line.split("#", 1)[0].strip() for line in found.group(1).splitlines() if line.split("#", 1)[0].strip()]


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHARDHERD_")}
    # A 4 s failover as the Spark stack tests use: under load a 2 s one self-fences agents mid-scenario.
    env.update(fast_env(disable_worker_metrics=True, failover_time_millis=4000))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # as in a checkout
    return env


def _owns_a_lease(run_dir: Path, worker: str) -> bool:
    try:
        state = StackState.read(run_dir)
    except StackNotRunning:
        return False
    client = OperatorClient(state.api_urls(), state.api_token(), timeout=3.0)
    try:
        return any(lease["owner"] == worker for lease in client.leases())
    except Exception:
        return False
    finally:
        client.close()


@pytest.mark.timeout(900)  # at a load average of 50 the scenarios took 40-60 s each, past the 300 s default
def test_the_readme_commands_run_as_written(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the example driver's line needs pyspark")
    env = _env()
    run_dir = tmp_path / ".shardherd" / "up"
    with open(tmp_path / "up.txt", "wb") as out:
        stack = subprocess.Popen(["shardherd", "up", "--no-spark", "--rate", "100"], cwd=tmp_path, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (run_dir / "state.json").exists(), 60, "the stack's state file")
        wait_for(lambda: _owns_a_lease(run_dir, "agent-2"), 60, "agent-2 holding a lease")
        for line in readme_lines():
            if line == UNTIL_CTRL_C:
                driver = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=tmp_path, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                wait_for(lambda: _owns_a_lease(run_dir, "example-driver"), 180, "the example driver's first lease")
                # Ctrl-C once it wrote a batch, as a user watching it would: `--counts` below reads that Parquet.
                wait_for(lambda: any(records_dir(run_dir / PIPELINE_DIR, "example-driver").glob("*.parquet")), 120,
                         "the example driver's first batch")
                driver.send_signal(signal.SIGINT)
                output, _ = driver.communicate(timeout=120)
                assert driver.returncode == 0, f"{line}:\n{output}"
                continue
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=180)
            assert done.returncode == 0, f"{line} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            assert done.stdout.strip(), f"{line} printed nothing"
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            assert stack.wait(120) == 0, (tmp_path / "up.txt").read_text()
        finally:
            if stack.poll() is None:
                os.killpg(stack.pid, signal.SIGKILL)
