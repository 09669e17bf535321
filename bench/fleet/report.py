"""The benchmark's printed output: the per-scenario table, store requests by kind, and the issue's targets."""

from __future__ import annotations

from collections.abc import Sequence

from bench.fleet.model import VARIANCE
from bench.fleet.scenarios import Result
from bench.store_counter import READ_KINDS, WRITE_KINDS


def _short(kinds: dict[str, float]) -> str:
    return " ".join(f"{kind}={value:.0f}" for kind, value in sorted(kinds.items(), key=lambda kv: -kv[1]))


def table(results: Sequence[Result]) -> str:
    """The per-scenario table and the cost lines."""
    header = (f"{'scenario':<24} {'variant':<19} {'moves':>5} {'min=forced+shed':>15} {'x min':>5} {'cpu min':>7} "
              f"{'greedy':>6} "
              f"{'runs cpu/tp':>11} {'bal.runs':>8} {'max/mean cpu/tp':>15} {'LPT':>5} {'leases':>6} {'old/new':>9} "
              f"{'reads/min':>9} {'writes/min':>10}")
    lines = [header, "-" * len(header)]
    for r in results:
        factor = f"{r.moves / r.minimum:.2f}" if r.minimum else ("0" if r.moves == 0 else "inf")
        split = f"{r.split[0]}/{r.split[1]}" if r.split[1] else "-"
        lines.append(
            f"{r.scenario:<24} {r.variant:<19} {r.moves:>5} {f'{r.minimum}={r.forced}+{r.minimum - r.forced}':>15} "
            f"{factor:>5} {r.cpu_minimum:>7} {_greedy(r):>6} {f'{_opt(r.cpu.runs)}/{_opt(r.tp.runs)}':>11} "
            f"{f'{_opt(r.cpu.balancing_runs)}/{_opt(r.tp.balancing_runs)}':>8} "
            f"{f'{r.cpu.final:.3f}/{r.tp.final:.3f}':>15} {r.lpt_ratio:>5.2f} "
            f"{f'{r.lease_counts[0]}-{r.lease_counts[1]}':>6} {split:>9} "
            f"{r.total_per_minute(READ_KINDS):>9.0f} {r.total_per_minute(WRITE_KINDS):>10.0f}")
    lines.append("")
    lines.append("store requests per minute by kind (observation window):")
    for r in results:
        lines.append(f"  {r.scenario:<24} {r.variant:<20} reads:  {_short(r.per_minute(READ_KINDS))}")
        lines.append(f"  {'':<24} {'':<20} writes: {_short(r.per_minute(WRITE_KINDS))}")
    return "\n".join(lines)


def _greedy(r: Result) -> str:
    """The offline greedy's moves; `*` if it did not reach the bound; `-` where it does not apply (cold start)."""
    if r.greedy is None:
        return "-"
    return f"{r.greedy[0]}{'' if r.greedy[1] else '*'}"


def _opt(value: float | None, spec: str = "d") -> str:
    return "-" if value is None else format(value, spec)


def targets(results: Sequence[Result]) -> list[str]:
    """The issue's targets, judged for the default strategy (variance, worker mode)."""
    lines = [_scenario_line(r) for r in results
             if r.variant == f"{VARIANCE}/worker" and not r.scenario.startswith("cost")]
    costs: dict[str, dict[str, Result]] = {}
    for r in results:
        if r.scenario.startswith("cost"):
            costs.setdefault(r.scenario, {})[r.variant] = r
    for name, by_variant in costs.items():
        worker_result, lease_result = by_variant.get(f"{VARIANCE}/worker"), by_variant.get(f"{VARIANCE}/lease")
        if worker_result is not None and lease_result is not None:
            lines += _cost_lines(name, worker_result, lease_result)
    return lines


def _scenario_line(r: Result) -> str:
    """One scenario's moves, balancing runs and end balance against the issue's targets."""
    moves_ok = [_yes(r.moves <= 1.1 * minimum) for minimum in (r.cpu_minimum, r.minimum)]
    runs = [_yes(b.balancing_runs is not None and b.balancing_runs <= 3) for b in (r.cpu, r.tp)]
    ends = [_yes(b.within) for b in (r.cpu, r.tp)]
    return (f"  {r.scenario:<24} moves<=1.1xmin cpu/tp: {moves_ok[0]}/{moves_ok[1]:<6} balanced within 3 "
            f"balancing runs cpu/tp: {runs[0]}/{runs[1]:<6}  ends balanced (<=1.10 x bound) cpu/tp: "
            f"{ends[0]}/{ends[1]:<6} "
            f"(offline greedy {_greedy(r)} moves; max/mean of LPT packing: tp {r.lpt_ratio:.2f})")


def _cost_lines(name: str, worker_result: Result, lease_result: Result) -> list[str]:
    """A cost scenario's writes per minute, worker mode against lease mode (with and without checkpoints)."""
    coordination = [k for k in WRITE_KINDS if k != "checkpoint"]  # application checkpoints are the same in both
    lines = []
    worker, lease = worker_result.total_per_minute(WRITE_KINDS), lease_result.total_per_minute(WRITE_KINDS)
    if lease:
        lines.append(f"  {name:<24} writes/min worker {worker:.0f} vs lease {lease:.0f}: ratio "
                     f"{worker / lease:.3f} (target <= 0.100: {_yes(worker <= lease / 10)})")
    own_worker, own_lease = (r.total_per_minute(coordination) for r in (worker_result, lease_result))
    counts = worker_result.counts
    if own_lease and counts.get("checkpoint", 0) > counts.get("handoff_complete", 0):  # application checkpoints
        lines.append(f"  {'':<24} without application checkpoints: {own_worker:.0f} vs {own_lease:.0f}: ratio "
                     f"{own_worker / own_lease:.3f}")
    return lines


def _yes(ok: bool) -> str:
    return "MET" if ok else "MISSED"
