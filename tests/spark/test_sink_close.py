"""Closing the checkpointing sink before the query stops: the batch being written finishes, later ones write nothing
(so stopping the query interrupts no write and leaves no `_temporary` directory), and nothing is checkpointed for
them. No Spark here: a closed sink returns before it reads the batch."""

from __future__ import annotations

import threading
from typing import Any

from shardherd.agent.spark.commit import CheckpointingSink
from shardherd.agent.spark.offsets import ShardPlan


class Committer:
    """Records what the sink asks of the agent."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_write(self, plans: list[ShardPlan]) -> list[ShardPlan]:
        self.calls.append("begin")
        return plans

    def commit_progress(self, batch_id: int, plans: list[ShardPlan]) -> None:
        self.calls.append(f"commit {batch_id}")

    def end_write(self, plans: list[ShardPlan]) -> None:
        self.calls.append("end")


def test_a_closed_sink_writes_and_checkpoints_nothing() -> None:
    committer, written = Committer(), []
    sink = CheckpointingSink(committer, lambda df, batch_id: written.append(batch_id), "/nowhere")
    assert sink.close(0.1) is True  # nothing in flight
    sink(object(), 7)  # type: ignore[arg-type]  # a closed sink never looks at the batch
    assert written == [] and committer.calls == []


def test_close_waits_for_the_batch_being_written() -> None:
    sink = CheckpointingSink(Committer(), lambda df, batch_id: None, "/nowhere")
    entered, release = threading.Event(), threading.Event()

    def process(df: Any, batch_id: int) -> None:
        entered.set()
        release.wait(5)

    sink._process = process  # type: ignore[method-assign]  # a batch that takes its time, without Spark
    batch = threading.Thread(target=sink, args=(object(), 1))
    batch.start()
    assert entered.wait(5)
    assert sink.close(0.2) is False  # still writing: the caller's wait is bounded
    release.set()
    batch.join(5)
    assert sink.close(0.2) is True
