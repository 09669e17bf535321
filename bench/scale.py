"""The real stack at scale (issue 36): hundreds of shards on tens of plain agents, every process real, on this machine.

    python -m bench.scale [--shards 256] [--agents 32] [--spark-agents 2] [--rate 500] [--settle 120] [--run-dir .scale]

Starts `shardherd up --no-spark` with shardherd's user defaults (CPU metrics on, leader every 2 s, full scans every
20 s; bench/stack_cost.py's USER_DEFAULTS), the Kinesis limits proxy in front of kinesalite (its shard limit raised
to fit), a throwaway PostgreSQL as the store (`--store moto` for the stack's moto server: one single-threaded Python
process, where 32 agents' checkpoints and heartbeats starved the leader lock's calls until both replicas gave up) and a
producer at `--rate` records/s, every process pricing its own store calls (SHARDHERD_STORE_METER_DIR), and adds
`--spark-agents` Spark agents (drivers running the example pipeline) beside the plain ones. It prints:
* start to every lease owned and to every shard read (its owner reports its lag, or it holds no record), from
  launching `up` (start-up of 30+ Python processes on two cores included; `up`'s own start-up line beside it);
* the leader's run time p50/p99/max over the runs it published while the bench watched (`/v1/leader`), those of
  the steady window and those before it (the first assignment with the shard sync's writes, the fills, the Spark
  drivers' start) apart;
* `/v1/assignments` (every page) and `/metrics` latency p50/p99, with the stack's token, after start-up (the Spark
  drivers still starting), and `/v1/assignments` again after the steady window;
* owner changes and leader moves (by reason) over `--settle` s of steady state from `--warmup` s after every shard
  was read, and the store's capacity units per minute over
  that window next to KCL 3.x's bill for the same leases and workers;
* when each Spark agent first reads a lease of its own, and how many it holds;
* each plain agent's resident memory (median, max), and each Spark agent's with its JVM;
* kill -9 of the agent holding most leases: seconds until each of its shards is read elsewhere (max, and how many),
  and until every one is owned elsewhere (what the simulator times), both from the same looks at the operator
  API's view (`KillWatch`; one every 0.25 s plus the view's own time, printed: the owned figure's resolution);
* the fleet simulator's figures for the same fleet and events beside the live ones (bench/scale_sim.py), on three
  seeds, each marked where the two differ by more than 20 % (and by more than the figure's resolution); the
  simulator's inputs and the live figures go into the run directory's scale-replay.json, for
  `python -m bench.scale_sim --replay` to replay on other seeds or a changed simulator; among them the leader's time
  per owner write on one write lane in its first assignment (the simulator's writes take it: the live leader wrote
  256 owners over 0.7-1.1 s on a loaded host, and the bench saw every lease owned that long after the first) and each
  agent's CPU reports over the steady window (one value per report, read from its row at each look), for a later
  fit of how often and how long an agent's CPU spikes.

The emulators and PostgreSQL stand in for AWS's services, which do not share the fleet's cores: they run at a higher
CPU priority (bench/stack_cost.py's `favour`) than the 30+ shardherd processes. At equal priority on two cores (load
20-40) kinesalite answered GetShardIterator after 17-27 s and GetRecords of a few hundred records after 19-30 s,
so shards with a backlog were never read within the agents' 30 s read timeout.
"""

from __future__ import annotations

import argparse
import compileall
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from botocore.exceptions import BotoCoreError, ClientError

from bench.churn import move_detail
from bench.multilang import tree_rss
from bench.scale_sim import (
    REPLAY_FILE,
    SEEDS,
    Figures,
    LiveInputs,
    cpu_inputs,
    describe,
    own_cpu,
    predict,
    side_by_side,
    write_lanes,
    write_replay,
)
from bench.stack_cost import (
    USER_DEFAULTS,
    batch_end_rate,
    by_caller,
    checkpoint_rate,
    difference,
    emulator_pids,
    favour,
    fresh_meters,
    print_bill,
    read_meters,
    stop_stack,
    wait_for_state,
)
from shardherd.coordinator.moves import MoveReason
from shardherd.coordinator.run_summary import FULL_RUN_PARTS
from shardherd.services.local_stack.control import request
from shardherd.services.local_stack.scenarios import Scenarios, holds_records
from shardherd.services.local_stack.state import StackState
from shardherd.services.local_stack.status import Snapshot
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.aws import make_client
from shardherd.shared.config import load_settings
from shardherd.shared.errors import ShardherdError
from shardherd.shared.store_factory import open_store
from shardherd.shared.worker import CPU_METRIC
from tests.support.postgres import PostgresServer

