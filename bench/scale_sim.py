"""The fleet simulator's prediction for a live scale run (issue 36): the same fleet and events, side by side.

bench/scale.py measures the real stack; `predict` gives the fleet simulator (bench/fleet/: the real leader loop,
lock and decider, simulated agents running the agent's lease keeper) what that run saw, and measures the same
figures on its virtual clock:
* the fleet: one shard per live lease with the KiB/s the live agents reported for it, the agents' first rows written
  at the offsets from the first lease owned at which the live run saw them (start-up on two cores spreads them over
  tens of seconds; the leader's first run waits for the rows of the agents there before it, as the live leader's
  first assignment found them), their CPU following a model fitted on the live rows: the median of agents holding
  nothing (or the least loaded) is the base, the plain agents' mean (the Spark agents' own CPU left out) what their
  leases add to it, and of bench/fleet_noise.py's LOCAL_CPU noise and excursions the plain agents get the share
  that spreads their moving averages as far as the live ones were (`plain_noise_scale`), the Spark agents all of
  it; the live stack's measurement noise (bench/fleet/noise.py), the users' timings (bench/stack_cost.py
  USER_DEFAULTS);
* every lease owned, counted from the first lease owned (the live figure from launching `up` includes process
  start-up and the shard sync, which the simulator models differently, so both sides count from the first owner),
  seen as the live bench sees it, by looking at the lease table every STEP (at a phase drawn per seed): the simulated
  leader's owner writes take the time the live leader's took per write on one of its write lanes (`write_seconds`,
  bench/fleet/model.py), so its first assignment's 256 writes land over about a second, as live, not in one instant;
* balancing moves from every lease owned to the steady window (agents still joining are filled by them), and when
  the run that made the last of them started: the time the fleet took to settle (`--moves` lists them);
* owner changes over the steady window, after the same warm-up, and the store's capacity units per minute there
  (the simulated agents checkpoint as often as the live ones did, and the Spark agents among them read their batch
  ends as often per lease as the live Spark agents did: those reads are the bulk of a mixed fleet's read units),
  priced as the live meter prices them (consistent reads on PostgreSQL) and shown per caller beside the live ones;
* kill -9 (a crash) of the agent holding most leases: its leases, and seconds until every one is owned elsewhere,
  beside the live run's seconds until every one was owned elsewhere (the live time until every one was read
  elsewhere is its own row: the simulated agents read nothing, so the owned->read gap shows there).
  The simulated agents name each row they write to the leader and the leader runs when a quiet worker's failover
  time ends, as live (`LeaderLoop.next_verdict`), so the crash moves leases one failover time after the victim's
  last heartbeat (7-10 s at the users' defaults, by the crash's phase, drawn per seed within a heartbeat interval:
  the live bench kills at no particular moment), not after the next scan saw that heartbeat.

bench/scale.py writes the simulator's inputs and the live figures into its run directory (REPLAY_FILE), so a live run
can be replayed later, on several seeds (one seed is never the evidence):

    python -m bench.scale_sim --replay .scale/scale-replay.json [--seed 7 --seed 8 ...]

Invariants: the simulator's inputs come only from the live run (no figure is tuned here; the noise share is fitted
on the live CPU figures alone, never on a simulated outcome); a figure that differs by more than 20 % is marked, as
the issue asks, for the simulator to be fixed, not the live run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from bench.fleet.model import VARIANCE, Fleet
from bench.fleet.noise import PLAIN_DELIVERY, LiveNoise, NoiseModel
from bench.fleet.worker import CpuModel, CpuNoise
from bench.fleet.world import Stream
from bench.fleet_noise import LOCAL_CPU
from bench.stack_cost import USER_DEFAULTS
from shardherd.coordinator.run_summary import RunSummary
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter, usage_total
from shardherd.shared.worker_metrics import ema

STEP = 0.5  # seconds of virtual time between the bench's looks at the simulated fleet
MARGIN = 0.2  # the bound on a difference between live and simulated figures
# A difference is marked only past a figure's resolution, below which neither side can tell it from noise:
# Both sides time their figures by looking every STEP (bench/scale.py's Startup looks every half second too), so two
# times may differ by up to two looks without either being wrong (live 0.6 s against 0.0 s to own every lease). The
# kill's live looks are the kill scenario's own, their gap measured per run (`_kill_row`).
LOOKS = 2 * STEP
# A count of moves or leases moves by one or two with one lease's rounding on either side: a joiner's share of 256
# leases over 34 agents is 7 or 8 (live 7, 7 and 7 against 7, 8 and 7), the busiest agent holds 9 or 10.
COUNTS = 2
# Store units per minute over the steady window: a few calls a minute (the lock's reads, 1 against 0; the standby
# coordinator's 2, which the simulator has no process for) are no bill anyone pays for and no model to fix.
UNITS = 5.0
KILL_WATCH = 120.0  # seconds the simulator watches after the kill
REPLAY_FILE = "scale-replay.json"  # in bench/scale.py's run directory
SEEDS = (7, 8, 9)  # the replay's default seeds
# The fit of the plain agents' CPU noise to the live run's figures (`plain_noise_scale`): one fixed draw of the noise
# (the fit belongs to the live run, not to a simulation's seed), looked at as the steady window is long.
FIT_SEED = "scale-sim-fit"
FIT_SECONDS = 600.0
FIT_LOOK = 30.0  # seconds between looks at the agents' moving averages
FIT_STEPS = 12  # bisection steps: the share to within 1 / 4096


@dataclass(frozen=True, slots=True)
class LiveInputs:
    """What the live run saw, for the simulator to replay."""

    kbps: Mapping[str, float]  # each shard's KiB/s as its live owner last reported it
    joins: Sequence[float]  # seconds from the first lease owned to each agent's first row (< 0: the first
    # assignment counted it; bench/scale.py's replay_offsets)
    cpu_base: float  # median CPU of the live agents holding nothing (the fleet's least loaded without any)
    cpu_mean: float  # mean CPU of every live agent
    warmup: float  # seconds from every lease owned to the steady window
    settle: float  # seconds of the steady window
    checkpoints: float = 0.0  # the live agents' application checkpoints per shard per minute (0: none)
    own_cpu: Sequence[float] = ()  # per agent of `joins` (same order; none: all 0), CPU points no lease explains
    batch_ends: Sequence[float] = ()  # per agent of `joins` (none: all 0), batch-end reads per held lease per minute
    consistent_reads: bool = False  # the live store's reads are priced as consistent (PostgreSQL; DynamoDB's default
    # is eventual): the simulator prices its leader's scans the same way, or it would halve them
    write_seconds: float = 0.0  # the live leader's time per owner write on one of its write lanes, in the run that
    # wrote most (the first assignment: its write part over its writes per lane; bench/scale.py `write_seconds`);
    # 0: unknown (a replay written before it was measured), the simulated writes land at once
    cpu_reports: Sequence[Sequence[float]] = ()  # per agent of `joins` (same order; none: not recorded), its CPU
    # reports over the steady window, one per report period (bench/scale.py `CpuReports`): not replayed yet, kept
    # for fitting how often and how long an agent's CPU spikes (the noise model fits only its size today)


@dataclass(frozen=True, slots=True)
class Figures:
    """The figures compared; None where a side did not measure one."""

    owned_after: float | None  # every lease owned, seconds after the first lease was
    steady_moves: int | None  # owner changes over the steady window
    read_units: float | None  # per minute over the steady window
    write_units: float | None
    kill_leases: int | None  # leases the killed agent held
    kill_after: float | None  # seconds until each of them is read elsewhere (live; the simulator reads none: None)
    settle_moves: int | None = None  # balancing moves from every lease owned to the steady window
    settled_after: float | None = None  # seconds from every lease owned to the last of them (0: none)
    reads_by_caller: Mapping[str, float] = field(default_factory=dict)  # read units per minute per caller
    kill_owned_after: float | None = None  # seconds until each of them is owned elsewhere (both sides; None in a
    # live replay written before bench/scale.py measured it: its table compares the read figure, marked so)
    kill_look: float | None = None  # live: seconds between the look that saw them all owned elsewhere and the one
    # before it, the owned figure's resolution (the kill scenario looks every 0.25 s plus the API view's own time)


def user_settings() -> dict[str, object]:
    """The users' defaults of the scale run (bench/stack_cost.py USER_DEFAULTS) as settings overrides."""
    return {name.removeprefix("SHARDHERD_").lower(): value for name, value in USER_DEFAULTS.items()}


