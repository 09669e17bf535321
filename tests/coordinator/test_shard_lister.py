"""ListShards lister against real emulator processes on 127.0.0.1: lineage after resharding, pagination, retries."""

from __future__ import annotations

import itertools
import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardherd.coordinator.shard_sync import CreateReason, plan_shard_sync
from shardherd.services.emulators.kinesalite import EmulatorNotInstalled, Kinesalite, KinesisLocal, NodeEmulator
from shardherd.services.emulators.ports import LOOPBACK, free_port, wait_until
from shardherd.shared.checkpoint import SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.errors import ShardherdError, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import ShardListingError, StreamNotFound, list_shards
from shardherd.shared.shards import MAX_HASH_KEY, Shard
from tests.coordinator.conftest import kinesis_client
from tests.support.faulty_proxy import DROPPED, Fault, FaultyProxy

_names = itertools.count()


def retry_policy(attempts: int = 5) -> tuple[RetryPolicy, ManualClock]:
    clock = ManualClock()
    return RetryPolicy(max_attempts=attempts, clock=clock, rng=random.Random(7)), clock


def create_stream(client: Any, shards: int) -> str:
    name = f"lister-{next(_names)}"
    client.create_stream(StreamName=name, ShardCount=shards)
    wait_active(client, name)
    return name


def wait_active(client: Any, name: str) -> None:
    def active() -> bool:
        return bool(client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
                    == "ACTIVE")

    wait_until(active, 20.0, f"stream {name} ACTIVE", lambda: True)


def by_id(shards: list[Shard]) -> dict[str, Shard]:
    result = {s.shard_id: s for s in shards}
    assert len(result) == len(shards), "the lister returned a shard twice"
    return result


def split_in_half(client: Any, name: str, shard: Shard) -> int:
    low, high = shard.hash_range
    new_start = (low + high) // 2 + 1
    client.split_shard(StreamName=name, ShardToSplit=shard.shard_id, NewStartingHashKey=str(new_start))
    wait_active(client, name)
    return new_start


def test_lists_lineage_after_split_and_merge(kinesis: Any) -> None:
    name = create_stream(kinesis, 4)
    retry, _ = retry_policy()
    before = by_id(list_shards(kinesis, name, retry))
    assert len(before) == 4 and all(s.is_open for s in before.values())
    s0, s1, s2, s3 = sorted(before.values(), key=lambda s: s.hash_range)
    new_start = split_in_half(kinesis, name, s0)
    kinesis.merge_shards(StreamName=name, ShardToMerge=s2.shard_id, AdjacentShardToMerge=s3.shard_id)
    wait_active(kinesis, name)

    after = by_id(list_shards(kinesis, name, retry))
    assert len(after) == 7
    new = {k: v for k, v in after.items() if k not in before}
    split_children = sorted((s for s in new.values() if s.parent_ids == (s0.shard_id,)), key=lambda s: s.hash_range)
    merged = [s for s in new.values() if set(s.parent_ids) == {s2.shard_id, s3.shard_id}]
    assert [c.hash_range for c in split_children] == [(s0.hash_range[0], new_start - 1),
                                                       (new_start, s0.hash_range[1])]
    assert len(merged) == 1 and merged[0].hash_range == (s2.hash_range[0], s3.hash_range[1])
    assert all(c.is_open for c in new.values())
    for parent in (s0, s2, s3):
        closed = after[parent.shard_id]
        assert not closed.is_open
        assert closed.ending_sequence_number is not None
        assert int(closed.ending_sequence_number) >= int(closed.starting_sequence_number)
    assert after[s1.shard_id].is_open
    open_ranges = sorted(s.hash_range for s in after.values() if s.is_open)
    assert open_ranges[0][0] == 0 and open_ranges[-1][1] == MAX_HASH_KEY


def test_page_size_ignored_by_kinesalite_still_lists_everything(kinesis: Any) -> None:
    name = create_stream(kinesis, 12)
    retry, _ = retry_policy()
    assert len(by_id(list_shards(kinesis, name, retry, page_size=5))) == 12


@pytest.mark.parametrize("page_size", [1, 7, 10_000])
def test_paginates_aws_style_on_kinesis_local(kinesis_local: NodeEmulator, page_size: int) -> None:
    client = kinesis_client(kinesis_local.endpoint_url)
    name = create_stream(client, 23)
    first = sorted(list_shards(client, name, retry_policy()[0]), key=lambda s: s.hash_range)[0]
    split_in_half(client, name, first)  # 22 open + 1 closed parent + 2 children
    requests: list[dict[str, Any]] = []
    client.meta.events.register("provide-client-params.kinesis.ListShards",
                                lambda params, **_: requests.append(dict(params)))

    shards = by_id(list_shards(client, name, retry_policy()[0], page_size=page_size))

    assert len(shards) == 25
    assert sum(not s.is_open for s in shards.values()) == 1
    assert len(requests) == math.ceil(25 / page_size)
    assert requests[0] == {"StreamName": name, "MaxResults": page_size}
    assert all(set(r) == {"NextToken", "MaxResults"} for r in requests[1:])


