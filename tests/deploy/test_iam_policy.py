from __future__ import annotations

import json
from string import Template
from typing import Any

from shardherd.shared.store import TableNames
from tests.deploy.rendering import REPO

POLICY = REPO / "deploy" / "iam-policy.json"
PLACES = {"REGION": "eu-west-1", "ACCOUNT_ID": "123456789012", "APPLICATION_NAME": "orders", "STREAM_NAME": "orders-s"}
RUNTIME_DYNAMODB = {
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Scan",
    "dynamodb:Query",
    "dynamodb:ConditionCheckItem",
}
KINESIS_READ = {"kinesis:ListShards", "kinesis:DescribeStreamSummary", "kinesis:GetShardIterator", "kinesis:GetRecords"}


def _policy() -> dict[str, Any]:
    text = Template(POLICY.read_text(encoding="utf-8")).substitute(PLACES)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _by_sid() -> dict[str, dict[str, Any]]:
    return {statement["Sid"]: statement for statement in _policy()["Statement"]}


def test_only_allow_statements_with_explicit_actions_and_resources() -> None:
    policy = _policy()
    assert policy["Version"] == "2012-10-17"
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert not [a for a in statement["Action"] if "*" in a]
        assert not [r for r in statement["Resource"] if r.endswith("*") or r == "*"]


def test_exactly_the_runtime_actions_on_the_three_tables_and_the_index() -> None:
    statements = [s for sid, s in _by_sid().items() if sid != "OptionalCreateTables"]
    dynamodb = {a for s in statements for a in s["Action"] if a.startswith("dynamodb:")}
    kinesis = {a for s in statements for a in s["Action"] if a.startswith("kinesis:")}
    assert dynamodb == RUNTIME_DYNAMODB
    assert kinesis == KINESIS_READ
    names = TableNames.for_application(PLACES["APPLICATION_NAME"])
    table_arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/{}".format
    tables = {table_arn(names.leases), table_arn(names.worker_metrics), table_arn(names.coordinator_state)}
    for statement in statements:
        resources = set(statement["Resource"])
        if "dynamodb:Query" in statement["Action"]:
            assert statement["Action"] == ["dynamodb:Query"]
            assert resources == {table_arn(names.leases) + "/index/LeaseOwnerToLeaseKeyIndex"}
        elif statement["Action"][0].startswith("dynamodb:"):
            assert resources == tables
        else:
            assert resources == {"arn:aws:kinesis:eu-west-1:123456789012:stream/orders-s"}


def test_table_creation_is_a_separate_optional_statement() -> None:
    optional = _by_sid()["OptionalCreateTables"]
    assert set(optional["Action"]) == {"dynamodb:CreateTable", "dynamodb:UpdateTable"}
    others = [s for sid, s in _by_sid().items() if sid != "OptionalCreateTables"]
    assert not [a for s in others for a in s["Action"] if a in {"dynamodb:CreateTable", "dynamodb:UpdateTable"}]
