"""The fleet simulator's side of the scale bench (bench/scale_sim.py): it replays a live run's fleet and events."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench.fleet.model import VARIANCE, Fleet
from bench.fleet.worker import CpuModel, CpuNoise
from bench.fleet.world import Stream
from bench.scale_sim import (
    STEP,
    Figures,
    LiveInputs,
    ReplayError,
    _Agent,
    _cpu,
    cpu_inputs,
    main,
    noise_spread,
    own_cpu,
    plain_mean,
    plain_noise_scale,
    predict,
    read_replay,
    side_by_side,
    user_settings,
    write_replay,
)
from shardherd.coordinator.moves import MoveReason
from shardherd.coordinator.run_summary import RunSummary
from shardherd.shared.config import load_settings


def test_a_replayed_fleet_owns_every_lease_and_fails_the_killed_agents_leases_over() -> None:
    kbps = {f"shardId-{i:012d}": 0.5 + (i % 5) * 0.3 for i in range(16)}
    joins = [-3.0, -1.0, -0.5, 6.0]  # three agents there before the first lease is owned, one joins 6 s after it
    figures = predict(LiveInputs(kbps, joins, cpu_base=2.0, cpu_mean=3.0, warmup=20.0, settle=30.0))
    assert figures.owned_after is not None and figures.owned_after < 6.0  # the late agent is not needed to own them
    assert figures.steady_moves is not None and figures.steady_moves >= 0
    # The late agent's first row is valid (its first CPU report comes first, as live: decision 0038), so the run that
    # sees it fills it: its leases move within two runs (2 s each) of that row, 2 s after it started at +6 s.
    assert figures.settle_moves and figures.settled_after is not None and figures.settled_after <= 6.0 + 2.0 + 4.0
    assert figures.read_units and figures.write_units  # heartbeats, checkpoints and scans are priced
    assert figures.kill_leases is not None and 4 <= figures.kill_leases <= 16  # the busiest of 4 holds >= a quarter
    # The victim named its last row to the leader, which runs when that row's failover time (10 s at the users'
    # defaults) ends: its leases move within 10 s of the crash plus one look (12.0 s when the simulated leader timed
    # the silence from a scan and ran only on its interval; live, 8.0-11.3 s to read them elsewhere).
    assert figures.kill_owned_after is not None and figures.kill_owned_after <= 10.0 + STEP, figures
    assert figures.kill_after is None  # the simulated agents read nothing: no time until they read


def test_the_crash_comes_at_a_phase_of_the_victims_heartbeats_drawn_per_seed() -> None:
    # Live, the kill comes at no particular moment of the victim's heartbeats: 7.6 s and 10.9 s to read its leases
    # elsewhere in two runs of the same code. The simulator crashed it at one phase whatever the seed.
    kbps = {f"shardId-{i:012d}": 0.5 for i in range(8)}
    inputs = LiveInputs(kbps, [-1.0, -0.5], cpu_base=2.0, cpu_mean=3.0, warmup=10.0, settle=10.0)
    kills = {predict(inputs, seed).kill_owned_after for seed in range(1, 5)}
    assert len(kills) > 1 and all(kill is not None and kill <= 10.0 + STEP for kill in kills), kills


def test_cpu_inputs_take_the_base_from_agents_holding_nothing() -> None:
    base, mean = cpu_inputs([(2.5, 15), (1.2, 0), (1.4, 0), (2.3, 15)])
    assert abs(base - 1.3) < 1e-9 and abs(mean - 1.85) < 1e-9
    assert cpu_inputs([(2.5, 15), (2.1, 3)])[0] == 2.1  # every agent holds leases: the least loaded one


def test_the_table_marks_figures_that_differ_by_more_than_a_fifth() -> None:
    live = Figures(6.0, 0, 100.0, 50.0, 15, 12.0)
    sim = Figures(5.0, 0, 130.0, 50.0, 15, None)
    table = side_by_side(live, sim)
    assert "| 6.0 | 5.0 (within 20 %) |" in table
    assert "| 100 | 130 (over 20 %) |" in table
    assert "| 12.0 | - |" in table  # a figure one side did not measure is not judged
    close = side_by_side(Figures(0.6, 0, 1.0, 1.0, 1, 9.0), Figures(0.0, 0, 1.0, 1.0, 1, None, kill_owned_after=10.2))
    assert "| 0.6 | 0.0 (within 20 %) |" in close  # both sides look every half second: two looks apart is no error
    assert "| 9.0 | 10.2 (within 20 %) |" in close


def test_the_spark_agents_batch_end_reads_are_replayed() -> None:
    kbps = {f"shardId-{i:012d}": 1.0 for i in range(8)}
    plain, spark = (predict(LiveInputs(kbps, [0.0, 0.0], cpu_base=2.0, cpu_mean=3.0, warmup=10.0, settle=30.0,
                                       batch_ends=rates)) for rates in ((), (30.0, 30.0)))
    assert plain.read_units is not None and spark.read_units is not None
    # Both agents read 30 batch ends per held lease per minute, 8 leases: 240 consistent GetItems, 1 unit each.
    assert spark.read_units - plain.read_units >= 0.8 * 240, (plain, spark)


def test_the_live_checkpoint_rate_is_replayed() -> None:
    kbps = {f"shardId-{i:012d}": 1.0 for i in range(8)}
    quiet, checkpointing = (predict(LiveInputs(kbps, [0.0, 0.0], cpu_base=2.0, cpu_mean=3.0, warmup=10.0, settle=30.0,
                                               checkpoints=rate)) for rate in (0.0, 30.0))
    assert quiet.write_units is not None and checkpointing.write_units is not None
    # 30 checkpoints per shard per minute on 8 shards: 240 writes a minute, at least 1 unit each.
    assert checkpointing.write_units - quiet.write_units >= 0.8 * 240, (quiet, checkpointing)


def test_agents_with_cpu_no_lease_explains_hold_their_share_in_the_simulator() -> None:
    # The live run (bench.scale: 64 shards, 8 plain agents and 2 Spark agents, 4.7 KiB/s in all, CPU base 1.2 %,
    # mean 3.9 %): the Spark agents' JVMs put them 12-17 points above the plain ones; band shed their leases for
    # CPU and filled them again on throughput shares, 61 owner changes in 10 minutes (the simulator: 43 in 180 s).
    # The leader now learns each agent's own CPU from its reports (the fill that gave it its share moved its
    # throughput, not its CPU) and keeps it (decision 0044): the mixed fleet settles as the plain one does.
    kbps = {f"shardId-{i:012d}": 0.04 + (i % 5) * 0.02 for i in range(64)}
    # Eight plain agents there at the first assignment (a row seen at its look replays one look, 0.5 s, before it).
    joins = [-1.5] * 2 + [-0.5] * 6 + [25.0, 25.2]
    plain, spark = (predict(LiveInputs(kbps, joins, cpu_base=1.2, cpu_mean=3.9, warmup=60.0, settle=180.0,
                                       own_cpu=own)) for own in ((), [0.0] * 8 + [12.0, 12.0]))
    assert plain.steady_moves == 0, plain
    assert spark.steady_moves == 0, spark


def test_own_cpu_is_a_spark_agents_cpu_above_the_plain_median() -> None:
    cpus = {"a": (1.0, 7), "b": (2.0, 6), "c": (3.0, 6), "s1": (15.0, 4), "s2": (1.5, 7)}
    assert own_cpu(cpus, {"s1", "s2", "gone"}) == {"s1": 13.0, "s2": 0.0}


def test_the_leaders_scans_are_priced_as_the_live_store_prices_them() -> None:
    kbps = {f"shardId-{i:012d}": 1.0 for i in range(64)}
    eventual, consistent = (predict(LiveInputs(kbps, [0.0, 0.0], cpu_base=2.0, cpu_mean=3.0, warmup=10.0, settle=60.0,
                                               consistent_reads=flag)) for flag in (False, True))
    # A consistent scan costs twice an eventual one (DynamoDB's pricing; the live meter prices PostgreSQL's reads
    # as consistent): the simulated leader's reads double, the agents' owner-index queries (never consistent) do not.
    leader = eventual.reads_by_caller["leader"], consistent.reads_by_caller["leader"]
    assert leader[0] > 0 and abs(leader[1] - 2 * leader[0]) <= 0.1 * leader[1], leader
    assert consistent.reads_by_caller["agent"] == eventual.reads_by_caller["agent"]


def test_the_table_shows_read_units_by_caller_with_executors_counted_with_their_agents() -> None:
    live = Figures(0.0, 0, 30.0, 1.0, 1, 9.0, reads_by_caller={"agent": 10.0, "executor": 5.0, "leader": 15.0})
    sim = Figures(0.0, 0, 35.0, 1.0, 1, 9.0, reads_by_caller={"agent": 14.0, "leader": 21.0})
    table = side_by_side(live, sim)
    assert "| - of which agents (executors included) | 15 | 14 (within 20 %) |" in table
    assert "| - of which leader | 15 | 21 (over 20 %) |" in table


def _small_run() -> tuple[LiveInputs, Figures]:
    kbps = {f"shardId-{i:012d}": 0.2 + (i % 3) * 0.1 for i in range(12)}
    inputs = LiveInputs(kbps, [-2.0, -0.5, 4.0], cpu_base=2.0, cpu_mean=2.5, warmup=15.0, settle=30.0, checkpoints=6.0,
                        own_cpu=[0.0, 0.0, 9.5], batch_ends=[0.0, 0.0, 20.0], consistent_reads=True,
                        cpu_reports=[[1.0, 1.2], [0.9], [15.0, 16.5, 14.9]])
    live = Figures(0.5, 3, 40.0, 120.0, 5, 9.1, settle_moves=4, settled_after=None,
                   reads_by_caller={"agent": 12.0, "leader": 28.0}, kill_owned_after=8.4, kill_look=0.61)
    return inputs, live


def test_a_replay_file_holds_the_inputs_and_live_figures_as_written(tmp_path: Path) -> None:
    inputs, live = _small_run()
    path = tmp_path / "scale-replay.json"
    write_replay(path, inputs, live)
    assert read_replay(path) == (inputs, live)


def test_the_replay_prints_one_table_per_seed_beside_the_live_figures(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    inputs, live = _small_run()
    path = tmp_path / "scale-replay.json"
    write_replay(path, inputs, live)
    assert main(["--replay", str(path), "--seed", "3", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert "12 shards" in out and "3 agents joining -2.0 to 4.0 s" in out and "own CPU of the Spark agents 9.5" in out
    tables = out.split("seed ")[1:]
    assert [table.split(":")[0] for table in tables] == ["3", "4"]
    for seed, table in zip((3, 4), tables, strict=True):
        # each table is the side-by-side of the live figures and that seed's prediction
        assert table.removeprefix(f"{seed}:\n").strip() == side_by_side(live, predict(inputs, seed))
        assert "| leases of the killed agent | 5 |" in table and "| - of which leader | 28 |" in table


@pytest.mark.parametrize("text", ["not json", "[]", '{"inputs": {}, "live": {}}',
                                  '{"inputs": {"kbps": {"s": "fast"}}, "live": {}}'])
def test_a_file_that_is_not_a_replay_is_refused_by_name(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReplayError, match=r"bad\.json: not a scale run's replay"):
        read_replay(path)


def test_a_replay_with_a_wrong_or_unknown_field_is_refused(tmp_path: Path) -> None:
    inputs, live = _small_run()
    path = tmp_path / "scale-replay.json"
    write_replay(path, inputs, live)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["live"]["settle_moves"] = 2.5
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReplayError, match="not a count"):
        read_replay(path)
    data["live"]["settle_moves"] = 2
    data["inputs"]["shards"] = 12
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReplayError, match="no field shards"):
        read_replay(path)


def test_agents_there_before_the_first_assignment_share_it_and_a_joiner_is_filled_when_its_row_appears() -> None:
    # Session 26's live run: 31 of 32 plain agents had rows before the leader's first assignment, which gave each 8 or
    # 9 of the 256 leases at once (no balancing move among them); the 32nd's row came ~1.5 s after it, and one run
    # filled it with 7. The simulator, starting agents and leader together, had assigned before 11 rows existed and
    # then shed 76 leases to them.
    kbps = {f"shardId-{i:012d}": 0.02 + (i % 7) * 0.01 for i in range(64)}
    joins = [-4.0] * 7 + [-1.0, 5.0]
    moves: list[tuple[float, str | None, str, MoveReason]] = []

    def on_run(at: float, summary: RunSummary) -> None:
        if summary.plan is not None:
            moves.extend((at, move.from_owner, move.to_worker, move.reason) for move in summary.plan.moves)

    figures = predict(LiveInputs(kbps, joins, cpu_base=2.0, cpu_mean=2.5, warmup=30.0, settle=10.0), on_run=on_run)
    first = min(at for at, _, _, reason in moves if reason is MoveReason.UNASSIGNED)
    assigned = {to for at, _, to, reason in moves if reason is MoveReason.UNASSIGNED and at == first}
    assert len(assigned) == 8, moves  # every agent there before the first lease was owned
    fills = [(at - first, to) for at, giver, to, reason in moves if reason is MoveReason.BALANCE_THROUGHPUT]
    joiner = {to for _, to in fills}
    assert len(joiner) == 1 and joiner.isdisjoint(assigned), fills  # only the late agent is filled
    # its row at +5.0 s wakes the leader (the channel's news) a quarter interval (0.5 s) later
    assert all(5.0 <= after <= 5.0 + 0.5 + STEP for after, _ in fills), fills
    assert figures.settle_moves is not None and figures.settle_moves >= len(fills)


def test_differences_below_a_figures_resolution_are_not_marked() -> None:
    live = Figures(0.5, 5, 30.0, 4.0, 9, 9.1, settle_moves=21, reads_by_caller={"lock": 1.0, "leader": 4.0})
    close = side_by_side(live, Figures(0.0, 7, 30.0, 4.0, 10, 9.1, settle_moves=23,
                                       reads_by_caller={"lock": 0.0, "leader": 9.0}))
    assert "over" not in close, close  # 2 moves or leases, 5 units a minute: within the sides' resolution
    far = side_by_side(live, Figures(0.0, 8, 30.0, 10.0, 12, 9.1, settle_moves=27,
                                     reads_by_caller={"lock": 0.0, "leader": 9.5}))
    assert "| owner changes in the steady window | 5 | 8 (over 20 %) |" in far
    assert "| store write units per minute | 4 | 10 (over 20 %) |" in far
    assert "| leases of the killed agent | 9 | 12 (over 20 %) |" in far
    assert "| balancing moves from then to the steady window | 21 | 27 (over 20 %) |" in far
    assert "| - of which leader | 4 | 10 (over 20 %) |" in far and "| - of which lock | 1 | 0 (within 20 %) |" in far


def test_the_replay_lists_the_simulated_balancing_moves_of_the_start(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    inputs, live = _small_run()
    path = tmp_path / "scale-replay.json"
    write_replay(path, inputs, live)
    assert main(["--replay", str(path), "--seed", "3", "--moves"]) == 0
    start, steady = capsys.readouterr().out.split("  steady window:\n")
    assert steady.startswith(("  +", "  (none)"))  # then the steady window's moves, whatever their reason
    lines = [line for line in start.splitlines() if line.startswith("  +")]
    # the agent whose row came 4 s after the first lease was owned gets its share in the run its row woke
    moved = [line for line in lines if "BALANCE_THROUGHPUT" in line]
    assert moved and all(line.startswith(("  +4.", "  +5.")) for line in moved), lines
    assert len({line.split(" -> ")[1].split()[0] for line in moved}) == 1  # one receiver


def test_the_plain_agents_mean_leaves_the_spark_agents_own_cpu_out() -> None:
    # Session 27's first scale run: 32 plain agents at about 1 %, two Spark agents 15.4 and 16.8 points above their
    # median: the mean of all 34 (1.91 %) put the plain agents' leases at 1.1 points of CPU above the base instead of
    # 0.2, six times the live cost of a KiB/s.
    kbps = {f"shardId-{i:012d}": 0.1 for i in range(8)}
    inputs = LiveInputs(kbps, [0.0] * 4, cpu_base=1.0, cpu_mean=(3 * 1.2 + 1.2 + 16.0) / 4, warmup=10.0, settle=10.0,
                        own_cpu=[0.0, 0.0, 0.0, 16.0], batch_ends=[0.0, 0.0, 0.0, 30.0])
    assert abs(plain_mean(inputs) - 1.2) < 1e-9
    assert _cpu(inputs).mean_at_start == plain_mean(inputs) and _cpu(inputs).base == 1.0


def test_cpu_noise_scales_exactly_with_its_share() -> None:
    # The fit bisects on the share: the same draws, each times the share (the clipping at 0 comes after).
    model = CpuModel(base=1.0, sample_sd=1.0, excursions_per_minute=6.0, excursion_seconds=8.0, excursion_points=4.0)
    full, part = (CpuNoise(model, random.Random(5), random.Random(6)) for _ in range(2))
    pairs = [(full.sample() + full.excursion(t), part.sample(0.25) + part.excursion(t, 0.25)) for t in range(300)]
    assert any(abs(a) > 4.0 for a, _ in pairs)  # excursions came
    assert all(abs(b - 0.25 * a) < 1e-9 for a, b in pairs)


def test_the_plain_agents_noise_is_the_most_their_live_spread_allows() -> None:
    settings = load_settings(**user_settings())
    kbps = {f"shardId-{i:012d}": 0.1 for i in range(16)}

    def inputs(spread: float) -> LiveInputs:
        return LiveInputs(kbps, [0.0] * 9, cpu_base=1.0, cpu_mean=(8 * (1.0 + spread) + 1.0 + spread + 15.0) / 9,
                          warmup=10.0, settle=10.0, own_cpu=[0.0] * 8 + [15.0], batch_ends=[0.0] * 8 + [30.0])

    model = _cpu(inputs(0.1))
    assert noise_spread(model, 0.0, 8, settings) == 0.0
    half = noise_spread(model, 0.5, 8, settings)
    assert 0.0 < half < noise_spread(model, 1.0, 8, settings)
    # a live spread that half the noise makes is fitted to half the noise (the Spark agent does not count)
    assert abs(plain_noise_scale(inputs(half)) - 0.5) < 0.02
    assert plain_noise_scale(inputs(0.0)) == 0.0
    assert plain_noise_scale(inputs(10.0)) == 1.0  # a spread the whole noise does not make: the model as it is


def test_a_replays_plain_agents_get_the_fitted_noise_and_its_spark_agents_all_of_it() -> None:
    kbps = {f"shardId-{i:012d}": 0.1 for i in range(4)}
    fleet = Fleet(VARIANCE, "worker", Stream.tiled(list(kbps.values())), 7)
    plain, spark = _Agent(0.0, 0.0, 0.0), _Agent(0.0, 14.0, 30.0)
    assert not plain.spark and spark.spark
    ids = [agent.add_to(fleet, 0.0, 0.25) for agent in (plain, spark)]
    assert [fleet.workers[wid].noise_scale for wid in ids] == [0.25, 1.0]
    assert fleet.workers[ids[1]].own_cpu == 14.0


def test_the_leaders_owner_writes_take_the_live_time_per_write_and_lane_so_the_first_assignment_spreads() -> None:
    # Session 28's run 2: the first assignment's 256 owner writes took 1,131 ms on the leader's 8 write lanes (its
    # `write` part), the bench saw every lease owned 1.1 s after the first; the simulator, writing them at one
    # instant, 0.0 on every seed. 64 leases on 8 lanes at 0.25 s a write: 8 rounds, 2.0 s.
    kbps = {f"shardId-{i:012d}": 0.05 for i in range(64)}
    inputs = LiveInputs(kbps, [-1.0, -1.0, -0.5, -0.5], cpu_base=1.0, cpu_mean=1.5, warmup=10.0, settle=10.0)
    assert predict(inputs, 7).owned_after == 0.0
    for seed in (7, 8, 9):
        owned_after = predict(replace(inputs, write_seconds=0.25), seed).owned_after
        # the bench's looks every STEP see the first write land after 0.25 s and the last after 2.0 s
        assert owned_after is not None and 2.0 - 0.25 - STEP <= owned_after <= 2.0 - 0.25 + STEP, (seed, owned_after)


def test_a_replay_carries_the_leaders_write_time_and_one_written_before_it_reads_as_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs, live = _small_run()
    path = tmp_path / "scale-replay.json"
    write_replay(path, replace(inputs, write_seconds=0.0353), live)
    assert read_replay(path)[0].write_seconds == 0.0353
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["inputs"]["write_seconds"]  # a replay of session 28's runs
    path.write_text(json.dumps(data), encoding="utf-8")
    assert read_replay(path)[0].write_seconds == 0.0
    # Given on the command line for such a file (from its run's log), it is replayed with it.
    assert main(["--replay", str(path), "--seed", "3", "--write-seconds", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "the leader's owner writes 500.0 ms each on one of 8 lanes" in out
    assert side_by_side(live, predict(replace(inputs, write_seconds=0.5), 3)) in out
    with pytest.raises(SystemExit):
        main(["--replay", str(path), "--write-seconds", "-1"])

READ_ROW = "kill -9: all of them read elsewhere after, s (live only: the simulator reads nothing)"


def test_the_kill_compares_owned_with_owned_and_shows_the_live_read_time_on_its_own_row() -> None:
    # Session 28's run 1: the live bench timed the killed agent's leases read elsewhere (10.3 s), the simulator owned
    # elsewhere (7.0 s on two seeds): over 20 %, part of it the new owners' first reads. Owned against owned: within.
    live = Figures(1.1, 0, 600.0, 4500.0, 9, 10.3, kill_owned_after=8.6, kill_look=0.62)
    sim = Figures(1.0, 0, 600.0, 4500.0, 9, None, kill_owned_after=7.0)
    table = side_by_side(live, sim)
    assert ("| kill -9: all of them owned elsewhere after, s (live look 0.62 s after the one before, sim every 0.5 s)"
            " | 8.6 | 7.0 (within 20 %) |") in table
    assert f"| {READ_ROW} | 10.3 | - |" in table
    assert "(live: read" not in table
    far = side_by_side(live, replace(sim, kill_owned_after=5.5))
    assert "| 8.6 | 5.5 (over 20 %) |" in far


def test_the_kills_owned_row_allows_one_look_on_each_side() -> None:
    # A live look that saw them owned 1.5 s after the one before (a loaded host's slow view): 3.0 s live could be
    # 1.5 s, and the simulator's look every 0.5 s adds its own; without the live look the table's usual two looks.
    sim = Figures(0.0, 0, 1.0, 1.0, 3, None, kill_owned_after=1.5)
    slow = side_by_side(Figures(0.0, 0, 1.0, 1.0, 3, 4.0, kill_owned_after=3.0, kill_look=1.5), sim)
    assert "| 3.0 | 1.5 (within 20 %) |" in slow
    unknown = side_by_side(Figures(0.0, 0, 1.0, 1.0, 3, 4.0, kill_owned_after=3.0), sim)
    assert "| kill -9: all of them owned elsewhere after, s | 3.0 | 1.5 (over 20 %) |" in unknown


def test_a_replay_written_before_the_live_owned_time_compares_its_read_time_marked_so(tmp_path: Path) -> None:
    inputs, live = _small_run()
    path = tmp_path / "scale-replay.json"
    write_replay(path, inputs, live)
    assert read_replay(path)[1].kill_owned_after == 8.4 and read_replay(path)[1].kill_look == 0.61
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["live"]["kill_owned_after"], data["live"]["kill_look"]  # as session 28's files hold it
    path.write_text(json.dumps(data), encoding="utf-8")
    old = read_replay(path)[1]
    assert (old.kill_after, old.kill_owned_after, old.kill_look) == (9.1, None, None)
    table = side_by_side(old, Figures(0.5, 3, 40.0, 120.0, 5, None, kill_owned_after=7.0))
    assert ("| kill -9: all of them elsewhere after, s (live: read, its owned time not in this replay; sim: owned) "
            "| 9.1 | 7.0 (over 20 %) |") in table
    assert f"| {READ_ROW} | 9.1 | - |" in table
