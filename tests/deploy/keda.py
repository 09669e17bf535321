"""The two KEDA objects the autoscaling example uses, as models written from KEDA's documented fields (KEDA 2.13+:
ScaledObject, TriggerAuthentication, the metrics-api trigger with bearer authentication). kubernetes-validate ships
no CRDs, so these stand in for KEDA's own: every field the example uses must be one KEDA documents, with its type, and
unknown fields are rejected (KEDA's trigger metadata is free-form strings; here it is checked for the metrics-api
scaler's documented keys). Pydantic, a dependency already, does the validation.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
Number = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(_Strict):
    """Object metadata (the parts the examples set)."""

    name: Name
    namespace: Name | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class SecretTargetRef(_Strict):
    """One trigger parameter taken from a Secret's key."""

    parameter: str
    name: Name
    key: str


class TriggerAuthenticationSpec(_Strict):
    """TriggerAuthentication.spec (the Secret form)."""

    secret_target_ref: Annotated[list[SecretTargetRef], Field(alias="secretTargetRef", min_length=1)]


class TriggerAuthentication(_Strict):
    """keda.sh/v1alpha1 TriggerAuthentication."""

    api_version: Annotated[Literal["keda.sh/v1alpha1"], Field(alias="apiVersion")]
    kind: Literal["TriggerAuthentication"]
    metadata: Metadata
    spec: TriggerAuthenticationSpec


class MetricsApi(_Strict):
    """The metrics-api scaler's metadata."""

    url: Annotated[str, Field(pattern="^https?://")]
    format: Literal["json", "xml", "yaml", "prometheus"] = "json"
    value_location: Annotated[str, Field(alias="valueLocation", min_length=1)]
    target_value: Annotated[Number, Field(alias="targetValue")]
    activation_target_value: Annotated[Number | None, Field(alias="activationTargetValue")] = None
    auth_mode: Annotated[Literal["apiKey", "basic", "tls", "bearer"] | None, Field(alias="authMode")] = None
    unsafe_ssl: Annotated[Literal["true", "false"] | None, Field(alias="unsafeSsl")] = None


class AuthenticationRef(_Strict):
    """A trigger's reference to its (Cluster)TriggerAuthentication."""

    name: Name
    kind: Literal["TriggerAuthentication", "ClusterTriggerAuthentication"] = "TriggerAuthentication"


class Trigger(_Strict):
    """One trigger (the metrics-api scaler: the only one the example uses)."""

    type: Literal["metrics-api"]
    name: str | None = None
    metric_type: Annotated[Literal["AverageValue", "Value", "Utilization"], Field(alias="metricType")] = \
        "AverageValue"
    use_cached_metrics: Annotated[bool, Field(alias="useCachedMetrics")] = False
    metadata: MetricsApi
    authentication_ref: Annotated[AuthenticationRef | None, Field(alias="authenticationRef")] = None


class ScaleTargetRef(_Strict):
    """What the ScaledObject scales (a Deployment by default)."""

    name: Name
    api_version: Annotated[str | None, Field(alias="apiVersion")] = None
    kind: str | None = None
    env_source_container_name: Annotated[str | None, Field(alias="envSourceContainerName")] = None


class Policy(_Strict):
    """An HPA scaling policy."""

    type: Literal["Pods", "Percent"]
    value: Annotated[int, Field(ge=1)]
    period_seconds: Annotated[int, Field(alias="periodSeconds", ge=1)]


class Rules(_Strict):
    """HPA scaling rules of one direction."""

    stabilization_window_seconds: Annotated[int | None, Field(alias="stabilizationWindowSeconds", ge=0)] = None
    select_policy: Annotated[Literal["Max", "Min", "Disabled"] | None, Field(alias="selectPolicy")] = None
    policies: list[Policy] = []


class Behavior(_Strict):
    """The HPA's behavior KEDA passes on."""

    scale_up: Annotated[Rules | None, Field(alias="scaleUp")] = None
    scale_down: Annotated[Rules | None, Field(alias="scaleDown")] = None


class HpaConfig(_Strict):
    """advanced.horizontalPodAutoscalerConfig."""

    name: str | None = None
    behavior: Behavior | None = None


class Advanced(_Strict):
    """ScaledObject.spec.advanced."""

    restore_to_original_replica_count: Annotated[bool, Field(alias="restoreToOriginalReplicaCount")] = False
    horizontal_pod_autoscaler_config: Annotated[HpaConfig | None, Field(alias="horizontalPodAutoscalerConfig")] = None


class Fallback(_Strict):
    """Replicas to keep while the scaler fails."""

    failure_threshold: Annotated[int, Field(alias="failureThreshold", ge=1)]
    replicas: Annotated[int, Field(ge=0)]


class ScaledObjectSpec(_Strict):
    """ScaledObject.spec."""

    scale_target_ref: Annotated[ScaleTargetRef, Field(alias="scaleTargetRef")]
    polling_interval: Annotated[int | None, Field(alias="pollingInterval", ge=1)] = None
    cooldown_period: Annotated[int | None, Field(alias="cooldownPeriod", ge=0)] = None
    initial_cooldown_period: Annotated[int | None, Field(alias="initialCooldownPeriod", ge=0)] = None
    idle_replica_count: Annotated[int | None, Field(alias="idleReplicaCount", ge=0)] = None
    min_replica_count: Annotated[int | None, Field(alias="minReplicaCount", ge=0)] = None
    max_replica_count: Annotated[int | None, Field(alias="maxReplicaCount", ge=1)] = None
    fallback: Fallback | None = None
    advanced: Advanced | None = None
    triggers: Annotated[list[Trigger], Field(min_length=1)]


class ScaledObject(_Strict):
    """keda.sh/v1alpha1 ScaledObject."""

    api_version: Annotated[Literal["keda.sh/v1alpha1"], Field(alias="apiVersion")]
    kind: Literal["ScaledObject"]
    metadata: Metadata
    spec: ScaledObjectSpec