POLL = 1.0  # seconds between the bench's reads of the API
OWNER_WRITES = ("assigned", "handoffs_started", "lost_races")  # a published run's owner writes (`writes`)
LABELS = {"run": "wall", "cpu": "CPU of the run's thread"}
REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "coordinator", "services", "shared")


def percentiles(values: Sequence[float]) -> str:
    """'p50 X, p99 Y, max Z' of `values` (milliseconds), or 'none'."""
    if not values:
        return "none"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):.0f} ms, p99 {p99:.0f} ms, max {ordered[-1]:.0f} ms (n={len(ordered)})"


class LeaderRuns:
    """Collects the runs the leader publishes (`/v1/leader`), on a thread, by (epoch, start)."""

    def __init__(self, client: OperatorClient) -> None:
        self._client = client
        self.durations: dict[tuple[int, float], float] = {}
        self.full: dict[tuple[int, float], dict[str, float]] = {}  # full runs: milliseconds by part (RunRecord)
        self.moves: dict[str, int] = {}  # the newest totals' moves by reason (continued across failovers)
        self.balancing: list[tuple[float, int]] = []  # (monotonic, the totals' balancing moves) each time they grew
        self.recent: dict[tuple[str, float], dict[str, Any]] = {}  # every published move seen, by (lease, run start)
        self.reasons: dict[tuple[int, float], str] = {}  # full runs: why each read the tables (its kind, no worker id)
        self.writes: dict[tuple[int, float], int] = {}  # full runs: the owner writes each sent (won or lost)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-runs", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            try:
                status = self._client.call("GET", "/v1/leader").get("status") or {}
            except ApiError:
                continue
            for run in status.get("runs", ()):
                self.durations[(run["epoch"], run["started_at"])] = run["duration_ms"]
                if run.get("scanned", True):
                    self.full[(run["epoch"], run["started_at"])] = {
                        "run": run["duration_ms"], "cpu": run.get("cpu_ms", 0.0), "scan": run.get("scan_ms", 0.0),
                        "decide": run.get("decide_ms", 0.0), **run.get("parts", {})}
                    self.reasons[(run["epoch"], run["started_at"])] = (run.get("scan_reason") or "-").split(":")[0]
                    self.writes[(run["epoch"], run["started_at"])] = sum(
                        run.get("writes", {}).get(name, 0) for name in OWNER_WRITES)
            if status.get("totals"):
                self.moves = dict(status["totals"]["moves_by_reason"])
                count = sum(n for reason, n in self.moves.items() if balancing(reason))
                if not self.balancing or count != self.balancing[-1][1]:
                    self.balancing.append((time.monotonic(), count))
            for move in status.get("recent_moves", ()):
                self.recent[(move["lease_key"], move["run_started_at"])] = move

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        self._thread.join(10)

    def write_seconds(self, lanes: int) -> float:
        """The leader's seconds per owner write on one of its `lanes` write lanes (`lane_write_seconds`)."""
        return lane_write_seconds([(run.get("write", 0.0), self.writes.get(key, 0)) for key, run in self.full.items()],
                                  lanes)

    def balancing_between(self, start: float, end: float) -> tuple[int, float]:
        """Balancing moves the leader made between two monotonic times (its totals), and seconds from `start` until
        the run that made the last of them started (0: none). That run's own start where its move was seen: the
        totals are published at most every 10 s on average (services/leader_status.py), so when they grew lags the
        run by up to that (session 26: the last fill's run at about +32 s, seen at +38.0 s); else when they grew."""
        before = [count for at, count in self.balancing if at <= start]
        within = [(at, count) for at, count in self.balancing if start < at <= end]
        if not within:
            return 0, 0.0
        started = [at for at, _ in self.balancing_moves(start, end)]
        return within[-1][1] - (before[-1] if before else 0), (started or [within[-1][0]])[-1] - start

    def balancing_moves(self, start: float, end: float) -> list[tuple[float, dict[str, Any]]]:
        """(monotonic start of its run, the move) of each published balancing move whose run started between two
        monotonic times, oldest first (the runs' starts are the leader's wall clock, on this host)."""
        return moves_between(self.recent.values(), time.time() - time.monotonic(), start, end)

    def summary(self, steady_from: float) -> str:
        """The runs of the steady window (from `steady_from`, monotonic) and those before it apart (start-up: the first
        assignment with the shard sync's writes, the fills, Spark drivers starting): every published run's time, then
        the full runs' (both tables read): wall, the run thread's CPU, the wall time of each part (a part a run did
        not publish counts 0 there) and why they read the tables."""
        wall = time.time() - time.monotonic()
        steady = {key for key in self.durations if key[1] - wall >= steady_from}
        return "\n".join([f"in the steady window: {self._summary(steady, inside=True)}",
                          f"before it (start-up and warm-up): {self._summary(steady, inside=False)}"])

    def _summary(self, steady: Collection[tuple[int, float]], inside: bool) -> str:
        durations = [ms for key, ms in self.durations.items() if (key in steady) == inside]
        full = [run for key, run in self.full.items() if (key in steady) == inside]
        reasons = [reason for key, reason in self.reasons.items() if (key in steady) == inside]
        names = ["run", "cpu", *FULL_RUN_PARTS,
                 *sorted({name for run in full for name in run} - {"run", "cpu", *FULL_RUN_PARTS})]
        lines = [f"{percentiles(durations)}; full runs:"]
        lines += [f"  {LABELS.get(name, name)}: {percentiles([run.get(name, 0.0) for run in full])}" for name in names]
        lines.append(f"  why they read the tables: {dict(Counter(reasons).most_common()) or '-'}")
        return "\n".join(lines)


