"""Virtual-clock fleet simulator (package bench/fleet/): the real shard sync planner, decider, leader loop and leader
lock against simulated workers on an in-memory store, compared with the `lease-count` strategy and a KCL 2.x taker
model in the same process.

Time is a ManualClock moved by an event queue (nothing sleeps). shardherd workers run the agent's own components
(bench/fleet/worker.py): the LeaseKeeper (discovery through the owner index, a lease still in a handoff towards them
ignored until the old owner completes it; mode `worker`: one heartbeat row per heartbeat interval; mode `lease`: the
row and a renewal of every held lease per heartbeat interval; DRAINING announced at once on a graceful scale-in, the
row deleted once nothing is held), and the MetricsSampler and MetricsReporter, with:
* CPU sampled every second from a model, `base + carried KiB/s / capacity` (+ seeded noise, clamped to 100), closed
  into one `sts` value per report period: the agent's own (`Settings.effective_metrics_report_millis`: every
  heartbeat in worker mode, `worker_metrics_reporter_freq_millis` in lease mode) unless `--report-seconds` sets it;
* per-lease throughput reported exactly, or as the agent's ThroughputRecorder measures it under `--noise`;
* a lease under handoff checkpointed and handed over `HANDOFF_DELAY` after the request;
* crash = every scheduled action of the worker stops.
KCL 2.x workers (a model, bench/fleet/worker.py) renew every held lease each heartbeat, run
`bench.kcl2_taker.Kcl2Taker` every `(failover + epsilon) x 2`, and on scale-in checkpoint and stop (no drain).

Figures per scenario and variant (definitions in `Result`, `minimum_moves` and `within_bound`): lease moves (changes
of the actual owner to another worker, counted exactly from the applied writes) against the minimum, leader runs and
balancing runs from the leader's first reaction until balanced, final max/mean load, and store requests per minute
by kind. Variants: `variance` (band balancing, the default), `variance-kcl` (KCL's dampened budgets), `lease-count`
and a KCL 2.x taker model.

    python -m bench.fleet_sim --quick            # all scenarios, small fleets (about a minute on 2 cores)
    python -m bench.fleet_sim                    # the sizes of issue 3
    python -m bench.fleet_sim --scenario crash --quick --zipf 1.0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench.fleet.measures import THRESHOLD
from bench.fleet.noise import PLAIN_DELIVERY, SPARK_DELIVERY, NoiseModel
from bench.fleet.report import table, targets
from bench.fleet.scenarios import FULL, QUICK, Result, run_scenario, scenarios


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen scenarios and print the table and the targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small fleets and short windows")
    parser.add_argument("--scenario", action="append", help="run only scenarios whose name starts with this")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--zipf", type=float, default=0.5, help="Zipf exponent of shard throughput (default 0.5)")
    parser.add_argument("--report-seconds", type=float, default=None,
                        help="worker CPU report period (default: the agents' own, every heartbeat in worker mode, "
                             "30 s in lease mode)")
    parser.add_argument("--noise", choices=("plain", "spark"), default=None,
                        help="workers measure throughput as the live agents do (bench/fleet/noise.py)")
    args = parser.parse_args(argv)
    noise = None if args.noise is None else NoiseModel(PLAIN_DELIVERY if args.noise == "plain" else SPARK_DELIVERY)
    size = QUICK if args.quick else FULL
    chosen = [s for s in scenarios(size) if not args.scenario or any(s.name.startswith(p) for p in args.scenario)]
    if not chosen:
        parser.error("no scenario matches")
    results: list[Result] = []
    for scenario in chosen:
        outcome = run_scenario(scenario, size, args.seed, args.zipf, args.report_seconds, noise)
        results.extend(outcome)
        print(f"... {scenario.name} done", file=sys.stderr, flush=True)
    print(f"zipf exponent {args.zipf}, seed {args.seed}, warm-up {size.warmup:.0f} s, window {size.observe:.0f} s; "
          f"balanced = every lease on a live worker and each worker's load <= {THRESHOLD:.2f} x max(mean, its "
          f"heaviest lease alone) in modelled CPU (cpu) or carried throughput (tp; lease counts on an idle stream); "
          f"runs counted from the leader's first move after the event")
    print(table(results))
    print("\ntargets (variance, worker mode):")
    print("\n".join(targets(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
