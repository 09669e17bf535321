"""LeaderStatus: round trip, typed errors for malformed items, the size bound, counters continued across failovers."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.coordinator.move_record import MalformedMoveRecord, MoveRecord
from shardherd.coordinator.moves import Move, MoveReason, Plan, Unplaced, UnplacedReason
from shardherd.coordinator.run_summary import RunSummary, WriteTally
from shardherd.services.leader_status import (
    MAX_RUNS,
    MAX_STATUS_BYTES,
    STATUS_KEY,
    LeaderStatus,
    LeaderWatch,
    MalformedLeaderStatus,
    ScaleRecord,
    decode,
    encode,
    read_status,
    recorded_moves,
    with_recorded_moves,
)
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import Lease
from shardherd.shared.store import LeaseStore, StateValue
from shardherd.shared.store_meter import StoreMeter, state_size
from tests.support.stores import make_store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[LeaseStore]:
    store = make_store("sqlite", sqlite_path=str(tmp_path / "status.db"))
    yield store
    store.close()


def _summary(epoch: int, moves: int, rng: random.Random, id_len: int = 12, error: str | None = None) -> RunSummary:
    def name(prefix: str) -> str:
        return prefix + "".join(rng.choice("abcdef0123456789") for _ in range(id_len))

    plan = Plan("variance", True, tuple(Move(name("shard-"), name("w-"), name("w-"), rng.choice(list(MoveReason)),
                                             "x" * 500) for _ in range(moves)),
                (Unplaced(name("shard-"), None, UnplacedReason.NO_CAPACITY, "full"),), (), ())
    return RunSummary(epoch, 1_700_000_000.0, rng.uniform(1, 50), moves, 3, 0, 0, True,
                      None if error else plan, WriteTally(assigned=moves), error=error)


def test_round_trip_and_detail_shortened(sqlite_store: LeaseStore) -> None:
    watch = LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0)
    summary = _summary(3, 4, random.Random(1))
    watch.on_run(summary)
    status = read_status(sqlite_store)
    assert status is not None and status.epoch == 3 and status.leader_id == "coord-a"
    assert summary.plan is not None
    assert [m.lease_key for m in status.recent_moves] == [m.lease_key for m in summary.plan.moves]
    assert [m.reason for m in status.recent_moves] == [m.reason.value for m in summary.plan.moves]
    assert all(len(m.detail) == 200 and m.epoch == 3 for m in status.recent_moves)
    assert [(u.lease_key, u.reason) for u in status.unplaced] == [(summary.plan.spillover[0].lease_key, "NO_CAPACITY")]
    assert status.runs[-1].moves_by_reason == summary.moves_by_reason()
    assert status.totals.writes["assigned"] == 4 and status.last_success_at == summary.started_at


@pytest.mark.parametrize("item, problem", [
    ({"statusVersion": 2, "status": "{}"}, "unsupported statusVersion"),
    ({"status": "{}"}, "unsupported statusVersion"),
    ({"statusVersion": 1}, "missing or not text"),
    ({"statusVersion": 1, "status": 7}, "missing or not text"),
    ({"statusVersion": 1, "status": b"\xff\xfe"}, "not UTF-8"),
    ({"statusVersion": 1, "status": "[1, 2"}, "LeaderStatus"),
    ({"statusVersion": 1, "status": '{"epoch": "one", "leader_id": "a", "published_at": 1}'}, "epoch"),
    ({"statusVersion": 1, "status": '{"version": 9, "epoch": 1, "leader_id": "a", "published_at": 1}'}, "version 9"),
])
def test_malformed_items_raise_a_typed_error(item: dict[str, StateValue], problem: str) -> None:
    with pytest.raises(MalformedLeaderStatus, match=problem):
        decode(item)


def test_the_item_stays_within_four_kib_with_many_long_moves(sqlite_store: LeaseStore) -> None:
    rng = random.Random(7)
    watch = LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0)
    summaries = [_summary(1, 100, rng, id_len=250) for _ in range(30)]
    for summary in summaries:
        watch.on_run(summary)
    raw = sqlite_store.get_state(STATUS_KEY)
    assert raw is not None and state_size(STATUS_KEY, raw) <= MAX_STATUS_BYTES
    status = read_status(sqlite_store)
    assert status is not None and 1 <= len(status.runs) <= MAX_RUNS and status.totals.runs == 30
    assert 0 < len(status.recent_moves) < 100  # the oldest moves were dropped to fit
    newest = summaries[-1].plan
    assert newest is not None
    kept = [m.lease_key for m in status.recent_moves]
    assert kept == [m.lease_key for m in newest.moves][-len(kept):]  # the newest moves, in order
    small = LeaderStatus(epoch=1, leader_id="a", published_at=1.0, recent_moves=status.recent_moves[-3:])
    assert LeaderStatus.model_validate_json(encode(small)) == small  # nothing dropped when it fits


def test_a_run_that_changes_nothing_is_not_published(sqlite_store: LeaseStore) -> None:
    clock = ManualClock()
    meter = StoreMeter(sqlite_store)
    watch = LeaderWatch(meter, "coord-a", clock)
    quiet = _summary(1, 0, random.Random(0))
    watch.on_run(quiet)
    first = read_status(sqlite_store)
    for _ in range(10):
        clock.advance(2)
        watch.on_run(dataclasses.replace(quiet, started_at=quiet.started_at + clock.monotonic(), duration_ms=3.0))
    assert read_status(sqlite_store) == first
    writes = [row for row in meter.rows() if row.operation.startswith("put")]
    assert sum(row.requests for row in writes) == 1 and sum(row.write_units for row in writes) <= 4
    watch.on_run(_summary(1, 2, random.Random(1)))  # moves: news
    status = read_status(sqlite_store)
    assert status is not None and status.totals.runs == 12 and len(status.recent_moves) == 2


def test_a_deposed_leader_cannot_overwrite_its_successors_status(sqlite_store: LeaseStore) -> None:
    rng = random.Random(5)
    old = LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0)
    old.on_run(_summary(1, 1, rng))
    new = LeaderWatch(sqlite_store, "coord-b", ManualClock(), min_interval=0)
    new.on_run(_summary(2, 1, rng))
    old.on_run(_summary(1, 3, rng))  # still believes it leads
    old.on_run(_summary(1, 4, rng))
    status = read_status(sqlite_store)
    assert status is not None and (status.leader_id, status.epoch) == ("coord-b", 2)
    assert status.totals.runs == 2


def test_a_new_leader_continues_the_counters(sqlite_store: LeaseStore) -> None:
    rng = random.Random(3)
    first = LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0)
    first.on_run(_summary(1, 2, rng))
    first.on_run(_summary(1, 1, rng, error="StoreUnavailable: boom"))
    second = LeaderWatch(sqlite_store, "coord-b", ManualClock(), min_interval=0)
    second.on_run(_summary(2, 3, rng))
    status = read_status(sqlite_store)
    assert status is not None and status.leader_id == "coord-b" and status.epoch == 2
    assert status.totals.runs == 3 and status.totals.failed_runs == 1
    assert sum(status.totals.moves_by_reason.values()) == 5
    assert [run.epoch for run in status.runs] == [1, 1, 2]


def test_a_new_leader_starts_afresh_over_a_malformed_item(sqlite_store: LeaseStore) -> None:
    sqlite_store.put_state(STATUS_KEY, {"statusVersion": 1, "status": "garbage"})
    LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0).on_run(_summary(5, 1, random.Random(0)))
    status = read_status(sqlite_store)
    assert status is not None and status.totals.runs == 1 and len(status.runs) == 1


def test_seconds_without_progress_on_the_leader(sqlite_store: LeaseStore) -> None:
    clock = ManualClock()
    watch = LeaderWatch(sqlite_store, "coord-a", clock)
    assert watch.seconds_without_progress() is None
    watch.on_lock_change(True, 1)
    clock.advance(4)
    assert watch.seconds_without_progress() == pytest.approx(4)
    watch.on_run(_summary(1, 0, random.Random(0)))
    clock.advance(1)
    assert watch.seconds_without_progress() == pytest.approx(1)
    watch.on_run(_summary(1, 0, random.Random(0), error="boom"))
    clock.advance(1)
    assert watch.seconds_without_progress() == pytest.approx(2)  # a failed run is no progress
    watch.on_lock_change(False, 1)
    assert watch.seconds_without_progress() is None
    assert watch.lock_changes() == {"acquired": 1, "lost": 1}


def test_a_leader_that_changes_something_every_run_publishes_about_once_per_min_interval(
        sqlite_store: LeaseStore) -> None:
    clock = ManualClock()
    meter = StoreMeter(sqlite_store)
    watch = LeaderWatch(meter, "coord-a", clock)
    rng = random.Random(9)
    for _ in range(30):  # a minute of runs, each moving a lease
        watch.on_run(_summary(1, 1, rng))
        clock.advance(2)
    puts = sum(row.requests for row in meter.rows() if row.operation.startswith("put"))
    assert 8 <= puts <= 10  # three at once (the burst), then one per MIN_PUBLISH_SECONDS
    status = read_status(sqlite_store)
    assert status is not None and status.totals.runs >= 26  # the totals of the runs up to the last publication


def test_moves_recorded_on_lease_rows_are_merged_once_and_a_bad_record_is_skipped(sqlite_store: LeaseStore) -> None:
    move = Move("shard-a", "w-1", "w-2", MoveReason.BALANCE_CPU, "y" * 300)
    record = MoveRecord.of(move, 4, 1_700_000_100.1234)
    assert len(record.encode()) < 300 and MoveRecord.decode(record.encode()) == dataclasses.replace(
        record, run_started_at=1_700_000_100.123)
    with pytest.raises(MalformedMoveRecord):
        MoveRecord.decode('{"e": "four"}')
    with pytest.raises(MalformedMoveRecord):
        MoveRecord.decode('{"e":true,"t":1,"r":"X","d":"","f":null,"w":"w"}')
    rows = [Lease("shard-a", "w-2", last_move=record.encode()), Lease("shard-b", "w-1", last_move="not json"),
            Lease("shard-c", "w-1")]
    found = recorded_moves(rows)
    assert [(d.lease_key, d.epoch, d.reason, d.from_owner, d.to_worker, len(d.detail)) for d in found] == [
        ("shard-a", 4, "BALANCE_CPU", "w-1", "w-2", 120)]
    published = LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0)
    summary = dataclasses.replace(_summary(4, 1, random.Random(2)), started_at=1_700_000_100.1234,
                                  plan=Plan("variance", True, (move,), (), (), ()))
    published.on_run(summary)
    status = read_status(sqlite_store)
    assert status is not None and len(status.recent_moves) == 1
    assert with_recorded_moves(status, rows) == status  # the same move, published and recorded: shown once
    older = Lease("shard-d", "w-3", last_move=MoveRecord.of(move, 3, 1_700_000_000.0).encode())
    merged = with_recorded_moves(status, [*rows, older])
    assert merged is not None and [m.lease_key for m in merged.recent_moves] == ["shard-d", "shard-a"]
    assert with_recorded_moves(None, rows) is None


def test_a_scale_figure_is_news_only_past_a_tenth_of_the_counted_one() -> None:
    def figure(capacity: float | None, load: float = 4476.0, remove: str = "w1") -> ScaleRecord:
        return ScaleRecord(desired=3, current=3, remove_first=remove, load_kbps=load, capacity_kbps=capacity,
                           computed_at=0.0)

    counted = figure(2268.4)
    assert figure(2215.3).is_news_after(counted) is False  # 2.3e3 and 2.2e3 to two digits: no longer news
    assert figure(2280.3).is_news_after(counted) is False
    assert figure(2500.0).is_news_after(counted) is True  # 10 % up
    assert figure(2268.4, load=4000.0).is_news_after(counted) is True  # the load 10 % down
    assert figure(2268.4, remove="w2").is_news_after(counted) is True
    assert figure(None).is_news_after(counted) is True and figure(1.0).is_news_after(figure(None)) is True
    assert figure(2268.4).is_news_after(None) is True


def test_a_status_from_a_newer_leader_with_fields_this_version_lacks_is_read(sqlite_store: LeaseStore) -> None:
    # A rolling deploy: the new leader's run records carry a field the old replica does not know (as scan_ms once
    # was); the old replica still reads the status, and the counters a new term continues are kept.
    watch = LeaderWatch(sqlite_store, "coord-a", ManualClock(), min_interval=0)
    watch.on_run(_summary(3, 2, random.Random(2)))
    raw = encode(read_status(sqlite_store) or pytest.fail("no status"))
    document = json.loads(raw)
    document["runs"][-1]["a_field_of_a_newer_version"] = {"p99": 1}
    document["newer_top_level"] = [1, 2]
    status = decode({"statusVersion": 1, "status": json.dumps(document)})
    assert status is not None and status.epoch == 3 and status.totals.writes["assigned"] == 2
    assert not hasattr(status.runs[-1], "a_field_of_a_newer_version")
