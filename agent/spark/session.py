"""A local SparkSession for drivers that embed the agent: loopback only, UI off, a JVM tuned for fast start.

Executors (Python workers) run this interpreter and see this checkout, so the `shardherd` source imports there too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import shardherd

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The folder that holds the `shardherd` package (a checkout or site-packages), for the executors' Python workers.
PACKAGE_ROOT = Path(shardherd.__file__).parent.parent
FAST_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_environment() -> None:
    """Environment a local Spark run needs: workers use this interpreter and see this package; loopback only."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))


def local_spark(app: str, master: str = "local[2]", driver_memory: str | None = None,
                conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession on loopback: `master` local (two cores by default) or a cluster's URL (client mode), UI off.

    `driver_memory` caps the driver JVM heap; `conf` adds Spark settings (e.g. executor memory and cores).
    """
    from pyspark.sql import SparkSession

    spark_environment()
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.speculation", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.extraJavaOptions", FAST_START_JVM))
    if driver_memory is not None:
        builder = builder.config("spark.driver.memory", driver_memory)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