def lane_write_seconds(runs: Iterable[tuple[float, int]], lanes: int) -> float:
    """Seconds per owner write on one of the leader's `lanes` write lanes, from each full run's (write part in ms,
    owner writes sent): the run that sent most (the first assignment: 256 at 256 shards) over its writes per lane, as
    the lanes send them (coordinator/leader_loop.py `_outcomes`); 0 if no run sent any. Only that run has writes
    enough to time: a balancing run's few take one lane's single write, within the part's rounding."""
    ms, writes = max(runs, key=lambda run: run[1], default=(0.0, 0))
    return ms / 1000 / math.ceil(writes / lanes) if writes > 0 else 0.0


def balancing(reason: str) -> bool:
    """Whether a published move's reason is a balancing one (an unknown, newer reason counts as one)."""
    known = MoveReason.__members__.get(reason)
    return known is None or known.is_balancing


def moves_between(moves: Iterable[Mapping[str, Any]], wall: float, start: float,
                  end: float) -> list[tuple[float, dict[str, Any]]]:
    """(monotonic start of its run, the move) of each balancing move of `moves` (as `/v1/leader` publishes them)
    whose run started between two monotonic times, oldest first; `wall` is the wall clock minus the monotonic one."""
    found = [(move["run_started_at"] - wall, dict(move)) for move in moves
             if move.get("kind", "move") == "move" and balancing(move["reason"])]
    return sorted(((at, move) for at, move in found if start < at <= end), key=lambda item: item[0])


def _owners(client: OperatorClient) -> dict[str, dict[str, Any]]:
    return {lease["lease_key"]: lease for lease in client.leases() if lease["state"] != "finished"}


def _until(what: str, began: float, limit: float, done: Callable[[], bool]) -> float:
    """Seconds from `began` (monotonic) until `done()`; SystemExit after `limit` s."""
    while time.monotonic() - began < limit:
        try:
            if done():
                return time.monotonic() - began
        except (ApiError, BotoCoreError, ClientError):
            pass  # a replica busy starting, Kinesis slow under the load: ask again
        time.sleep(POLL)
    raise SystemExit(f"not {what} within {limit:.0f} s")


def _latency(call: Callable[[], object], count: int) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - began))
    return times


def _memory(state: StackState, names: Collection[str], tree: bool = False) -> list[float]:
    """Resident MiB of each named agent's process (with `tree`, its children too: a Spark driver's JVM)."""
    sizes = []
    for entry in state.by_role("agent"):
        if entry.name not in names:
            continue
        try:
            sizes.append((tree_rss(entry.pid) if tree else psutil.Process(entry.pid).memory_info().rss) / 2**20)
        except psutil.Error:
            continue
    return sizes


def _spark_share(client: OperatorClient, names: Sequence[str], began: float, limit: float) -> str:
    """Each Spark agent's leases once it holds one whose lag it reports (it reads), and when (s from launching)."""
    held: dict[str, float] = {}
    counts: dict[str, int] = {}

    def reading() -> bool:
        counts.clear()
        for lease in _owners(client).values():
            counts[lease["owner"]] = counts.get(lease["owner"], 0) + 1
            if lease["owner"] in names and lease["millis_behind_latest"] is not None:
                held.setdefault(lease["owner"], time.monotonic() - began)
        return len(held) == len(names)

    try:
        _until("every Spark agent reading a lease", began, limit, reading)
    except SystemExit as exc:
        return str(exc)
    return ", ".join(f"{name} reads from {held[name]:.1f} s, holds {counts[name]}" for name in names)


