"""A Spark agent of the local stack: a local Spark driver embedding the agent, running the example pipeline.

    python -m shardherd.services.local_stack.spark_agent --out DIR [--master local[1]] [--driver-memory 512m] ...

Settings come from SHARDHERD_* variables (the stack sets the worker id, stream and endpoints). The driver appends
Parquet to `<out>/records/<worker id>` and keeps Spark's checkpoint in `<out>/checkpoint/<worker id>` (plans only:
progress lives in the lease table). SIGUSR1 (the whole stack stops) gives the leases back without waiting for a
handoff. SIGTERM (or SIGINT) drains: the query keeps running while the leader hands the
agent's leases on, each after its last batch was written and checkpointed; then the query and Spark stop, exit 0.
A query that fails drains the leases too (the agent's supervisor does it) and the process exits 1.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.spark.offsets import Caps
from shardherd.agent.spark.progress_log import BatchTimingLog
from shardherd.agent.spark.session import local_spark
from shardherd.services.agent_service import StopSignals
from shardherd.services.local_stack.pipeline import records_dir, write_records
from shardherd.shared.config import Settings, load_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverOptions:
    """How the driver runs: Spark master and heap, per-shard cap, trigger, and where its files go."""

    out: Path
    master: str = "local[1]"
    driver_memory: str = "512m"
    max_records: int = 2000
    trigger: str = "1 second"
    probe_interval: float = 0.5
    drain_timeout: float | None = None


def run_driver(settings: Settings, options: DriverOptions, stopping: threading.Event,
               after: Callable[[SparkSession], None] | None = None, drain: Callable[[], bool] = lambda: True,
               on_session: Callable[[], object] = lambda: None) -> int:
    """Run the pipeline until `stopping` is set (exit code 0) or the query ends by itself (exit code 1).

    On `stopping` the agent drains if `drain()` says so, else it gives its leases back at once (the fleet stops).
    `on_session` runs once the session is up: where the caller installs its signal handlers again, as the session's
    SparkContext replaced the SIGINT one (agent/spark/signals.py).

    `after` gets the session once the agent has drained, before Spark stops (the example prints counts with it).
    """
    worker = settings.worker_id
    started = time.monotonic()
    # The agent joins the fleet once its query runs (run_query starts it): a driver added to a running fleet, or
    # replacing one in a rolling deploy, takes leases only when it can read them, not while its JVM starts.
    agent = SparkAgent(settings, channel=options.out / "channel" / worker, caps=Caps(options.max_records),
                       probe_interval=options.probe_interval)
    spark: SparkSession | None = None
    code = 0
    try:
        spark = local_spark(f"shardherd-{worker}", options.master, options.driver_memory)
        log.info("Spark session up after %.1f s", time.monotonic() - started)
        on_session()
        if not stopping.is_set():
            spark.streams.addListener(BatchTimingLog())
            query = agent.run_query(spark, write_records(records_dir(options.out, worker)),
                                    str(options.out / "checkpoint" / worker), processing_time=options.trigger)
            log.info("query running after %.1f s", time.monotonic() - started)
            while query.isActive and not stopping.wait(0.2):
                pass
            if not stopping.is_set():
                code = 1
                log.error("the query ended by itself (%s)", agent.stopped_because or query.exception())
        if drain():
            log.info("stopping: draining %d leases while the query runs", len(agent.keeper.held()))
    finally:
        agent.stop(drain=drain(), drain_timeout=options.drain_timeout)
        if spark is not None:
            try:
                if after is not None:
                    after(spark)
            finally:
                spark.stop()
    return code


def main() -> int:
    """Parse arguments, install the signal handlers, run the driver."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Parquet, Spark checkpoints and channels go here")
    parser.add_argument("--master", default=DriverOptions.master, help="Spark master (default local[1])")
    parser.add_argument("--driver-memory", default=DriverOptions.driver_memory, help="driver JVM heap")
    parser.add_argument("--max-records", type=int, default=DriverOptions.max_records,
                        help="records per shard per micro-batch")
    parser.add_argument("--trigger", default=DriverOptions.trigger, help="processing-time trigger interval")
    parser.add_argument("--drain-timeout", type=float, default=None,
                        help="seconds to wait on SIGTERM for the leader to move leases away (default: derived)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("shardherd.agent.spark.commit").setLevel(logging.DEBUG)  # each batch's write and checkpoints
    signals = StopSignals().install()
    options = DriverOptions(args.out, args.master, args.driver_memory, args.max_records, args.trigger,
                            drain_timeout=args.drain_timeout)
    return run_driver(load_settings(), options, signals.stopping, drain=lambda: signals.drain,
                      on_session=signals.install)


if __name__ == "__main__":
    raise SystemExit(main())
