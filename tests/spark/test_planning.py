"""Spark-free parts of the source: offsets as plans, recorded batch ends, planning and replay rules, the book."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.reader import ShardReadError
from shardherd.agent.spark import source
from shardherd.agent.spark.batch_ends import (
    BatchEnd,
    StaleBatch,
    forget_ends,
    record_end,
    record_over,
    recorded_end,
    stored_end,
)
from shardherd.agent.spark.book import ShardBook
from shardherd.agent.spark.channel import (
    ChannelError,
    ShardState,
    ShardView,
    Snapshot,
    read_ack,
    read_snapshot,
)
from shardherd.agent.spark.commit import offset_log_entry
from shardherd.agent.spark.offsets import BatchOffset, Caps, InvalidOffset, ShardPlan
from shardherd.agent.spark.planning import group_plans, partitions_to_read, plan_next
from shardherd.agent.spark.probe import ProbeResult
from shardherd.agent.spark.source import ShardherdStreamReader, SourceOptions, StoreOptions
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames

BIG = "4" + "9" * 55  # longer than any int64: must survive as a string


def _view(checkpoint: Checkpoint, pending: bool = True, state: ShardState = ShardState.OWNED,
          arrival: float | None = None, tenure: str = "t1") -> ShardView:
    return ShardView(checkpoint, state, pending, tenure=tenure, waiting_since=arrival)


def test_offsets_round_trip_through_json_with_long_sequence_numbers() -> None:
    plan = ShardPlan("s-1", StartPosition.after(Checkpoint(BIG, 3)), Caps(7, 1024), "t", "r", 4, "it-1", 12.5)
    whole = ShardPlan("s-2", StartPosition.after(Checkpoint("5"), record_complete=True), Caps(1), run="r", number=4)
    offset = BatchOffset(4, {"s-1": plan, "s-2": whole,
                             "s-0": ShardPlan("s-0", StartPosition.after(TRIM_HORIZON), run="r", number=4)}, "r")
    text = json.dumps(offset.to_json())
    assert BatchOffset.from_json(text) == offset
    assert json.loads(text)["shards"]["s-1"]["after"] == BIG


@pytest.mark.parametrize("bad", [
    "not json", "[]", '{"n": -1, "shards": {}}', '{"n": true, "shards": {}}',
    '{"shards": {"s": {"after": "12x", "max": 3}}}', '{"shards": {"s": {"after": "1"}}}',
    '{"shards": {"s": {"after": "1", "max": 0}}}', '{"shards": {"s": {"after": "1", "max": "x"}}}',
    '{"shards": {"s": {"after": "1", "max": 2, "ts": "nan"}}}',
])
def test_malformed_offsets_raise_a_typed_error(bad: str) -> None:
    with pytest.raises(InvalidOffset):
        BatchOffset.from_json(bad)


def test_a_plan_from_before_recorded_ends_is_read_again_as_its_record_count_from_its_start() -> None:
    """A Spark checkpoint written by the version that fixed ends in the driver (a fixed `end`, no caps) still loads."""
    old = {"n": 8, "shards": {"shardId-000000000007": {
        "after": "49680650666567509039173904371758122900381049328819503218", "sub": 0, "whole": False, "ts": None,
        "end": "49680650666567509039173904372894513170818801646396506226", "endSub": 0, "records": 255,
        "bytes": 23376, "tenure": "dcc9e3470b1e"}}}
    plan = BatchOffset.from_json(json.dumps(old)).shards["shardId-000000000007"]
    assert plan.caps == Caps(255) and plan.tenure == "dcc9e3470b1e"
    assert plan.position == StartPosition.after(Checkpoint("49680650666567509039173904371758122900381049328819503218"))
    with pytest.raises(InvalidOffset):  # neither caps nor a record count: malformed
        BatchOffset.from_json(json.dumps({"n": 1, "shards": {"s": {"after": "1", "tenure": "t"}}}))


def test_a_plan_takes_each_shard_with_records_waiting_from_its_checkpoint_with_the_caps_and_no_end() -> None:
    start = BatchOffset(3, {"gone": ShardPlan("gone", StartPosition.after(Checkpoint("5")))}, "r0")
    snapshot = Snapshot(9, "w", {
        "a": ShardView(Checkpoint("100", 2), pending=True, tenure="ta", iterator="it-a"),
        "idle": _view(Checkpoint("7"), pending=False),
        "moving": _view(Checkpoint("8"), state=ShardState.HANDING_OFF),
        "late": _view(Checkpoint("9"), arrival=50.0),
    })
    end = plan_next(start, snapshot, Caps(10, 99), until=40.0, run="fresh")
    assert (end.number, end.run, set(end.shards)) == (4, "r0", {"a"})  # a restarted query continues its run
    assert end.shards["a"] == ShardPlan("a", StartPosition.after(Checkpoint("100", 2)), Caps(10, 99), "ta", "r0", 4,
                                        "it-a", 40.0)
    assert set(plan_next(start, snapshot, Caps(10), until=None, run="x").shards) == {"a", "late"}
    assert plan_next(BatchOffset(), snapshot, Caps(), None, run="fresh").run == "fresh"  # a fresh checkpoint


def test_nothing_waiting_returns_start_so_spark_runs_no_batch() -> None:
    start = BatchOffset(2)
    assert plan_next(start, None, Caps(), None, "r") is start
    assert plan_next(start, Snapshot(1, "w", {"a": _view(Checkpoint("1"), pending=False)}), Caps(), None, "r") is start


def test_replayed_plan_drops_shards_no_longer_held_or_held_anew() -> None:
    end = BatchOffset(5, {shard: ShardPlan(shard, StartPosition.after(Checkpoint("10")), tenure="t1")
                          for shard in "abce"})
    moving = _view(Checkpoint("10"), state=ShardState.HANDING_OFF)
    snapshot = Snapshot(2, "w", {"a": _view(Checkpoint("20")), "b": moving, "e": _view(Checkpoint("10"), tenure="t2")})
    plans = {plan.shard_id: plan for plan in partitions_to_read(end, snapshot)}
    assert set(plans) == {"a", "b"}  # c is gone, e was lost and acquired again; b finishes its handoff
    assert plans["a"] == end.shards["a"]  # its start stays: its recorded end is what every read of it gives
    assert partitions_to_read(end, None) == []


def _lease(key: str, checkpoint: Checkpoint = TRIM_HORIZON) -> Lease:
    return Lease(key, lease_owner="w", checkpoint=checkpoint)


def test_plans_group_into_at_most_the_given_partitions_whatever_their_order() -> None:
    plans = [ShardPlan(shard, StartPosition.after(TRIM_HORIZON)) for shard in ["s-c", "s-a", "s-e", "s-b", "s-d"]]
    assert group_plans(plans, None) == [(plan,) for plan in plans]  # one partition per shard without the option
    assert group_plans(plans, 8) == [(plan,) for plan in plans]
    groups = group_plans(plans, 2)
    assert [[plan.shard_id for plan in group] for group in groups] == [["s-a", "s-c", "s-e"], ["s-b", "s-d"]]
    assert group_plans(list(reversed(plans)), 2) == groups  # a function of the plans, not of their order
    assert group_plans(plans[:1], 4) == [(plans[0],)] and group_plans([], 3) == []


def _end(tenure: str, number: int, end: str | None, records: int = 3, run: str = "r", behind: int | None = 0,
         iterator: str | None = "it-next") -> BatchEnd:
    return BatchEnd(tenure, run, number, None if end is None else Checkpoint(end, 0), records, 10 * records,
                    iterator, behind, 1.0, 2.0, behind == 0)


def test_the_first_read_of_a_plan_records_its_end_and_every_other_read_follows_it() -> None:
    store = MemoryLeaseStore(TableNames.for_application("app"))
    first = _end("t", 1, "40")
    assert recorded_end(store, "t", "r", 1) is None
    assert record_end(store, first) == first
    assert record_end(store, _end("t", 1, "55", records=9)) == first  # a second attempt of the plan: the first end
    assert recorded_end(store, "t", "r", 1) == first
    assert recorded_end(store, "t", "r", 2) is None  # the next plan of the run: not read yet
    later = _end("t", 2, None, records=0)
    assert record_end(store, later) == later  # a read that found nothing: the checkpoint stays
    with pytest.raises(StaleBatch):  # a leftover task of plan 1 never reads again
        recorded_end(store, "t", "r", 1)
    with pytest.raises(StaleBatch):
        record_end(store, first)
    fresh = _end("t", 1, "60", run="r2")  # a new query run on a fresh Spark checkpoint numbers from 1 again
    assert record_end(store, fresh) == fresh and recorded_end(store, "t", "r2", 1) == fresh
    assert recorded_end(store, "other", "r", 1) is None
    forget_ends(store, "t")
    assert recorded_end(store, "t", "r2", 1) is None


def test_a_first_read_records_over_the_item_it_found_and_loses_to_a_read_of_the_plan_that_recorded_in_between() -> None:
    store = MemoryLeaseStore(TableNames.for_application("app"))
    assert stored_end(store, "t") is None
    found = _end("t", 1, "40")
    assert record_over(store, found, None) == found  # no item before the read: recorded
    previous = stored_end(store, "t")
    assert previous == found
    first, second = _end("t", 2, "50"), _end("t", 2, "58", records=7)
    assert record_over(store, first, previous) == first  # the item found is still there: recorded
    assert record_over(store, second, previous) == first  # another read of plan 2 recorded after it looked: its end
    with pytest.raises(ShardReadError):  # an item that changed since (not to this plan's end): the task fails
        record_over(store, _end("t", 3, "60"), previous)
    assert recorded_end(store, "t", "r", 2) == first


def test_book_probes_idle_shards_only_plans_busy_ones_again_and_releases_a_handoff_after_the_write_in_flight(
        tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s-1"))
    book.acquired(_lease("s-2", Checkpoint("30")))
    assert book.to_probe() == [("s-1", StartPosition.after(TRIM_HORIZON), None),
                               ("s-2", StartPosition.after(Checkpoint("30")), None)]
    found = ProbeResult(True, iterator="it-30", behind_millis=500, first_arrival=1.0)
    assert not book.probed("s-2", StartPosition.after(Checkpoint("31")), found)  # another position: ignored
    book.probed("s-2", StartPosition.after(Checkpoint("30")), found)
    published = read_snapshot(tmp_path)
    assert published is not None and published.shards["s-2"].pending and not published.shards["s-1"].pending
    assert published.shards["s-2"].iterator == "it-30"  # the plan's read starts there: no GetShardIterator
    assert book.to_probe() == [("s-1", StartPosition.after(TRIM_HORIZON), None)]  # records wait: no more probing
    assert book.lag_millis("s-2", 3.5) == 2500 and book.lag_millis("s-1", 3.5) is None
    assert book.records_behind("s-1") is None and book.records_behind("unknown") is None  # not known

    tenure = book.snapshot().shards["s-2"].tenure
    assert book.holds("s-2", tenure) and not book.holds("s-2", "other")
    book.checkpointed("s-2", "other", _end("other", 1, "40"))  # a plan of another hold: ignored
    assert book.snapshot().shards["s-2"].checkpoint == Checkpoint("30")
    book.checkpointed("s-2", tenure, _end(tenure, 1, "40"))
    view = book.snapshot().shards["s-2"]
    assert view == ShardView(Checkpoint("40"), pending=True, behind_millis=0, tenure=tenure, iterator="it-next")
    assert book.records_behind("s-2") == 0 and book.to_probe()[1:] == []  # it read records: read again, unprobed
    book.checkpointed("s-2", tenure, _end(tenure, 2, None, records=0, iterator="it-40"))  # found nothing: idle
    assert book.to_probe()[1] == ("s-2", StartPosition.after(Checkpoint("40")), "it-40")
    book.probed("s-2", StartPosition.after(Checkpoint("40")), ProbeResult(iterator="it-40b", behind_millis=0))
    assert book.snapshot().shards["s-2"].iterator == "it-40b" and not book.snapshot().shards["s-2"].pending
    book.checkpointed("s-2", tenure, None)  # no end recorded: read again from the same checkpoint
    assert book.snapshot().shards["s-2"].pending and book.snapshot().shards["s-2"].checkpoint == Checkpoint("40")

    plan = ShardPlan("s-2", StartPosition.after(Checkpoint("40")), tenure=tenure)
    assert book.begin_write([plan, ShardPlan("s-2", plan.position, tenure="other")]) == [plan]
    assert book.handing_off("s-2")  # a write in flight holds the shard: the handoff waits for its checkpoint
    assert book.snapshot().shards["s-2"].state is ShardState.HANDING_OFF
    assert book.begin_write([plan]) == []  # a later batch does not write a shard under handoff
    assert book.end_write([plan]) == ["s-2"]  # the write ended: the handoff no longer waits
    assert not book.handing_off("unknown")
    book.acquired(_lease("s-3", Checkpoint("5")))
    s3 = book.snapshot().shards["s-3"].tenure
    assert not book.handing_off("s-3")  # no write in flight: nothing to wait for
    assert book.end_write([]) == [] and book.lost("s-3") == s3
    assert book.probed("s-1", StartPosition.after(TRIM_HORIZON), ProbeResult(ended=True))
    assert book.lost("s-2") == tenure and book.held_shards() == {"s-1"}


def test_a_plan_waits_once_for_the_first_probe_of_a_shard_just_acquired(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Planned before its first probe, a shard handed to a running driver would wait for the whole next micro-batch.
    monkeypatch.setattr(source, "FIRST_PROBE_WAIT_SECONDS", 2.0)
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s-1", Checkpoint("30")))
    book.probed("s-1", StartPosition.after(Checkpoint("30")), ProbeResult(True, behind_millis=0))
    reader = ShardherdStreamReader(SourceOptions(tmp_path, "orders"))
    limit = reader.getDefaultReadLimit()
    first = reader.latestOffset(BatchOffset().to_json(), limit)
    assert set(BatchOffset.from_json(first).shards) == {"s-1"}

    book.acquired(_lease("s-2", Checkpoint("50")))
    found = ProbeResult(True, iterator="it-50", behind_millis=0)
    threading.Timer(0.3, book.probed, ("s-2", StartPosition.after(Checkpoint("50")), found)).start()
    began = time.monotonic()
    second = BatchOffset.from_json(reader.latestOffset(first, limit))
    assert time.monotonic() - began >= 0.3
    assert set(second.shards) == {"s-1", "s-2"} and second.shards["s-2"].iterator == "it-50"

    book.acquired(_lease("s-3", Checkpoint("70")))  # never probed (its probes fail): one plan waits, then no more
    began = time.monotonic()
    third = BatchOffset.from_json(reader.latestOffset(second.to_json(), limit))
    assert time.monotonic() - began >= 2.0 and set(third.shards) == {"s-1", "s-2"}
    began = time.monotonic()
    reader.latestOffset(third.to_json(), limit)
    assert time.monotonic() - began < 1.0


def test_a_new_hold_of_a_lease_gets_a_new_tenure(tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s"))
    first = book.snapshot().shards["s"].tenure
    book.lost("s")
    book.acquired(_lease("s"))
    assert first and book.snapshot().shards["s"].tenure not in {"", first}


def test_offset_log_entries_parse_and_garbage_is_rejected() -> None:
    offset = BatchOffset(2, {"s": ShardPlan("s", StartPosition.after(Checkpoint("1")), number=2)})
    text = "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offset.to_json()) + "\n"
    assert offset_log_entry(text) == offset
    for bad in ["", "v1\n{}", "garbage\n{}\n{}"]:
        with pytest.raises(InvalidOffset):
            offset_log_entry(bad)


def test_source_options_round_trip_and_reject_bad_values(tmp_path: Path) -> None:
    options = SourceOptions(tmp_path, "stream", "eu-west-1", "http://127.0.0.1:1", Caps(5, 99), 0.05, True, "python",
                            None, StoreOptions("app", "sql", "http://127.0.0.1:2", str(tmp_path / "meter")))
    assert SourceOptions.parse(options.to_options()) == options
    grouped = SourceOptions(tmp_path, "stream", max_partitions=3, read_ahead_after=1.5)
    assert SourceOptions.parse(grouped.to_options()) == grouped
    assert SourceOptions.parse({"channel": "x", "stream": "s"}).kpl_decoder == "auto"
    for bad in [{}, {"channel": "x"}, {"channel": "x", "stream": "s", "maxRecordsPerShard": "0"},
                {"channel": "x", "stream": "s", "minCallIntervalMs": "-1"},
                {"channel": "x", "stream": "s", "kplDecoder": "fast"},
                {"channel": "x", "stream": "s", "maxBytesPerShard": "lots"},
                {"channel": "x", "stream": "s", "maxPartitions": "0"},
                {"channel": "x", "stream": "s", "readAheadAfterMs": "0"},
                {"channel": "x", "stream": "s", "storeBackend": "redis"}]:
        with pytest.raises(InvalidOffset):
            SourceOptions.parse(bad)


def test_malformed_channel_files_raise_a_typed_error(tmp_path: Path) -> None:
    assert read_snapshot(tmp_path) is None and read_ack(tmp_path) is None
    (tmp_path / "snapshot.json").write_text('{"version": 1, "worker": "w", "shards": {"s": {"cp": "??"}}}')
    (tmp_path / "ack.json").write_text("[1]")
    with pytest.raises(ChannelError):
        read_snapshot(tmp_path)
    with pytest.raises(ChannelError):
        read_ack(tmp_path)
