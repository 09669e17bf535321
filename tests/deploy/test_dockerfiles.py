from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dockerfile  # type: ignore[import-not-found]  # a C extension without stubs
import pytest

from tests.deploy.rendering import REPO
from tests.support.tools import installed_tool

IMAGES = ["Dockerfile.coordinator", "Dockerfile.agent"]
BUILD_TOOLS = ("gcc", "build-essential", "make ", "apt-get install")


def _stages(name: str) -> list[list[dockerfile.Command]]:
    """The instructions of each build stage (global ARGs before the first FROM dropped)."""
    stages: list[list[dockerfile.Command]] = []
    for command in dockerfile.parse_file(str(REPO / name)):
        if command.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(command)
    return stages


def _final(name: str) -> list[dockerfile.Command]:
    return _stages(name)[-1]


def _one(stage: list[dockerfile.Command], cmd: str) -> dockerfile.Command:
    found = [c for c in stage if c.cmd == cmd]
    assert len(found) == 1, f"expected one {cmd}, got {len(found)}"
    return found[0]


@pytest.mark.parametrize("name", IMAGES)
def test_hadolint_is_clean(name: str) -> None:
    result = subprocess.run(
        [str(installed_tool("hadolint")), "--no-color", "--format", "json", str(REPO / name)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=30,
    )
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", IMAGES)
def test_multi_stage_with_a_named_runtime_stage_built_from_copies(name: str) -> None:
    stages = _stages(name)
    assert len(stages) >= 2
    aliases = [stage[0].value[-1] for stage in stages]
    assert aliases[-1] == "runtime" and "build" in aliases
    final = stages[-1]
    flags = [flag for c in final if c.cmd == "COPY" for flag in c.flags]
    copies_from = {flag.removeprefix("--from=") for flag in flags if flag.startswith("--from=")}
    assert "build" in copies_from
    runs = " ".join(" ".join(c.value) for c in final if c.cmd == "RUN")
    assert not [tool for tool in BUILD_TOOLS if tool in runs]
    assert "pip install" not in runs


@pytest.mark.parametrize("name", IMAGES)
def test_base_images_are_pinned_slim_versions(name: str) -> None:
    args = [c.value[0] for c in dockerfile.parse_file(str(REPO / name)) if c.cmd == "ARG" and "_IMAGE=" in c.value[0]]
    assert args
    for arg in args:
        image = arg.split("=", 1)[1]
        tag = image.split(":", 1)[1]
        assert tag not in {"latest", ""} and any(ch.isdigit() for ch in tag.split("-")[0]), image


@pytest.mark.parametrize("name", IMAGES)
def test_runs_as_a_numeric_non_root_user_with_an_exec_form_entrypoint(name: str) -> None:
    final = _final(name)
    user = [c for c in final if c.cmd == "USER"][-1].value[0]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0
    entrypoint = _one(final, "ENTRYPOINT")
    assert entrypoint.json, "ENTRYPOINT must be exec form so signals reach the process"
    assert final.index(entrypoint) > final.index([c for c in final if c.cmd == "USER"][-1])


def test_coordinator_runs_the_service_with_a_healthcheck_on_healthz() -> None:
    final = _final("Dockerfile.coordinator")
    assert _one(final, "ENTRYPOINT").value == ("shardherd",)
    cmd = _one(final, "CMD")
    assert cmd.json and cmd.value == ("coordinator",)
    healthcheck = _one(final, "HEALTHCHECK")
    assert healthcheck.value[0] == "CMD"
    assert "/healthz" in " ".join(healthcheck.value) and "127.0.0.1" in " ".join(healthcheck.value)
    assert "8080" in [v for c in final if c.cmd == "EXPOSE" for v in c.value]
    env = " ".join(" ".join(c.value) for c in final if c.cmd == "ENV")
    assert "PYTHONDONTWRITEBYTECODE" in env


def test_agent_image_has_java_pyspark_and_the_python_for_executors() -> None:
    stages = _stages("Dockerfile.agent")
    final = stages[-1]
    env = dict(zip(*[iter(v for c in final if c.cmd == "ENV" for v in c.value)] * 2, strict=True))
    assert env["JAVA_HOME"] == "/opt/java/openjdk"
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == "/opt/shardherd/bin/python"
    assert env["SPARK_HOME"].startswith("/opt/shardherd/lib/python3.11/site-packages/")
    jre = next(stage for stage in stages if stage[0].value[-1] == "jre")
    commands = dockerfile.parse_file(str(REPO / "Dockerfile.agent"))
    assert ":17." in next(c.value[0] for c in commands if c.cmd == "ARG" and c.value[0].startswith("JRE_IMAGE="))
    assert jre[0].value[0] == "${JRE_IMAGE}"
    build_runs = " ".join(" ".join(c.value) for stage in stages if stage[0].value[-1] == "build" for c in stage)
    assert ".[spark]" in build_runs and "pyspark==" in build_runs


def test_agent_entrypoint_script_is_valid_bash_and_in_the_build_context() -> None:
    script = REPO / "deploy" / "spark-entrypoint.sh"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False, timeout=10)
    assert usage.returncode == 64 and "usage" in usage.stderr
    passthrough = subprocess.run(["bash", str(script), "echo", "ran"], capture_output=True, text=True, timeout=10)
    assert passthrough.stdout == "ran\n"
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert ignore[ignore.index("*") :].count("!deploy/spark-entrypoint.sh") == 1
    for source in ("shared/", "coordinator/", "agent/", "services/", "pyproject.toml"):
        assert f"!{source}" in ignore


def test_executor_command_passes_spark_settings_in_order(tmp_path: Path) -> None:
    java_home = tmp_path / "java"
    (java_home / "bin").mkdir(parents=True)
    fake_java = java_home / "bin" / "java"
    fake_java.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n', encoding="utf-8")
    fake_java.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "JAVA_HOME": str(java_home),
        "SPARK_HOME": "/spark",
        "SPARK_JAVA_OPT_0": "-Dfirst=1",
        "SPARK_JAVA_OPT_1": "-Dsecond=a b",
        "SPARK_EXECUTOR_MEMORY": "2g",
        "SPARK_DRIVER_URL": "spark://driver:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "app-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_EXECUTOR_POD_NAME": "exec-3",
    }
    script = REPO / "deploy" / "spark-entrypoint.sh"
    result = subprocess.run(["bash", str(script), "executor"], env=env, capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    args = result.stdout.splitlines()
    assert args[:4] == ["-Dfirst=1", "-Dsecond=a b", "-Xms2g", "-Xmx2g"]
    assert args[args.index("-cp") + 1] == "/spark/jars/*"
    assert args[args.index("--executor-id") + 1] == "3"
    assert args[args.index("--resourceProfileId") + 1] == "0"
