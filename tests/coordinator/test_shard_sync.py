"""Shard sync planner: KCL's hierarchical lease lifecycle on hand-built reshard histories."""

from __future__ import annotations

import random
from collections.abc import Iterable
from datetime import UTC, datetime

import pytest

from shardherd.coordinator.shard_sync import (
    CreateReason,
    DeleteReason,
    ShardSyncInputError,
    SyncPlan,
    plan_shard_sync,
)
from shardherd.shared.checkpoint import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.shards import MAX_HASH_KEY, MalformedShard, Shard, ShardListError

STAMP = datetime(2026, 1, 1, tzinfo=UTC)
POSITIONS = ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP")
CHILD_START = {"TRIM_HORIZON": TRIM_HORIZON, "LATEST": TRIM_HORIZON, "AT_TIMESTAMP": AT_TIMESTAMP}
INITIAL = {"TRIM_HORIZON": TRIM_HORIZON, "LATEST": LATEST, "AT_TIMESTAMP": AT_TIMESTAMP}
STARTED = Checkpoint.at("4242")


def sid(n: int) -> str:
    return f"shardId-{n:012d}"


class StreamBuilder:
    """Builds a stream's shard list the way Kinesis reshards: closing parents, opening children over their range."""

    def __init__(self, count: int) -> None:
        self.shards: dict[str, Shard] = {}
        self._seq = 0
        step = (MAX_HASH_KEY + 1) // count
        for i in range(count):
            high = MAX_HASH_KEY if i == count - 1 else (i + 1) * step - 1
            self._open(None, None, i * step, high)

    def _next_seq(self) -> str:
        self._seq += 1000
        return str(self._seq)

    def _open(self, parent: str | None, adjacent: str | None, low: int, high: int) -> str:
        shard_id = sid(len(self.shards))
        self.shards[shard_id] = Shard(shard_id, parent, adjacent, str(low), str(high), self._next_seq())
        return shard_id

    def _close(self, shard_id: str) -> Shard:
        shard = self.shards[shard_id]
        assert shard.is_open, f"{shard_id} is already closed"
        closed = Shard(shard.shard_id, shard.parent_shard_id, shard.adjacent_parent_shard_id,
                       shard.starting_hash_key, shard.ending_hash_key, shard.starting_sequence_number,
                       self._next_seq())
        self.shards[shard_id] = closed
        return closed

    def split(self, n: int) -> tuple[int, int]:
        parent = self._close(sid(n))
        low, high = parent.hash_range
        middle = (low + high) // 2
        a = self._open(parent.shard_id, None, low, middle)
        b = self._open(parent.shard_id, None, middle + 1, high)
        return int(a[-12:]), int(b[-12:])

    def merge(self, n: int, m: int) -> int:
        first, second = sorted((self._close(sid(n)), self._close(sid(m))), key=lambda s: s.hash_range)
        assert first.hash_range[1] + 1 == second.hash_range[0], "only adjacent shards merge"
        child = self._open(first.shard_id, second.shard_id, first.hash_range[0], second.hash_range[1])
        return int(child[-12:])

    def trim(self, *numbers: int) -> None:
        """Drop shards from the listing, as retention expiry does."""
        for n in numbers:
            del self.shards[sid(n)]

    def listing(self) -> list[Shard]:
        return list(self.shards.values())

    def open_ids(self) -> set[str]:
        return {s.shard_id for s in self.shards.values() if s.is_open}


def doc_example() -> StreamBuilder:
    """The tree in the comment of KCL's HierarchicalShardSyncer: 0+1->6, 2+3->7, 6+7->8, 4 open, 5->9,10."""
    stream = StreamBuilder(6)
    assert stream.merge(0, 1) == 6
    assert stream.merge(2, 3) == 7
    assert stream.merge(6, 7) == 8
    assert stream.split(5) == (9, 10)
    return stream


def lease(n: int, checkpoint: Checkpoint = STARTED, **fields: object) -> Lease:
    return Lease(lease_key=sid(n), checkpoint=checkpoint).with_changes(**fields)


def plan(stream: StreamBuilder, leases: Iterable[Lease], position: str = "TRIM_HORIZON") -> SyncPlan:
    return plan_shard_sync(stream.listing(), list(leases), position, STAMP if position == "AT_TIMESTAMP" else None)


