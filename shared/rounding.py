"""KCL's rounding of stored figures: 6 decimals, halves away from zero (HALF_UP), so values match KCL's exactly."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from shardherd.shared.row_checks import throughput_problem

_SIX_DECIMALS = Decimal("0.000001")


def round6(value: float) -> float:
    """Round to 6 decimals, halves away from zero, as KCL does before storing a metric or a throughput."""
    return float(Decimal(repr(float(value))).quantize(_SIX_DECIMALS, rounding=ROUND_HALF_UP))


def round_throughput(value: float) -> float:
    """Throughput rounded as KCL stores it; ValueError for anything no reader could use (shared/row_checks.py)."""
    problem = throughput_problem(value)
    if problem is not None:
        raise ValueError(f"throughput must be a finite number >= 0: {problem}")
    return round6(value)
