"""Container CPU utilisation from the ECS task metadata endpoint v4, as a share of the container's limit, as KCL's.

`/stats` gives Docker's `cpu_stats` and `precpu_stats` (the previous read): the container used
`cpu delta / system delta x online_cpus` cores. Its limit is its share of the task's CPUs: task `Limits.CPU` (vCPUs,
or `online_cpus` when absent) times this container's `Limits.CPU` over the sum of every container's `Limits.CPU`
(CPU units; 2, Docker's minimum, when a container has none). This container is the one whose `DockerId` is the last
path segment of the endpoint URI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from shardherd.agent.metrics import InvalidMetricInput, MetricSourceError
from shardherd.shared.plain_http import HttpClient, HttpError

ECS_URI_ENV = "ECS_CONTAINER_METADATA_URI_V4"
DEFAULT_CONTAINER_SHARE = 2.0


def _lookup(document: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` in a JSON document, or None when it (or a parent) is absent."""
    value = document
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _optional_number(document: Any, *path: str) -> float | None:
    """The number at `path`, None when absent or null, a MetricSourceError when it is something else."""
    value = _lookup(document, path)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MetricSourceError(f"ECS metadata {'.'.join(path)} is not a number: {value!r}")
    return float(value)


def _number(document: Any, *path: str) -> float:
    """The number at `path`, or a MetricSourceError naming the missing or bad field."""
    value = _optional_number(document, *path)
    if value is None:
        raise MetricSourceError(f"ECS metadata has no {'.'.join(path)}")
    return value


class EcsCpu:
    """Percent of this container's CPU limit used, per Docker's last stats interval, read over HTTP."""

    name = "ecs"

    def __init__(self, base_uri: str, timeout_seconds: float = 2.0) -> None:
        url = urlsplit(base_uri)
        docker_id = url.path.rstrip("/").rsplit("/", 1)[-1]
        if url.scheme not in ("http", "https") or not url.hostname or not docker_id:
            raise InvalidMetricInput(f"{ECS_URI_ENV} is not an http URI ending in a container id: {base_uri!r}")
        self._base = base_uri.rstrip("/")
        self._docker_id = docker_id
        self._client = HttpClient(timeout_seconds)
        self._limit: float | None = None

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._client.close()

    def _get(self, suffix: str) -> Any:
        url = self._base + suffix
        try:
            response = self._client.get(url)
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
            return response.json()
        except (HttpError, ValueError) as exc:
            raise MetricSourceError(f"ECS metadata {url} failed: {exc}") from exc

    def limit_cpus(self, online_cpus: float) -> float:
        """CPUs this container may use (read once from `/task`, then cached)."""
        if self._limit is None:
            task = self._get("/task")
            task_cpus = _optional_number(task, "Limits", "CPU") or online_cpus
            containers = task.get("Containers") if isinstance(task, Mapping) else None
            if not isinstance(containers, list):
                raise MetricSourceError("ECS task metadata has no Containers list")
            shares = [
                (container.get("DockerId"), _optional_number(container, "Limits", "CPU") or DEFAULT_CONTAINER_SHARE)
                for container in containers
                if isinstance(container, Mapping)
            ]
            total = sum(share for _, share in shares)
            mine = next((share for docker_id, share in shares if docker_id == self._docker_id), None)
            if mine is None:  # not listed (yet): it still runs in the task, with Docker's minimum share
                mine = DEFAULT_CONTAINER_SHARE
                total += mine
            self._limit = mine / total * task_cpus
        return self._limit

    def sample(self) -> float:
        """Percent used in Docker's last interval: 0 with no previous read, 100 if no system time passed."""
        stats = self._get("/stats")
        pre_total = _number(stats, "precpu_stats", "cpu_usage", "total_usage")
        pre_system = _optional_number(stats, "precpu_stats", "system_cpu_usage") or 0.0
        if pre_total == 0 and pre_system == 0:
            return 0.0
        cpu_delta = _number(stats, "cpu_stats", "cpu_usage", "total_usage") - pre_total
        system_delta = _number(stats, "cpu_stats", "system_cpu_usage") - pre_system
        online_cpus = _number(stats, "cpu_stats", "online_cpus")
        if cpu_delta < 0 or system_delta < 0 or online_cpus <= 0:
            raise MetricSourceError(
                f"ECS stats are inconsistent (cpu delta {cpu_delta}, system delta {system_delta}, cpus {online_cpus})"
            )
        if system_delta == 0:
            return 100.0
        cores_used = cpu_delta / system_delta * online_cpus
        return min(100.0, cores_used / self.limit_cpus(online_cpus) * 100.0)
