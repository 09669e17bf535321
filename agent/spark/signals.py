"""Stop signals of a Spark job: SIGTERM and SIGINT (Ctrl-C) both ask the job to drain its agent and exit.

PySpark's SparkContext installs its own SIGINT handler when it starts (it cancels the running Spark jobs and raises
KeyboardInterrupt in the main thread), replacing any handler the job installed before: a job that drains on Ctrl-C
installs its handlers again after the session started, which `stop_signals` does.
The handlers only set an event; the job's main thread then stops its agent (`SparkAgent.stop`), which drains.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_signals(spark: SparkSession | None = None, stopping: threading.Event | None = None) -> threading.Event:
    """`stopping` (or a new event), set by SIGTERM or SIGINT from now on (main thread only).

    With `spark`, after its context started (it starts it). Call it once before the session too, with no session, and
    pass that event again after: a signal while the JVM starts then stops the job as well, and after the session's
    start PySpark's handler no longer has the last word.
    """
    if spark is not None:
        _ = spark.sparkContext  # the context, and with it PySpark's SIGINT handler, exists before ours replaces it
    event = stopping if stopping is not None else threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: event.set())
    return event
