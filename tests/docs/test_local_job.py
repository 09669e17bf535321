"""docs/spark.md's "Run your own job against the local stack", run as written: examples/local_job.sh starts
`shardherd up --no-spark`, runs examples/spark_job.py as one more worker from the stack's job.env, interrupts it as
Ctrl-C does (SIGINT), and stops the stack. The job drains (exit 0) and wrote Parquet, with no half-written batch."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_citations import ROOT

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPT = ROOT / "examples" / "local_job.sh"


def test_the_documented_commands_run_a_job_that_drains_on_ctrl_c(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Java is not on PATH")
    # The user's working directory: a checkout (the script runs examples/spark_job.py from it).
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SHARDHERD_", "AWS_"))}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]), PYTHONPATH=str(ROOT),
               PYSPARK_PYTHON=sys.executable)
    script = subprocess.Popen(["bash", str(SCRIPT)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = script.communicate(timeout=420)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGTERM)  # the script's trap stops the stack
            script.wait(120)
    text = output.decode(errors="replace")
    assert script.returncode == 0, text[-4000:] + (tmp_path / "up.log").read_text()[-2000:]
    records = tmp_path / "my-job" / "records"
    assert list(records.glob("*.parquet")), "the job wrote the shards it held"
    assert not (records / "_temporary").exists(), "the stop interrupted no write"
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert "leases not moved by a leader" not in text, "every lease the job held was handed over by the drain"
    assert not (tmp_path / ".shardherd" / "up" / "job.env").exists(), "a stopped stack leaves no job.env behind"
