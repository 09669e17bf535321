from __future__ import annotations

import shutil
import subprocess
import sys

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

from tests.deploy.rendering import CHART, EXAMPLES, KUBERNETES_VERSION, RELEASE, REPO, manifests

YAMLLINT_CONFIG = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"
DRAIN = "/drain?wait="


def test_yaml_files_pass_yamllint() -> None:
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted(EXAMPLES.glob("*.yaml"))]
    files += sorted((REPO / "tests" / "deploy" / "values").glob("*.yaml"))
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-d", YAMLLINT_CONFIG, *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout


def test_driver_pod_template_is_a_valid_pod_that_uses_the_rendered_agent_objects() -> None:
    template = yaml.safe_load((EXAMPLES / "driver-pod-template.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)
    rendered = {obj["metadata"]["name"] for obj in manifests({"fullnameOverride": RELEASE})}
    (container,) = template["spec"]["containers"]
    assert {ref["configMapRef"]["name"] for ref in container["envFrom"]} <= rendered
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["shardherd-config"]["configMap"]["name"] in rendered
    assert volumes["shardherd-token"]["secret"]["secretName"] in rendered
    env = {e["name"]: e for e in container["env"]}
    assert env["SHARDHERD_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert DRAIN in " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert template["metadata"]["labels"]["shardherd.io/client"] == "true"
    # The agent's health endpoint (decision 0022): the probed port is the one the chart's agent env sets.
    (agent_env,) = [o for o in manifests({"fullnameOverride": RELEASE})
                    if o["metadata"]["name"] == f"{RELEASE}-agent-env"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and str(ports[probe["port"]]) == agent_env["data"]["SHARDHERD_AGENT_HEALTH_PORT"]


def test_spark_application_embeds_the_agent_like_the_pod_template() -> None:
    app = yaml.safe_load((EXAMPLES / "spark-application.yaml").read_text(encoding="utf-8"))
    template = yaml.safe_load((EXAMPLES / "driver-pod-template.yaml").read_text(encoding="utf-8"))
    (container,) = template["spec"]["containers"]
    driver = app["spec"]["driver"]
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2" and app["kind"] == "SparkApplication"
    assert driver["lifecycle"] == container["lifecycle"]
    assert driver["env"] == container["env"] and driver["envFrom"] == container["envFrom"]
    assert driver["labels"]["shardherd.io/client"] == "true"
    assert app["spec"]["sparkConf"]["spark.pyspark.python"] == "/opt/shardherd/bin/python"


def test_spark_submit_script_parses_and_uses_the_pod_template() -> None:
    script = EXAMPLES / "spark-submit.sh"
    bash = shutil.which("bash")
    assert bash
    subprocess.run([bash, "-n", str(script)], check=True, timeout=10)
    text = script.read_text(encoding="utf-8")
    assert "spark.kubernetes.driver.podTemplateFile=driver-pod-template.yaml" in text
    no_server = {"PATH": "/usr/bin:/bin"}
    missing = subprocess.run([bash, str(script)], capture_output=True, text=True, env=no_server, timeout=10)
    assert missing.returncode != 0 and "API_SERVER" in missing.stderr


def test_spark_drivers_mount_the_read_token_only() -> None:
    """The preStop drain asks the agent over loopback (tests/agent/test_self_drain.py runs it): no admin token."""
    for name in ("driver-pod-template.yaml", "spark-application.yaml"):
        text = (EXAMPLES / name).read_text(encoding="utf-8")
        assert "shardherd-api-read-token" in text and "SHARDHERD_API_READ_TOKEN_FILE" in text
        assert "shardherd-api-token" not in text and "SHARDHERD_API_TOKEN_FILE" not in text