def _cpu(inputs: LiveInputs) -> CpuModel:
    """bench/fleet_noise.py's LOCAL_CPU (noise and excursions of agents on the 2-core host) with the run's base and
    the plain agents' mean: the Spark agents' own CPU is theirs (`own_cpu`), not a load their leases carry."""
    return replace(LOCAL_CPU, base=inputs.cpu_base, mean_at_start=max(plain_mean(inputs), inputs.cpu_base + 0.01))


def plain_mean(inputs: LiveInputs) -> float:
    """The live agents' mean CPU without the Spark agents' own (`own_cpu` puts each at the plain agents' median)."""
    return inputs.cpu_mean - (statistics.fmean(inputs.own_cpu) if inputs.own_cpu else 0.0)


def noise_spread(model: CpuModel, scale: float, agents: int, settings: Settings, seed: str = FIT_SEED) -> float:
    """How far the mean of `agents` agents' CPU moving averages lies above the least of them when their CPU is the
    model's base plus its noise and excursions times `scale`: the median over looks every FIT_LOOK s for FIT_SECONDS.
    Each agent samples once a second and reports its samples' mean every `settings` report period; its moving
    average is the one GET /v1/workers shows (`ema` of the reports its row keeps)."""
    period = settings.effective_metrics_report_millis / 1000
    noises = [CpuNoise(model, random.Random(f"{seed}:{i}"), random.Random(f"{seed}:excursions:{i}"))
              for i in range(agents)]
    samples: list[list[float]] = [[] for _ in noises]
    reports: list[deque[float]] = [deque(maxlen=settings.no_of_persisted_metrics_per_worker_metrics) for _ in noises]
    spreads, report_at, look_at = [], period, FIT_LOOK
    for second in range(1, int(FIT_SECONDS) + 1):
        for noise, taken in zip(noises, samples, strict=True):
            taken.append(min(100.0, max(0.0, model.base + noise.sample(scale) + noise.excursion(second, scale))))
        if second >= report_at:
            for taken, history in zip(samples, reports, strict=True):
                history.append(statistics.fmean(taken))
                taken.clear()
            report_at += period
        if second >= look_at:
            averages = [ema(list(history), settings.worker_metrics_ema_alpha) for history in reports]
            spreads.append(statistics.fmean(averages) - min(averages))
            look_at += FIT_LOOK
    return statistics.median(spreads)


