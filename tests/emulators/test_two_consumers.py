"""Two shardherd applications on one stream through the Kinesis limits proxy, written at half the write limit."""

from __future__ import annotations

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from tests.support.two_consumers import run_two_consumers

pytestmark = pytest.mark.slow


def test_two_applications_keep_up_beside_each_other_within_the_read_limits(moto_server: MotoServer,
                                                                          kinesalite: NodeEmulator) -> None:
    """About 25-45 s (a reason: two whole applications must start, then a window long enough to count calls per
    second: 8 s). 1 shard written at 250 records/s of 2,000 bytes (half its write byte limit); the agents use the
    user defaults for reads. bench/two_consumers.py runs the same longer, against the old pacing."""
    with KinesisLimits(kinesalite.port) as limits:
        run = run_two_consumers(moto_server, limits, shards=1, rate=250, size=2000, seconds=8.0)
    assert run.written >= 250 * 8 * 0.8
    assert run.write_throttled == 0  # half the write limit: the producer is never throttled
    for name, app in run.apps.items():
        assert app.drain_seconds < 5.0, f"application {name} fell behind: {app}"  # one idle poll plus processing
        assert app.calls_per_shard_second <= 1.2, f"application {name} polled {app}"  # once a second, caught up
    assert run.throttled_fraction <= 0.01, run
    assert run.iterators == 0, run  # no new iterator per batch or poll: only when a lease arrives or one expires