def created(result: SyncPlan) -> dict[str, tuple[Checkpoint, CreateReason]]:
    return {c.lease.lease_key: (c.lease.checkpoint, c.reason) for c in result.creates}


def deleted(result: SyncPlan) -> dict[str, DeleteReason]:
    return {d.lease.lease_key: d.reason for d in result.deletes}


def ids(*numbers: int) -> frozenset[str]:
    return frozenset(sid(n) for n in numbers)


def apply(result: SyncPlan, leases: Iterable[Lease]) -> dict[str, Lease]:
    table = {le.lease_key: le for le in leases}
    for deletion in result.deletes:
        del table[deletion.lease.lease_key]
    for creation in result.creates:
        assert creation.lease.lease_key not in table, "a plan never re-creates an existing lease"
        table[creation.lease.lease_key] = creation.lease
    return table


# ---------------------------------------------------------------------------------------------------------------
# Initial positions


@pytest.mark.parametrize(
    ("position", "expected", "reasons"),
    [
        ("LATEST", ids(4, 8, 9, 10), {CreateReason.NEW_OPEN_SHARD}),
        ("TRIM_HORIZON", ids(0, 1, 2, 3, 4, 5), {CreateReason.TREE_ROOT, CreateReason.NEW_OPEN_SHARD}),
        ("AT_TIMESTAMP", ids(0, 1, 2, 3, 4, 5), {CreateReason.TREE_ROOT, CreateReason.NEW_OPEN_SHARD}),
    ],
)
def test_empty_table_gets_open_shards_or_roots(
    position: str, expected: frozenset[str], reasons: set[CreateReason]
) -> None:
    result = plan(doc_example(), [], position)
    assert set(created(result)) == expected
    assert {checkpoint for checkpoint, _ in created(result).values()} == {INITIAL[position]}
    assert {reason for _, reason in created(result).values()} == reasons
    assert created(result)[sid(4)][1] is CreateReason.NEW_OPEN_SHARD
    assert result.deletes == ()


@pytest.mark.parametrize("position", POSITIONS)
def test_roots_are_the_oldest_shards_still_listed(position: str) -> None:
    stream = doc_example()
    stream.trim(0, 1, 2, 3)  # 6 and 7 lost their parents to retention: they are the roots now
    expected = ids(4, 8, 9, 10) if position == "LATEST" else ids(4, 5, 6, 7)
    assert set(created(plan(stream, [], position))) == expected


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        ("LATEST", {sid(6): (LATEST, CreateReason.UNLEASED_COPARENT)}),
        ("TRIM_HORIZON", {sid(n): (TRIM_HORIZON, CreateReason.TREE_ROOT) for n in (0, 1)}),
        ("AT_TIMESTAMP", {sid(n): (AT_TIMESTAMP, CreateReason.TREE_ROOT) for n in (0, 1)}),
    ],
)
def test_reference_doc_example(position: str, expected: dict[str, tuple[Checkpoint, CreateReason]]) -> None:
    result = plan(doc_example(), [lease(4), lease(5), lease(7)], position)
    assert created(result) == expected
    assert result.deletes == ()


def test_created_leases_carry_parents_and_hash_range() -> None:
    stream = doc_example()
    result = plan(stream, [lease(4), lease(5), lease(7)], "LATEST")
    (creation,) = result.creates
    shard = stream.shards[sid(6)]
    assert creation.lease.parent_shard_ids == ids(0, 1)
    assert (creation.lease.starting_hash_key, creation.lease.ending_hash_key) == (
        shard.starting_hash_key,
        shard.ending_hash_key,
    )
    assert creation.lease.lease_owner is None


def test_creations_are_in_starting_sequence_order() -> None:
    stream = StreamBuilder(3)
    stream.split(2)
    stream.split(0)
    result = plan(stream, [], "LATEST")
    keys = [c.lease.lease_key for c in result.creates]
    assert keys == sorted(keys, key=lambda k: int(stream.shards[k].starting_sequence_number))
    assert set(keys) == stream.open_ids()


