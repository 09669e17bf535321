"""The one set of short intervals the tests run with, as settings and as the environment of child processes.

Seconds-scale instead of the production defaults so failover, discovery and assignment happen within a test: failover
2 s, leader runs and discovery every 0.3 s, leader lock 2 s / 0.4 s, CPU sampled every 0.2 s and reported every second.
Tests change single values with keyword overrides; each states why.
"""

from __future__ import annotations

from typing import Any

from shardherd.agent.read_spec import ReadLimits

FAST_SETTINGS: dict[str, Any] = {
    "failover_time_millis": 2000,
    "discovery_interval_millis": 300,
    "lease_assignment_interval_millis": 300,
    "shard_sync_interval_millis": 1000,
    "leader_lock_lease_duration_millis": 2000,
    "leader_lock_heartbeat_period_millis": 400,
    "graceful_lease_handoff_timeout_millis": 5000,
    "in_memory_worker_metrics_capture_frequency_millis": 200,
    "worker_metrics_reporter_freq_millis": 1000,
}

# Agents in tests poll empty shards often, so records show up within a test's patience.
FAST_READS = ReadLimits(min_call_interval=0.05, idle_backoff=0.1)


def fast_settings(**overrides: Any) -> dict[str, Any]:
    """`FAST_SETTINGS` with `overrides` applied, as keyword arguments for `load_settings`."""
    return {**FAST_SETTINGS, **overrides}


def fast_env(**overrides: Any) -> dict[str, str]:
    """The same settings as `SHARDHERD_*` environment variables for a child process."""
    return settings_env(fast_settings(**overrides))


def settings_env(settings: dict[str, Any]) -> dict[str, str]:
    """Settings by `Settings` field name as the `SHARDHERD_*` variables `load_settings` reads (booleans true/false)."""
    return {f"SHARDHERD_{name.upper()}": _env_value(value) for name, value in settings.items() if value is not None}


def _env_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
