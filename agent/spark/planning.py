"""Planning rules of the source (Spark-free): which shards a batch reads, from where, and how much at most.

R1: the lease table (through the agent's snapshot) is the only source of progress; Spark offsets are plans.
R2: every plan starts a shard at its lease checkpoint, never at Spark's `start` (shards appear, vanish, return).
R3: a replayed plan drops shards no longer held and skips what was checkpointed since it was made.
R4: a plan names no end: the first read of it records where it stopped (agent/spark/batch_ends.py) and every
    later read follows that, so a plan read twice gives the same rows; that recorded end is the checkpoint the
    batch earns once written.
R5: a shard is planned only when records are known to wait (pending), so an idle shard costs no batch.
"""

from __future__ import annotations

from shardherd.agent.spark.channel import ShardState, ShardView, Snapshot
from shardherd.agent.spark.offsets import BatchOffset, Caps, ShardPlan


def plannable(view: ShardView, until: float | None) -> bool:
    """True if a new batch should read this shard: owned, not handing off, records known to wait (before `until`)."""
    if view.state is not ShardState.OWNED or not view.pending:
        return False
    return until is None or view.waiting_since is None or view.waiting_since <= until


def plan_next(start: BatchOffset, snapshot: Snapshot | None, caps: Caps, until: float | None,
              run: str) -> BatchOffset:
    """The end offset of the next batch; `start` itself (so Spark runs no batch) when nothing is waiting.

    The plans continue `start`'s run (a query restarted on its checkpoint), else `run` (a fresh checkpoint).
    """
    if snapshot is None:
        return start
    run = start.run or run
    number = start.number + 1
    shards = {shard: ShardPlan(shard, view.position, caps, view.tenure, run, number, view.iterator, until)
              for shard, view in snapshot.shards.items() if plannable(view, until)}
    if not shards:
        return start
    return BatchOffset(number, shards, run)


def partitions_to_read(end: BatchOffset, snapshot: Snapshot | None) -> list[ShardPlan]:
    """The shard plans to turn into partitions: only shards still held under the plan's tenure.

    A shard held under another tenure than the plan's (lost and acquired again, or a plan of an earlier driver)
    is left to new plans. A plan whose shard was checkpointed since it was made (replayed after a batch that
    was written) keeps its start: its recorded end, if any, is what every read of it must give.
    """
    if snapshot is None:
        return []
    plans = []
    for shard, plan in sorted(end.shards.items()):
        view = snapshot.shards.get(shard)
        if view is None or view.tenure != plan.tenure:
            continue
        plans.append(plan)
    return plans


def group_plans(plans: list[ShardPlan], groups: int | None) -> list[tuple[ShardPlan, ...]]:
    """The read partitions of a batch: one per plan, or at most `groups` with the plans spread evenly.

    Every partition of a Python data source costs a round trip to a Python worker (0.03 s on a quiet core, 0.25 s
    at load 18 on 2 cores), so a batch of more shards than cores pays it per shard, in waves; a partition of several
    shards reads them at once (agent/spark/arrow_read.py, `read_plans`). Plans go round in shard id order (a plan's
    size is unknown until it is read): the grouping is a function of the plans alone, and a read of a partition
    gives the rows of its plans whatever the grouping, so a replay may group differently and still read the same
    rows.
    """
    if groups is None or groups >= len(plans):
        return [(plan,) for plan in plans]
    ordered = sorted(plans, key=lambda item: item.shard_id)
    return [tuple(ordered[index::groups]) for index in range(groups)]
