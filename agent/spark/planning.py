"""Planning rules of the source (Spark-free): which shards a batch reads, and from where.

R1: the lease table (through the agent's snapshot) is the only source of progress; Spark offsets are plans.
R2: every plan starts a shard at its lease checkpoint, never at Spark's `start` (shards appear, vanish, return).
R3: a replayed plan drops shards no longer held and skips what was checkpointed since it was made.
"""

from __future__ import annotations

from agent.spark.channel import ShardState, ShardView, Snapshot
from agent.spark.offsets import BatchOffset, Caps, ShardPlan


def plannable(view: ShardView, until: float | None) -> bool:
    """True if a new batch should read this shard: owned, not handing off, records known to wait (before `until`)."""
    if view.state is not ShardState.OWNED or not view.pending:
        return False
    return until is None or view.next_arrival is None or view.next_arrival <= until


def plan_next(start: BatchOffset, snapshot: Snapshot | None, caps: Caps, until: float | None) -> BatchOffset:
    """The end offset of the next batch; `start` itself (so Spark runs no batch) when nothing is waiting."""
    if snapshot is None:
        return start
    shards = {shard: ShardPlan(shard, view.position, caps, until)
              for shard, view in snapshot.shards.items() if plannable(view, until)}
    if not shards:
        return start
    return BatchOffset(start.number + 1, shards)


def partitions_to_read(end: BatchOffset, snapshot: Snapshot | None) -> list[ShardPlan]:
    """The shard plans to turn into partitions: only shards still held, each from no earlier than its checkpoint."""
    if snapshot is None:
        return []
    plans = []
    for shard, plan in sorted(end.shards.items()):
        view = snapshot.shards.get(shard)
        if view is None:
            continue
        if view.checkpoint > plan.position.checkpoint:
            plan = plan.starting_after(view.checkpoint)
        plans.append(plan)
    return plans
