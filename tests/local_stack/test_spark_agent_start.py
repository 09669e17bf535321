"""The local stack's Spark driver joins the fleet only once its query runs, not while its JVM starts.

A driver added to a running fleet (or replacing one in a rolling deploy) that heartbeat during its JVM start was
given leases it could not read for that long (45-95 s under load, session 7). Real driver process, moto server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardherd.services.emulators.moto_server import MotoServer
from tests.support.fast_settings import fast_env
from tests.support.stores import make_store, unique_app, worker_record
from tests.support.stream_stack import kill_processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def test_a_stack_driver_writes_no_worker_row_before_its_spark_session_is_up(moto_server: MotoServer,
                                                                           tmp_path: Path) -> None:
    pytest.importorskip("pyspark.sql")
    app = unique_app("spark-start")
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url, app=app)
    log = tmp_path / "driver.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "SHARDHERD_APPLICATION_NAME": app, "SHARDHERD_STREAM_NAME": app, "SHARDHERD_WORKER_ID": "driver-1",
           "SHARDHERD_STORE_BACKEND": "dynamodb", "SHARDHERD_DYNAMODB_ENDPOINT_URL": moto_server.endpoint_url,
           # no Kinesis is needed: nothing is assigned, so nothing is read (a closed loopback port)
           "SHARDHERD_KINESIS_ENDPOINT_URL": "http://127.0.0.1:9", **fast_env(disable_worker_metrics=True)}
    with log.open("wb") as out:
        driver = subprocess.Popen([sys.executable, "-m", "shardherd.services.local_stack.spark_agent",
                                   "--out", str(tmp_path / "out")], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: worker_record(store, "driver-1") is not None or driver.poll() is not None, 180,
                 "the driver's first worker row")
        text = log.read_text()
        assert driver.poll() is None, text
        assert "Spark session up" in text, "the driver heartbeat before its Spark session existed:\n" + text
    finally:
        driver.send_signal(signal.SIGUSR1)  # the whole stack stops: leases given back, Spark stopped
        with contextlib.suppress(subprocess.TimeoutExpired):
            driver.wait(60)
        kill_processes([driver])
