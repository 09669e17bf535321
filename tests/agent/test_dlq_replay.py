"""`shardherd dlq list|replay`: quarantined records put back into a kinesalite stream through per-record throttles
(the limits proxy, its write limit shrunk), each removed from the destination only once Kinesis took it."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardherd.agent.quarantine import FileDestination, Quarantined
from shardherd.services.cli import main
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.throttle_model import ShardLimits
from shardherd.shared.aws import make_client
from tests.docs.test_citations import ROOT
from tests.support.stores import unique_app
from tests.support.stream_stack import active_stream

QUARANTINED = 120


def quarantine(root: Path, count: int, stream: str) -> list[Quarantined]:
    destination = FileDestination(root.as_uri(), root)
    records = [Quarantined(stream, f"shardId-00000000000{index % 2}", str(10**20 + index), index % 3,
                           f"pk-{index}", None, base64.b64encode(f"poison-{index}".encode()).decode(), None,
                           "ValueError: bad", 3, "agent-1", datetime.now(UTC).isoformat())
               for index in range(count)]
    for record in records:
        destination.put(record)
    return records


def read_all(kinesis: Any, stream: str) -> list[tuple[bytes, str]]:
    found: list[tuple[bytes, str]] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while True:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            found.extend((record["Data"], record["PartitionKey"]) for record in page["Records"])
            if not page["Records"]:
                return found
            iterator = page["NextShardIterator"]
    return found


def test_replay_puts_every_record_back_once_through_throttling_and_empties_the_destination(
        kinesalite: NodeEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """About 3 s: 120 records into a shard that takes 50 a second."""
    records = quarantine(tmp_path, QUARANTINED, "the-original-stream")
    with KinesisLimits(kinesalite.port, limits=ShardLimits(write_records_per_second=50)) as limits:
        monkeypatch.setenv("SHARDHERD_KINESIS_ENDPOINT_URL", limits.endpoint_url)
        kinesis = make_client("kinesis", "us-east-1", limits.endpoint_url)
        target = unique_app("replayed")
        active_stream(kinesis, target, 1)
        assert main(["dlq", "replay", tmp_path.as_uri(), "--to-stream", target, "--dry-run"]) == 0
        assert f"would put {QUARANTINED} records back into {target}" in capsys.readouterr().out
        assert read_all(kinesis, target) == [] and len(list(tmp_path.glob("*/*/*.json"))) == QUARANTINED

        assert main(["dlq", "replay", tmp_path.as_uri(), "--to-stream", target]) == 0
        throttled = limits.counts()["shards"][f"{target}/shardId-000000000000"]["WriteProvisionedThroughputExceeded"]
        put = read_all(kinesis, target)
    assert throttled > 0  # some puts were refused per record, and put again
    assert Counter(put) == Counter((record.payload, record.partition_key) for record in records)
    assert set(Counter(put).values()) == {1}
    assert list(tmp_path.glob("*/*/*.json")) == []
    assert f"replayed {QUARANTINED} records" in capsys.readouterr().out


def test_list_shows_each_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = quarantine(tmp_path, 3, "orders")
    assert main(["dlq", "list", tmp_path.as_uri()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(records) + 1 and lines[-1].startswith(f"{len(records)} quarantined records")
    for record in records:
        assert any(f"{record.sequence_number}/{record.sub_sequence_number} key={record.partition_key}" in line
                   for line in lines)


@pytest.mark.parametrize("args", [["dlq", "list", "ftp://host/dir"], ["dlq", "list", "file://relative/dir"],
                                  ["dlq", "replay", "s3:///no-bucket"], ["dlq", "replay", "file:///no/such/dir"]])
def test_bad_input_is_one_line_and_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and captured.err.startswith("shardherd: ")


def test_the_documented_dlq_commands_list_and_put_back_the_records(kinesalite: NodeEmulator, tmp_path: Path) -> None:
    """examples/dlq.sh (shown in docs/decisions/0031-operator-controls.md), run as written by the shell."""
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    stream = unique_app("documented")
    active_stream(kinesis, stream, 1)
    dead = tmp_path / "dead"
    dead.mkdir()
    records = quarantine(dead, 5, stream)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SHARDHERD_", "AWS_"))}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]), PYTHONPATH=str(ROOT),
               DLQ_URL=dead.as_uri(), SHARDHERD_KINESIS_ENDPOINT_URL=kinesalite.endpoint_url)
    done = subprocess.run(["bash", str(ROOT / "examples" / "dlq.sh")], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"{len(records)} quarantined records in {dead.as_uri()}" in done.stdout
    assert f"would put {len(records)} records back into {stream}" in done.stdout
    assert f"replayed {len(records)} records" in done.stdout
    assert Counter(read_all(kinesis, stream)) == Counter((record.payload, record.partition_key) for record in records)
    assert list(dead.glob("*/*/*.json")) == []