def plain_noise_scale(inputs: LiveInputs) -> float:
    """The share of `_cpu`'s noise and excursions (0 to 1) that spreads the plain agents' CPU moving averages as far
    above the least of them as the live run's were (`plain_mean` less `cpu_base`, from GET /v1/workers at the end of
    its steady window). The whole spread is taken as noise (the leases' load spreads them too), so the share is the
    most noise the live figures allow: where they allow all of LOCAL_CPU's, it stays as it is (1).

    Fitted on the noise alone (no fleet, no leases), by bisection: the noise scales with the share exactly, only the
    clipping at 0 bends it, so the spread grows with the share."""
    model, agents = _cpu(inputs), sum(1 for agent in _agents(inputs) if not agent.spark)
    target, settings = plain_mean(inputs) - inputs.cpu_base, load_settings(**user_settings())
    if agents < 2:
        return 1.0  # the spread of one agent's figures is no spread
    if target <= 0:
        return 0.0
    low, high = 0.0, 1.0
    if noise_spread(model, high, agents, settings) <= target:
        return high
    for _ in range(FIT_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if noise_spread(model, middle, agents, settings) < target else (low, middle)
    return (low + high) / 2


def _owned(fleet: Fleet) -> bool:
    live = set(fleet.live())
    return all(lease.actual_owner in live for lease in fleet.leases())


def _run_until(fleet: Fleet, done: Callable[[Fleet], bool], limit: float) -> float | None:
    """Virtual seconds until `done(fleet)` holds, looking every STEP; None past `limit`."""
    start = fleet.events.now()
    while fleet.events.now() - start < limit:
        fleet.events.run_until(fleet.events.now() + STEP)
        if done(fleet):
            return fleet.events.now() - start
    return None


@dataclass(frozen=True, slots=True, order=True)
class _Agent:
    """One live agent as the simulator starts it."""

    offset: float  # seconds from the first lease owned to its first row (< 0: there already)
    own_cpu: float  # CPU points no lease explains
    batch_ends: float  # batch-end reads per held lease per minute (a Spark agent's; 0: a plain agent)

    @property
    def spark(self) -> bool:
        """A Spark agent (its driver's CPU and batch-end reads are its own), not a plain one."""
        return self.batch_ends > 0 or self.own_cpu > 0

    def add_to(self, fleet: Fleet, row_at: float, plain_noise: float) -> str:
        """Start it in `fleet`, its first row written at simulation time `row_at`, with `plain_noise` of the CPU
        model's noise if it is a plain agent (a Spark agent has all of it: LOCAL_CPU's excursions are its); its id."""
        return fleet.add_workers(1, self.own_cpu, 60.0 / self.batch_ends if self.batch_ends > 0 else 0.0,
                                 row_at=row_at, noise_scale=1.0 if self.spark else plain_noise)[0]


def _agents(inputs: LiveInputs) -> list[_Agent]:
    count = len(inputs.joins)
    return [_Agent(*values) for values in zip(inputs.joins, inputs.own_cpu or [0.0] * count,
                                               inputs.batch_ends or [0.0] * count, strict=True)]


@dataclass(frozen=True, slots=True)
class _Started:
    """Where the start left the fleet: every lease owned (if it was within 600 s), later agents scheduled."""

    owned_after: float | None  # seconds from the first lease owned to every lease owned
    owned_at: float  # the simulation time every lease was owned (the time the start ended if never)
    moves: int  # the fleet's move count then


class _Looks:
    """The bench's looks at the lease table every STEP from `phase` (s): when the first lease and every lease were
    first seen owned. They are events of the fleet's queue, so a look can fall between two of a leader run's timed
    writes (bench/fleet/model.py), as a live look falls within the live leader's write part."""

    def __init__(self, fleet: Fleet, phase: float) -> None:
        self._fleet = fleet
        self.first: float | None = None
        self.done: _Started | None = None
        fleet.events.every(phase, STEP, self._look)

    def _look(self) -> bool:
        fleet, now = self._fleet, self._fleet.events.now()
        if self.first is None and any(lease.actual_owner for lease in fleet.leases()):
            self.first = now
        if self.first is not None and _owned(fleet):
            self.done = _Started(now - self.first, now, fleet.moves.moves)
        return self.done is None


def _start(fleet: Fleet, agents: Sequence[_Agent], plain_noise: float, phase: float) -> _Started:
    """Start the agents on the live timeline of their first rows, until every lease is owned.

    The simulated first assignment comes when the live one did, at offset 0: the leader's first run waits until then
    and for the rows of the agents there before it (offset < 0; at least the first agent), which come at their live
    offsets (the earliest one first-report wait after the start). Live, the first assignment found those rows
    (session 26: 31 of 32 plain agents, running 6-8 s before it, each given 8 or 9 of 256 leases at once; the
    simulated leader, started with them, assigned before 11 of them had a row and shed 76 leases to them next run).
    Every later agent writes its first row at its offset after it, the moment the live bench saw that row (not one
    first-report wait and a start jitter after it; a 16-shard run's agent at 0.0 was filled 0.3 s after the
    assignment live, 2.5 s after it in the simulator)."""
    pending = sorted(agents)
    early = max(1, sum(1 for agent in pending if agent.offset < 0))
    ids = [pending[0].add_to(fleet, 0.0, plain_noise)]
    zero = fleet.workers[ids[0]].row_wait() - pending[0].offset  # the simulation time of offset 0
    ids += [agent.add_to(fleet, zero + agent.offset, plain_noise) for agent in pending[1:early]]
    fleet.first_run_at(zero, ids)
    for agent in pending[early:]:
        agent.add_to(fleet, zero + agent.offset, plain_noise)
    looks = _Looks(fleet, phase)
    while fleet.events.now() < 600.0 and looks.done is None:
        fleet.events.run_until(fleet.events.now() + STEP)
    return looks.done or _Started(None, fleet.events.now(), fleet.moves.moves)


def predict(inputs: LiveInputs, seed: int = 7, on_run: Callable[[float, RunSummary], None] | None = None) -> Figures:
    """Replay the live run's fleet and events in the simulator; its figures. `on_run` sees each leader run with the
    virtual time it started (seconds from the simulation's start)."""
    meters: list[StoreMeter] = []

    def wrap(inner: LeaseStore) -> LeaseStore:
        meters.append(StoreMeter(inner, consistent_reads=inputs.consistent_reads, default_caller="agent"))
        return meters[-1]

    keys = sorted(inputs.kbps)
    fleet = Fleet(VARIANCE, "worker", Stream.tiled([inputs.kbps[key] for key in keys]), seed,
                  checkpoint_seconds=60.0 / inputs.checkpoints if inputs.checkpoints > 0 else 0.0,
                  overrides=user_settings(), noise=LiveNoise(NoiseModel(PLAIN_DELIVERY), seed), cpu_model=_cpu(inputs),
                  wrap_store=wrap, progress=True, channel=True, write_seconds=inputs.write_seconds,
                  on_run=None if on_run is None else lambda summary: on_run(
                      fleet.events.now() - summary.duration_ms / 1000, summary))  # when the run started
    fleet.calibrate(len(inputs.joins))
    # The live bench looks every half second at no particular phase of the leader's runs: drawn per seed.
    started = _start(fleet, _agents(inputs), plain_noise_scale(inputs),
                     random.Random(f"{seed}:looks").uniform(0.0, STEP))
    fleet.events.run_until(started.owned_at + inputs.warmup)
    settle_moves = fleet.moves.moves - started.moves  # every lease is owned: each owner change is a balancing move
    settled_after = max((at - started.owned_at for at, _, moved in fleet.runs if moved and at > started.owned_at),
                        default=0.0)
    meters[0].reset()
    fleet.moves.moves = 0
    fleet.events.run_until(fleet.events.now() + inputs.settle)
    minutes = inputs.settle / 60.0
    usage = usage_total(meters[0].rows())
    reads = {caller: total.read_units / minutes for caller, total in meters[0].by_caller().items()}
    steady = fleet.moves.moves
    # The live bench kills at no particular moment of the victim's heartbeats: the crash's phase is drawn per seed.
    fleet.events.run_until(fleet.events.now() + random.Random(f"{seed}:kill").uniform(0.0, fleet.timing.heartbeat))
    held = {wid: 0 for wid in fleet.live()}
    for lease in fleet.leases():
        if lease.actual_owner in held:
            held[lease.actual_owner] += 1
    victim = max(held, key=lambda wid: (held[wid], wid))
    victims = {lease.lease_key for lease in fleet.leases() if lease.actual_owner == victim}
    fleet.workers[victim].crash()

    def moved(fleet: Fleet) -> bool:
        live = set(fleet.live())
        return all(lease.actual_owner in live for lease in fleet.leases() if lease.lease_key in victims)

    return Figures(started.owned_after, steady, usage.read_units / minutes, usage.write_units / minutes, len(victims),
                   None, settle_moves, settled_after, reads, kill_owned_after=_run_until(fleet, moved, KILL_WATCH))


def cpu_inputs(rows: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """(base, mean) of the live agents' CPU from (cpu, leases held) per agent: the base is the median CPU of those
    holding nothing, or the least loaded agent's if every agent holds a lease."""
    idle = [cpu for cpu, held in rows if held == 0]
    base = statistics.median(idle) if idle else min(cpu for cpu, _ in rows)
    return base, statistics.fmean(cpu for cpu, _ in rows)


def own_cpu(cpus: Mapping[str, tuple[float, int]], spark: Collection[str]) -> dict[str, float]:
    """Each Spark agent's CPU points above the plain agents' median (what its JVM adds; never below 0), from
    (CPU, leases held) per agent. The plain agents carry about the same share, so the rest is not their leases'."""
    plain = [cpu for wid, (cpu, _) in cpus.items() if wid not in spark]
    middle = statistics.median(plain) if plain else 0.0
    return {wid: max(0.0, cpus[wid][0] - middle) for wid in spark if wid in cpus}


def _cell(value: float | int | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _differs(live: float | int | None, sim: float | int | None, resolution: float) -> str:
    if live is None or sim is None:
        return ""
    if live == sim:
        return ""
    bound = max(MARGIN * max(abs(live), abs(sim)), resolution)
    return f" ({'over' if abs(live - sim) > bound else 'within'} 20 %)"


def _grouped(reads: Mapping[str, float]) -> dict[str, float]:
    """Read units per minute by caller, a Spark application's executors counted with its agent (the simulated
    Spark agent reads its batch ends itself)."""
    grouped: dict[str, float] = {}
    for caller, units in reads.items():
        name = "agents (executors included)" if caller in ("agent", "executor") else caller
        grouped[name] = grouped.get(name, 0.0) + units
    return grouped


def side_by_side(live: Figures, sim: Figures) -> str:
    """The comparison table (Markdown), each row marked when live and simulator differ by more than 20 % of the larger
    and by more than the figure's resolution: LOOKS for a time, COUNTS for a count, UNITS for store units a minute."""
    live_reads, sim_reads = _grouped(live.reads_by_caller), _grouped(sim.reads_by_caller)
    rows = [("every lease owned, s after the first was", live.owned_after, sim.owned_after, 1, LOOKS),
            ("balancing moves from then to the steady window", live.settle_moves, sim.settle_moves, 0, COUNTS),
            ("the last of them, s after every lease was owned", live.settled_after, sim.settled_after, 1, LOOKS),
            ("owner changes in the steady window", live.steady_moves, sim.steady_moves, 0, COUNTS),
            ("store read units per minute", live.read_units, sim.read_units, 0, UNITS)]
    rows += [(f"- of which {caller}", live_reads.get(caller), sim_reads.get(caller), 0, UNITS)
             for caller in sorted(set(live_reads) | set(sim_reads))]
    rows += [("store write units per minute", live.write_units, sim.write_units, 0, UNITS),
             ("leases of the killed agent", live.kill_leases, sim.kill_leases, 0, COUNTS),
             _kill_row(live, sim),
             ("kill -9: all of them read elsewhere after, s (live only: the simulator reads nothing)", live.kill_after,
              None, 1, LOOKS)]
    lines = ["| figure | live | simulator |", "|---|---|---|"]
    lines += [f"| {name} | {_cell(a, digits)} | {_cell(b, digits)}{_differs(a, b, floor)} |"
              for name, a, b, digits, floor in rows]
    return "\n".join(lines)


def _kill_row(live: Figures, sim: Figures) -> tuple[str, float | None, float | None, int, float]:
    """The kill's owned row: both sides' seconds until every lease of the killed agent is owned elsewhere, its
    resolution one look on each side (the live scenario's look that saw it, after the one before it; the simulator's
    STEP), LOOKS where the live look is not known. A replay written before the live owned figure was measured
    compares the live read figure, as the table did then, and says so."""
    if live.kill_owned_after is None and live.kill_after is not None:
        return ("kill -9: all of them elsewhere after, s (live: read, its owned time not in this replay; sim: owned)",
                live.kill_after, sim.kill_owned_after, 1, LOOKS)
    if live.kill_look is None:
        return "kill -9: all of them owned elsewhere after, s", live.kill_owned_after, sim.kill_owned_after, 1, LOOKS
    return (f"kill -9: all of them owned elsewhere after, s (live look {live.kill_look:.2f} s after the one before, "
            f"sim every {STEP} s)", live.kill_owned_after, sim.kill_owned_after, 1, live.kill_look + STEP)


def describe(inputs: LiveInputs) -> str:
    """One line on what the simulator replays."""
    own = [cpu for cpu, rate in zip(inputs.own_cpu or [0.0] * len(inputs.joins),
                                    inputs.batch_ends or [0.0] * len(inputs.joins), strict=True) if cpu or rate]
    joins = sorted(inputs.joins)
    return (f"{len(inputs.kbps)} shards at the KiB/s the agents reported, {sum(inputs.kbps.values()):.1f} KiB/s in "
            f"all; {len(joins)} agents joining {joins[0]:.1f} to {joins[-1]:.1f} s from the first lease owned; CPU "
            f"base {inputs.cpu_base:.2f} %, mean {inputs.cpu_mean:.2f} % (plain agents {plain_mean(inputs):.2f} %: "
            f"{plain_noise_scale(inputs):.2f} of LOCAL_CPU's noise); own CPU of the Spark agents "
            f"{', '.join(f'{cpu:.1f}' for cpu in own) or '-'} points; the leader's owner writes "
            f"{_write_time(inputs)}; warm-up {inputs.warmup:.0f} s, steady window {inputs.settle:.0f} s")


def write_lanes() -> int:
    """The leader's write lanes at the users' defaults (`leader_write_threads`), live and simulated."""
    return load_settings(**user_settings()).leader_write_threads


def _write_time(inputs: LiveInputs) -> str:
    if inputs.write_seconds <= 0:
        return "land at once (their live time unknown)"
    return f"{1000 * inputs.write_seconds:.1f} ms each on one of {write_lanes()} lanes"


class ReplayError(ValueError):
    """A replay file that does not hold a live run's inputs and figures as `write_replay` writes them."""


def _plain(value: LiveInputs | Figures) -> dict[str, Any]:
    def plain(item: object) -> object:
        if isinstance(item, Mapping):
            return dict(item)
        return list(item) if isinstance(item, Sequence) else item
    return {spec.name: plain(getattr(value, spec.name)) for spec in fields(value)}


def write_replay(path: Path, inputs: LiveInputs, live: Figures) -> None:
    """Write a live run's simulator inputs and figures as JSON, for `read_replay` (and `--replay`)."""
    path.write_text(json.dumps({"inputs": _plain(inputs), "live": _plain(live)}, indent=1) + "\n", encoding="utf-8")


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _count(value: object) -> int:
    if not _number(value).is_integer():
        raise TypeError(f"{value!r} is not a count")
    return int(_number(value))


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


def _numbers(value: object) -> list[float]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return [_number(item) for item in value]


def _series(value: object) -> list[list[float]]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return [_numbers(item) for item in value]


def _by_name(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        raise TypeError(f"{value!r} is not an object")
    return {str(key): _number(item) for key, item in value.items()}


# Each field's annotation (a string: the module postpones them) to what reads its JSON value.
_READERS: dict[str, Callable[[object], object]] = {"float": _number, "int": _count, "bool": _flag,
                                                    "Sequence[float]": _numbers, "Mapping[str, float]": _by_name,
                                                    "Sequence[Sequence[float]]": _series}
_Record = TypeVar("_Record", LiveInputs, Figures)


def _record(kind: type[_Record], data: object) -> _Record:
    if not isinstance(data, dict):
        raise TypeError(f"{kind.__name__}: {data!r} is not an object")
    specs = {spec.name: str(spec.type) for spec in fields(kind)}
    if unknown := sorted(set(data) - set(specs)):
        raise TypeError(f"{kind.__name__} has no field {', '.join(unknown)}")
    values: dict[str, Any] = {name: None if value is None and specs[name].endswith(" | None")
              else _READERS[specs[name].removesuffix(" | None")](value) for name, value in data.items()}
    return kind(**values)  # a required field missing: TypeError


def read_replay(path: Path) -> tuple[LiveInputs, Figures]:
    """A live run's simulator inputs and figures from `path` (`write_replay`); ReplayError, naming the file and the
    fault, if it cannot be read or holds anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("not an object")
        return _record(LiveInputs, data.get("inputs")), _record(Figures, data.get("live"))
    except (OSError, ValueError, TypeError) as exc:
        raise ReplayError(f"{path}: not a scale run's replay ({exc})") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Replay a live scale run's fleet in the simulator, once per seed, each beside the live figures."""
    parser = argparse.ArgumentParser(description="Replay a live scale run (bench/scale.py writes "
                                     f"{REPLAY_FILE} into its run directory) in the fleet simulator.")
    parser.add_argument("--replay", type=Path, required=True, help="the run's replay file")
    parser.add_argument("--seed", type=int, action="append", help="a seed of the simulation (repeat for more; "
                        f"default {', '.join(map(str, SEEDS))}: one seed is never the evidence)")
    parser.add_argument("--moves", action="store_true", help="list each seed's balancing moves from every lease "
                        "owned to the steady window, as bench/scale.py lists the live ones, then the steady window's")
    parser.add_argument("--write-seconds", type=float, default=None, help="the live leader's seconds per owner write "
                        "on one write lane, for a replay file written before bench/scale.py measured it (its log's "
                        "start-up `write` max over the first assignment's writes per lane, e.g. 1.131 / (256 / 8))")
    args = parser.parse_args(argv)
    try:
        inputs, live = read_replay(args.replay)
    except ReplayError as exc:
        parser.error(str(exc))
    if args.write_seconds is not None:
        if args.write_seconds < 0:
            parser.error("--write-seconds must not be negative")
        inputs = replace(inputs, write_seconds=args.write_seconds)
    print(f"fleet simulator replaying {args.replay} ({describe(inputs)})")
    for seed in args.seed or SEEDS:
        figures, runs = _replay(inputs, seed)
        print(f"seed {seed}:\n{side_by_side(live, figures)}", flush=True)
        if args.moves:
            print("\n".join(startup_moves(runs, figures, inputs)) or "  (none)", flush=True)
    return 0


def _replay(inputs: LiveInputs, seed: int) -> tuple[Figures, list[tuple[float, RunSummary]]]:
    runs: list[tuple[float, RunSummary]] = []
    return predict(inputs, seed, lambda at, summary: runs.append((at, summary))), runs


def startup_moves(runs: Sequence[tuple[float, RunSummary]], figures: Figures, inputs: LiveInputs) -> list[str]:
    """One line per balancing move of the simulated runs (virtual time, summary) from every lease owned to the
    steady window, then one per move of the steady window (what makes its owner changes), each timed from every
    lease owned by its run."""
    first = next((at for at, summary in runs if summary.plan is not None and any(
        move.from_owner is None for move in summary.plan.moves)), None)
    if first is None or figures.owned_after is None:
        return []
    owned = first + figures.owned_after
    steady = owned + inputs.warmup

    def lines(since: float, until: float, balancing: bool) -> list[str]:
        return [f"  +{at - owned:.1f} s {move.lease_key}: {move.from_owner} -> {move.to_worker} {move.reason.name}: "
                f"{move.detail}" for at, summary in runs if summary.plan is not None and since <= at < until
                for move in summary.plan.moves if move.reason.is_balancing or not balancing]

    return [*lines(owned, steady, True), "  steady window:", *(lines(steady, steady + inputs.settle, False)
                                                                or ["  (none)"])]


if __name__ == "__main__":
    raise SystemExit(main())
