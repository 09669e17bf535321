from __future__ import annotations

import base64
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed
import pytest
from pydantic import SecretStr

from shardherd.shared.config import Settings, load_settings
from tests.deploy.rendering import (
    CHART,
    CHART_MANAGED,
    EXAMPLES,
    KUBERNETES_VERSION,
    NAMESPACE,
    VALUES_DIR,
    Manifest,
    containers,
    helm,
    manifests,
    named,
    only,
    render,
    values_file,
)

VALUES_FILES = [*sorted(VALUES_DIR.glob("*.yaml")), EXAMPLES / "values-eks.yaml"]
# Custom resources have no schema in kubernetes-validate; they are checked field by field below instead.
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def _cases() -> list[Any]:
    return [pytest.param(None, id="defaults")] + [pytest.param(path, id=path.stem) for path in VALUES_FILES]


def _values(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else values_file(path)


def _toml(config_map: Manifest) -> dict[str, Any]:
    return tomllib.loads(config_map["data"]["shardherd.toml"])


@pytest.mark.parametrize("path", _cases())
def test_every_manifest_is_valid_kubernetes_strict(path: Path | None) -> None:
    objects = manifests(_values(path))
    assert objects
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("path", _cases())
def test_chart_lints_clean_in_strict_mode(path: Path | None) -> None:
    report = helm.lint(CHART, _values(path), strict=True, namespace=NAMESPACE, kube_version=f"v{KUBERNETES_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("path", _cases())
def test_coordinator_pods_are_hardened(path: Path | None) -> None:
    deployment = only(manifests(_values(path)), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in containers(deployment):
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["resources"]["limits"]["memory"]
        writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert writable == {"/tmp"}


def test_defaults_give_two_replicas_a_budget_a_policy_and_a_token_secret() -> None:
    objects = manifests()
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = only(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert pdb["spec"]["maxUnavailable"] == 1
    policy = only(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == selector
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert policy["spec"]["ingress"][0]["from"], "an ingress rule without sources would admit every pod"
    assert only(objects, "Service")["spec"]["selector"] == selector
    secret = only(objects, "Secret")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 32 and token.isalnum()
    assert not [obj for obj in objects if obj["kind"] == "ServiceMonitor"]


def test_api_token_reaches_the_container_only_as_a_mounted_secret_file() -> None:
    objects = manifests()
    deployment = only(objects, "Deployment")
    secret_name = only(objects, "Secret")["metadata"]["name"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (container,) = containers(deployment)
    env = {e["name"]: e for e in container["env"]}
    assert "SHARDHERD_API_TOKEN" not in env
    token_file = Path(env["SHARDHERD_API_TOKEN_FILE"]["value"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(token_file.parent))
    assert volumes[mount["name"]]["secret"]["secretName"] == secret_name
    assert volumes[mount["name"]]["secret"]["items"] == [{"key": "token", "path": token_file.name}]
    assert env["SHARDHERD_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_existing_secret_is_used_and_none_is_created() -> None:
    objects = manifests(values_file(VALUES_DIR / "minimal-single.yaml"))
    assert not [obj for obj in objects if obj["kind"] in {"Secret", "PodDisruptionBudget", "NetworkPolicy"}]
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["api-token"]["secret"]["secretName"] == "shardherd-ops-token"
    (container,) = containers(deployment)
    assert container["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "shared-irsa"


def test_irsa_role_annotation_and_service_monitor() -> None:
    objects = manifests(values_file(EXAMPLES / "values-eks.yaml"))
    account = only(objects, "ServiceAccount")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == (
        "arn:aws:iam::123456789012:role/shardherd-orders-consumer"
    )
    assert only(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    monitor = only(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    service_labels = only(objects, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    agent_maps = [obj for obj in objects if obj["metadata"].get("name", "").endswith("-agent")]
    assert [obj["metadata"]["namespace"] for obj in agent_maps] == ["spark-jobs"]


@pytest.mark.parametrize("path", _cases())
def test_rendered_config_is_accepted_by_settings(path: Path | None) -> None:
    values = _values(path)
    objects = manifests(values)
    coordinator_toml = _toml(named(objects, "ConfigMap", f"{only(objects, 'Deployment')['metadata']['name']}-config"))
    settings = Settings(**coordinator_toml["shardherd"], worker_id="pod-0")
    expected = {**helm.Chart.load(CHART).values["config"], **((values or {}).get("config") or {})}
    for name, value in expected.items():
        actual = getattr(settings, name)
        if isinstance(actual, SecretStr):
            actual = actual.get_secret_value()
        if name == "initial_timestamp":
            actual = actual.isoformat().replace("+00:00", "Z")
        if name == "streams":  # each stream as the values wrote it (timestamps as ISO text, unset parts left out)
            actual = [{key: item.isoformat() if isinstance(item, datetime) else item
                       for key, item in spec.model_dump().items() if item is not None} for spec in actual]
        assert actual == value, name


def test_every_setting_survives_the_toml_round_trip_with_its_type() -> None:
    values = values_file(VALUES_DIR / "every-setting.yaml")
    config = _toml(named(manifests(values), "ConfigMap", "shardherd-config"))["shardherd"]
    assert set(config) == set(Settings.model_fields) - CHART_MANAGED - {"stream_name"}  # exclusive with streams
    assert config["streams"][0]["creation_epoch"] == 1700000000 and config["streams"][1] == {"name": "payments"}
    assert isinstance(config["max_leases_for_worker"], int) and config["max_leases_for_worker"] == 2**31 - 1
    assert isinstance(config["failover_time_millis"], int)
    assert config["max_throughput_per_host_kbps"] == 2048.5


def test_agent_config_maps_merge_agent_settings_and_point_at_the_service() -> None:
    values = {"agent": {"namespaces": ["spark-a", "spark-b"], "config": {"failover_time_millis": 30000}}}
    objects = manifests(values)
    service = only(objects, "Service")
    for namespace in ("spark-a", "spark-b"):
        agent = [o for o in objects if o["metadata"]["namespace"] == namespace]
        files = next(o for o in agent if "shardherd.toml" in o["data"])
        env = next(o for o in agent if "SHARDHERD_COORDINATOR_URL" in o["data"])
        assert _toml(files)["shardherd"]["failover_time_millis"] == 30000
        assert env["data"]["SHARDHERD_COORDINATOR_URL"] == (
            f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
        )
        assert env["data"]["SHARDHERD_CONFIG_FILE"] == "/etc/shardherd/shardherd.toml"
    coordinator = named(objects, "ConfigMap", "shardherd-config")
    assert _toml(coordinator)["shardherd"]["failover_time_millis"] == 10000


def test_config_change_rolls_the_pods() -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        annotations = only(manifests(values), "Deployment")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    assert checksum(None) != checksum({"config": {"stream_name": "other"}})


def test_notes_warn_about_missing_stream_and_role() -> None:
    notes = next(text for path, text in render().items() if path.endswith("NOTES.txt"))
    assert "config.stream_name is not set" in notes
    assert "serviceAccount.roleArn is empty" in notes
    configured = render(values_file(EXAMPLES / "values-eks.yaml"))
    assert "WARNING" not in next(text for path, text in configured.items() if path.endswith("NOTES.txt"))


def test_agents_get_a_health_port_for_the_driver_pods_liveness_probe() -> None:
    """Decision 0022: the agent env carries the port the driver pod template probes; null turns it off."""
    env = named(manifests(None), "ConfigMap", "shardherd-agent-env")["data"]
    assert env["SHARDHERD_AGENT_HEALTH_PORT"] == "8081" and env["SHARDHERD_AGENT_HEALTH_HOST"] == "0.0.0.0"
    settings = load_settings(agent_health_port=env["SHARDHERD_AGENT_HEALTH_PORT"], worker_id="driver-0")
    assert settings.agent_health_port == 8081
    off = named(manifests({"agent": {"healthPort": None}}), "ConfigMap", "shardherd-agent-env")["data"]
    assert "SHARDHERD_AGENT_HEALTH_PORT" not in off
