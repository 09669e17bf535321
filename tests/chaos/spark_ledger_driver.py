"""`python -m tests.chaos.spark_ledger_driver --dir DIR`: a Spark driver that writes the chaos ledgers.

The worker of the chaos cluster and the fault matrix as a Spark agent: a SparkAgent (local[1], its own JVM)
configured by SHARDHERD_* variables, whose foreachBatch sink appends each row as a delivery line to the file named
by SHARDHERD_TEST_LEDGER (the plain agents' format, tests/support/file_ledger.py), flushed and fsynced inside the
batch, so a batch the lease table counts as done is on disk. Spark's checkpoint and the agent's channel live in
`DIR/<worker>-checkpoint` and `DIR/<worker>-channel` (the disk cells fill or freeze them). The lease checkpoints
the agent writes after each committed batch are read from the lease table by the harness. SIGTERM drains and exits 0;
a query that ends by itself exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from shardherd.agent.spark.commit import BatchFunction
from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.spark.offsets import Caps
from shardherd.shared.config import load_settings
from tests.support.file_ledger import LEDGER_ENV, append_to_ledger
from tests.support.stream_stack import local_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def ledger_sink(path: str, worker: str) -> BatchFunction:
    """A foreachBatch function appending every row of the batch to the ledger at `path`."""
    def write(df: DataFrame, batch_id: int) -> None:
        rows = df.select("shard_id", "sequence_number", "sub_sequence_number", "data").collect()
        if rows:
            append_to_ledger(path, worker, [(r[0], str(r[1]), int(r[2]), bytes(r[3])) for r in rows])

    return write


def main(argv: list[str]) -> int:
    """Run the agent's query until SIGTERM (drain, exit 0) or until it ends by itself (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    terminate = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        terminate.set()

    signal.signal(signal.SIGTERM, on_term)
    settings = load_settings()
    worker = settings.worker_id
    spark = local_spark(f"shardherd-{worker}", master="local[1]")
    agent = SparkAgent(settings, channel=args.dir / f"{worker}-channel", caps=Caps(200), probe_interval=0.2,
                       min_call_interval=0.05)
    query = agent.run_query(spark, ledger_sink(os.environ[LEDGER_ENV], worker), str(args.dir / f"{worker}-checkpoint"),
                            processing_time="300 milliseconds")
    while query.isActive and not terminate.wait(0.2):
        pass
    ended_by_itself = not terminate.is_set()
    agent.stop(drain=not ended_by_itself)
    spark.stop()
    return 1 if ended_by_itself else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
