"""One tested PySpark range everywhere: the spark extra's floor is the PySpark the tests run on, and the agent image
and the example SparkApplication pin that same version."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _floor() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    requirement = next(item for item in extra if item.startswith("pyspark"))
    match = re.fullmatch(r"pyspark>=([0-9.]+),<5", requirement)
    assert match, requirement
    return match.group(1)


def test_the_tests_run_on_the_spark_floor_and_the_image_and_examples_pin_it() -> None:
    pyspark = pytest.importorskip("pyspark")
    floor = _floor()
    assert pyspark.__version__ == floor  # the floor is what these tests exercise, no older release
    dockerfile = (ROOT / "Dockerfile.agent").read_text()
    assert re.search(rf"^ARG PYSPARK_VERSION={re.escape(floor)}$", dockerfile, re.MULTILINE)
    application = (ROOT / "helm/examples/spark-application.yaml").read_text()
    assert f'sparkVersion: "{floor}"' in application
