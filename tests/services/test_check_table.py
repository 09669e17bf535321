"""`shardherd check-table` as a real process against KCL-shaped tables on moto server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from tests.support.stores import unique_app

SEQ = "49590338271490256608559692538361571095921575989136588898"
ACCOUNT_STREAM = "123456789012:orders:1700000000"


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int | float) -> dict[str, str]:
    return {"N": str(value)}


def kcl_lease(key: str, checkpoint: str, **extra: Any) -> dict[str, Any]:
    """A lease item as KCL writes it (attribute names and types of its serializer)."""
    item = {"leaseKey": _s(key), "leaseCounter": _n(3), "checkpoint": _s(checkpoint),
            "checkpointSubSequenceNumber": _n(0), "ownerSwitchesSinceCheckpoint": _n(0)}
    item.update(extra)
    return item


def kcl_multi_lease(stream: str, shard: str, checkpoint: str, **extra: Any) -> dict[str, Any]:
    """A multi-stream lease item: key `account:stream:epoch:shard`, plus `streamName` and `shardId`."""
    return kcl_lease(f"{stream}:{shard}", checkpoint, streamName=_s(stream), shardId=_s(shard), **extra)


class KclTables:
    """A KCL application's three tables on moto, filled with raw items."""

    def __init__(self, moto: MotoServer) -> None:
        self.moto = moto
        self.client = make_client("dynamodb", "us-east-1", moto.endpoint_url)
        self.name = unique_app("kcl-check")

    def create(self, suffix: str, key: str, items: list[dict[str, Any]]) -> None:
        table = self.name + suffix
        self.client.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                                 KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                                 AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}])
        for item in items:
            self.client.put_item(TableName=table, Item=item)

    def items(self, suffix: str = "") -> list[dict[str, Any]]:
        return sorted(self.client.scan(TableName=self.name + suffix)["Items"], key=str)

    def check(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        base = {key: value for key, value in os.environ.items() if not key.startswith("SHARDHERD_")}
        return subprocess.run(
            [sys.executable, "-m", "shardherd", "check-table", *args, "--endpoint-url", self.moto.endpoint_url,
             "--region", "us-east-1"],
            env={**base, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", **(env or {})},
            capture_output=True, text=True, timeout=60, check=False)

    def verdicts(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, tuple[str, str]]]:
        done = self.check("--table", self.name, "--json", *args, env=env)
        assert done.returncode in (0, 1), done.stderr
        rows = json.loads(done.stdout)
        assert all(set(row) == {"row", "verdict", "reason"} for row in rows)
        return done.returncode, {row["row"]: (row["verdict"], row["reason"]) for row in rows}


@pytest.fixture
def kcl(moto_server: MotoServer) -> KclTables:
    return KclTables(moto_server)


def test_single_stream_table_every_row_judged_and_nothing_written(kcl: KclTables) -> None:
    kcl.create("", "leaseKey", [
        kcl_lease("shardId-000000000000", SEQ, leaseOwner=_s("kcl-worker-1"), throughputKBps=_n(12.5)),
        kcl_lease("shardId-000000000001", "TRIM_HORIZON"),
        kcl_lease("shardId-000000000002", "SHARD_END", childShardIds={"SS": ["shardId-000000000003"]}),
        kcl_lease("shardId-000000000003", "TRIM_HORIZON", parentShardId={"SS": ["shardId-000000000002"]}),
        kcl_lease("shardId-000000000004", "LATEST"),
        kcl_lease("shardId-000000000005", "AT_TIMESTAMP"),
        kcl_lease("shardId-000000000006", "12abc"),
        {"leaseKey": _s("shardId-000000000007"), "leaseCounter": _n(1)},  # no checkpoint at all
        kcl_multi_lease(ACCOUNT_STREAM, "shardId-000000000000", "LATEST"),
        kcl_lease("not:a:lease-key", "LATEST"),
        {"leaseKey": _s("kcl-worker-1"), "entityType": _s("WORKER_METRIC_STATS"), "lut": _n(1700000000)},
    ])
    kcl.create("-WorkerMetricStats", "wid", [
        {"wid": _s("kcl-worker-1"), "lut": _n(1700000000), "sts": {"M": {"C": {"L": [_n(40.5), _n(41)]}}},
         "opr": {"M": {"C": {"L": [_n(100)]}}}},
        {"wid": _s("kcl-worker-2"), "lut": _s("yesterday")},
    ])
    kcl.create("-CoordinatorState", "key", [
        {"key": _s("Leader"), "ownerName": _s("kcl-worker-1"), "leaseDuration": _s("120000"),
         "recordVersionNumber": _s("7c1f")},
        {"key": _s("Migration3.0"), "cv": _s("CLIENT_VERSION_3x")},
        {"key": _s("LeaderEpoch"), "epoch": _n(3)},
    ])
    before = [kcl.items(suffix) for suffix in ("", "-WorkerMetricStats", "-CoordinatorState")]

    code, rows = kcl.verdicts()

    assert code == 1  # something is refused
    assert rows["shardId-000000000000"][0] == "continue" and f"resumes after sequence number {SEQ}" in rows[
        "shardId-000000000000"][1] and "owned by kcl-worker-1" in rows["shardId-000000000000"][1]
    assert rows["shardId-000000000001"] == ("continue", rows["shardId-000000000001"][1])
    assert "reads from TRIM_HORIZON" in rows["shardId-000000000001"][1]
    assert "SHARD_END" in rows["shardId-000000000002"][1] and rows["shardId-000000000002"][0] == "continue"
    assert "child of shardId-000000000002" in rows["shardId-000000000003"][1]
    assert "reads from LATEST" in rows["shardId-000000000004"][1]
    assert rows["shardId-000000000005"][0] == "refuse" and "initial_timestamp" in rows["shardId-000000000005"][1]
    assert rows["shardId-000000000006"][0] == "refuse" and "12abc" in rows["shardId-000000000006"][1]
    assert rows["shardId-000000000007"][0] == "refuse" and "checkpoint is missing" in rows["shardId-000000000007"][1]
    multi = rows[f"{ACCOUNT_STREAM}:shardId-000000000000"]
    assert multi[0] == "ignore" and "single-stream application" in multi[1]
    assert rows["not:a:lease-key"][0] == "refuse" and "malformed lease key" in rows["not:a:lease-key"][1]
    assert rows["kcl-worker-1"][0] in ("ignore", "continue")  # the 3.5 entity in the lease table, the metrics row
    assert rows["kcl-worker-2"][0] == "refuse" and "lut" in rows["kcl-worker-2"][1]
    assert rows["Leader"][0] == "continue" and rows["Migration3.0"][0] == "ignore"
    assert rows["LeaderEpoch"][0] == "continue" and "epoch counter" in rows["LeaderEpoch"][1]
    # Read only: every table is exactly as it was.
    assert [kcl.items(suffix) for suffix in ("", "-WorkerMetricStats", "-CoordinatorState")] == before

    # The configured initial timestamp makes the AT_TIMESTAMP lease continue (the agent can start it then).
    code, rows = kcl.verdicts(env={"SHARDHERD_INITIAL_TIMESTAMP": "2026-01-01T00:00:00+00:00"})
    assert rows["shardId-000000000005"][0] == "continue"


def test_multi_stream_table_rows_by_stream_and_text_output(kcl: KclTables) -> None:
    other = "123456789012:payments:1700000100"
    kcl.create("", "leaseKey", [
        kcl_multi_lease(ACCOUNT_STREAM, "shardId-000000000000", SEQ, leaseOwner=_s("kcl-a")),
        kcl_multi_lease(ACCOUNT_STREAM, "shardId-000000000001", "SHARD_END"),
        kcl_multi_lease(other, "shardId-000000000000", "TRIM_HORIZON"),
    ])
    code, rows = kcl.verdicts()
    assert code == 0  # inferred multi-stream application over both streams
    assert set(verdict for verdict, _ in rows.values()) == {"continue"}
    assert "stream orders shard shardId-000000000000 resumes after" in rows[f"{ACCOUNT_STREAM}:shardId-000000000000"][1]

    # Configured with one stream only: the other stream's rows are left alone (ignored), still exit 0.
    streams = json.dumps([{"name": "orders"}])
    code, rows = kcl.verdicts(env={"SHARDHERD_STREAMS": streams})
    assert code == 0 and rows[f"{other}:shardId-000000000000"][0] == "ignore"
    assert "not one of the application's streams" in rows[f"{other}:shardId-000000000000"][1]
    # A configured creation epoch that differs: KCL's rows belong to another incarnation of the stream.
    code, rows = kcl.verdicts(env={"SHARDHERD_STREAMS": json.dumps([{"name": "orders", "creation_epoch": 5}])})
    assert rows[f"{ACCOUNT_STREAM}:shardId-000000000000"][0] == "ignore"

    # Attributes that disagree with the key: refused, with the reason, in text form with a summary line.
    kcl.client.put_item(TableName=kcl.name, Item=kcl_lease(
        f"{ACCOUNT_STREAM}:shardId-000000000009", "LATEST", streamName=_s(other), shardId=_s("shardId-000000000009")))
    done = kcl.check("--table", kcl.name)
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "4 rows: 3 continue, 0 ignore, 1 refuse"
    refused = [line for line in lines if line.startswith("refuse ")]
    assert refused == [f"refuse {ACCOUNT_STREAM}:shardId-000000000009 malformed lease key: streamName attribute "
                       f"'{other}' differs from the key's stream"]


def test_usage_and_access_errors_exit_2_with_one_line(kcl: KclTables) -> None:
    missing = kcl.check("--table", kcl.name)
    assert missing.returncode == 2 and missing.stderr.strip() == f"shardherd: table {kcl.name} not found"
    usage = kcl.check()
    assert usage.returncode == 2 and "--table" in usage.stderr
