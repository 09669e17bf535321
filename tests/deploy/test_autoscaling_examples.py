"""helm/examples/keda-scaledobject.yaml and hpa-external-metric.yaml: valid objects (the HPA by kubernetes-validate;
KEDA's objects against models written from KEDA's documented fields, tests/deploy/keda.py, as kubernetes-validate has
no CRDs) that ask what the coordinator serves: /v1/scale's `desired_workers` with the read token, the gauge
`shardherd_desired_workers`, on the chart's Service, for the MultiLang example's Deployment."""

from __future__ import annotations

from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency
from pydantic import ValidationError

from shardherd.coordinator.scale_model import ScaleFigure
from shardherd.services.api.metrics import leader_families
from shardherd.services.api.models import ScaleOut
from shardherd.services.api.scale import router
from shardherd.services.cli import build_parser
from shardherd.services.leader_status import LeaderStatus, ScaleRecord
from tests.deploy.keda import ScaledObject, TriggerAuthentication
from tests.deploy.rendering import EXAMPLES, KUBERNETES_VERSION, RELEASE, manifests


def _deployment() -> dict[str, object]:
    _, deployment = yaml.safe_load_all((EXAMPLES / "multilang-deployment.yaml").read_text(encoding="utf-8"))
    assert deployment["kind"] == "Deployment"
    return dict(deployment)


def test_the_keda_scaled_object_reads_desired_workers_from_v1_scale_with_the_read_token() -> None:
    auth, scaled = yaml.safe_load_all((EXAMPLES / "keda-scaledobject.yaml").read_text(encoding="utf-8"))
    TriggerAuthentication.model_validate(auth)
    ScaledObject.model_validate(scaled)
    assert scaled["spec"]["scaleTargetRef"]["name"] == _deployment()["metadata"]["name"]  # type: ignore[index]
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert meta["valueLocation"] in ScaleOut.model_fields and meta["format"] == "json"
    assert trigger["metricType"] == "AverageValue" and float(meta["targetValue"]) == 1.0  # replicas = the count
    assert urlsplit(meta["url"]).path in {route.path for route in router.routes}  # type: ignore[attr-defined]
    policies = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["policies"]
    assert policies == [{"type": "Pods", "value": 1, "periodSeconds": 60}]  # one drain at a time


def test_the_keda_trigger_asks_the_charts_service_with_the_charts_read_token() -> None:
    auth, scaled = yaml.safe_load_all((EXAMPLES / "keda-scaledobject.yaml").read_text(encoding="utf-8"))
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    url = urlsplit(meta["url"])
    objects = manifests({"fullnameOverride": RELEASE})
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert url.hostname == f"{service['metadata']['name']}.shardherd.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert meta["authMode"] == "bearer" and trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    (ref,) = auth["spec"]["secretTargetRef"]
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert ref["parameter"] == "token" and ref["name"] == f"{RELEASE}-api-read-token"
    assert ref["key"] in secrets[ref["name"]]["data"]
    assert auth["metadata"]["namespace"] == scaled["metadata"]["namespace"]


def test_the_keda_schema_rejects_what_keda_would() -> None:
    _, scaled = yaml.safe_load_all((EXAMPLES / "keda-scaledobject.yaml").read_text(encoding="utf-8"))
    for broken in ({**scaled, "spec": {**scaled["spec"], "maxReplicas": 4}},
                   {**scaled, "spec": {k: v for k, v in scaled["spec"].items() if k != "scaleTargetRef"}}):
        try:
            ScaledObject.model_validate(broken)
        except ValidationError:
            continue
        raise AssertionError("the schema accepted a broken ScaledObject")


def test_the_hpa_scales_the_same_deployment_on_the_desired_workers_gauge() -> None:
    hpa = yaml.safe_load((EXAMPLES / "hpa-external-metric.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
    deployment = _deployment()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (deployment["kind"], deployment["metadata"]["name"])  # type: ignore[index]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    status = LeaderStatus(epoch=1, leader_id="c", published_at=0.0, scale=ScaleRecord.of(
        ScaleFigure(3, 2, "w1", (), 10.0, 5.0), 0.0))
    served = {sample.name: sample.value for family in leader_families(status, True, 0.0, None)
              for sample in family.samples}
    assert served[metric["external"]["metric"]["name"]] == 3


def test_the_removal_marker_may_do_what_mark_removal_calls_on_the_scaled_deployments_pods() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "removal-marker.yaml").read_text(encoding="utf-8")))
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    kinds = {d["kind"]: d for d in documents}
    deployment, workers = kinds["Deployment"], _deployment()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser("mark-removal").parse_args(container["command"][1:])
    # The pods it marks are the scaled Deployment's, in its namespace (the MultiLang example names none: it is
    # applied in kclpy-apps, the namespace its comment and the ScaledObject's name).
    _, scaled = yaml.safe_load_all((EXAMPLES / "keda-scaledobject.yaml").read_text(encoding="utf-8"))
    assert args.namespace == scaled["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    key, value = args.selector.split("=")
    assert workers["spec"]["selector"]["matchLabels"] == {key: value}  # type: ignore[index]
    # The Role grants the two verbs the command uses (list, patch) on pods, bound to the pod's ServiceAccount.
    (rule,) = kinds["Role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}
    (subject,) = kinds["RoleBinding"]["subjects"]
    assert subject["name"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert kinds["RoleBinding"]["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    # It reads /v1/scale with the chart's read token, on the chart's agent env (the coordinator's URL).
    rendered = {o["metadata"]["name"]: o for o in manifests({"fullnameOverride": RELEASE})}
    (env_from,) = container["envFrom"]
    assert "SHARDHERD_COORDINATOR_URL" in rendered[env_from["configMapRef"]["name"]]["data"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shardherd-token"]["secret"]["secretName"] == f"{RELEASE}-api-read-token"