class Startup:
    """When each agent's row first appeared and when the first and the last lease were first owned (monotonic), seen
    on the store itself every half second from the moment the stack's state names it. Not through the API: on a
    loaded host the coordinators answer after the agents' rows exist, so the first answer already lists all of them
    (the simulator then started every agent at once, while live 17 agents took all 256 leases before the rest)."""

    def __init__(self, state: StackState, store_settings: dict[str, str], shards: int, agents: int) -> None:
        self.rows: dict[str, float] = {}
        self.first_owned: float | None = None
        self.all_owned: float | None = None
        self.first_owners: set[str] = set()  # the owners when every lease was first owned: the first assignment's
        self._store = _open(state, store_settings)
        self._shards, self._agents = shards, agents
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="startup-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            try:
                workers, leases = self._store.scan_workers().workers, self._store.scan_leases().leases
            except ShardherdError:
                continue  # the stack is still creating its tables
            now = time.monotonic()
            for record in workers:
                self.rows.setdefault(record.worker_id, now)
            self._owned([lease.lease_owner for lease in leases if not lease.is_finished], now)
            if self.all_owned is not None and len(self.rows) >= self._agents:
                return  # every lease owned, every agent's row seen (a Spark agent's comes late)

    def _owned(self, owners: list[str | None], now: float) -> None:
        """Note when the open leases (their owners) were first owned, one and all."""
        if self.first_owned is None and any(owners):
            self.first_owned = now
        if self.all_owned is None and len(owners) >= self._shards and all(owners):
            self.all_owned = now
            self.first_owners = {owner for owner in owners if owner}

    def stop(self) -> None:
        """Stop watching and close the store."""
        self._stop.set()
        self._thread.join(10)
        self._store.close()

    def joins(self) -> list[tuple[float, str]]:
        """(seconds from the first lease owned to the agent's first row (< 0: there before it), its id), by time, as
        `replay_offsets` gives them to the simulator."""
        first = self.first_owned if self.first_owned is not None else min(self.rows.values(), default=0.0)
        return replay_offsets({wid: seen - first for wid, seen in self.rows.items()}, self.first_owners)


def replay_offsets(seen: Mapping[str, float], first_owners: Collection[str]) -> list[tuple[float, str]]:
    """(offset, agent) by offset from each agent's first row as seen (seconds from the first lease owned), with the
    first assignment's owners before it and the others not: the simulator starts agents with an offset below 0
    before its first assignment and the rest after it.

    A look reads rows and leases together every half second, so a row seen at the look that first saw an owned lease
    has offset 0 whether it came before the assignment or after (a 16-shard run: two rows at 0.0, one in the first
    assignment, one filled 1.5 s later): an owner is put one look (0.5 s) before it. A row seen before it whose agent
    the assignment left out (its row did not count yet) joins at 0, as it ran."""
    return sorted((min(offset, -0.5) if wid in first_owners else max(offset, 0.0), wid) for wid, offset in seen.items())


def _open(state: StackState, store_settings: dict[str, str]) -> Any:
    return open_store(load_settings(application_name=state.application_name, region=state.region,
                                    dynamodb_endpoint_url=state.dynamodb_endpoint_url, **store_settings))


def _startup(client: OperatorClient, state: StackState, shards: int, began: float,
             limit: float, seen: Startup) -> tuple[float, float]:
    """Seconds from `began` to every lease owned (as `seen` watches the store), and to every shard read: its owner
    reports its lag, or the shard holds no record yet (a lease's progress is written with its checkpoints, so an
    empty shard never reports one; the producer's Zipf keys leave some shards empty for minutes)."""
    kinesis = make_client("kinesis", state.region, state.kinesis_endpoint_url)
    _until("every lease owned", began, limit, lambda: seen.all_owned is not None)
    owned = (seen.all_owned or began) - began
    holding: set[str] = set()  # shards seen to hold a record: they stay so, no need to ask Kinesis again

    def empty(shard: str) -> bool:
        if shard not in holding and holds_records(kinesis, state.stream_name, shard):
            holding.add(shard)
        return shard not in holding

    def read() -> bool:
        leases = _owners(client)
        return len(leases) >= shards and all(lease["millis_behind_latest"] is not None or empty(lease["shard_id"])
                                             for lease in leases.values())
    return owned, _until("every shard read", began, limit, read)


