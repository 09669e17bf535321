from __future__ import annotations

import json
import math
from typing import Any

import pytest

from shardherd.shared.config import Settings
from tests.deploy.rendering import CHART, CHART_MANAGED, helm, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
CONFIG_SCHEMA = SCHEMA["$defs"]["settings"]["properties"]


@pytest.mark.parametrize(
    ("values", "where", "why"),
    [
        ({"coordinator": {"replicaCount": 0}}, "/coordinator/replicaCount", "minimum"),
        ({"podSecurityContext": {"runAsUser": 0, "runAsGroup": 10001}}, "/podSecurityContext/runAsUser", "minimum"),
        ({"coordinator": {"port": 80}}, "/coordinator/port", "minimum"),
        ({"config": {"failover_time_millis": 50}}, "/config/failover_time_millis", "minimum"),
        ({"config": {"failover_time_millis": "10s"}}, "/config/failover_time_millis", "integer"),
        ({"config": {"lease_assignment_strategy": "random"}}, "/config/lease_assignment_strategy", "variance"),
        ({"config": {"application_name": "a b"}}, "/config/application_name", "pattern"),
        ({"config": {"failoverTimeMillis": 10000}}, "/config", "failoverTimeMillis"),
        ({"config": {"worker_id": "pod-0"}}, "/config", "worker_id"),
        ({"agent": {"config": {"dampening_percentage": 101}}}, "/agent/config/dampening_percentage", "maximum"),
        ({"serviceAccount": {"roleArn": "arn:aws:iam::12345:role/x"}}, "/serviceAccount/roleArn", "pattern"),
        ({"image": {"repository": "r", "digest": "latest"}}, "/image/digest", "pattern"),
        ({"networkPolicy": {"allowedClients": []}}, "/networkPolicy/allowedClients", "minItems"),
        ({"replicas": 3}, "", "replicas"),
    ],
    ids=lambda case: case if isinstance(case, str) else None,
)
def test_bad_values_fail_with_a_message_naming_the_key(values: dict[str, Any], where: str, why: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    message = str(caught.value)
    assert f"at '{where}'" in message, message
    assert why in message, message


def test_config_schema_lists_exactly_the_settings_fields() -> None:
    assert set(CONFIG_SCHEMA) == set(Settings.model_fields) - CHART_MANAGED


@pytest.mark.parametrize("name", sorted(set(Settings.model_fields) - CHART_MANAGED))
def test_config_schema_constraints_match_settings(name: str) -> None:
    """The chart must accept what Settings accepts and reject what it rejects, field by field."""
    model = Settings.model_json_schema()["properties"][name]
    variants = model.get("anyOf", [model])
    expected = next(v for v in variants if v.get("type") != "null")
    chart = CONFIG_SCHEMA[name]
    types = chart["type"] if isinstance(chart["type"], list) else [chart["type"]]
    assert types[0] == expected["type"]
    assert ("null" in types) == (len(variants) > 1)
    for key in ("pattern", "minimum", "exclusiveMinimum", "format"):
        assert chart.get(key) == expected.get(key), key
    if "maximum" in expected:
        assert chart["maximum"] == expected["maximum"]
    if "enum" in expected:
        assert [v for v in chart["enum"] if v is not None] == expected["enum"]


def test_values_defaults_equal_the_settings_defaults() -> None:
    """values.yaml repeats some defaults for discoverability; they must not drift from shared/config.py."""
    with helm.Chart.load(CHART) as chart:
        config = chart.values["config"]
    assert config
    for name, value in config.items():
        default = Settings.model_fields[name].default
        assert value == default or (isinstance(default, float) and math.isclose(value, default)), name
