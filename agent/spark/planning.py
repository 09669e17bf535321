"""Planning rules of the source (Spark-free): which shards a batch reads, from where, and through which record.

R1: the lease table (through the agent's snapshot) is the only source of progress; Spark offsets are plans.
R2: every plan starts a shard at its lease checkpoint, never at Spark's `start` (shards appear, vanish, return).
R3: a replayed plan drops shards no longer held and skips what was checkpointed since it was made.
R4: every plan ends at a record the probe saw (whole probed segments within the caps, at least one), so a plan
    read twice gives the same rows and its end is the checkpoint the batch earns once written.
"""

from __future__ import annotations

from shardherd.agent.spark.channel import Segment, ShardState, ShardView, Snapshot
from shardherd.agent.spark.offsets import BatchOffset, Caps, ShardPlan


def plannable(view: ShardView, until: float | None) -> bool:
    """True if a new batch should read this shard: owned, not handing off, records known to wait (before `until`)."""
    if view.state is not ShardState.OWNED or not view.pending:
        return False
    return until is None or view.next_arrival is None or view.next_arrival <= until


def segments_within(segments: tuple[Segment, ...], caps: Caps, until: float | None) -> list[Segment]:
    """The leading segments a batch takes: within the caps (the first one always), none that began after `until`."""
    taken: list[Segment] = []
    records = size = 0
    for segment in segments:
        if until is not None and segment.first_arrival is not None and segment.first_arrival > until:
            break
        records += segment.records
        size += segment.bytes
        if taken and (records > caps.max_records or (caps.max_bytes is not None and size > caps.max_bytes)):
            break
        taken.append(segment)
    return taken


def shard_plan(shard: str, view: ShardView, caps: Caps, until: float | None) -> ShardPlan | None:
    """The plan of one shard in the next batch: from its checkpoint through the last segment taken."""
    taken = segments_within(view.segments, caps, until)
    if not taken:
        return None
    return ShardPlan(shard, view.position, taken[-1].end, sum(item.records for item in taken),
                     sum(item.bytes for item in taken), view.tenure)


def plan_next(start: BatchOffset, snapshot: Snapshot | None, caps: Caps, until: float | None) -> BatchOffset:
    """The end offset of the next batch; `start` itself (so Spark runs no batch) when nothing is waiting."""
    if snapshot is None:
        return start
    shards = {}
    for shard, view in snapshot.shards.items():
        plan = shard_plan(shard, view, caps, until) if plannable(view, until) else None
        if plan is not None:
            shards[shard] = plan
    if not shards:
        return start
    return BatchOffset(start.number + 1, shards)


def partitions_to_read(end: BatchOffset, snapshot: Snapshot | None) -> list[ShardPlan]:
    """The shard plans to turn into partitions: only shards still held, each from no earlier than its checkpoint.

    A shard already checkpointed at or past the plan's end has nothing left to read in it; a shard held under
    another tenure than the plan's (lost and acquired again, or a plan of an earlier driver) is left to new plans.
    """
    if snapshot is None:
        return []
    plans = []
    for shard, plan in sorted(end.shards.items()):
        view = snapshot.shards.get(shard)
        if view is None or view.tenure != plan.tenure or view.checkpoint >= plan.end:
            continue
        if view.checkpoint > plan.position.checkpoint:
            plan = plan.starting_after(view.checkpoint)
        plans.append(plan)
    return plans


def group_plans(plans: list[ShardPlan], groups: int | None) -> list[tuple[ShardPlan, ...]]:
    """The read partitions of a batch: one per plan, or at most `groups` with the plans spread by records.

    Every partition of a Python data source costs a round trip to a Python worker (0.03 s on a quiet core, 0.25 s
    at load 18 on 2 cores), so a batch of more shards than cores pays it per shard, in waves; a partition of several
    shards reads them at once (agent/spark/arrow_read.py, `read_plans`). Largest plan first to the lightest
    partition, ties by shard id: the grouping is a function of the plans alone, and a read of a partition gives the
    rows of its plans whatever the grouping, so a replay may group differently and still read the same rows.
    """
    if groups is None or groups >= len(plans):
        return [(plan,) for plan in plans]
    members: list[list[ShardPlan]] = [[] for _ in range(groups)]
    loads = [0] * groups
    for plan in sorted(plans, key=lambda item: (-item.records, item.shard_id)):
        lightest = min(range(groups), key=lambda index: (loads[index], index))
        members[lightest].append(plan)
        loads[lightest] += max(1, plan.records)
    return [tuple(sorted(group, key=lambda item: item.shard_id)) for group in members if group]
