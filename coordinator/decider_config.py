"""The decider's knobs, taken from `Settings` (KCL names and defaults, plus shardherd's dead-band)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from shardherd.shared.config import Settings
from shardherd.shared.errors import ConfigError


class Strategy(enum.Enum):
    """Which assignment strategy the leader runs (a module of coordinator/deciders/ by this name).

    Settings choose it with `lease_assignment_strategy` (`variance` or `lease-count`) and, for `variance`,
    `variance_balancing` (`band` or `kcl`): see `from_settings`.
    """

    BAND = "band"
    KCL_VARIANCE = "kcl-variance"
    LEASE_COUNT = "lease-count"

    @classmethod
    def from_settings(cls, assignment: str, balancing: str) -> Strategy:
        """The strategy named by the settings pair; a clear `ConfigError` for a name no strategy has."""
        if assignment == "lease-count":
            return cls.LEASE_COUNT
        if assignment == "variance" and balancing in SETTING_NAMES:
            return SETTING_NAMES[balancing]
        raise ConfigError(f"unknown assignment strategy: lease_assignment_strategy={assignment!r}, "
                          f"variance_balancing={balancing!r} (expected variance with band or kcl, or lease-count)")


# `variance_balancing` values, for `lease_assignment_strategy = variance`.
SETTING_NAMES = {"band": Strategy.BAND, "kcl": Strategy.KCL_VARIANCE}


@dataclass(frozen=True, slots=True)
class DeciderConfig:
    """Assignment settings; validated so the decider never has to guard against nonsense values."""

    strategy: Strategy = Strategy.BAND
    rebalance_threshold_percentage: float = 10.0
    dampening_percentage: float = 60.0
    allow_throughput_overshoot: bool = True
    max_leases_for_worker: int = 2**31 - 1
    max_throughput_per_host_kbps: float = math.inf
    worker_metrics_ema_alpha: float = 0.5
    # Balancing counts a worker's metric only as far out as it was in each of its last this many reports (1: the
    # newest alone, KCL), each caught up to the load carried now (FleetView._confirm; decision 0013). From the
    # settings: the reports within `rebalance_persistence_millis` (`persistent_reports`).
    rebalance_persistent_reports: int = 1
    # Band strategy: with every worker inside its metric's band, fill workers far below the throughput band
    # (band.balance_pass; decisions 0014, 0020).
    rebalance_fill_on_throughput: bool = True
    rebalance_dead_band_percentage: float = 2.0
    rebalance_min_band_points: float = 2.0
    rebalance_min_gain_kbps: float = 0.5
    rebalance_min_gain_points: float = 2.0
    allow_receiver_above_average: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.rebalance_threshold_percentage <= 100:
            problems.append(
                f"rebalance_threshold_percentage must be in (0, 100], got {self.rebalance_threshold_percentage}"
            )
        if not 0 < self.dampening_percentage <= 100:
            problems.append(f"dampening_percentage must be in (0, 100], got {self.dampening_percentage}")
        if self.max_leases_for_worker < 1:
            problems.append(f"max_leases_for_worker must be >= 1, got {self.max_leases_for_worker}")
        if not self.max_throughput_per_host_kbps > 0:
            problems.append(f"max_throughput_per_host_kbps must be > 0, got {self.max_throughput_per_host_kbps}")
        if not 0 < self.worker_metrics_ema_alpha <= 1:
            problems.append(f"worker_metrics_ema_alpha must be in (0, 1], got {self.worker_metrics_ema_alpha}")
        if self.rebalance_persistent_reports < 1:
            problems.append(f"rebalance_persistent_reports must be >= 1, got {self.rebalance_persistent_reports}")
        if not 0 <= self.rebalance_dead_band_percentage <= 100:
            problems.append(
                f"rebalance_dead_band_percentage must be in [0, 100], got {self.rebalance_dead_band_percentage}"
            )
        if not 0 <= self.rebalance_min_band_points <= 100:
            problems.append(f"rebalance_min_band_points must be in [0, 100], got {self.rebalance_min_band_points}")
        if not 0 <= self.rebalance_min_gain_kbps < math.inf:
            problems.append(f"rebalance_min_gain_kbps must be finite and >= 0, got {self.rebalance_min_gain_kbps}")
        if not 0 <= self.rebalance_min_gain_points <= 100:
            problems.append(f"rebalance_min_gain_points must be in [0, 100], got {self.rebalance_min_gain_points}")
        if problems:
            raise ConfigError("invalid decider configuration: " + "; ".join(problems))

    @classmethod
    def from_settings(cls, settings: Settings) -> DeciderConfig:
        """The decider's part of the process settings."""
        return cls(
            strategy=Strategy.from_settings(settings.lease_assignment_strategy, settings.variance_balancing),
            rebalance_threshold_percentage=settings.rebalance_threshold_percentage,
            dampening_percentage=settings.dampening_percentage,
            allow_throughput_overshoot=settings.allow_throughput_overshoot,
            max_leases_for_worker=settings.max_leases_for_worker,
            max_throughput_per_host_kbps=settings.max_throughput_per_host_kbps,
            worker_metrics_ema_alpha=settings.worker_metrics_ema_alpha,
            rebalance_persistent_reports=persistent_reports(settings),
            rebalance_fill_on_throughput=settings.rebalance_fill_on_throughput,
            rebalance_dead_band_percentage=settings.rebalance_dead_band_percentage,
            rebalance_min_band_points=settings.rebalance_min_band_points,
            rebalance_min_gain_kbps=settings.rebalance_min_gain_kbps,
            rebalance_min_gain_points=settings.rebalance_min_gain_points,
            allow_receiver_above_average=settings.allow_receiver_above_average,
        )


def persistent_reports(settings: Settings) -> int:
    """How many of a worker's last reports an excess must show in: those within `rebalance_persistence_millis`.

    Worker-mode agents report every heartbeat (about 4 s): 30 s are 8 reports. At most the history an agent keeps;
    at least the newest report (with reports a reporter period apart, lease mode, KCL's rule).
    """
    reports = math.ceil(settings.rebalance_persistence_millis / settings.effective_metrics_report_millis)
    return max(1, min(settings.no_of_persisted_metrics_per_worker_metrics, reports))
