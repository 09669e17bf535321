"""Poison records (decision 0031): a batch that keeps failing is bisected down to the record that fails, which blocks
the shard (policy `block`) or is written to a dead-letter destination and checkpointed past (`quarantine`).

Real parts: a coordinator and an agent in this process on moto server (DynamoDB, S3) and kinesalite, short intervals.
Each test takes 8 to 16 s: three failures of the batch (1 + 2 s of backoff), the bisection, three failures of the
record alone (1 + 2 s), the stack's start-up, and for some a rewind, a replay or a destination coming back.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shardherd.agent.consumer import Checkpointer
from shardherd.agent.kpl import UserRecord, encode_aggregate
from shardherd.agent.quarantine import open_destination
from shardherd.agent.records import Record
from shardherd.agent.runtime import Agent
from shardherd.services.cli import main
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.dlq_url import BadDestination
from shardherd.shared.errors import ConfigError
from shardherd.shared.worker import PoisonReport
from tests.support.fast_settings import FAST_READS
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stores import unique_app
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

RECORDS = 40
POISON_AT = 17  # the index of the poison payload among the records produced
TOKEN = "poison-records-admin-token-0123456789"


class RejectsOne(LedgerProcessor):
    """Takes a batch whole or not at all: raises on any batch holding the poison payload (a sink rejecting it)."""

    poison = b""

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if any(record.data == self.poison for record in records):
            raise ValueError(f"the sink rejects {self.poison.decode()}")
        super().process_records(records, checkpointer, millis_behind_latest)


class Stack(StreamStack):
    """One shard, its coordinator and one agent whose processor rejects one payload."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, **overrides: Any) -> None:
        super().__init__(moto, kinesalite, 1, prefix="poison", s3_endpoint_url=moto.endpoint_url, **overrides)
        self.ledger = Ledger()
        self.agent: Agent | None = None

    def start_agent(self, poison: bytes, **settings: Any) -> Agent:
        RejectsOne.poison = poison
        self.agent = Agent(self.settings("agent-1", agent_health_port=0, **settings),
                           lambda: RejectsOne(self.ledger, "agent-1"), limits=FAST_READS).start()
        return self.agent

    def metrics(self) -> str:
        assert self.agent is not None and self.agent.health is not None
        return httpx.get(f"http://127.0.0.1:{self.agent.health.port}/metrics", timeout=5).text

    def stored_checkpoint(self) -> str:
        return next(iter(self.checkpoints().values()))

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop(drain=False)
        super().close()


@contextmanager
def running(stack: Stack) -> Iterator[Stack]:
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator) -> Iterator[Stack]:
    with running(Stack(moto_server, kinesalite)) as created:
        yield created


@pytest.fixture
def bucket(moto_server: MotoServer) -> str:
    name = unique_app("dlq").lower().replace("_", "-")
    make_client("s3", "us-east-1", moto_server.endpoint_url).create_bucket(Bucket=name)
    return name


def poisoned_sequence(stack: Stack) -> str:
    return stack.keys[POISON_AT][1]


def assert_delivered_once(stack: Stack, expected: list[bytes]) -> None:
    counts = Counter(stack.ledger.payloads())
    assert set(counts) == set(expected) and set(counts.values()) == {1}


