"""The Spark pipeline and a plain shardherd application on one stream through the limits proxy, at half its write
limit: both keep up, within the shard's read limits, and no Spark batch is delayed by more than a trigger."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from tests.support.two_consumers import run_two_consumers

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_spark_beside_a_plain_application_both_keep_up_within_the_read_limits(
        moto_server: MotoServer, kinesalite: NodeEmulator, spark: SparkSession, tmp_path: Path) -> None:
    """About 30-50 s (a reason: a Spark query and a plain application must start, then a window long enough to
    count calls per second: 8 s). 1 shard written at 250 records/s of 2,000 bytes (half its write byte limit); both
    use user defaults. bench/two_consumers.py --spark runs the same longer."""
    with KinesisLimits(kinesalite.port) as limits:
        run = run_two_consumers(moto_server, limits, shards=1, rate=250, size=2000, seconds=8.0, spark=spark,
                                workdir=tmp_path)
    assert run.written >= 250 * 8 * 0.8
    assert run.write_throttled == 0  # half the write limit: the producer is never throttled
    spark_app, plain = run.apps["a"], run.apps["b"]
    assert spark_app.drain_seconds < 5.0, f"the Spark application fell behind: {spark_app}"  # a trigger + a batch
    assert plain.drain_seconds < 5.0, f"the plain application fell behind: {plain}"
    assert plain.calls_per_shard_second <= 1.2, plain  # once a second, caught up
    assert spark_app.calls_per_shard_second <= 2.0, spark_app  # a read per trigger, a probe only when idle
    assert run.throttled_fraction <= 0.01, run
    assert run.iterators == 0, run  # no new iterator per batch or poll: only when a lease arrives or one expires
    own = (spark_app.calls_per_shard_second + plain.calls_per_shard_second) * run.seconds  # 1 shard
    assert abs(own - run.proxy_calls) <= 4, run  # each agent's /metrics count its calls (Spark's: at commit)
    assert run.spark_batches is not None and run.spark_batches.delay_max <= 1.0, run  # no batch a trigger late