def test_missing_stream_is_a_typed_error(kinesis: Any) -> None:
    retry, clock = retry_policy()
    with pytest.raises(StreamNotFound, match="no-such-stream"):
        list_shards(kinesis, "no-such-stream", retry)
    assert clock.monotonic() == ManualClock().monotonic()  # not retried


@pytest.fixture
def throttled_stream(kinesis: Any) -> Iterator[str]:
    yield create_stream(kinesis, 3)


FAULTS = [
    Fault(400, "LimitExceededException"),
    Fault(400, "ProvisionedThroughputExceededException"),
    Fault(500, "InternalFailure"),
    DROPPED,  # connection closed without an answer
    Fault(503, "ServiceUnavailable"),
]
EXPIRED = Fault(400, "ExpiredNextTokenException")


def test_retries_throttling_5xx_and_dropped_connections(kinesalite: NodeEmulator, throttled_stream: str) -> None:
    retry, clock = retry_policy(attempts=6)
    start = clock.monotonic()
    with FaultyProxy(kinesalite.endpoint_url, FAULTS) as proxy:
        shards = list_shards(kinesis_client(proxy.endpoint_url), throttled_stream, retry)
    assert len(shards) == 3
    assert (proxy.faults_served, len(proxy.forwarded)) == (5, 1)
    assert clock.monotonic() > start  # backed off on the injected clock, not in real time


def test_gives_up_after_the_retry_budget(kinesalite: NodeEmulator, throttled_stream: str) -> None:
    retry, _ = retry_policy(attempts=3)
    with FaultyProxy(kinesalite.endpoint_url, FAULTS) as proxy, pytest.raises(StoreUnavailable, match="3 times"):
        list_shards(kinesis_client(proxy.endpoint_url), throttled_stream, retry)
    assert (proxy.faults_served, proxy.forwarded) == (3, [])


def test_non_transient_error_is_typed_and_not_retried(kinesalite: NodeEmulator, throttled_stream: str) -> None:
    retry, clock = retry_policy(attempts=5)
    faults = [Fault(400, "AccessDeniedException"), *FAULTS]
    with FaultyProxy(kinesalite.endpoint_url, faults) as proxy, pytest.raises(ShardListingError, match="AccessDenied"):
        list_shards(kinesis_client(proxy.endpoint_url), throttled_stream, retry)
    assert proxy.requests == 1
    assert clock.monotonic() == ManualClock().monotonic()


def test_expired_next_token_restarts_the_listing(kinesis_local: NodeEmulator) -> None:
    name = create_stream(kinesis_client(kinesis_local.endpoint_url), 5)
    # Page 1 is answered, page 2 says the token expired: the lister starts over (3 pages of 2), each shard once.
    with FaultyProxy(kinesis_local.endpoint_url, [None, EXPIRED]) as proxy:
        shards = list_shards(kinesis_client(proxy.endpoint_url), name, retry_policy()[0], page_size=2)
    assert len(by_id(shards)) == 5
    assert (proxy.faults_served, len(proxy.forwarded)) == (1, 4)


def test_token_expiring_every_time_is_reported(kinesis_local: NodeEmulator) -> None:
    name = create_stream(kinesis_client(kinesis_local.endpoint_url), 5)
    with (
        FaultyProxy(kinesis_local.endpoint_url, [None, EXPIRED] * 3) as proxy,
        pytest.raises(ShardListingError, match="expired 3 times"),
    ):
        list_shards(kinesis_client(proxy.endpoint_url), name, retry_policy()[0], page_size=2, max_restarts=2)
    assert proxy.requests == 6


def test_connection_refused_is_retried_then_reported() -> None:
    retry, clock = retry_policy(attempts=3)
    client = kinesis_client(f"http://{LOOPBACK}:{free_port()}")
    with pytest.raises(StoreUnavailable, match="failed 3 times"):
        list_shards(client, "any", retry)
    assert clock.monotonic() > ManualClock().monotonic()


