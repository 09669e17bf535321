"""A KCL 2.x lease table, continued by shardherd (docs/migrate-from-kcl.md, "KCL 2.x tables").

The table is as KCL 2.x leaves it after its workers stopped: a lease table without the owner index, leases owned by
a KCL worker with checkpoints in the middle of each shard, no worker-metrics or coordinator-state table. shardherd
adds the index and its own tables, and its agent resumes every shard right after KCL 2.x's checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardherd.services.coordinator_service import CoordinatorService
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.config import load_settings
from shardherd.shared.store import LEASE_OWNER_INDEX
from tests.support.fast_settings import fast_env
from tests.support.file_ledger import LEDGER_ENV, read_ledger
from tests.support.stores import unique_app
from tests.support.stream_stack import active_stream, kill_processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

RECORDS = 40  # per shard; KCL 2.x checkpointed the first half


def kcl2_lease(shard: str, checkpoint: str) -> dict[str, Any]:
    """A lease item with the attributes KCL 2.x's DynamoDBLeaseSerializer writes (2.3+: hash range, no throughput)."""
    return {"leaseKey": {"S": shard}, "leaseOwner": {"S": "kcl2-worker-1"}, "leaseCounter": {"N": "57"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": checkpoint},
            "checkpointSubSequenceNumber": {"N": "0"}, "startingHashKey": {"S": "0"}, "endingHashKey": {"S": "1"}}


def test_shardherd_continues_a_kcl_2x_table_after_each_checkpoint(moto_server: MotoServer, kinesalite: NodeEmulator,
                                                                 tmp_path: Path) -> None:
    app = unique_app("kcl2")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    active_stream(kinesis, app, 2)
    sequences: dict[str, list[str]] = {}
    for index in range(2 * RECORDS):
        put = kinesis.put_record(StreamName=app, Data=f"r-{index}".encode(), PartitionKey=f"k{index}")
        sequences.setdefault(put["ShardId"], []).append(put["SequenceNumber"])
    dynamodb = make_client("dynamodb", "us-east-1", moto_server.endpoint_url)
    dynamodb.create_table(TableName=app, KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                          BillingMode="PAY_PER_REQUEST")
    checkpoints = {shard: numbers[len(numbers) // 2 - 1] for shard, numbers in sequences.items()}
    for shard, checkpoint in checkpoints.items():
        dynamodb.put_item(TableName=app, Item=kcl2_lease(shard, checkpoint))

    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "SHARDHERD_APPLICATION_NAME": app, "SHARDHERD_STREAM_NAME": app, "SHARDHERD_STORE_BACKEND": "dynamodb",
           "SHARDHERD_DYNAMODB_ENDPOINT_URL": moto_server.endpoint_url,
           "SHARDHERD_KINESIS_ENDPOINT_URL": kinesalite.endpoint_url, LEDGER_ENV: str(ledger),
           **fast_env(disable_worker_metrics=True, api_port=0)}
    settings = load_settings(**{key[len("SHARDHERD_"):].lower(): value for key, value in env.items()
                                if key.startswith("SHARDHERD_") and key != LEDGER_ENV}, worker_id="coordinator")
    coordinator = CoordinatorService.build(settings)
    coordinator.start()
    agent = subprocess.Popen([sys.executable, "-m", "shardherd", "agent", "--processor",
                              "tests.support.file_ledger:FileLedgerProcessor"],
                             env={**env, "SHARDHERD_WORKER_ID": "shardherd-1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        expected = {shard: numbers[len(numbers) // 2:] for shard, numbers in sequences.items()}

        def read() -> dict[str, list[str]]:
            by_shard: dict[str, list[str]] = {}
            for shard, sequence, *_ in read_ledger(str(ledger)):
                by_shard.setdefault(shard, []).append(sequence)
            return by_shard

        wait_for(lambda: read() == expected, 60, "every record after KCL 2.x's checkpoints, and none before")
    finally:
        kill_processes([agent])
        coordinator.stop()
    indexes = dynamodb.describe_table(TableName=app)["Table"].get("GlobalSecondaryIndexes", [])
    assert [index["IndexName"] for index in indexes] == [LEASE_OWNER_INDEX]
    for table in (f"{app}-WorkerMetricStats", f"{app}-CoordinatorState"):  # (list_tables pages at 100 names)
        assert dynamodb.describe_table(TableName=table)["Table"]["TableStatus"] == "ACTIVE"