def _live_fleet(client: OperatorClient, store_settings: dict[str, str], state: StackState) -> tuple[
        dict[str, float], dict[str, tuple[float, int]], list[Any], list[str]]:
    """Each lease's KiB/s as its owner reports it, (CPU, leases held) per agent, and the lease and worker tables."""
    store = _open(state, store_settings)
    try:
        leases, records = store.scan_leases().leases, store.scan_workers().workers
    finally:
        store.close()
    kbps = {lease.lease_key: 0.0 for lease in leases if not lease.is_finished}
    for record in records:
        kbps.update({key: value for key, value in record.lease_throughput.items() if key in kbps})
    cpus = {worker["worker_id"]: (worker["cpu_ema"], worker["lease_count"])
            for worker in client.call("GET", "/v1/workers")["items"] if worker["cpu_ema"] is not None}
    return kbps, cpus, leases, [record.worker_id for record in records]


def new_reports(seen: Sequence[float], history: Sequence[float]) -> list[float]:
    """The reports a worker row's CPU history (oldest first, its newest few) holds beyond `seen`, the history an
    earlier look found: the longest end of `seen` the history starts with is what both hold. Two looks at identical
    histories count no new report (a report equal to the one it pushed out of a full history is not told apart)."""
    for start in range(len(seen) + 1):
        both = len(seen) - start
        if both <= len(history) and list(seen[start:]) == list(history[:both]):
            return list(history[both:])
    return list(history)  # unreachable: an empty overlap always matches


class CpuReports:
    """Each agent's CPU reports (its row's `C` history, one value per report period) from looks at the store, for
    the replay file: a later simulator can fit how often an agent's CPU spikes and for how long, not only the size
    of its noise. The first look at a row only learns what it holds already."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._seen: dict[str, tuple[float, ...]] = {}
        self.reports: dict[str, list[float]] = {}

    def look(self) -> None:
        """Read the worker rows and note each agent's reports since the last look (none if the store fails now)."""
        try:
            records = self._store.scan_workers().workers
        except ShardherdError:
            return
        for record in records:
            history = tuple(record.metric_stats.get(CPU_METRIC, ()))
            if record.worker_id in self._seen:
                self.reports.setdefault(record.worker_id, []).extend(new_reports(self._seen[record.worker_id],
                                                                                 history))
            self._seen[record.worker_id] = history

    def close(self) -> None:
        """Close the store."""
        self._store.close()


def _steady(client: OperatorClient, runs: LeaderRuns, meters: Path, seconds: float,
            spark: Collection[str], cpu: CpuReports) -> tuple[int, dict[str, int], float, Any, float]:
    """Owner changes seen and leader moves by reason over `seconds`, with the meters' difference, the minutes, and the
    leases the `spark` agents held on average (each look every 3 s counts alike); `cpu` looks at the agents' CPU
    reports at each look (the bench's own store reads: its process has no meter)."""
    before, moves, since = read_meters(meters), runs.moves, time.time()
    owners = {key: lease["owner"] for key, lease in _owners(client).items()}
    changes = 0
    held: list[int] = []
    began = time.monotonic()
    cpu.look()
    while time.monotonic() - began < seconds:
        time.sleep(3.0)
        cpu.look()
        now = {key: lease["owner"] for key, lease in _owners(client).items()}
        changes += sum(1 for key, owner in now.items() if key in owners and owners[key] != owner)
        held.append(sum(1 for owner in now.values() if owner in spark))
        owners = now
    time.sleep(2.5)  # the meters write every 2 s
    moved = {reason: count - moves.get(reason, 0) for reason, count in runs.moves.items()
             if count > moves.get(reason, 0)}
    for move in sorted(runs.recent.values(), key=lambda move: move["run_started_at"]):
        if move["run_started_at"] >= since:
            print(f"  +{move['run_started_at'] - since:.0f} s {move_detail(move)}")
    return (changes, moved, (time.monotonic() - began) / 60, difference(read_meters(meters), before),
            statistics.fmean(held) if held else 0.0)


