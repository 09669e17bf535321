"""Host CPU utilisation from psutil, for hosts with none of the Linux sources (macOS, Windows, odd containers)."""

from __future__ import annotations

from shardherd.agent.metrics import MetricSourceError


class PsutilCpu:
    """Percent of all host CPUs busy since the previous call, as psutil measures it; 0 on the first call."""

    name = "psutil"

    def __init__(self) -> None:
        import psutil  # only where this source is chosen: a Linux agent does not load it (agent/metrics/cpu_tree.py)

        self._psutil = psutil
        self._started = False

    def sample(self) -> float:
        """The non-blocking system-wide percentage psutil measured since the last call."""
        try:
            value = float(self._psutil.cpu_percent(interval=None))
        except (OSError, self._psutil.Error) as exc:
            raise MetricSourceError(f"psutil cannot read CPU times: {exc}") from exc
        if not self._started:
            self._started = True
            return 0.0
        return value