def test_split_feeds_the_planner_child_leases_only_after_parent_shard_end(kinesis: Any) -> None:
    name = create_stream(kinesis, 2)
    retry, _ = retry_policy()
    parent, other = sorted(list_shards(kinesis, name, retry), key=lambda s: s.hash_range)
    new_start = split_in_half(kinesis, name, parent)
    listing = list_shards(kinesis, name, retry)
    children = sorted((s for s in listing if s.parent_shard_id == parent.shard_id), key=lambda s: s.hash_range)
    assert len(children) == 2

    working = [Lease(parent.shard_id, checkpoint=Checkpoint.at(parent.starting_sequence_number)),
               Lease(other.shard_id, checkpoint=Checkpoint.at(other.starting_sequence_number))]
    assert plan_shard_sync(listing, working, "TRIM_HORIZON").is_empty

    finished = [working[0].with_changes(checkpoint=SHARD_END), working[1]]
    plan = plan_shard_sync(listing, finished, "LATEST")
    assert [c.lease.lease_key for c in plan.creates] == [c.shard_id for c in children]
    assert {c.reason for c in plan.creates} == {CreateReason.PARENTS_FINISHED}
    assert all(c.lease.checkpoint == TRIM_HORIZON for c in plan.creates)
    assert all(c.lease.parent_shard_ids == {parent.shard_id} for c in plan.creates)
    assert [(c.lease.starting_hash_key, c.lease.ending_hash_key) for c in plan.creates] == [
        (str(parent.hash_range[0]), str(new_start - 1)),
        (str(new_start), str(parent.hash_range[1])),
    ]
    assert plan.deletes == ()


# ---------------------------------------------------------------------------------------------------------------
# The emulator launcher itself


def test_launcher_names_the_install_command_when_packages_are_missing(tmp_path: Path) -> None:
    with pytest.raises(EmulatorNotInstalled, match=re.escape("npm ci --prefix services/emulators")):
        Kinesalite(node_modules=tmp_path).start()


def test_launcher_listens_on_loopback_only_and_leaves_no_process() -> None:
    with KinesisLocal() as emulator:
        pid = emulator.pid
        assert pid is not None
        listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
        own = [line.split()[3] for line in listening.splitlines() if f"pid={pid}," in line]
        assert own and all(address.startswith(f"{LOOPBACK}:") for address in own), own
    assert not emulator.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_emulator_exits_when_its_python_parent_is_killed() -> None:
    script = (
        "import sys; from shardherd.services.emulators.kinesalite import Kinesalite\n"
        "k = Kinesalite().start(); print(k.pid, flush=True); sys.stdin.read()"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2])
    assert parent.stdout is not None
    node_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=10)

    def gone() -> bool:
        try:
            os.kill(node_pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, 10.0, f"node process {node_pid} to exit after its parent died", lambda: True)
    assert gone()


def item(shard_id: str, low: int, high: int, ending: str | None = None) -> dict[str, Any]:
    sequence = {"StartingSequenceNumber": "100"} | ({"EndingSequenceNumber": ending} if ending else {})
    return {"ShardId": shard_id, "HashKeyRange": {"StartingHashKey": str(low), "EndingHashKey": str(high)},
            "SequenceNumberRange": sequence}


def page(*items: dict[str, Any], token: str | None = None) -> Fault:
    """A canned 200 reply holding one ListShards page."""
    return Fault(200, extra={"Shards": list(items)} | ({"NextToken": token} if token else {}))


def test_shard_seen_open_then_closed_across_pages_is_kept_closed(kinesalite: NodeEmulator) -> None:
    pages = [page(item("shardId-1", 0, 9), item("shardId-2", 10, 19), token="t1"),
             page(item("shardId-1", 0, 9, ending="200"), token="t2"),
             page(item("shardId-2", 10, 19))]
    with FaultyProxy(kinesalite.endpoint_url, pages) as proxy:
        shards = by_id(list_shards(kinesis_client(proxy.endpoint_url), "canned", retry_policy()[0]))
    assert [(s.shard_id, s.ending_sequence_number) for s in shards.values()] == [("shardId-1", "200"),
                                                                                  ("shardId-2", None)]


@pytest.mark.parametrize(
    ("pages", "match"),
    [
        ([page(item("shardId-1", 0, 9), token="t1"), page(item("shardId-1", 0, 8))], "different descriptions"),
        ([page(item("shardId-1", 0, 9), token="t1"), page(token="t1")], "same NextToken twice"),
        ([page({"ShardId": "shardId-1"})], "HashKeyRange"),
    ],
)
def test_inconsistent_pages_are_rejected(kinesalite: NodeEmulator, pages: list[Fault], match: str) -> None:
    with FaultyProxy(kinesalite.endpoint_url, pages) as proxy, pytest.raises(ShardherdError, match=match):
        list_shards(kinesis_client(proxy.endpoint_url), "canned", retry_policy()[0])