# ---------------------------------------------------------------------------------------------------------------
# Split and merge


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("parent_checkpoint", [TRIM_HORIZON, AT_TIMESTAMP, LATEST, STARTED])
def test_split_children_wait_for_parent_shard_end(position: str, parent_checkpoint: Checkpoint) -> None:
    stream = StreamBuilder(2)
    stream.split(0)
    result = plan(stream, [lease(0, parent_checkpoint), lease(1)], position)
    assert result.is_empty


@pytest.mark.parametrize("position", POSITIONS)
def test_split_children_created_once_parent_finished(position: str) -> None:
    stream = StreamBuilder(2)
    a, b = stream.split(0)
    result = plan(stream, [lease(0, SHARD_END), lease(1)], position)
    assert created(result) == {
        sid(a): (CHILD_START[position], CreateReason.PARENTS_FINISHED),
        sid(b): (CHILD_START[position], CreateReason.PARENTS_FINISHED),
    }
    assert {c.lease.parent_shard_ids for c in result.creates} == {ids(0)}
    assert result.deletes == ()  # the parent stays until its children have started


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(
    ("first", "second", "creates_child"),
    [
        (SHARD_END, STARTED, False),
        (STARTED, SHARD_END, False),
        (SHARD_END, TRIM_HORIZON, False),
        (SHARD_END, SHARD_END, True),
    ],
)
def test_merge_child_needs_every_parent_finished(
    position: str, first: Checkpoint, second: Checkpoint, creates_child: bool
) -> None:
    stream = StreamBuilder(3)
    child = stream.merge(0, 1)
    result = plan(stream, [lease(0, first), lease(1, second), lease(2)], position)
    expected = {sid(child): (CHILD_START[position], CreateReason.PARENTS_FINISHED)} if creates_child else {}
    assert created(result) == expected


@pytest.mark.parametrize("position", POSITIONS)
def test_merge_with_unleased_coparent_leases_the_coparent_first(position: str) -> None:
    stream = StreamBuilder(3)
    child = stream.merge(0, 1)
    result = plan(stream, [lease(0, SHARD_END), lease(2)], position)
    # Shard 1 has no lease and no leased ancestry: it is leased at the initial position, the child waits for it.
    reason = CreateReason.TREE_ROOT
    assert created(result) == {sid(1): (INITIAL[position], reason)}
    result = plan(stream, [lease(0, SHARD_END), lease(1, SHARD_END), lease(2)], position)
    assert set(created(result)) == ids(child)


def test_merge_of_parents_in_different_generations_waits_for_the_younger() -> None:
    stream = StreamBuilder(2)
    a, b = stream.split(1)  # 1 -> 2, 3
    child = stream.merge(0, a)  # 0 + 2 -> 4
    leases = [lease(0, SHARD_END), lease(1, STARTED)]
    assert plan(stream, leases).is_empty  # 2 waits for 1, so 4 waits too
    leases = [lease(0, SHARD_END), lease(1, SHARD_END)]
    assert set(created(plan(stream, leases))) == ids(a, b)
    leases = [lease(0, SHARD_END), lease(1, SHARD_END), lease(a, SHARD_END), lease(b, STARTED)]
    assert set(created(plan(stream, leases))) == ids(child)


def test_one_generation_per_pass() -> None:
    stream = StreamBuilder(1)
    a, b = stream.split(0)
    c, d = stream.split(a)
    e = stream.merge(d, b)
    leases = [lease(0, SHARD_END)]
    first = plan(stream, leases)
    assert set(created(first)) == ids(a, b)  # not the grandchildren c, d, e
    table = apply(first, leases)
    table[sid(a)] = lease(a, SHARD_END)
    second = plan(stream, table.values())
    assert set(created(second)) == ids(c, d)  # e waits for d (a generation later than b)
    table = apply(second, table.values())
    table[sid(b)] = lease(b, SHARD_END)
    table[sid(d)] = lease(d, SHARD_END)
    assert set(created(plan(stream, table.values()))) == ids(e)


def test_inconsistent_children_are_reported_and_skipped() -> None:
    stream = StreamBuilder(2)
    a, b = stream.split(0)
    stale = stream.shards[sid(0)]
    # The listing still shows the parent open while its children are already listed (pages raced a split).
    stream.shards[sid(0)] = Shard(stale.shard_id, None, None, stale.starting_hash_key, stale.ending_hash_key,
                                  stale.starting_sequence_number)
    result = plan(stream, [lease(0), lease(1)])
    assert result.is_empty
    assert set(result.inconsistent_shard_ids) == ids(a, b)
    # The lease table is authoritative: a parent lease at SHARD_END releases the children even on a stale listing.
    assert set(created(plan(stream, [lease(0, SHARD_END), lease(1)]))) == ids(a, b)