def measure(args: argparse.Namespace, run: Path, began: float, stack: subprocess.Popen[bytes],
            store_settings: dict[str, str]) -> None:
    """Everything the docstring lists, printed as it is measured."""
    state = wait_for_state(run, began + args.limit, stack)
    favour(emulator_pids(state))
    # The state is written as each agent starts, before the control socket listens.
    _until("the stack's control socket", began, args.limit, lambda: Path(state.control_socket).exists())
    spark = [str(request(state.control_socket, "add-agent", timeout=60.0, spark=True)["name"])
             for _ in range(args.spark_agents)]
    state = StackState.read(run)  # with the Spark agents
    plain = {entry.name for entry in state.by_role("agent")} - set(spark)
    client = OperatorClient(state.api_urls(), state.api_token(), timeout=30.0)
    runs = LeaderRuns(client)
    seen = Startup(state, store_settings, args.shards, args.agents + len(spark))
    try:
        _print_startup(args, run, client, state, began, seen, spark)
        assignments = _latency(client.leases, args.calls)
        with httpx.Client(timeout=30.0) as http:
            metrics = _latency(lambda: http.get(f"{state.api_urls()[0]}/metrics").raise_for_status(), args.calls)
        print(f"/v1/assignments (every page, token): {percentiles(assignments)}\n/metrics: {percentiles(metrics)}")
        time.sleep(args.warmup)
        steady_from = time.monotonic()
        cpu = CpuReports(_open(state, store_settings))
        try:
            changes, moves, minutes, window, spark_leases = _steady(client, runs, run / "meter", args.settle, spark,
                                                                    cpu)
        finally:
            cpu.close()
        print(f"steady state over {minutes:.1f} min, from {args.warmup:.0f} s after every shard was read: {changes} "
              f"owner changes seen, leader moves {moves or 'none'} (load {os.getloadavg()[0]:.1f})")
        settled = _latency(client.leases, args.calls)  # timed after the window: its calls would load it
        print(f"/v1/assignments after the steady window (every page, token; load {os.getloadavg()[0]:.1f}): "
              f"{percentiles(settled)}")
        kbps, cpus, leases, workers = _live_fleet(client, store_settings, state)
        print_bill(window, minutes, leases, workers)
        print(f"leader runs {runs.summary(steady_from)}")
        _print_memory(state, plain, spark)
        kill = _kill(state, args.limit)
    finally:
        seen.stop()
        runs.stop()
        client.close()
    live = _live_figures(seen, runs, (steady_from, minutes, window), changes, kill)
    if seen.all_owned is not None:
        print("balancing moves from every lease owned to the steady window (s after every lease was owned, by the "
              "run's start):")
        for at, move in runs.balancing_moves(seen.all_owned, steady_from):
            print(f"  +{at - seen.all_owned:.1f} s {move_detail(move)}")
    warmup = steady_from - (seen.all_owned if seen.all_owned is not None else steady_from)
    # Per lease the Spark agents held on average over the window, not at its end: in session 26 their drivers exited
    # and came back during it, and the reads over the window (136 a minute) divided by the 5 leases held at its end
    # gave 27 a lease a minute, where their agents' logs show 11.8 leases held on average (11.5 a lease a minute);
    # the simulated Spark agents, holding 14, read 378 a minute.
    _simulate(run, live, kbps, (warmup, args.settle), (checkpoint_rate(window, minutes, len(kbps)),
                                                   batch_end_rate(window, minutes, spark_leases)),
              seen.joins(), cpus, spark, args.store == "postgres",  # the meter prices SQL reads as consistent
              runs.write_seconds(write_lanes()), cpu.reports)


def _live_figures(seen: Startup, runs: LeaderRuns, steady: tuple[float, float, Any], changes: int,
                  kill: Kill) -> Figures:
    """The live side of the comparison; `steady` is the steady window's (monotonic start, minutes, meter totals)."""
    steady_from, minutes, window = steady
    # The API's store reads are the bench's own polling of every page; the simulator has no API, so neither side
    # counts them.
    units = {caller: values for caller, values in by_caller(window).items() if caller != "api"}
    settle_moves, settled_after = (None, None) if seen.all_owned is None else runs.balancing_between(seen.all_owned,
                                                                                                    steady_from)
    return Figures(None if seen.first_owned is None or seen.all_owned is None else seen.all_owned - seen.first_owned,
                   changes, sum(u[1] for u in units.values()) / minutes, sum(u[2] for u in units.values()) / minutes,
                   kill.leases, kill.read_after, settle_moves, settled_after,
                   reads_by_caller={caller: u[1] / minutes for caller, u in units.items() if u[1] > 0},
                   kill_owned_after=kill.owned_after, kill_look=kill.look)


def _print_startup(args: argparse.Namespace, run: Path, client: OperatorClient, state: StackState, began: float,
                   seen: Startup, spark: Sequence[str]) -> None:
    owned, read = _startup(client, state, args.shards, began, args.limit, seen)
    up_line = next((line for line in (run / "up.log").read_text().splitlines() if line.startswith("startup:")),
                   "(no start-up line yet)")
    print(f"{args.shards} shards, {args.agents} agents, store {args.store}, load {os.getloadavg()[0]:.1f}: every "
          f"lease owned after {owned:.1f} s, every shard read after {read:.1f} s (from launching `up`)\n"
          f"  up says: {up_line}")
    if spark:
        print(f"{len(spark)} Spark agents (started with the plain ones): "
              f"{_spark_share(client, spark, began, args.limit)}", flush=True)


