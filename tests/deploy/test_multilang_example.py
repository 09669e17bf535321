"""helm/examples/multilang-deployment.yaml: valid objects, the chart's agent objects, a properties file shardherd
accepts, and the same drain hook as the Spark driver template."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

from shardherd.agent.multilang.properties import build_config, parse_properties
from tests.deploy.rendering import EXAMPLES, KUBERNETES_VERSION, RELEASE, manifests


def test_multilang_deployment_runs_shardherd_multilang_with_the_chart_objects() -> None:
    config_map, deployment = yaml.safe_load_all((EXAMPLES / "multilang-deployment.yaml").read_text(encoding="utf-8"))
    for obj in (config_map, deployment):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["shardherd", "multilang"] and "--no-coordinator" in command
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (name,) = config_map["data"]
    properties = Path(mounts["properties"]) / name
    assert str(properties) == command[command.index("--properties") + 1]
    config = build_config(parse_properties(config_map["data"]["app.properties"]), Path("/opt/app"))
    assert config.command[0] == "python3" and config.settings["stream_name"] == "orders"
    rendered = {obj["metadata"]["name"] for obj in manifests({"fullnameOverride": RELEASE})}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["shardherd-config"]["configMap"]["name"] in rendered
    assert {ref["configMapRef"]["name"] for ref in container["envFrom"]} <= rendered
    assert pod["metadata"]["labels"]["shardherd.io/client"] == "true"
    driver = yaml.safe_load((EXAMPLES / "driver-pod-template.yaml").read_text(encoding="utf-8"))
    assert container["lifecycle"] == driver["spec"]["containers"][0]["lifecycle"]  # tested there with a server
