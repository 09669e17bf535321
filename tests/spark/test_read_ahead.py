"""Reading ahead while behind (agent/spark/read_ahead.py): the next plan's first call, made early, read once.

Reads go through kinesalite over HTTP into an in-memory store. A plan that follows a read ahead yields exactly the
records the read ahead's answer held (nothing put after it), counts that call as its own, and a replay of it gives
the same rows; a read that found the pipeline caught up reads nothing ahead.
"""

from __future__ import annotations

import time
from typing import Any

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.reader import ReaderStats
from shardherd.agent.spark.arrow_read import read_plan
from shardherd.agent.spark.batch_ends import BatchEnd, recorded_end
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.agent.spark.read_ahead import KEEP_SECONDS, READS_AHEAD, ReadAhead, behind, first_answer
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from tests.support.stores import unique_app
from tests.support.waiting import wait_for


def _stream(kinesalite: NodeEmulator) -> tuple[Any, str, str]:
    stream = unique_app("ahead")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream active")
    return kinesis, stream, kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]


def _put(kinesis: Any, stream: str, payloads: list[bytes]) -> None:
    kinesis.put_records(StreamName=stream, Records=[{"Data": data, "PartitionKey": "k"} for data in payloads])


def _data(raw: RawKinesis, store: MemoryLeaseStore, stream: str, plan: ShardPlan, ahead: float | None = None
          ) -> list[bytes]:
    return [row["data"] for batch in read_plan(raw, store, stream, plan, read_ahead_after=ahead)
            for row in batch.to_pylist()]


def _next(plan: ShardPlan, end: BatchEnd) -> ShardPlan:
    assert end.end is not None
    return ShardPlan(plan.shard_id, StartPosition.after(end.end), plan.caps, plan.tenure, plan.run, plan.number + 1,
                     end.iterator)


def test_a_read_ahead_answers_its_plans_first_call_once_and_only_on_its_iterator(kinesalite: NodeEmulator) -> None:
    kinesis, stream, shard = _stream(kinesalite)
    _put(kinesis, stream, [b"a", b"b"])
    raw = RawKinesis("us-east-1", kinesalite.endpoint_url)
    iterator = raw.get_shard_iterator(stream, shard, {"ShardIteratorType": "TRIM_HORIZON"})
    ahead = ReadAhead()
    ahead.start(raw, "t", iterator, 100, 0.0)
    assert ahead.take("t", "another iterator") is None  # another plan's start (an earlier plan read again): kept
    answer = ahead.take("t", iterator)
    assert answer is not None and ahead.take("t", iterator) is None  # handed over once
    answer.result(30)
    _put(kinesis, stream, [b"c"])  # after the call: not in its answer
    stats = ReaderStats()
    response = first_answer(raw, iterator, 100, stats, answer)
    assert [record["Data"] for record in response["Records"]] == ["YQ==", "Yg=="]  # a, b
    assert stats.get_records_calls == 1  # the read ahead's call, counted by the read that took it
    now = [0.0]
    stale = ReadAhead(lambda: now[0])
    stale.start(raw, "t", iterator, 100, 0.0)
    now[0] = KEEP_SECONDS
    assert stale.take("t", iterator) is None  # kept too long: dropped


def test_behind_is_a_read_spanning_the_threshold() -> None:
    end = BatchEnd("t", "r", 1, Checkpoint("9"), 2, 20, "it", 0, 100.0, 101.6, True)
    assert behind(end, 1.5) and not behind(end, 2.0) and not behind(end, None)
    assert not behind(BatchEnd("t", "r", 1, None), 0.1)  # nothing read: no arrivals


def test_the_plan_after_a_read_ahead_reads_each_record_once_and_replays_the_same(kinesalite: NodeEmulator) -> None:
    kinesis, stream, shard = _stream(kinesalite)
    _put(kinesis, stream, [b"a-0"])
    time.sleep(0.05)  # the first plan's records span 50 ms of arrivals or more: behind for a threshold of 10 ms
    _put(kinesis, stream, [b"a-1"])
    raw, store = RawKinesis("us-east-1", kinesalite.endpoint_url), MemoryLeaseStore(TableNames.for_application("ahead"))
    first = ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(100), unique_app("t"), "r", 1)
    assert _data(raw, store, stream, first, ahead=0.01) == [b"a-0", b"a-1"]
    end = recorded_end(store, first.tenure, "r", 1)
    assert end is not None and end.iterator is not None and end.end is not None
    made = READS_AHEAD.held(first.tenure)
    assert made is not None
    made.result(30)
    _put(kinesis, stream, [b"b-0", b"b-1"])  # after the read ahead: left for the plan after next
    second = _next(first, end)
    assert _data(raw, store, stream, second) == []  # the read ahead's answer: nothing had arrived
    second_end = recorded_end(store, first.tenure, "r", 2)
    assert second_end is not None and second_end.calls == 1 and second_end.end is None
    assert _data(raw, store, stream, second) == []  # replayed: the same (no) rows
    third = ShardPlan(shard, StartPosition.after(end.end), Caps(100), first.tenure, "r", 3)
    assert _data(raw, store, stream, third) == [b"b-0", b"b-1"]  # each record once, in order
    assert _data(raw, store, stream, third) == [b"b-0", b"b-1"]


def test_a_caught_up_read_reads_nothing_ahead(kinesalite: NodeEmulator) -> None:
    kinesis, stream, shard = _stream(kinesalite)
    _put(kinesis, stream, [b"a-0", b"a-1"])  # one put: the records span no time
    raw, store = RawKinesis("us-east-1", kinesalite.endpoint_url), MemoryLeaseStore(TableNames.for_application("ahead"))
    plan = ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(100), unique_app("t"), "r", 1)
    assert _data(raw, store, stream, plan, ahead=1.5) == [b"a-0", b"a-1"]
    end = recorded_end(store, plan.tenure, "r", 1)
    assert end is not None and READS_AHEAD.take(plan.tenure, end.iterator) is None
    assert _data(raw, store, stream, plan) == [b"a-0", b"a-1"]  # off (None): a replay reads the same