# ---------------------------------------------------------------------------------------------------------------
# Deletion


def split_stream() -> tuple[StreamBuilder, int, int]:
    stream = StreamBuilder(2)
    a, b = stream.split(0)
    return stream, a, b


@pytest.mark.parametrize(
    ("child_a", "child_b", "deletes_parent"),
    [
        (TRIM_HORIZON, TRIM_HORIZON, False),
        (STARTED, TRIM_HORIZON, False),
        (STARTED, AT_TIMESTAMP, False),
        (STARTED, STARTED, True),
        (STARTED, SHARD_END, True),
        (LATEST, STARTED, True),  # KCL counts anything but TRIM_HORIZON / AT_TIMESTAMP as started
        (STARTED, None, False),  # a child without a lease
    ],
)
def test_finished_parent_deleted_only_when_children_started(
    child_a: Checkpoint, child_b: Checkpoint | None, deletes_parent: bool
) -> None:
    stream, a, b = split_stream()
    leases = [lease(0, SHARD_END), lease(1), lease(a, child_a)]
    if child_b is not None:
        leases.append(lease(b, child_b))
    result = plan(stream, leases)
    assert deleted(result) == ({sid(0): DeleteReason.CHILDREN_STARTED} if deletes_parent else {})


def test_finished_lease_waits_for_its_own_parents_to_go() -> None:
    stream = StreamBuilder(1)
    a, b = stream.split(0)
    c, d = stream.split(a)
    leases = [lease(0, SHARD_END), lease(a, SHARD_END), lease(b), lease(c), lease(d)]
    assert deleted(plan(stream, leases)) == {sid(0): DeleteReason.CHILDREN_STARTED}  # a waits for 0 to go
    leases = [le for le in leases if le.lease_key != sid(0)]
    assert deleted(plan(stream, leases)) == {sid(a): DeleteReason.CHILDREN_STARTED}


def test_finished_lease_counts_recorded_child_shard_ids() -> None:
    stream, a, b = split_stream()
    leases = [lease(0, SHARD_END, child_shard_ids=ids(a, b, 99)), lease(1), lease(a), lease(b)]
    assert deleted(plan(stream, leases)) == {}  # shard 99 is recorded as a child and has no started lease
    leases[0] = lease(0, SHARD_END, child_shard_ids=ids(a, b))
    assert deleted(plan(stream, leases)) == {sid(0): DeleteReason.CHILDREN_STARTED}


