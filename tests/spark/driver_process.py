"""A real Spark driver process for the multi-driver test: a SparkAgent configured by SHARDHERD_* env, a file sink.

    python -m tests.spark.driver_process --out rows.jsonl --checkpoint DIR --channel DIR [--master URL --conf K=V]

Each written row is one JSON line `[shard, sequence, sub-sequence, worker, pid, batch, unix time, reader pid]` in
`--out` (pid: this driver's; reader pid: the process whose `read()` produced the row), flushed and fsynced inside the
batch's write, so a row the lease table counts as done is on disk even if the process is SIGKILLed right after.
SIGTERM drains (the agent hands its leases on while the query still runs), then exits 0; a query that ends
without it exits 1 with the agent's reason. `--master` defaults to `local[1]`; a `spark://` URL runs the driver in
client mode on that cluster, with `--conf` settings (repeatable).

`--slow-write S` makes each write a two-step sink: the rows, then S seconds later a second Spark job (as a sink that
writes a second table would); `<out>.busy` exists from the moment its rows are on disk until the write returns, so
a test can signal the driver between a batch's write and its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

from shardherd.agent.spark.commit import BatchFunction
from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.spark.offsets import Caps
from shardherd.shared.config import load_settings
from tests.support.stream_stack import local_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Row = tuple[str, str, int, str, int, int, float, int]


def read_rows(path: Path) -> list[Row]:
    """The rows a driver wrote (a line cut short by a SIGKILL is not a row: it was never acknowledged)."""
    if not path.exists():
        return []
    rows: list[Row] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.endswith("]"):
            shard, sequence, sub, worker, pid, batch, stamp, reader = json.loads(line)
            rows.append((shard, sequence, int(sub), worker, int(pid), int(batch), float(stamp), int(reader)))
    return rows


def busy_marker(out: Path) -> Path:
    """The file that exists while a batch's rows are on disk and its write has not returned (so not checkpointed)."""
    return out.with_suffix(".busy")


def file_sink(out: Path, handle: IO[str], worker: str, slow_write: float) -> BatchFunction:
    """A foreachBatch function appending each row, keyed by (shard, sequence, sub-sequence), to `handle`."""
    busy = busy_marker(out)

    def write(df: DataFrame, batch_id: int) -> None:
        try:
            rows = df.select("shard_id", "sequence_number", "sub_sequence_number", "reader_pid").collect()
            stamp = time.time()
            for row in rows:
                handle.write(json.dumps([row[0], row[1], row[2], worker, os.getpid(), batch_id, stamp, row[3]]) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            if slow_write:
                busy.touch()
                time.sleep(slow_write)
                df.count()
        finally:
            busy.unlink(missing_ok=True)

    return write


def main() -> None:
    """Run the agent and its query until SIGTERM (drain) or the query ends."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--channel", type=Path, required=True)
    parser.add_argument("--cap", type=int, default=100)
    parser.add_argument("--slow-write", type=float, default=0.0)
    parser.add_argument("--master", default="local[1]")
    parser.add_argument("--conf", action="append", default=[], help="a Spark setting KEY=VALUE")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {os.getpid()} %(name)s %(message)s")
    terminate = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        terminate.set()

    signal.signal(signal.SIGTERM, on_term)
    settings = load_settings()
    spark = local_spark(f"shardherd-{settings.worker_id}", master=args.master,
                        conf=dict(setting.split("=", 1) for setting in args.conf))
    agent = SparkAgent(settings, channel=args.channel, caps=Caps(args.cap), probe_interval=0.2,
                       min_call_interval=0.05, include_reader=True)
    with args.out.open("a", encoding="utf-8") as handle:
        query = agent.run_query(spark, file_sink(args.out, handle, settings.worker_id, args.slow_write),
                                str(args.checkpoint),
                                processing_time="300 milliseconds")
        while query.isActive and not terminate.wait(0.2):
            pass
        agent.stop(drain=True)
    spark.stop()
    if not terminate.is_set():  # the query ended on its own: a test waiting for this driver's rows should say why
        raise SystemExit(f"the query ended without SIGTERM: {agent.stopped_because or 'no reason recorded'}")


if __name__ == "__main__":
    main()
