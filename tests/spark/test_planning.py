"""Spark-free parts of the source: offsets as plans, planning and replay rules, the driver's book, summaries."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.read_spec import StartPosition
from agent.spark.book import ShardBook
from agent.spark.channel import ChannelError, ShardState, ShardView, Snapshot, read_ack, read_snapshot
from agent.spark.commit import BadBatchSummary, progress_from_summary
from agent.spark.offsets import BatchOffset, Caps, InvalidOffset, ShardPlan
from agent.spark.planning import partitions_to_read, plan_next
from agent.spark.probe import ProbeResult
from agent.spark.source import SourceOptions
from shared.checkpoint import TRIM_HORIZON, Checkpoint
from shared.lease import Lease

BIG = "4" + "9" * 55  # longer than any int64: must survive as a string


def _view(checkpoint: Checkpoint, pending: bool = True, state: ShardState = ShardState.OWNED,
          arrival: float | None = None) -> ShardView:
    return ShardView(checkpoint, state, pending, arrival)


def test_offsets_round_trip_through_json_with_long_sequence_numbers() -> None:
    plan = ShardPlan("s-1", StartPosition.after(Checkpoint(BIG, 3)), Caps(7, 1024), until=12.5)
    offset = BatchOffset(4, {"s-1": plan, "s-0": ShardPlan("s-0", StartPosition.after(TRIM_HORIZON))})
    text = json.dumps(offset.to_json())
    assert BatchOffset.from_json(text) == offset
    assert json.loads(text)["shards"]["s-1"]["after"] == BIG


@pytest.mark.parametrize("bad", [
    "not json", "[]", '{"n": -1, "shards": {}}', '{"n": true, "shards": {}}',
    '{"shards": {"s": {"after": "12x", "max": 1}}}', '{"shards": {"s": {"after": "1"}}}',
    '{"shards": {"s": {"after": "1", "max": 0}}}', '{"shards": {"s": {"after": "1", "max": 1, "until": "nan"}}}',
])
def test_malformed_offsets_raise_a_typed_error(bad: str) -> None:
    with pytest.raises(InvalidOffset):
        BatchOffset.from_json(bad)


def test_plan_takes_positions_from_the_snapshot_and_skips_idle_handing_off_and_later_records() -> None:
    start = BatchOffset(3, {"gone": ShardPlan("gone", StartPosition.after(Checkpoint("5")))})
    snapshot = Snapshot(9, "w", {
        "a": _view(Checkpoint("100", 2)),
        "idle": _view(Checkpoint("7"), pending=False),
        "moving": _view(Checkpoint("8"), state=ShardState.HANDING_OFF),
        "late": _view(Checkpoint("9"), arrival=50.0),
    })
    end = plan_next(start, snapshot, Caps(10), until=40.0)
    assert end.number == 4 and set(end.shards) == {"a"}
    assert end.shards["a"].position == StartPosition.after(Checkpoint("100", 2))
    assert end.shards["a"].caps == Caps(10) and end.shards["a"].until == 40.0
    assert set(plan_next(start, snapshot, Caps(10), until=None).shards) == {"a", "late"}


def test_nothing_waiting_returns_start_so_spark_runs_no_batch() -> None:
    start = BatchOffset(2)
    assert plan_next(start, None, Caps(), None) is start
    assert plan_next(start, Snapshot(1, "w", {"a": _view(Checkpoint("1"), pending=False)}), Caps(), None) is start


def test_replayed_plan_drops_shards_no_longer_held_and_skips_what_was_checkpointed() -> None:
    end = BatchOffset(5, {shard: ShardPlan(shard, StartPosition.after(Checkpoint("10"))) for shard in "abc"})
    moving = _view(Checkpoint("10"), state=ShardState.HANDING_OFF)
    snapshot = Snapshot(2, "w", {"a": _view(Checkpoint("20")), "b": moving})
    plans = {plan.shard_id: plan for plan in partitions_to_read(end, snapshot)}
    assert set(plans) == {"a", "b"}  # c is gone; b is still finishing its handoff
    assert plans["a"].position == StartPosition.after(Checkpoint("20"))
    assert plans["b"].position == StartPosition.after(Checkpoint("10"))
    assert partitions_to_read(end, None) == []


def _lease(key: str, checkpoint: Checkpoint = TRIM_HORIZON) -> Lease:
    return Lease(key, lease_owner="w", checkpoint=checkpoint)


def test_book_publishes_snapshots_and_releases_a_handoff_only_after_the_runner_planned_past_it(tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s-1"))
    book.acquired(_lease("s-2", Checkpoint("30")))
    assert book.to_probe() == [("s-1", StartPosition.after(TRIM_HORIZON)),
                               ("s-2", StartPosition.after(Checkpoint("30")))]
    assert not book.probed("s-2", StartPosition.after(Checkpoint("31")), ProbeResult(True, 1.0))  # stale position
    book.probed("s-2", StartPosition.after(Checkpoint("30")), ProbeResult(True, 1.0))
    published = read_snapshot(tmp_path)
    assert published is not None and published.shards["s-2"].pending and not published.shards["s-1"].pending
    assert book.to_probe() == [("s-1", StartPosition.after(TRIM_HORIZON))]

    assert book.handing_off("s-2")
    version = book.snapshot().version
    assert book.handoffs_ready(version - 1) == [] and book.handoffs_ready(version) == ["s-2"]
    assert not book.handing_off("unknown")
    assert book.probed("s-1", StartPosition.after(TRIM_HORIZON), ProbeResult(False, ended=True))
    assert book.lost("s-2") == "s-2" and book.held_shards() == {"s-1"}


def test_book_plans_again_without_probing_only_when_a_batch_hit_its_cap(tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path)
    book.acquired(_lease("s"))
    book.checkpointed("s", Checkpoint("40"), more_likely=True, last_arrival=5.0)
    assert book.snapshot().shards["s"] == ShardView(Checkpoint("40"), ShardState.OWNED, True, 5.0)
    book.checkpointed("s", Checkpoint("50"), more_likely=False, last_arrival=6.0)
    assert book.snapshot().shards["s"] == ShardView(Checkpoint("50"))


def test_summary_rows_become_checkpoints_and_bad_rows_are_rejected() -> None:
    when = datetime(2026, 1, 2, tzinfo=UTC)
    progress = progress_from_summary([("s", BIG, 4, when, 12, 300), ("t", "9", 0, None, 1, None)])
    assert progress[0].checkpoint == Checkpoint(BIG, 4) and progress[0].last_arrival == when.timestamp()
    assert (progress[1].records, progress[1].bytes) == (1, 0)
    for bad in [("", "1", 0, None, 1, 1), ("s", None, 0, None, 1, 1), ("s", "x1", 0, None, 1, 1),
                ("s", "1", -1, None, 1, 1)]:
        with pytest.raises(BadBatchSummary):
            progress_from_summary([bad])


def test_source_options_round_trip_and_reject_bad_values(tmp_path: Path) -> None:
    options = SourceOptions(tmp_path, "stream", "eu-west-1", "http://127.0.0.1:1", Caps(5, 99), 0.05, True)
    assert SourceOptions.parse(options.to_options()) == options
    for bad in [{}, {"channel": "x"}, {"channel": "x", "stream": "s", "maxRecordsPerShard": "0"},
                {"channel": "x", "stream": "s", "minCallIntervalMs": "-1"},
                {"channel": "x", "stream": "s", "maxBytesPerShard": "lots"}]:
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
