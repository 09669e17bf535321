"""On this real machine: the selected CPU source measures a busy interval as a value in (0, 100]."""

from __future__ import annotations

import time

from shardherd.agent.metrics.select import select_cpu_source
from shardherd.shared.clock import SystemClock


def burn_cpu(seconds: float) -> int:
    """Keep one core busy for `seconds` of wall time."""
    deadline = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < deadline:
        spins += sum(range(1000)) % 7
    return spins


def test_selected_source_measures_a_busy_interval() -> None:
    source = select_cpu_source(SystemClock())
    assert source is not None
    assert source.sample() == 0.0  # every source reports 0 on its first call
    burn_cpu(0.3)
    value = source.sample()
    # This process kept a core busy for the whole interval, so the share is above 0 whatever the host's size.
    assert 0.0 < value <= 100.0, f"{source.name} gave {value}"
