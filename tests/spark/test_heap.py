"""The driver's agent keeps full garbage collections short: its start-up heap is frozen out of the collector's reach.

No JVM: a Spark agent on a real store (every backend), started and given its first batch as the sink would.
A full collection walks every tracked object holding the GIL; in a driver at load 13-28 on 2 cores that stalled the
whole process, heartbeat included, for 0.6-1.5 s (agent/heap.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.agent.spark.driver import SparkAgent
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.store import LeaseStore


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test session's heap as the collector normally sees it, before and after."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_a_started_agent_leaves_its_start_up_heap_out_of_full_collections(store: LeaseStore, tmp_path: Path) -> None:
    settings = load_settings(worker_id="w1", application_name="heap", stream_name="orders",
                             kinesis_endpoint_url="http://127.0.0.1:9", disable_worker_metrics=True)
    agent = SparkAgent(settings, channel=tmp_path, store=store, clock=ManualClock())
    try:
        walked = len(gc.get_objects())  # what a full collection walks now
        assert gc.get_freeze_count() == 0
        agent.start()
        assert gc.get_freeze_count() >= walked // 2
        assert len(gc.get_objects()) < walked // 5
        made_by_a_batch = [[index] for index in range(20_000)]  # objects of a query's first batch, kept
        agent.commit_progress(0, [])
        assert len(gc.get_objects()) < len(made_by_a_batch)  # frozen too, once after the first batch
        frozen = gc.get_freeze_count()
        agent.commit_progress(1, [])
        assert gc.get_freeze_count() <= frozen  # later batches freeze nothing (frozen objects may still be freed)
    finally:
        agent.stop(drain=False)
