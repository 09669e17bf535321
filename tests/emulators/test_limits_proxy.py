"""The limits proxy over HTTP with boto3: AWS's error shapes, per-record PutRecords throttling, the 10 MiB cut.

One proxy process per test in front of the session's kinesalite; each test takes about a second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.throttle_model import ShardLimits
from tests.support.stores import unique_app
from tests.support.stream_stack import active_stream

SHARD = "shardId-000000000000"


def client(endpoint: str, access_key: str) -> Any:
    """A boto3 Kinesis client without botocore retries, known to the proxy by `access_key`."""
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access_key,
                        aws_secret_access_key="secret", config=Config(retries={"total_max_attempts": 1}))


@pytest.fixture
def limits(kinesalite: NodeEmulator) -> Iterator[KinesisLimits]:
    """The proxy with AWS's limits, except answers cut at 4 KiB and 200 records/s of writes (quick to reach)."""
    shrunk = ShardLimits(max_response_bytes=4096, write_records_per_second=200)
    with KinesisLimits(kinesalite.port, limits=shrunk) as proxy:
        yield proxy


def test_reads_are_throttled_per_shard_across_callers_with_aws_error(limits: KinesisLimits) -> None:
    spark, kcl = client(limits.endpoint_url, "spark-app"), client(limits.endpoint_url, "kcl-app")
    stream = unique_app("limits")
    active_stream(spark, stream, 1)
    iterator = spark.get_shard_iterator(StreamName=stream, ShardId=SHARD,
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    made = {"spark-app": 0, "kcl-app": 0}
    refused = {"spark-app": 0, "kcl-app": 0}
    error: Any = None
    for _ in range(3):  # six calls at once exceed 5 per second (a slow machine may spread them: try again)
        time.sleep(1.0)
        for name, caller in [("spark-app", spark), ("kcl-app", kcl)] * 3:
            try:
                iterator = caller.get_records(ShardIterator=iterator)["NextShardIterator"]
                made[name] += 1
            except ClientError as exc:
                error = exc.response
                refused[name] += 1
        if error is not None:
            break
    assert error is not None, "six GetRecords calls in a row were never throttled"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert error["Error"]["Message"] == f"Rate exceeded for Shard - 000000000000/{stream}/{SHARD}"
    counts = limits.counts()
    pair = {row["caller"]: row for row in counts["by_shard_and_caller"] if row["stream"] == stream}
    for name in made:  # both callers draw on the shard's one budget, and each is counted on its own
        assert pair[name].get("GetRecords.Success", 0) == made[name]
        assert pair[name].get("ReadProvisionedThroughputExceeded", 0) == refused[name]
    assert counts["shards"][f"{stream}/{SHARD}"]["GetShardIterator.Success"] == 1


def test_writes_over_the_limit_fail_per_record_and_put_record_fails_whole(limits: KinesisLimits) -> None:
    producer = client(limits.endpoint_url, "producer")
    stream = unique_app("limits")
    active_stream(producer, stream, 2)
    records = [{"Data": b"x" * 100, "PartitionKey": f"key-{index}"} for index in range(500)]
    answers = [producer.put_records(StreamName=stream, Records=records)]
    failed = [entry for answer in answers for entry in answer["Records"] if "ErrorCode" in entry]
    assert sum(answer["FailedRecordCount"] for answer in answers) == len(failed) > 0
    assert {entry["ErrorCode"] for entry in failed} == {"ProvisionedThroughputExceededException"}
    assert all(entry["ErrorMessage"].startswith("Rate exceeded for shard shardId-") and
               entry["ErrorMessage"].endswith(f" in stream {stream} under account 000000000000.") for entry in failed)
    written = sum(1 for answer in answers for entry in answer["Records"] if "SequenceNumber" in entry)
    assert 0 < written <= 400  # at most 200 records per shard in any second
    counts = limits.counts()["callers"]["producer"]
    assert counts["WriteProvisionedThroughputExceeded"] == len(failed)
    assert counts["IncomingRecords"] == written
    # PutRecord fails whole: right after a PutRecords that filled one shard's second (retried: a slow machine may
    # let the second pass between the two calls).
    same_shard = [{"Data": b"y", "PartitionKey": "hot"}] * 300
    error: Any = None
    for _ in range(3):
        time.sleep(1.0)
        producer.put_records(StreamName=stream, Records=same_shard)
        try:
            producer.put_record(StreamName=stream, Data=b"x", PartitionKey="hot")
        except ClientError as exc:
            error = exc.response
            break
    else:
        pytest.fail("PutRecord was never throttled right after its shard's limit was reached")
    assert error["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Message"].startswith("Rate exceeded for shard shardId-00000000000")
    listed = producer.describe_stream_summary(StreamName=stream)  # calls the proxy does not model pass through
    assert listed["StreamDescriptionSummary"]["OpenShardCount"] == 2


def test_an_answer_is_cut_at_the_byte_cap_and_the_next_iterator_goes_on_from_there(limits: KinesisLimits) -> None:
    kinesis = client(limits.endpoint_url, "reader")
    stream = unique_app("limits")
    active_stream(kinesis, stream, 1)
    sent = [f"{index:04d}".encode() * 250 for index in range(10)]  # 1,000 bytes each: 4 per 4 KiB answer
    kinesis.put_records(StreamName=stream, Records=[{"Data": data, "PartitionKey": "k"} for data in sent])
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    pages = []
    while True:
        answer = kinesis.get_records(ShardIterator=iterator)
        pages.append(([record["Data"] for record in answer["Records"]], answer["MillisBehindLatest"]))
        iterator = answer["NextShardIterator"]
        if not answer["Records"]:
            break
        time.sleep(0.25)  # within 5 calls per second
    assert [len(page) for page, _ in pages] == [4, 4, 2, 0]
    assert [data for page, _ in pages for data in page] == sent
    assert pages[0][1] > 0 and pages[2][1] == 0  # a cut page is behind the tip, the last one is not
    assert limits.counts()["callers"]["reader"]["GetRecords.Bytes"] == 10_000
