"""The short chaos run: every fault kind once against real processes, then every ledger check must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.chaos.analysis import format_report
from tests.chaos.scenario import SoakConfig, run_soak

pytestmark = pytest.mark.slow



@pytest.mark.timeout(420)
def test_every_fault_kind_once_loses_nothing(moto_server: MotoServer, kinesalite: NodeEmulator,
                                              tmp_path: Path) -> None:
    report = run_soak(moto_server.endpoint_url, kinesalite.endpoint_url, tmp_path, SoakConfig(), log=print)
    print(format_report(report))
    failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]
    assert not failed, "\n".join(failed)
    for kind in ("kill", "term", "throttle", "partition", "split", "merge"):
        assert report.counts.get(f"event {kind}", 0) >= 1, kind
    assert report.figures["agent kill -9 -> shards read elsewhere s"]
    assert report.counts["graceful duplicates"] == 0