def test_finished_lease_without_known_children_is_kept() -> None:
    stream = StreamBuilder(2)
    stream.shards[sid(0)] = Shard(sid(0), None, None, "0", str(MAX_HASH_KEY // 2), "1", "2")
    stream.shards[sid(2)] = Shard(sid(2), None, None, "0", str(MAX_HASH_KEY // 2), "3")
    assert deleted(plan(stream, [lease(0, SHARD_END), lease(1), lease(2)])) == {}


@pytest.mark.parametrize("checkpoint", [TRIM_HORIZON, LATEST, STARTED, SHARD_END])
def test_lease_of_shard_gone_from_stream_is_garbage(checkpoint: Checkpoint) -> None:
    stream = StreamBuilder(2)
    result = plan(stream, [lease(0), lease(1), lease(7, checkpoint)])
    assert deleted(result) == {sid(7): DeleteReason.SHARD_GONE}
    assert created(result) == {}


@pytest.mark.parametrize("checkpoint", [STARTED, SHARD_END])
def test_garbage_parent_releases_its_children(checkpoint: Checkpoint) -> None:
    stream, a, b = split_stream()
    stream.trim(0)  # the parent expired from the stream while its lease was still there
    result = plan(stream, [lease(0, checkpoint), lease(1)], "LATEST")
    assert deleted(result) == {sid(0): DeleteReason.SHARD_GONE}
    assert created(result) == {sid(a): (TRIM_HORIZON, CreateReason.PARENTS_FINISHED),
                               sid(b): (TRIM_HORIZON, CreateReason.PARENTS_FINISHED)}


@pytest.mark.parametrize("checkpoint", [TRIM_HORIZON, LATEST, AT_TIMESTAMP, STARTED])
def test_unfinished_lease_of_listed_shard_is_never_deleted(checkpoint: Checkpoint) -> None:
    stream, a, b = split_stream()
    # Even with both children started (a state only a broken writer makes), the parent is not finished.
    leases = [lease(0, checkpoint), lease(1), lease(a), lease(b)]
    assert deleted(plan(stream, leases)) == {}


# ---------------------------------------------------------------------------------------------------------------
# Whole lifecycles: random reshard histories driven pass by pass to a fixed point


def worker_step(table: dict[str, Lease], stream: StreamBuilder, parents_done: set[str]) -> None:
    """Every lease moves one step: waiting leases start (once their parents finished), started ones on closed shards
    finish."""
    for key, current in list(table.items()):
        shard = stream.shards.get(key)
        if current.checkpoint.is_initial:
            if all(p in parents_done or p not in table for p in current.parent_shard_ids):
                table[key] = current.with_changes(checkpoint=STARTED)
        elif not current.is_finished and shard is not None and not shard.is_open:
            table[key] = current.with_changes(checkpoint=SHARD_END)
            parents_done.add(key)


def random_reshard(stream: StreamBuilder, rng: random.Random) -> None:
    open_shards = sorted((s for s in stream.shards.values() if s.is_open), key=lambda s: s.hash_range)
    if rng.random() < 0.5 or len(open_shards) < 2:
        stream.split(int(rng.choice(open_shards).shard_id[-12:]))
    else:
        i = rng.randrange(len(open_shards) - 1)
        stream.merge(int(open_shards[i].shard_id[-12:]), int(open_shards[i + 1].shard_id[-12:]))


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("seed", range(8))
def test_random_histories_converge_without_loss_or_repeat(position: str, seed: int) -> None:
    rng = random.Random(seed)
    stream = StreamBuilder(rng.randint(1, 4))
    for _ in range(rng.randint(0, 6)):
        random_reshard(stream, rng)
    shards_at_start = set(stream.shards)
    table: dict[str, Lease] = {}
    ever_created: list[str] = []
    finished: set[str] = set()
    for step in range(200):
        if step < 60 and rng.random() < 0.2:
            random_reshard(stream, rng)
        result = plan(stream, table.values(), position)
        for creation in result.creates:
            if creation.reason is CreateReason.PARENTS_FINISHED:
                assert all(table[p].is_finished for p in creation.lease.parent_shard_ids if p in table)
                assert creation.lease.checkpoint == CHILD_START[position]
        for deletion in result.deletes:
            assert deletion.lease.is_finished or deletion.lease.lease_key not in stream.shards
        ever_created += [c.lease.lease_key for c in result.creates]
        table = apply(result, table.values())
        worker_step(table, stream, finished)
        if step > 60 and result.is_empty and all(le.checkpoint == STARTED for le in table.values()):
            break
    else:
        pytest.fail("shard sync did not reach a fixed point")
    assert len(ever_created) == len(set(ever_created)), "a shard was leased twice"
    assert set(table) == stream.open_ids(), "at the fixed point only open shards keep leases"
    assert plan(stream, table.values(), position).is_empty
    later_shards = set(stream.shards) - shards_at_start
    assert later_shards <= set(ever_created), "every shard born after the start is processed"
    if position != "LATEST":
        assert set(ever_created) == set(stream.shards), "TRIM_HORIZON / AT_TIMESTAMP process every shard"


@pytest.mark.parametrize("position", POSITIONS)
def test_applying_a_plan_then_planning_again_creates_nothing_new(position: str) -> None:
    stream = doc_example()
    leases = [lease(4), lease(5, SHARD_END), lease(7)]
    first = plan(stream, leases, position)
    assert first.creates
    second = plan(stream, apply(first, leases).values(), position)
    assert second.is_empty


# ---------------------------------------------------------------------------------------------------------------
# Bad input


def test_rejects_bad_shard_listings() -> None:
    stream = StreamBuilder(2)
    with pytest.raises(ShardListError, match="twice"):
        plan_shard_sync([*stream.listing(), stream.shards[sid(0)]], [], "LATEST")
    with pytest.raises(ShardListError, match="hole"):
        plan_shard_sync([stream.shards[sid(1)]], [], "LATEST")
    with pytest.raises(ShardListError, match="short of"):
        plan_shard_sync([stream.shards[sid(0)]], [], "LATEST")
    with pytest.raises(ShardListError, match="no open shard"):
        plan_shard_sync([], [], "LATEST")
    overlap = Shard(sid(5), None, None, "0", "10", "1")
    with pytest.raises(ShardListError, match="overlap"):
        plan_shard_sync([*stream.listing(), overlap], [], "LATEST")
    cycle = [Shard(sid(7), sid(8), None, "0", str(MAX_HASH_KEY), "1", "2"),
             Shard(sid(8), sid(7), None, "0", str(MAX_HASH_KEY), "1", "2")]
    with pytest.raises(ShardListError, match="cycle"):
        plan_shard_sync([*stream.listing(), *cycle], [], "LATEST")


def test_rejects_leases_out_of_scope() -> None:
    stream = StreamBuilder(1)
    with pytest.raises(ShardSyncInputError, match="multi-stream"):
        plan(stream, [Lease(lease_key=f"123:s:1:{sid(0)}")])
    with pytest.raises(ShardSyncInputError, match="twice"):
        plan(stream, [lease(0), lease(0)])


@pytest.mark.parametrize(
    ("position", "timestamp", "match"),
    [
        ("SHARD_END", None, "initial position"),
        ("EARLIEST", None, "initial position"),
        ("AT_TIMESTAMP", None, "needs an initial timestamp"),
        ("AT_TIMESTAMP", datetime(2026, 1, 1), "timezone-aware"),
    ],
)
def test_rejects_bad_initial_position(position: str, timestamp: datetime | None, match: str) -> None:
    with pytest.raises(ShardSyncInputError, match=match):
        plan_shard_sync(StreamBuilder(1).listing(), [], position, timestamp)


VALID_ITEM: dict[str, object] = {
    "ShardId": "shardId-000000000003",
    "ParentShardId": "shardId-000000000001",
    "AdjacentParentShardId": "shardId-000000000002",
    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"},
    "SequenceNumberRange": {"StartingSequenceNumber": "49590338271490256608559692538361571095921575989136588898"},
}


def test_shard_from_list_shards_item() -> None:
    shard = Shard.from_list_shards_item(VALID_ITEM)
    assert shard.parent_ids == ("shardId-000000000001", "shardId-000000000002")
    assert shard.is_open and shard.hash_range == (0, 99)
    closed = Shard.from_list_shards_item(
        {**VALID_ITEM, "SequenceNumberRange": {"StartingSequenceNumber": "5", "EndingSequenceNumber": "9"}}
    )
    assert not closed.is_open and closed.ending_sequence_number == "9"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"ShardId": None}, "ShardId"),
        ({"ShardId": "bad id!"}, "ShardId"),
        ({"ParentShardId": None}, "adjacent parent but no parent"),
        ({"AdjacentParentShardId": "shardId-000000000001"}, "same shard"),
        ({"ParentShardId": "shardId-000000000003", "AdjacentParentShardId": None}, "own parent"),
        ({"HashKeyRange": None}, "HashKeyRange"),
        ({"HashKeyRange": {"StartingHashKey": "5", "EndingHashKey": "4"}}, "hash range"),
        ({"HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128)}}, "hash range"),
        ({"HashKeyRange": {"StartingHashKey": "-1", "EndingHashKey": "4"}}, "decimal"),
        ({"SequenceNumberRange": {}}, "StartingSequenceNumber is missing"),
        ({"SequenceNumberRange": {"StartingSequenceNumber": 5}}, "must be a string"),
    ],
)
def test_malformed_list_shards_items(change: dict[str, object], match: str) -> None:
    with pytest.raises(MalformedShard, match=match):
        Shard.from_list_shards_item({**VALID_ITEM, **change})


def test_non_mapping_item_is_malformed() -> None:
    with pytest.raises(MalformedShard, match="mapping"):
        Shard.from_list_shards_item(["shardId-1"])  # type: ignore[arg-type]
