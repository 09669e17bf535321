"""The example job the agent image ships (examples/spark_job.py), run as users run it: `spark-submit` of the file,
SHARDHERD_* settings in the environment, here in local mode against the emulators. Its default sink is checked in
the session's Spark."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from examples.spark_job import default_checkpoint, log_counts
from shardherd.agent.spark.schema import DDL
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.support.fast_settings import settings_env
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "spark_job.py"
SHARDS = 2


def spark_submit() -> Path:
    """The `spark-submit` of the installed PySpark (the image's SPARK_HOME is the same package folder)."""
    pyspark = pytest.importorskip("pyspark")
    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


def parquet_payloads(output: Path) -> list[bytes]:
    """The `data` column of every row the job appended (Spark's `_temporary` and `_SUCCESS` entries skipped)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    return [bytes(value) for part in sorted(output.glob("*.parquet"))
            for value in pq.read_table(part, columns=["data"]).column("data").to_pylist()]


def job_process(submit_pid: int) -> psutil.Process:
    """The job's Python process among spark-submit's descendants (skipping short-lived ones that are gone)."""
    for child in psutil.Process(submit_pid).children(recursive=True):
        try:
            if str(JOB) in child.cmdline():
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no process runs {JOB} under spark-submit {submit_pid}")


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator) -> Iterator[StreamStack]:
    stack = StreamStack(moto_server, kinesalite, SHARDS, prefix="job", failover_millis=4000)
    yield stack
    stack.close()


def test_spark_submit_of_the_example_reads_every_record_into_parquet_and_drains_on_sigterm(
        stack: StreamStack, tmp_path: Path) -> None:
    output = tmp_path / "records"
    env = {**os.environ, **settings_env(stack.base), "SHARDHERD_WORKER_ID": "example-driver",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
    command = [str(spark_submit()), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
               "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
               str(JOB), "--output", output.as_uri(), "--checkpoint", str(tmp_path / "checkpoint"),
               "--trigger", "500 milliseconds"]
    log = tmp_path / "job.log"
    with log.open("wb") as sink:
        job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        wait_for(lambda: set(stack.owners().values()) == {"example-driver"}, 120, "the job's driver to own the leases")
        stack.produce(300, "job")
        wait_for(lambda: sorted(parquet_payloads(output)) == sorted(stack.produced), 120,
                 "every produced record in the job's Parquet")
        last = {shard: sequence for shard, sequence in sorted(stack.keys, key=lambda key: int(key[1]))}
        wait_for(lambda: {stack.checkpoints()[shard] for shard in last} == set(last.values()), 30,
                 "checkpoints at each shard's last record")
        # The job's own handler drains: SIGTERM to its Python process, the child of spark-submit's JVM (in a pod,
        # SIGTERM reaches the JVM and the preStop hook's drain moves the shards first: docs/deploy-eks.md).
        job_process(job.pid).send_signal(signal.SIGTERM)
        assert job.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert set(stack.owners().values()) == {None}, "the drain gave every lease back"
    assert sorted(parquet_payloads(output)) == sorted(stack.produced), "no record twice after the drain"
    assert not (output / "_temporary").exists(), "the stop interrupted no write"


def test_the_default_sink_logs_records_and_bytes_per_shard(spark: SparkSession,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [("shardId-1", "1", 0, "k", at, b"abc", "a"), ("shardId-1", "2", 0, "k", at, b"de", "a"),
            ("shardId-0", "3", 0, "k", at, b"", "a"), ("shardId-1", "4", 0, "k", at, b"fghi", "b")]
    df = spark.createDataFrame(rows, DDL)
    with caplog.at_level(logging.INFO, logger="spark_job"):
        log_counts(df, 7)
    assert [record.getMessage() for record in caplog.records if record.name == "spark_job"] == [
        "batch 7: a/shardId-0 1 records 0 bytes", "batch 7: a/shardId-1 2 records 5 bytes",
        "batch 7: b/shardId-1 1 records 4 bytes"]


def test_two_jobs_on_one_host_get_their_own_default_checkpoint() -> None:
    first, second = default_checkpoint("host-a:101"), default_checkpoint("host-a:102")
    assert first != second and first.endswith("checkpoint") and ":" not in Path(first).parent.name
