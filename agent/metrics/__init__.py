"""The agent's worker metrics: CPU sources, the sampler that turns samples into KCL's `sts`/`opr` history, throughput.

This module holds what every metric module shares: the CPU source protocol, the typed errors and KCL's rounding.
"""

from __future__ import annotations

from typing import Protocol

from shardherd.shared.errors import ShardherdError


class MetricSourceError(ShardherdError):
    """A CPU source could not produce a sample (file missing or malformed, endpoint down, counters went backwards)."""


class InvalidMetricInput(ShardherdError, ValueError):
    """A caller handed the metrics code a value it cannot accept (negative bytes, a bad setting, an unknown format)."""


class CpuSource(Protocol):
    """Something that reports this worker's CPU utilisation in percent of what it may use, one sample per call."""

    name: str

    def sample(self) -> float:
        """Percent used since the previous call (0 on the first call); raises MetricSourceError when it cannot tell."""
        ...

