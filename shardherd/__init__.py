"""shardherd: leader-based Kinesis shard lease coordination for Python and Spark, compatible with KCL 3.x lease tables.

The public surface for applications; everything else lives in the subpackages `shardherd.shared` (models, stores,
configuration), `shardherd.coordinator` (leader), `shardherd.agent` (worker, Spark source and sink) and
`shardherd.services` (the runnable processes). Names load on first use, so importing shardherd pulls in neither
PySpark nor boto3.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardherd.agent.consumer import Checkpointer, RecordProcessor
    from shardherd.agent.runtime import Agent
    from shardherd.agent.spark.commit import BatchFunction
    from shardherd.agent.spark.driver import SparkAgent, register_source
    from shardherd.agent.spark.offsets import Caps
    from shardherd.agent.spark.signals import stop_signals
    from shardherd.shared.config import Settings, load_settings
    from shardherd.shared.errors import ShardherdError

# Each public name and the module that defines it.
_HOMES = {
    "Agent": "shardherd.agent.runtime",
    "BatchFunction": "shardherd.agent.spark.commit",
    "Caps": "shardherd.agent.spark.offsets",
    "Checkpointer": "shardherd.agent.consumer",
    "RecordProcessor": "shardherd.agent.consumer",
    "Settings": "shardherd.shared.config",
    "ShardherdError": "shardherd.shared.errors",
    "SparkAgent": "shardherd.agent.spark.driver",
    "load_settings": "shardherd.shared.config",
    "register_source": "shardherd.agent.spark.driver",
    "stop_signals": "shardherd.agent.spark.signals",
}

__all__ = ["Agent", "BatchFunction", "Caps", "Checkpointer", "RecordProcessor", "Settings", "ShardherdError",
           "SparkAgent", "load_settings", "register_source", "stop_signals"]


def __getattr__(name: str) -> Any:
    """Import a public name from its home module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shardherd' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
