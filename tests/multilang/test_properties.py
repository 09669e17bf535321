"""The MultiLangDaemon properties file: Java Properties syntax, mapped keys, ignored keys, refused keys."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardherd.agent.multilang.properties import build_config, load_multilang_config, parse_properties
from shardherd.services.multilang_service import read_limits
from shardherd.shared.errors import ConfigError

BASE = {"executableName": "app.py", "streamName": "s", "applicationName": "a",
        "AWSCredentialsProvider": "DefaultCredentialsProvider"}


def test_java_properties_syntax() -> None:
    text = "# comment\n! other\n  a = 1\nb:2\nc 3\nd = one \\\n    two\ne = tab\\tx\\u0041\nf\n"
    assert parse_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "one two", "e": "tab\txA", "f": ""}


def test_mapped_keys(tmp_path: Path) -> None:
    path = tmp_path / "app.properties"
    path.write_text("executableName = python3 -u my app.py\nstreamArn = arn:aws:kinesis:us-east-5:000000000000:"
                    "stream/fromarn\nstreamName = ignored\napplicationName = app\nAwsCredentialsProvider = "
                    "ProfileCredentialsProvider|dev\nregionName = eu-west-1\ninitialPositionInStreamExtended = "
                    "1636609142\nmaxRecords = 500\nidleTimeBetweenReadsInMillis = 250\n"
                    "callProcessRecordsEvenForEmptyRecordList = true\nfailoverTimeMillis = 7000\n"
                    "shutdownGraceMillis = 9000\ntimeoutInSeconds = 30\nmetricsLevel = NONE\n")
    config = load_multilang_config(path)
    assert config.command == ("python3", "-u", "my", "app.py")
    assert config.workdir == tmp_path
    assert config.settings == {
        "stream_name": "fromarn", "application_name": "app", "region": "eu-west-1",
        "initial_position_in_stream": "AT_TIMESTAMP",
        "initial_timestamp": datetime.fromtimestamp(1636609142, UTC), "failover_time_millis": "7000"}
    assert config.profile == "dev"
    assert (config.call_process_records_for_empty, config.shutdown_grace_millis, config.timeout_seconds) == (
        True, 9000, 30.0)
    limits = read_limits(config)
    assert (limits.records_per_call, limits.min_call_interval, limits.idle_backoff) == (500, 0.25, 0.25)
    assert "metricsLevel" in config.ignored


def test_unknown_unsupported_and_missing_keys_are_named_with_the_reason() -> None:
    with pytest.raises(ConfigError) as error:
        build_config({**BASE, "streamNmae": "typo", "dynamoDBRegionName": "us-west-2",
                      "AWSCredentialsProvider": "KclStsAssumeRoleCredentialsProvider|arn|name",
                      "retrievalMode": "FANOUT", "maxRecords": "-1"}, Path("."))
    message = str(error.value)
    assert "streamNmae: unknown key" in message
    assert "dynamoDBRegionName: not supported: shardherd uses regionName" in message
    assert "KclStsAssumeRoleCredentialsProvider is not supported" in message
    assert "retrievalMode: FANOUT is not supported" in message
    assert "maxRecords: must be >= 0" in message
    with pytest.raises(ConfigError, match=r"executableName is required.*\n.*applicationName is required"):
        build_config({"streamName": "s", "AWSCredentialsProvider": "DefaultCredentialsProvider"}, Path("."))
