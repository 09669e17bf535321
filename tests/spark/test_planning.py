"""Spark-free parts of the source: offsets as plans with fixed ends, planning and replay rules, the driver's book."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark import source
from shardherd.agent.spark.book import ShardBook
from shardherd.agent.spark.channel import (
    ChannelError,
    Segment,
    ShardState,
    ShardView,
    Snapshot,
    read_ack,
    read_snapshot,
)
from shardherd.agent.spark.commit import offset_log_entry
from shardherd.agent.spark.offsets import BatchOffset, Caps, InvalidOffset, ShardPlan
from shardherd.agent.spark.planning import group_plans, partitions_to_read, plan_next, shard_plan
from shardherd.agent.spark.probe import ProbeResult
from shardherd.agent.spark.source import ShardherdStreamReader, SourceOptions
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease

BIG = "4" + "9" * 55  # longer than any int64: must survive as a string


def _segments(*ends: str, records: int = 5, arrival: float | None = None) -> tuple[Segment, ...]:
    return tuple(Segment(Checkpoint(end), records, 10 * records, arrival) for end in ends)


def _view(checkpoint: Checkpoint, pending: bool = True, state: ShardState = ShardState.OWNED,
          arrival: float | None = None, tenure: str = "t1") -> ShardView:
    segments = _segments(str(int(checkpoint.sequence_number) + 10), arrival=arrival) if pending else ()
    return ShardView(checkpoint, state, segments, tenure=tenure)


def test_offsets_round_trip_through_json_with_long_sequence_numbers() -> None:
    plan = ShardPlan("s-1", StartPosition.after(Checkpoint(BIG, 3)), Checkpoint(BIG + "1", 2), 7, 1024, "t")
    whole = ShardPlan("s-2", StartPosition.after(Checkpoint("5"), record_complete=True), Checkpoint("9"), 1, 1)
    offset = BatchOffset(4, {"s-1": plan, "s-2": whole,
                             "s-0": ShardPlan("s-0", StartPosition.after(TRIM_HORIZON), Checkpoint("3"))})
    text = json.dumps(offset.to_json())
    assert BatchOffset.from_json(text) == offset
    assert json.loads(text)["shards"]["s-1"]["after"] == BIG


@pytest.mark.parametrize("bad", [
    "not json", "[]", '{"n": -1, "shards": {}}', '{"n": true, "shards": {}}',
    '{"shards": {"s": {"after": "12x", "end": "13"}}}', '{"shards": {"s": {"after": "1"}}}',
    '{"shards": {"s": {"after": "1", "end": "TRIM_HORIZON"}}}', '{"shards": {"s": {"after": "1", "end": "2x"}}}',
    '{"shards": {"s": {"after": "1", "end": "2", "ts": "nan"}}}',
])
def test_malformed_offsets_raise_a_typed_error(bad: str) -> None:
    with pytest.raises(InvalidOffset):
        BatchOffset.from_json(bad)


def test_plan_ends_at_a_probed_record_within_the_caps_and_skips_idle_handing_off_and_later_records() -> None:
    start = BatchOffset(3, {"gone": ShardPlan("gone", StartPosition.after(Checkpoint("5")), Checkpoint("6"))})
    snapshot = Snapshot(9, "w", {
        "a": ShardView(Checkpoint("100", 2), segments=_segments("110", "120", "130"), tenure="ta"),
        "idle": _view(Checkpoint("7"), pending=False),
        "moving": _view(Checkpoint("8"), state=ShardState.HANDING_OFF),
        "late": _view(Checkpoint("9"), arrival=50.0),
    })
    end = plan_next(start, snapshot, Caps(10), until=40.0)
    assert end.number == 4 and set(end.shards) == {"a"}
    plan = end.shards["a"]
    assert plan.position == StartPosition.after(Checkpoint("100", 2))
    assert (plan.end, plan.records, plan.bytes, plan.tenure) == (Checkpoint("120"), 10, 100, "ta")  # 2 segments fit
    assert set(plan_next(start, snapshot, Caps(10), until=None).shards) == {"a", "late"}
    assert plan_next(start, snapshot, Caps(3), None).shards["a"].end == Checkpoint("110")  # at least one segment
    assert plan_next(start, snapshot, Caps(100, max_bytes=120), None).shards["a"].end == Checkpoint("120")


def test_nothing_waiting_returns_start_so_spark_runs_no_batch() -> None:
    start = BatchOffset(2)
    assert plan_next(start, None, Caps(), None) is start
    assert plan_next(start, Snapshot(1, "w", {"a": _view(Checkpoint("1"), pending=False)}), Caps(), None) is start


def test_replayed_plan_drops_shards_no_longer_held_or_held_anew_and_skips_what_was_checkpointed() -> None:
    end = BatchOffset(5, {shard: ShardPlan(shard, StartPosition.after(Checkpoint("10")), Checkpoint("30"),
                                           tenure="t1") for shard in "abcde"})
    moving = _view(Checkpoint("10"), state=ShardState.HANDING_OFF)
    snapshot = Snapshot(2, "w", {"a": _view(Checkpoint("20")), "b": moving, "d": _view(Checkpoint("30")),
                                 "e": _view(Checkpoint("10"), tenure="t2")})
    plans = {plan.shard_id: plan for plan in partitions_to_read(end, snapshot)}
    assert set(plans) == {"a", "b"}  # c is gone, d is done, e was lost and acquired again; b finishes its handoff
    assert plans["a"].position == StartPosition.after(Checkpoint("20")) and plans["a"].end == Checkpoint("30")
    assert plans["b"].position == StartPosition.after(Checkpoint("10"))
    assert partitions_to_read(end, None) == []


def _lease(key: str, checkpoint: Checkpoint = TRIM_HORIZON) -> Lease:
    return Lease(key, lease_owner="w", checkpoint=checkpoint)


def _plan(shard: str, records: int) -> ShardPlan:
    return ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Checkpoint("100"), records, records * 10, "t")


def test_plans_group_into_at_most_the_given_partitions_balanced_by_records_whatever_their_order() -> None:
    plans = [_plan("s-a", 900), _plan("s-b", 100), _plan("s-c", 500), _plan("s-d", 400), _plan("s-e", 0)]
    assert group_plans(plans, None) == [(plan,) for plan in plans]  # one partition per shard without the option
    assert group_plans(plans, 8) == [(plan,) for plan in plans]
    groups = group_plans(plans, 2)
    assert [[plan.shard_id for plan in group] for group in groups] == [["s-a", "s-b"], ["s-c", "s-d", "s-e"]]
    assert group_plans(list(reversed(plans)), 2) == groups  # a function of the plans, not of their order
    assert [[plan.shard_id for plan in group] for group in group_plans(plans, 1)] == [
        ["s-a", "s-b", "s-c", "s-d", "s-e"]]
    assert group_plans(plans[:1], 4) == [(plans[0],)] and group_plans([], 3) == []


def test_book_publishes_segments_probes_from_the_frontier_and_releases_a_handoff_after_the_write_in_flight(
        tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s-1"))
    book.acquired(_lease("s-2", Checkpoint("30")))
    assert book.to_probe(10) == [("s-1", StartPosition.after(TRIM_HORIZON)),
                                 ("s-2", StartPosition.after(Checkpoint("30")))]
    found = ProbeResult(Segment(Checkpoint("40", 3), 6, 60, 1.0), behind_millis=0)
    assert not book.probed("s-2", StartPosition.after(Checkpoint("31")), found)  # stale frontier: ignored
    book.probed("s-2", StartPosition.after(Checkpoint("30")), found)
    published = read_snapshot(tmp_path)
    assert published is not None and published.shards["s-2"].pending and not published.shards["s-1"].pending
    assert published.shards["s-2"].segments == (found.segment,)
    frontier = StartPosition.after(Checkpoint("40", 3), record_complete=True)
    assert book.to_probe(10) == [("s-1", StartPosition.after(TRIM_HORIZON)), ("s-2", frontier)]
    assert book.to_probe(6) == [("s-1", StartPosition.after(TRIM_HORIZON))]  # enough waiting: no more probing
    assert book.lag_millis("s-2", 3.5) == 2500 and book.lag_millis("s-1", 3.5) is None
    assert book.records_behind("s-2") == 6  # probed up to the tip: exactly what waits
    assert book.records_behind("s-1") is None and book.records_behind("unknown") is None  # not known

    tenure = book.snapshot().shards["s-2"].tenure
    assert book.holds("s-2", tenure) and not book.holds("s-2", "other")
    book.checkpointed("s-2", "other", Checkpoint("40", 3))  # a plan of another hold: ignored
    assert book.snapshot().shards["s-2"].pending
    book.checkpointed("s-2", tenure, Checkpoint("40", 3))
    assert book.snapshot().shards["s-2"] == ShardView(Checkpoint("40", 3), behind_millis=0, tenure=tenure)
    assert book.lag_millis("s-2", 3.5) == 0 and book.records_behind("s-2") == 0
    behind = ProbeResult(Segment(Checkpoint("45"), 4, 40, 2.0), behind_millis=900)
    book.probed("s-2", book.snapshot().shards["s-2"].frontier, behind)
    assert book.records_behind("s-2") is None  # more waits beyond the probe than it saw
    book.checkpointed("s-2", tenure, Checkpoint("45"))

    plan = ShardPlan("s-2", StartPosition.after(Checkpoint("40", 3)), Checkpoint("50"), tenure=tenure)
    assert book.begin_write([plan, ShardPlan("s-2", plan.position, plan.end, tenure="other")]) == [plan]
    assert book.handing_off("s-2")  # a write in flight holds the shard: the handoff waits for its checkpoint
    assert book.snapshot().shards["s-2"].state is ShardState.HANDING_OFF
    assert book.begin_write([plan]) == []  # a later batch does not write a shard under handoff
    assert book.end_write([plan]) == ["s-2"]  # the write ended: the handoff no longer waits
    assert not book.handing_off("unknown")
    book.acquired(_lease("s-3", Checkpoint("5")))
    assert not book.handing_off("s-3")  # no write in flight: nothing to wait for
    assert book.end_write([]) == [] and book.lost("s-3") == "s-3"
    assert book.probed("s-1", StartPosition.after(TRIM_HORIZON), ProbeResult(ended=True))
    assert book.lost("s-2") == "s-2" and book.held_shards() == {"s-1"}


def test_a_plan_waits_once_for_the_first_probe_of_a_shard_just_acquired(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Planned before its first probe, a shard handed to a running driver would wait for the whole next micro-batch.
    monkeypatch.setattr(source, "FIRST_PROBE_WAIT_SECONDS", 2.0)
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s-1", Checkpoint("30")))
    probed = ProbeResult(Segment(Checkpoint("40"), 2, 20), behind_millis=0)
    book.probed("s-1", StartPosition.after(Checkpoint("30")), probed)
    reader = ShardherdStreamReader(SourceOptions(tmp_path, "orders"))
    limit = reader.getDefaultReadLimit()
    first = reader.latestOffset(BatchOffset().to_json(), limit)
    assert set(BatchOffset.from_json(first).shards) == {"s-1"}

    book.acquired(_lease("s-2", Checkpoint("50")))
    found = ProbeResult(Segment(Checkpoint("60"), 3, 30), behind_millis=0)
    threading.Timer(0.3, book.probed, ("s-2", StartPosition.after(Checkpoint("50")), found)).start()
    began = time.monotonic()
    second = BatchOffset.from_json(reader.latestOffset(first, limit))
    assert time.monotonic() - began >= 0.3
    assert set(second.shards) == {"s-1", "s-2"} and second.shards["s-2"].end == Checkpoint("60")

    book.acquired(_lease("s-3", Checkpoint("70")))  # never probed (its probes fail): one plan waits, then no more
    began = time.monotonic()
    third = BatchOffset.from_json(reader.latestOffset(second.to_json(), limit))
    assert time.monotonic() - began >= 2.0 and set(third.shards) == {"s-1", "s-2"}
    began = time.monotonic()
    reader.latestOffset(third.to_json(), limit)
    assert time.monotonic() - began < 1.0


def test_small_probed_segments_merge_so_the_snapshot_stays_small(tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path, merge_below=10)
    book.acquired(_lease("s"))
    for index, end in enumerate(["11", "12", "13", "14"]):
        frontier = book.snapshot().shards["s"].frontier
        book.probed("s", frontier, ProbeResult(Segment(Checkpoint(end), 3, 30, float(index))))
    segments = book.snapshot().shards["s"].segments
    assert segments == (Segment(Checkpoint("13"), 9, 90, 0.0), Segment(Checkpoint("14"), 3, 30, 3.0))


def test_records_probed_while_a_batch_runs_count_once_after_its_checkpoint(tmp_path: Path) -> None:
    # A probe merges new records into the segment a running batch planned through; its checkpoint must leave only
    # the new records waiting (counted twice before: throughput, records processed and lag were inflated).
    book = ShardBook("w", tmp_path, merge_below=100)
    book.acquired(_lease("s"))
    tenure = book.snapshot().shards["s"].tenure
    book.probed("s", book.snapshot().shards["s"].frontier, ProbeResult(Segment(Checkpoint("11"), 3, 30, 1.0)))
    planned = shard_plan("s", book.snapshot().shards["s"], Caps(1000), until=None)
    assert planned is not None and (planned.end, planned.records, planned.bytes) == (Checkpoint("11"), 3, 30)
    book.probed("s", book.snapshot().shards["s"].frontier, ProbeResult(Segment(Checkpoint("12"), 2, 20, 2.0)))
    book.probed("s", book.snapshot().shards["s"].frontier, ProbeResult(Segment(Checkpoint("13"), 4, 40, 3.0)))
    assert book.snapshot().shards["s"].segments == (Segment(Checkpoint("13"), 9, 90, 1.0),)  # one merged segment

    book.checkpointed("s", tenure, planned.end)
    assert book.snapshot().shards["s"].segments == (Segment(Checkpoint("13"), 6, 60, 2.0),)
    assert book.lag_millis("s", 5.0) == 3000  # the oldest record still waiting arrived at 2.0
    book.checkpointed("s", tenure, Checkpoint("13"))
    assert book.snapshot().shards["s"].segments == ()


def test_a_new_hold_of_a_lease_gets_a_new_tenure(tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s"))
    first = book.snapshot().shards["s"].tenure
    book.lost("s")
    book.acquired(_lease("s"))
    assert first and book.snapshot().shards["s"].tenure not in {"", first}


def test_offset_log_entries_parse_and_garbage_is_rejected() -> None:
    offset = BatchOffset(2, {"s": ShardPlan("s", StartPosition.after(Checkpoint("1")), Checkpoint("2"))})
    text = "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offset.to_json()) + "\n"
    assert offset_log_entry(text) == offset
    for bad in ["", "v1\n{}", "garbage\n{}\n{}"]:
        with pytest.raises(InvalidOffset):
            offset_log_entry(bad)


def test_source_options_round_trip_and_reject_bad_values(tmp_path: Path) -> None:
    options = SourceOptions(tmp_path, "stream", "eu-west-1", "http://127.0.0.1:1", Caps(5, 99), 0.05, True, "python")
    assert SourceOptions.parse(options.to_options()) == options
    grouped = SourceOptions(tmp_path, "stream", max_partitions=3)
    assert SourceOptions.parse(grouped.to_options()) == grouped
    assert SourceOptions.parse({"channel": "x", "stream": "s"}).kpl_decoder == "auto"
    for bad in [{}, {"channel": "x"}, {"channel": "x", "stream": "s", "maxRecordsPerShard": "0"},
                {"channel": "x", "stream": "s", "minCallIntervalMs": "-1"},
                {"channel": "x", "stream": "s", "kplDecoder": "fast"},
                {"channel": "x", "stream": "s", "maxBytesPerShard": "lots"},
                {"channel": "x", "stream": "s", "maxPartitions": "0"}]:
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