def _print_memory(state: StackState, plain: Collection[str], spark: Sequence[str]) -> None:
    sizes = _memory(state, plain)
    print(f"agent resident memory: median {statistics.median(sizes):.0f} MiB, max {max(sizes):.0f} MiB "
          f"({len(sizes)} plain agents)")
    if spark:
        drivers = _memory(state, spark, tree=True)
        print(f"Spark agents (driver process and its JVM): {', '.join(f'{size:.0f} MiB' for size in drivers)}")


@dataclass(frozen=True, slots=True)
class Kill:
    """What the kill -9 of the agent holding most leases measured, from one start instant (the kill)."""

    leases: int  # the leases it held
    read_after: float | None  # seconds until every one was read elsewhere (None: not all within the limit)
    owned_after: float | None  # seconds until every one was owned elsewhere (None: not seen)
    look: float | None  # seconds between the look that saw them all owned elsewhere and the one before it


class KillWatch(Scenarios):
    """The stack's scenarios (services/local_stack/scenarios.py) keeping, of each look at the operator API's view,
    when it answered and who held each open lease (`_processor`'s worker: the checkpoint owner during a handoff, as
    the simulator's `actual_owner`), so that the kill's owned figure comes from the looks its read figure comes from;
    and when the scenario said its first line: `kill_agent` says it the instant after the kill, where its read times
    start."""

    def __init__(self, state: StackState, timeout: float) -> None:
        super().__init__(state, timeout, say=self._said)
        self.looks: list[tuple[float, dict[str, str | None]]] = []
        self.said_at: float | None = None

    def _said(self, line: str) -> None:
        if self.said_at is None:
            self.said_at = time.monotonic()

    def snapshot(self) -> Snapshot:
        """The operator API's view, noted with the monotonic time it answered."""
        found = super().snapshot()
        self.looks.append((time.monotonic(), {lease["lease_key"]: lease["checkpoint_owner"] or lease["owner"]
                                              for lease in found.unfinished}))
        return found


def owned_elsewhere(looks: Sequence[tuple[float, Mapping[str, str | None]]], keys: Collection[str], victim: str,
                    since: float) -> tuple[float | None, float | None]:
    """Seconds from `since` (monotonic) to the first look at or after it at which every one of `keys` was held by a
    worker, not `victim` (None: no look saw that), and the seconds from the look before that one (the figure's
    resolution: it happened between the two); `looks` are (monotonic, holder by lease key), oldest first."""
    for index, (at, holders) in enumerate(looks):
        if at >= since and all(holders.get(key) not in (None, victim) for key in keys):
            return at - since, (at - looks[index - 1][0]) if index else None
    return None, None


