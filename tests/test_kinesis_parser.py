"""shared/kinesis_parser.py: GetRecords bodies parse to what botocore's own walk makes of them, and clients built by
shared/aws.py read the same records as a plain boto3 client from a real emulator."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import botocore.session
import pytest
from botocore.model import Shape
from botocore.parsers import ResponseParserFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.shared.aws import make_client, utc_timestamp
from shardherd.shared.kinesis_parser import KinesisParserFactory
from tests.coordinator.conftest import kinesalite, kinesis_client  # noqa: F401

OUTPUT: Shape = botocore.session.get_session().get_service_model("kinesis").operation_model(
    "GetRecords").output_shape  # type: ignore[assignment]  # GetRecords has an output
HEADERS = {"x-amzn-RequestId": "r-1", "Content-Type": "application/x-amz-json-1.1"}


def both(body: bytes, status: int = 200) -> tuple[Any, Any]:
    """The body parsed by botocore's JSON parser and by the Kinesis one (the same timestamp parser for both)."""
    response = {"status_code": status, "headers": HEADERS, "body": body}
    parsed = []
    for factory in (ResponseParserFactory(), KinesisParserFactory()):
        factory.set_parser_defaults(timestamp_parser=utc_timestamp)
        parsed.append(factory.create_parser("json").parse(dict(response), OUTPUT))
    return parsed[0], parsed[1]


record_items = st.fixed_dictionaries(
    {"SequenceNumber": st.from_regex(r"[0-9]{1,56}", fullmatch=True),
     "Data": st.binary(max_size=64).map(lambda data: base64.b64encode(data).decode()),
     "PartitionKey": st.text(min_size=1, max_size=20)},
    optional={"ApproximateArrivalTimestamp": st.one_of(st.integers(0, 2**33), st.floats(0, 2**33), st.none()),
              "EncryptionType": st.sampled_from(["NONE", "KMS", None]),
              "Unmodelled": st.just("dropped by both")})


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.one_of(record_items, st.none()), max_size=8), st.one_of(st.none(), st.integers(0, 10**6)))
def test_records_parse_as_botocore_parses_them(records: list[dict[str, Any] | None], lag: int | None) -> None:
    body = json.dumps({"Records": records, "NextShardIterator": "AAAA", "MillisBehindLatest": lag}).encode()
    expected, parsed = both(body)
    assert parsed == expected
    for record in parsed["Records"]:
        if record is not None:
            assert isinstance(record["Data"], bytes) and "Unmodelled" not in record


def test_timestamps_and_binary_data_keep_their_types_and_values() -> None:
    body = json.dumps({"Records": [{"SequenceNumber": "7", "Data": base64.b64encode(b"\xf3\x00\xff").decode(),
                                    "PartitionKey": "k\u00e9", "ApproximateArrivalTimestamp": 1_700_000_000.25}],
                       "NextShardIterator": "AAAA", "MillisBehindLatest": 0}).encode()
    expected, parsed = both(body)
    assert parsed == expected
    record = parsed["Records"][0]
    assert record["Data"] == b"\xf3\x00\xff" and record["PartitionKey"] == "k\u00e9"
    assert record["ApproximateArrivalTimestamp"] == datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)


def test_errors_parse_as_botocore_parses_them() -> None:
    body = json.dumps({"__type": "ExpiredIteratorException", "message": "Iterator expired"}).encode()
    expected, parsed = both(body, status=400)
    assert parsed == expected
    assert parsed["Error"]["Code"] == "ExpiredIteratorException"


def test_a_client_reads_what_a_plain_boto3_client_reads(kinesalite: NodeEmulator) -> None:  # noqa: F811
    plain = kinesis_client(kinesalite.endpoint_url)
    ours = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    plain.create_stream(StreamName="parser-1", ShardCount=1)
    plain.get_waiter("stream_exists").wait(StreamName="parser-1", WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    sent = [bytes([index]) * index for index in range(1, 40)] + [b"\xf3\x89\x9a\xc2"]
    plain.put_records(StreamName="parser-1", Records=[{"Data": data, "PartitionKey": f"k{index}"}
                                                      for index, data in enumerate(sent)])
    shard = plain.list_shards(StreamName="parser-1")["Shards"][0]["ShardId"]

    def read(client: Any) -> list[dict[str, Any]]:
        iterator = client.get_shard_iterator(StreamName="parser-1", ShardId=shard,
                                             ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records: list[dict[str, Any]] = client.get_records(ShardIterator=iterator)["Records"]
        return records

    theirs, mine = read(plain), read(ours)
    assert [record["Data"] for record in mine] == sent
    assert mine == theirs  # arrival times: the same instants (ours in UTC, botocore's in the local zone)
    assert all(record["ApproximateArrivalTimestamp"].tzinfo is UTC for record in mine)


@pytest.mark.parametrize("service", ["dynamodb", "sts"])
def test_other_services_keep_botocores_parsers(service: str) -> None:
    client = make_client(service, "us-east-1", "http://127.0.0.1:9")
    assert not isinstance(client._endpoint._response_parser_factory, KinesisParserFactory)
