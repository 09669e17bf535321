"""The kill scenario's idea of "resumed" for a shard that holds no record (bench/scale.py's kill of a 35-lease agent
waited its whole limit for one): asked of a real kinesalite on 127.0.0.1, a never-checkpointed shard without a
record counts once a new owner holds it outside a handoff; one with a record, or a checkpoint, still needs records
reported by the new owner. About 3 s."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.local_stack.scenarios import Scenarios, _resumed
from shardherd.services.local_stack.state import StackState
from shardherd.shared.aws import make_client

STREAM = "scenario-empty"


@pytest.fixture(scope="module")
def kinesis_url() -> Iterator[str]:
    if shutil.which("node") is None:
        pytest.skip("kinesalite needs Node.js, which is not on PATH")
    with Kinesalite() as emulator:
        kinesis = make_client("kinesis", "us-east-1", emulator.endpoint_url)
        kinesis.create_stream(StreamName=STREAM, ShardCount=3)
        kinesis.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 0.2})
        shards = [shard["ShardId"] for shard in kinesis.list_shards(StreamName=STREAM)["Shards"]]
        for shard in shards[1:]:  # shard 0 stays empty
            start = next(s for s in kinesis.list_shards(StreamName=STREAM)["Shards"] if s["ShardId"] == shard)
            kinesis.put_record(StreamName=STREAM, Data=b"x", PartitionKey="k",
                               ExplicitHashKey=start["HashKeyRange"]["StartingHashKey"])
        yield emulator.endpoint_url


def _lease(shard: int, checkpoint: str, owner: str | None = "agent-2", records: int | None = None) -> dict[str, Any]:
    return {"lease_key": f"shardId-{shard:012d}", "shard_id": f"shardId-{shard:012d}", "stream": None,
            "checkpoint": checkpoint, "owner": owner, "checkpoint_owner": None, "records_processed": records}


def test_only_a_never_checkpointed_shard_without_a_record_counts_as_empty(kinesis_url: str) -> None:
    state = StackState(supervisor_pid=0, application_name="app", stream_name=STREAM, region="us-east-1",
                       kinesis_endpoint_url=kinesis_url, dynamodb_endpoint_url=None, dashboard_url="",
                       control_socket="", api_token_file=None)
    leases = {lease["lease_key"]: lease for lease in (
        _lease(0, "TRIM_HORIZON"),  # no record: nothing to read
        _lease(1, "TRIM_HORIZON"),  # a record, not yet checkpointed
        _lease(2, "49590338271490256608559692538361571095921575989136588898"))}  # checkpointed
    assert Scenarios(state, timeout=5)._empty(leases) == {"shardId-000000000000"}


def test_resumed_needs_records_unless_there_are_none_to_read() -> None:
    owned_elsewhere = _lease(0, "TRIM_HORIZON")
    assert not _resumed(owned_elsewhere, {"agent-1"})
    assert _resumed(owned_elsewhere, {"agent-1"}, empty=True)
    assert not _resumed({**owned_elsewhere, "checkpoint_owner": "agent-1"}, {"agent-1"}, empty=True)  # in a handoff
    assert not _resumed(_lease(0, "TRIM_HORIZON", owner="agent-1"), {"agent-1"}, empty=True)  # the victim's still
    assert not _resumed(_lease(0, "TRIM_HORIZON", owner=None), {"agent-1"}, empty=True)
    assert _resumed(_lease(1, "TRIM_HORIZON", records=3), {"agent-1"})