def _kill(state: StackState, limit: float) -> Kill:
    """kill -9 of the agent holding most leases: how many it held, and the seconds until they were all read, and all
    owned, elsewhere (the owned figure from the scenario's own looks, timed from the same instant)."""
    watch = KillWatch(state, limit)
    outcomes = watch.kill_agent(None)
    keys = [outcome.subject for outcome in outcomes]
    resumed = [outcome.seconds for outcome in outcomes if outcome.seconds is not None]
    # The scenario chose the victim from its first look, before the kill: the holder of the keys it follows.
    victim = watch.looks[0][1].get(keys[0]) if keys and watch.looks else None
    owned, look = (None, None) if watch.said_at is None or victim is None else owned_elsewhere(
        watch.looks, keys, victim, watch.said_at)
    gaps = [later - earlier for (earlier, _), (later, _) in zip(watch.looks, watch.looks[1:], strict=False)]
    apart = f"{min(gaps):.2f} to {max(gaps):.2f} s apart, median {statistics.median(gaps):.2f} s" if gaps else "-"
    print(f"kill -9 of the agent with most leases ({len(outcomes)}): {len(resumed)} read elsewhere, the last after "
          f"{_seconds(max(resumed, default=None))} s; all owned elsewhere after {_seconds(owned)} s (at a look "
          f"{_seconds(look)} s after the one before; the scenario's looks came {apart}; load "
          f"{os.getloadavg()[0]:.1f})")
    return Kill(len(outcomes), max(resumed) if len(resumed) == len(outcomes) and resumed else None, owned, look)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _simulate(run: Path, live: Figures, kbps: dict[str, float], window: tuple[float, float],
              rates: tuple[float, float], joins: list[tuple[float, str]], cpus: dict[str, tuple[float, int]],
              spark: Sequence[str], consistent_reads: bool, write_seconds: float,
              cpu_reports: Mapping[str, Sequence[float]]) -> None:
    """Print the simulator's figures for the live run's fleet, and write its inputs and the live figures into `run`
    (`python -m bench.scale_sim --replay` replays them): `window` is (warm-up, steady) seconds, `rates` the
    checkpoints per shard and the Spark agents' batch-end reads per lease they hold, each per minute;
    `consistent_reads` says whether the live store's reads are priced as consistent (PostgreSQL), `write_seconds`
    the leader's time per owner write on one write lane (`LeaderRuns.write_seconds`), `cpu_reports` each agent's CPU
    reports over the steady window (`CpuReports`)."""
    checkpoints, batch_ends = rates
    base, mean = cpu_inputs(list(cpus.values()))
    own = own_cpu(cpus, set(spark))
    inputs = LiveInputs(kbps, [offset for offset, _ in joins], base, mean, *window, checkpoints,
                        [own.get(wid, 0.0) for _, wid in joins],
                        [batch_ends if wid in spark else 0.0 for _, wid in joins], consistent_reads,
                        write_seconds=write_seconds, cpu_reports=[list(cpu_reports.get(wid, ())) for _, wid in joins])
    replay = run / REPLAY_FILE
    write_replay(replay, inputs, live)
    print(f"fleet simulator on the same fleet and events (bench/scale_sim.py; {describe(inputs)}; replay: "
          f"python -m bench.scale_sim --replay {replay}):")
    print(f"  (store units without the API's reads, the bench's own polling; the simulated agents checkpoint as "
          f"often as the live ones, {checkpoints:.1f} per shard per minute, and the Spark agents read their batch "
          f"ends as often, {batch_ends:.1f} per lease per minute)")
    for seed in SEEDS:  # one seed is never the evidence
        print(f"seed {seed}:\n{side_by_side(live, predict(inputs, seed))}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the stack, measure, stop it (SIGINT, as Ctrl-C)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--rate", type=int, default=500, help="records/s the producer puts over all shards (the runs "
                        "in docs/store-cost.md use 300)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds after every shard is read before the "
                        "steady-state window (the first balancing runs)")
    parser.add_argument("--settle", type=float, default=120.0, help="seconds of steady state watched")
    parser.add_argument("--spark-agents", type=int, default=2, help="Spark agents (drivers running the example "
                        "pipeline, `local[1]`) started beside the plain ones (0: none)")
    parser.add_argument("--calls", type=int, default=200, help="API calls timed per endpoint (200: p99 is not max)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds any one step may take")
    parser.add_argument("--run-dir", default=".scale", help="run directory (inside the current directory)")
    parser.add_argument("--store", choices=("postgres", "moto"), default="postgres",
                        help="the lease store: a throwaway PostgreSQL (the default: moto is one single-threaded "
                             "Python process, and 32 agents' checkpoints and heartbeats starve the leader lock's "
                             "calls there), or the stack's moto server")
    parser.add_argument("--kinesis-limits", action=argparse.BooleanOptionalAction, default=True,
                        help="Kinesis through the stack's limits proxy (`shardherd up --aws-limits`, the default)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # unwind: the stack and PostgreSQL stop
    # An installed package carries its bytecode; an editable checkout under PYTHONDONTWRITEBYTECODE=1 compiles every
    # module in every process it starts (0.1-0.15 CPU s per agent, bench/agent_footprint.py).
    for package in PACKAGES:
        compileall.compile_dir(REPO / package, quiet=1)
    run = Path(args.run_dir).resolve()
    meters = fresh_meters(run)
    env = {**os.environ, **USER_DEFAULTS, "SHARDHERD_STORE_METER_DIR": str(meters)}
    command = [sys.executable, "-m", "shardherd", "up", "--no-spark", "--api-port", "0", "--run-dir", str(run),
               "--shards", str(args.shards), "--agents", str(args.agents), "--rate", str(args.rate),
               "--startup-timeout", str(args.limit), "--duration", str(3 * args.limit + args.warmup + args.settle),
               "--aws-limits" if args.kinesis_limits else "--no-aws-limits"]
    postgres = PostgresServer().start() if args.store == "postgres" else None
    if postgres is not None:
        favour([postgres.pid])  # before any connection: each backend forked from it inherits the priority
    store_settings = {} if postgres is None else {"store_backend": "sql", "sql_url": postgres.url}
    env.update({f"SHARDHERD_{name.upper()}": value for name, value in store_settings.items()})
    began = time.monotonic()
    try:
        with (run / "up.log").open("w", encoding="utf-8") as log:
            stack = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                measure(args, run, began, stack, store_settings)
            finally:
                stop_stack(stack, 120.0)
    finally:
        if postgres is not None:
            postgres.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
