"""Example pipeline: per-shard record counts and bytes as Parquet, idempotent on (shard, sequence, sub-sequence).

One command runs it against the stack `shardherd up` runs (its run directory tells where the emulators are):

    python -m examples.shard_counts [--run-dir .shardherd/up] [--duration 60]

It joins the stack as one more worker: a local Spark driver embedding the agent (`SparkAgent.run_query`), so the
leader gives it a share of the shards. Each micro-batch appends its records' keys and sizes to
`<run dir>/shard-counts/records/<worker>` (Parquet), beside the stack's own Spark agents. Ctrl-C (or `--duration`)
drains its leases back to the stack, then it writes per-shard counts over distinct keys of every driver to
`<run dir>/shard-counts/counts` and prints them. `--counts` only does the last step. The pipeline itself is
`services/local_stack/pipeline.py`; the driver is `services/local_stack/spark_agent.py`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

from shardherd.agent.spark.session import local_spark
from shardherd.services.local_stack.pipeline import write_counts
from shardherd.services.local_stack.spark_agent import DriverOptions, run_driver
from shardherd.services.local_stack.stack import PIPELINE_DIR
from shardherd.services.local_stack.state import StackState, run_dir
from shardherd.shared.config import load_settings

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession


def print_counts(spark: SparkSession, out: Path) -> None:
    """Write `<out>/counts` and print one line per shard."""
    counts = write_counts(spark, out)
    for shard, records, size in counts:
        print(f"{shard}: {records} records, {size} bytes")
    print(f"{sum(records for _, records, _ in counts)} distinct records; Parquet in {out}")


def main() -> int:
    """Join the running stack as a Spark driver until Ctrl-C or --duration, then print per-shard counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="the stack's run directory (default .shardherd/up)")
    parser.add_argument("--worker", default="example-driver", help="worker id of this driver")
    parser.add_argument("--duration", type=float, default=None, help="drain and stop after this many seconds")
    parser.add_argument("--counts", action="store_true", help="only compute and print the counts")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    directory = run_dir(args.run_dir)
    out = directory / PIPELINE_DIR
    if args.counts:  # only the Parquet is needed: works after the stack stopped
        if not (out / "records").is_dir():
            raise SystemExit(f"no pipeline output under {out / 'records'} (did `shardherd up` run Spark agents there?)")
        spark = local_spark("shardherd-counts")
        try:
            print_counts(spark, out)
        finally:
            spark.stop()
        return 0
    state = StackState.read(directory)
    if state.kinesis_endpoint_url or state.dynamodb_endpoint_url:  # emulators accept any credentials
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    settings = load_settings(application_name=state.application_name, stream_name=state.stream_name,
                             region=state.region, kinesis_endpoint_url=state.kinesis_endpoint_url,
                             dynamodb_endpoint_url=state.dynamodb_endpoint_url, worker_id=args.worker)
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    def install() -> None:
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)

    install()
    if args.duration is not None:
        timer = threading.Timer(args.duration, stopping.set)
        timer.daemon = True
        timer.start()
    print(f"joining {state.stream_name} as {args.worker}; Ctrl-C drains and prints the counts")
    return run_driver(settings, DriverOptions(out, master="local[2]"), stopping,
                      after=lambda spark: print_counts(spark, out), on_session=install)


if __name__ == "__main__":
    raise SystemExit(main())
