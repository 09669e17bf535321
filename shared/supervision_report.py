"""How a process's supervised threads show in Prometheus text (the coordinator's /metrics and the agents' health port).

Restarts are counters per thread; the seconds since each thread last completed a step are gauges; a critical loop's
stall bound is a gauge too, so an alert can compare the two.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from shardherd.shared.supervision import Supervisor


def supervision_families(supervisor: Supervisor) -> list[Metric]:
    """Per supervised thread: restarts, seconds since its last completed step, its stall bound (critical only)."""
    restarts = CounterMetricFamily("shardherd_thread_restarts", "Failures of a supervised thread (each restarted, "
                                   "or for a critical one, the process gave up)", labels=["thread", "kind"])
    idle = GaugeMetricFamily("shardherd_thread_seconds_since_progress",
                             "Seconds since a supervised thread last completed a step", labels=["thread", "kind"])
    bound = GaugeMetricFamily("shardherd_thread_stall_bound_seconds",
                              "A critical thread without progress for this long fails /healthz and ends the process",
                              labels=["thread"])
    for state in supervisor.snapshot():
        restarts.add_metric([state.name, state.kind.value], state.restarts)
        idle.add_metric([state.name, state.kind.value], state.seconds_since_progress)
        if state.stall_after is not None:
            bound.add_metric([state.name], state.stall_after)
    gave_up = GaugeMetricFamily("shardherd_process_gave_up", "1 once a critical thread failed or stalled (exiting)",
                                value=0 if supervisor.gave_up is None else 1)
    return [restarts, idle, bound, gave_up]
