"""One tested PySpark range everywhere: the spark extra's floor is the PySpark the tests run on; the agent image, the
example SparkApplication and docs/spark.md state that same version, and the hadoop-aws the docs and the submit script
add matches the Hadoop jars of that PySpark."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANGE = re.compile(r"pyspark>=([0-9.]+),<5")


def _range() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    requirement: str = next(item for item in extra if item.startswith("pyspark"))
    assert RANGE.fullmatch(requirement), requirement
    return requirement


def _floor() -> str:
    match = RANGE.fullmatch(_range())
    assert match
    return match.group(1)


def test_the_tests_run_on_the_spark_floor_and_the_image_and_examples_pin_it() -> None:
    pyspark = pytest.importorskip("pyspark")
    floor = _floor()
    assert pyspark.__version__ == floor  # the floor is what these tests exercise, no older release
    dockerfile = (ROOT / "Dockerfile.agent").read_text()
    assert re.search(rf"^ARG PYSPARK_VERSION={re.escape(floor)}$", dockerfile, re.MULTILINE)
    application = (ROOT / "helm/examples/spark-application.yaml").read_text()
    assert f'sparkVersion: "{floor}"' in application


def test_the_docs_state_the_same_range_and_pins() -> None:
    floor = _floor()
    docs = re.sub(r"\s+", " ", (ROOT / "docs/spark.md").read_text())
    assert f"PySpark `{_range().removeprefix('pyspark')}`" in docs
    assert f"ARG PYSPARK_VERSION={floor}" in docs and f'sparkVersion: "{floor}"' in docs
    stated = set(re.findall(r"PySpark (\d+\.\d+\.\d+)", docs)) | set(re.findall(r"pyspark==(\d+\.\d+\.\d+)", docs))
    assert stated == {floor}, stated


def test_hadoop_aws_matches_the_hadoop_of_that_pyspark() -> None:
    pyspark = pytest.importorskip("pyspark")
    jars = [jar.name for jar in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")]
    assert len(jars) == 1, jars
    hadoop = jars[0].removeprefix("hadoop-client-api-").removesuffix(".jar")
    docs = (ROOT / "docs/spark.md").read_text()
    assert set(re.findall(r"hadoop-aws:(\d+\.\d+\.\d+)", docs)) == {hadoop}
    assert f"Hadoop {hadoop}" in docs and f"hadoop-client-api-{hadoop}.jar" in docs
    script = (ROOT / "helm/examples/spark-submit.sh").read_text()
    assert f'HADOOP_AWS_VERSION="${{HADOOP_AWS_VERSION:-{hadoop}}}"' in script
