"""Host CPU utilisation from psutil, for hosts with none of the Linux sources (macOS, Windows, odd containers)."""

from __future__ import annotations

import psutil

from shardherd.agent.metrics import MetricSourceError


class PsutilCpu:
    """Percent of all host CPUs busy since the previous call, as psutil measures it; 0 on the first call."""

    name = "psutil"

    def __init__(self) -> None:
        self._started = False

    def sample(self) -> float:
        """The non-blocking system-wide percentage psutil measured since the last call."""
        try:
            value = float(psutil.cpu_percent(interval=None))
        except (OSError, psutil.Error) as exc:
            raise MetricSourceError(f"psutil cannot read CPU times: {exc}") from exc
        if not self._started:
            self._started = True
            return 0.0
        return value
