"""Offline rendering of the Helm chart with Helm's own engine (helm-python-sdk) and manifest helpers for the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "shardherd"

# Settings the chart sets per pod or from other values (pod name, Service URL, port, Secret file), never from `config`.
CHART_MANAGED = frozenset({"worker_id", "api_host", "api_port", "api_token", "api_token_file", "coordinator_url",
                           "api_advertise_url", "agent_health_port", "agent_health_host"})
EXAMPLES = REPO / "helm" / "examples"
VALUES_DIR = Path(__file__).resolve().parent / "values"
RELEASE = "shardherd"
NAMESPACE = "streaming"
KUBERNETES_VERSION = "1.37.0"

helm = pytest.importorskip(
    "helm_python",
    reason="helm-python-sdk (Helm's Go engine) ships x86_64 wheels only; the chart tests need it",
)

Manifest = dict[str, Any]


def values_file(path: Path) -> dict[str, Any]:
    """A values file as Helm reads it (`-f path`)."""
    loaded: dict[str, Any] = helm.values_from_yaml(path.read_text(encoding="utf-8"))
    return loaded


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Every template of the chart rendered with `values`, keyed by template path (schema checked first)."""
    with helm.Chart.load(CHART) as chart:
        rendered: dict[str, str] = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return rendered


def manifests(values: dict[str, Any] | None = None) -> list[Manifest]:
    """The Kubernetes objects a release would create (NOTES.txt left out, empty documents dropped)."""
    objects: list[Manifest] = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def only(objects: list[Manifest], kind: str) -> Manifest:
    """The single object of `kind`, failing the test if there is not exactly one."""
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def named(objects: list[Manifest], kind: str, name: str) -> Manifest:
    """The object of `kind` called `name`."""
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]


def containers(deployment: Manifest) -> Iterator[Manifest]:
    """The containers of a Deployment's pod template."""
    yield from deployment["spec"]["template"]["spec"]["containers"]
