"""The two Kubernetes API calls `shardherd mark-removal` makes: list a namespace's pods, set or clear one annotation.

Invariants:
1. Only pods are touched, and only through a JSON merge patch of one annotation: the rest of the pod is never written.
2. In a pod, the API server, the token and its CA come from the service account Kubernetes mounts
   (KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount); the token file is read for every
   call, since bound service-account tokens are rotated while the pod runs.
3. Every call has a deadline (`timeout`); every failure is a KubeError naming the call and the API's answer.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from shardherd.shared.errors import ShardherdError
from shardherd.shared.lean_httpx import httpx

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(ShardherdError):
    """A Kubernetes API call failed, or the API cannot be found or authenticated to."""


@dataclass(frozen=True)
class Pod:
    """A pod's name and annotations, as listed."""

    name: str
    annotations: dict[str, str]


class KubePods:
    """Pods of one namespace through the Kubernetes API (in-cluster unless `api` is given)."""

    def __init__(self, namespace: str, api: str | None = None, token_file: str | None = None,
                 ca_file: str | None = None, timeout: float = 10.0) -> None:
        self.namespace = namespace
        self._token_file = Path(token_file) if token_file else SERVICE_ACCOUNT / "token"
        if api is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise KubeError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset): pass --kube-api")
            api = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            ca_file = ca_file or str(SERVICE_ACCOUNT / "ca.crt")
        self.api = api.rstrip("/")
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=ca_file)
            except OSError as exc:
                raise KubeError(f"cannot read the Kubernetes CA {ca_file}: {exc.strerror}") from exc
        self._http = httpx.Client(verify=verify, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def pods(self, selector: str | None) -> list[Pod]:
        """The namespace's pods matching the label selector (all of them when None)."""
        body = self._call("GET", f"/api/v1/namespaces/{quote(self.namespace)}/pods",
                          params={"labelSelector": selector} if selector else None)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise KubeError(f"listing pods in {self.namespace}: the answer has no list of items")
        return [Pod(str(item["metadata"]["name"]), dict(item["metadata"].get("annotations") or {}))
                for item in items]

    def annotate(self, pod: str, key: str, value: str | None) -> None:
        """Set the pod's annotation `key` to `value`, or remove it when `value` is None."""
        self._call("PATCH", f"/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(pod)}",
                   json={"metadata": {"annotations": {key: value}}},
                   headers={"Content-Type": "application/merge-patch+json"})

    def _call(self, method: str, path: str, **request: Any) -> Any:
        try:
            token = self._token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeError(f"cannot read the service account token {self._token_file}: {exc.strerror}") from exc
        headers = {**request.pop("headers", {}), "Authorization": f"Bearer {token}"}
        try:
            response = self._http.request(method, self.api + path, headers=headers, **request)
        except httpx.HTTPError as exc:
            raise KubeError(f"{method} {path}: cannot reach the Kubernetes API at {self.api}: {exc}") from exc
        if response.is_error:
            raise KubeError(f"{method} {path}: HTTP {response.status_code}: {_reason(response)}")
        try:
            return response.json()
        except ValueError as exc:
            raise KubeError(f"{method} {path}: the answer is not JSON") from exc


def _reason(response: httpx.Response) -> str:
    """The Status object's message, else the body's start."""
    try:
        return str(response.json().get("message", response.text[:200]))
    except (ValueError, AttributeError):
        return response.text[:200]