def test_block_delivers_and_checkpoints_everything_before_the_poison_record_and_names_it(
        moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> None:
    with running(Stack(moto_server, kinesalite, api_token=TOKEN)) as stack:
        blocks_until_rewound(stack, tmp_path)


def blocks_until_rewound(stack: Stack, tmp_path: Path) -> None:
    stack.produce(RECORDS, "b")
    agent = stack.start_agent(stack.produced[POISON_AT])
    sequence = poisoned_sequence(stack)
    wait_for(lambda: bool(agent.progress.poisoned()), 60, "the shard blocked on its poison record")
    [(lease_key, record)] = agent.progress.poisoned().items()
    assert (record.sequence_number, record.sub_sequence_number) == (sequence, 0)
    before = stack.produced[:POISON_AT]
    assert_delivered_once(stack, before)  # nothing after the poison record delivered, nothing before it twice
    assert stack.stored_checkpoint() == stack.keys[POISON_AT - 1][1]
    failing = agent.progress.failing()[lease_key]
    assert failing.last_error.startswith(f"poison record {sequence}/0: ValueError: the sink rejects")
    metrics = stack.metrics()
    assert f'shardherd_shard_poison_record{{lease="{lease_key}",sequence="{sequence}",sub_sequence="0"}} 1.0' in metrics
    assert agent.progress.snapshot([lease_key])[lease_key].poison == PoisonReport(blocked_on=f"{sequence}/0")
    api = stack.coordinator.api
    assert api is not None
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client:
        wait_for(lambda: [item["blocked_on"] for item in client.get("/v1/poison").json()["items"]] == [
            f"{sequence}/0"], 30, "the coordinator's API naming the poison record")
    # The operator's path: rewind the shard past the record (the owner stops the retries, hands it over, resumes).
    token = tmp_path / "token"
    token.write_text(TOKEN)
    assert main(["rewind", "--to-sequence", f"{lease_key}={sequence}", "--url", api.url,
                 "--token-file", str(token)]) == 0
    poison = stack.produced[POISON_AT]
    others = [payload for payload in stack.produced if payload != poison]
    wait_for(lambda: set(stack.ledger.payloads()) >= set(others), 60, "the records after the poison one delivered")
    assert_delivered_once(stack, others)
    assert not agent.progress.poisoned()


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_quarantine_writes_the_record_then_checkpoints_past_it_and_replay_puts_it_back(
        stack: Stack, kind: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = tmp_path.as_uri() if kind == "file" else f"s3://{request.getfixturevalue('bucket')}/dead/letters"
    stack.produce(RECORDS, "q")
    poison = stack.produced[POISON_AT]
    agent = stack.start_agent(poison, poison_policy="quarantine", poison_destination=url)
    others = [payload for payload in stack.produced if payload != poison]
    wait_for(lambda: set(stack.ledger.payloads()) >= set(others), 60, "every other record delivered")
    destination = open_destination(url, "us-east-1", stack.base["s3_endpoint_url"])
    [name] = list(destination.names())
    stored = destination.get(name)
    shard, sequence = stack.keys[POISON_AT]
    assert (stored.stream, stored.shard_id, stored.sequence_number, stored.sub_sequence_number) == (
        stack.app, shard, sequence, 0)
    assert base64.b64decode(stored.data) == poison and stored.partition_key == f"key-{POISON_AT}"
    assert stored.error.startswith("ValueError: the sink rejects") and stored.worker_id == "agent-1"
    assert stored.attempts >= agent.settings.poison_attempts and stored.approximate_arrival is not None
    wait_for(lambda: stack.stored_checkpoint() == stack.keys[-1][1], 30, "the checkpoint at the last record")
    stack.produce(5, "after")  # the lease keeps progressing past the quarantined record
    wait_for(lambda: stack.stored_checkpoint() == stack.keys[-1][1], 30, "the checkpoint at the newest record")
    assert_delivered_once(stack, [payload for payload in stack.produced if payload != poison])
    assert agent.progress.quarantined() == {shard: 1} and not agent.progress.poisoned()
    assert agent.progress.snapshot([shard])[shard].poison == PoisonReport(
        None, 1, f"{sequence}/0", f"{url.rstrip('/')}/{stored.name}")
    assert f'shardherd_shard_quarantined_records_total{{lease="{shard}"}} 1.0' in stack.metrics()
    # Fixed: `shardherd dlq replay` puts it back into the stream, and the agent reads it again.
    RejectsOne.poison = b"-fixed-"
    monkeypatch.setenv("SHARDHERD_KINESIS_ENDPOINT_URL", stack.base["kinesis_endpoint_url"])
    monkeypatch.setenv("SHARDHERD_S3_ENDPOINT_URL", stack.base["s3_endpoint_url"])
    assert main(["dlq", "replay", url]) == 0
    wait_for(lambda: poison in stack.ledger.payloads(), 30, "the replayed record read again")
    assert list(destination.names()) == []
    assert_delivered_once(stack, [*stack.produced])


def test_a_destination_that_fails_blocks_the_shard_until_the_write_succeeds(stack: Stack, tmp_path: Path) -> None:
    dead = tmp_path / "dead"
    dead.mkdir()
    agent = stack.start_agent(b"", poison_policy="quarantine", poison_destination=dead.as_uri())
    stack.wait_owned("agent-1")
    shutil.rmtree(dead)  # the destination goes away after start-up
    stack.produce(RECORDS, "f")
    RejectsOne.poison = stack.produced[POISON_AT]
    shard, sequence = stack.keys[POISON_AT]
    wait_for(lambda: "writing" in getattr(agent.progress.failing().get(shard), "last_error", ""), 60,
             "the quarantine write failing")
    assert agent.progress.failing()[shard].last_error.startswith(f"poison record {sequence}/0: DestinationError")
    assert_delivered_once(stack, stack.produced[:POISON_AT])  # blocked, not skipped
    assert stack.stored_checkpoint() == stack.keys[POISON_AT - 1][1]
    dead.mkdir()  # back: the retried write goes through, then the shard moves on
    others = [payload for payload in stack.produced if payload != RejectsOne.poison]
    wait_for(lambda: set(stack.ledger.payloads()) >= set(others), 60, "every other record delivered")
    assert len(list(dead.glob("*/*/*.json"))) == 1
    assert_delivered_once(stack, others)


def test_a_poison_kpl_sub_record_is_found_and_quarantined_with_its_sub_sequence(stack: Stack, tmp_path: Path) -> None:
    users = [UserRecord(f"user-{index}", f"k-{index}".encode()) for index in range(12)]
    bad = users[7].data
    agent = stack.start_agent(bad, poison_policy="quarantine", poison_destination=tmp_path.as_uri())
    stack.produce(3, "plain")
    answer = stack.kinesis.put_record(StreamName=stack.app, Data=encode_aggregate(users), PartitionKey="agg")
    stack.produce(3, "tail")
    others = [*stack.produced, *(user.data for user in users if user.data != bad)]
    wait_for(lambda: set(stack.ledger.payloads()) >= set(others), 60, "every other record delivered")
    [path] = list(tmp_path.glob("*/*/*.json"))
    stored = json.loads(path.read_bytes())
    assert (stored["sequence_number"], stored["sub_sequence_number"]) == (answer["SequenceNumber"], 7)
    assert stored["partition_key"] == "user-7" and base64.b64decode(stored["data"]) == bad
    assert_delivered_once(stack, others)
    assert agent.progress.quarantined() == {answer["ShardId"]: 1}


def test_a_quarantine_without_a_usable_destination_is_refused_at_start_up(stack: Stack, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="poison_policy quarantine needs a poison_destination"):
        stack.settings("agent-1", poison_policy="quarantine")
    with pytest.raises(ConfigError, match="use file:///absolute/directory or s3://bucket"):
        stack.settings("agent-1", poison_destination="ftp://host/dir")
    missing = tmp_path / "missing"
    for url, problem in ((missing.as_uri(), "is not an existing directory"),
                         ("s3://no-such-bucket/x", "cannot write to bucket no-such-bucket")):
        with pytest.raises(BadDestination, match=re.escape(problem)):
            Agent(stack.settings("agent-1", poison_policy="quarantine", poison_destination=url),
                  lambda: RejectsOne(stack.ledger, "agent-1"))
    assert not missing.exists()
