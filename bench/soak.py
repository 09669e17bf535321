"""Long chaos soak: every fault kind over and over for N minutes on real processes, then the ledger report.

Usage: python -m bench.soak --minutes 30 [--agents 3] [--shards 4] [--defaults] [--metrics-off]
Starts its own moto server and kinesalite on 127.0.0.1; prints the same report as the CI chaos test and exits 1 if a
check failed. `--defaults` runs with shardherd's default timings instead of the seconds-scale CI ones. CPU metrics
are on, as users run them (each agent reads its own driven cgroup tree or ECS metadata endpoint, see
tests/support/cpu_fixtures.py); `--metrics-off` turns them off. Every pass includes a rolling deploy (an agent told to
stop while its replacement starts).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.moto_server import MotoServer
from tests.chaos.analysis import format_report
from tests.chaos.faults import FaultPlan
from tests.chaos.scenario import METRICS_OFF, SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--defaults", action="store_true", help="default timings (failover 10 s, intervals 2 s)")
    parser.add_argument("--metrics-off", action="store_true", help="disable worker CPU metrics")
    parser.add_argument("--workdir", type=Path, default=None, help="keep ledgers and logs here")
    args = parser.parse_args(argv)
    config = SoakConfig(agents=args.agents, shards=args.shards, minutes=args.minutes, seed=args.seed)
    if args.defaults:
        config.overrides = {}
        config.spacing = 25.0
        config.plan = FaultPlan(partition_seconds=25.0, burst_seconds=6.0)
    if args.metrics_off:
        config.overrides = {**config.overrides, **METRICS_OFF}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with MotoServer() as moto, Kinesalite(shard_limit=500, log_path=workdir / "kinesalite.log") as kinesis:
            report = run_soak(moto.endpoint_url, kinesis.endpoint_url, workdir, config,
                              log=lambda line: print(line, flush=True))
    print(format_report(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
