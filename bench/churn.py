"""Live lease churn: run the real local stack, warm up, then count owner changes and handoff stalls per shard.

Usage: python -m bench.churn [--spark] [--runs 3] [--warmup 60] [--window 180] [--scenario hot-shard|add-agent]
       [--set NAME=VALUE ...]

Each run starts `shardherd up` (plain agents unless `--spark`; `--api-port 0`; a run directory under `--run-root`),
waits `--warmup` seconds, then polls `GET /v1/assignments` every `--poll` seconds for `--window` seconds: an owner
change is a new `owner` of a lease (a graceful handoff counts once, when it starts); a shard stalls while its lease
has a `checkpoint_owner` (a handoff under way). The leader's published recent moves give each move's reason.

With `--scenario`, the action (`hot-shard` on the busiest shard, or `add-agent`) happens right after the warm-up; the
bench then reports how many balancing runs moved leases in the `--settle` seconds after it, and the owner changes in
the window that follows (the issue's target: balanced within 3 balancing runs, then 0 further moves).

Each run also prints the start-up and join figures the README and docs/spark.md quote: every shard assigned how many
seconds after `shardherd up` started (as `up` itself reports it, and as seen from here), and with `add-agent` the
join: when the new agent's row first appeared in the worker table (its first heartbeat; the store is read directly
every 0.25 s, not through the API's cached snapshot), then from that heartbeat when it held its first lease, its
share by count (shards // workers) and the band's share (its throughput share at the lower edge of the band of the
leader's fill), in seconds and in balancing runs: the leader's published cumulative count of balancing runs, from the
run that first saw its row (included if it balanced) to the run whose move gave it those leases.

`--set NAME=VALUE` passes a setting to every process of the stack (`SHARDHERD_NAME=VALUE`), e.g.
`--set disable_worker_metrics=true`. Prints one line per run and the median and maximum over runs (the machine is
shared and noisy).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardherd.services.leader_status import MIN_PUBLISH_SECONDS
from shardherd.services.local_stack.control import request
from shardherd.services.local_stack.state import StackNotRunning, StackState
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.config import load_settings
from shardherd.shared.store_factory import open_store

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 400.0  # Spark drivers on a loaded 2-core host: 200 s to a running query at load 50


@dataclass
class Window:
    """What one polling window saw."""

    seconds: float = 0.0
    changes: Counter[str] = field(default_factory=Counter)  # owner changes per shard
    stalled: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # seconds in handoff per shard
    worst_minute: dict[str, float] = field(default_factory=dict)  # most handoff seconds of any minute, per shard
    paths: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # owners in order, per shard
    # per shard: (seconds since its last owner change or None if none seen, KiB/s the API shows) at every poll
    rates: dict[str, list[tuple[float | None, float]]] = field(default_factory=lambda: defaultdict(list))
    # per worker: each new CPU report (the newest `cpu_history` value once the history changed), in order
    cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    @property
    def moves(self) -> int:
        """Owner changes over all shards."""
        return sum(self.changes.values())

    def per_ten_minutes(self) -> float:
        """Owner changes scaled to ten minutes."""
        return self.moves * 600.0 / self.seconds if self.seconds else 0.0


@dataclass
class RunFigures:
    """One run's figures."""

    window: Window
    reasons: Counter[str]
    details: list[str]
    balancing_runs: int | None = None  # scenario: balancing runs with moves during the settle period
    settle_moves: int | None = None
    settle_details: list[str] = field(default_factory=list)  # scenario: the settle period's moves
    all_assigned: float | None = None  # seconds from the start of `shardherd up` to every shard owned (seen here)
    up_reported: str | None = None  # `up`'s own start-up line
    join: list[str] = field(default_factory=list)  # add-agent: the new agent's first lease and share


def _poll(urls: list[str], token: str | None) -> dict[str, dict[str, Any]] | None:
    for url in urls:
        client = OperatorClient(url, token, timeout=3.0)
        try:
            return {lease["lease_key"]: lease for lease in client.leases() if lease["state"] != "finished"}
        except ApiError:
            continue
        finally:
            client.close()
    return None


def _leader_status(urls: list[str], token: str | None) -> dict[str, Any] | None:
    for url in urls:
        client = OperatorClient(url, token, timeout=3.0)
        try:
            status: dict[str, Any] | None = client.call("GET", "/v1/leader")["status"]
            return status
        except ApiError:
            continue
        finally:
            client.close()
    return None


def _cpu_histories(urls: list[str], token: str | None) -> dict[str, tuple[float, ...]] | None:
    for url in urls:
        client = OperatorClient(url, token, timeout=3.0)
        try:
            return {worker["worker_id"]: tuple(worker["cpu_history"]) for worker in client.call("GET", "/v1/workers")[
                "items"] if worker["state"] != "expired"}
        except ApiError:
            continue
        finally:
            client.close()
    return None


def watch(state: StackState, seconds: float, poll: float) -> Window:
    """Poll the assignments for `seconds`: owner changes, and handoff seconds per shard (worst minute too)."""
    urls, token = state.api_urls(), state.api_token()
    window = Window()
    owners: dict[str, str | None] = {}
    changed_at: dict[str, float] = {}
    seen_cpu: dict[str, tuple[float, ...]] = {}
    minute: dict[tuple[str, int], float] = defaultdict(float)
    started = last = time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(max(0.0, poll - (time.monotonic() - last)))
        now = time.monotonic()
        step, last = now - last, now
        histories = _cpu_histories(urls, token)
        for worker, history in (histories or {}).items():
            if history and history != seen_cpu.get(worker):
                window.cpu[worker].append(history[-1])
            seen_cpu[worker] = history
        leases = _poll(urls, token)
        for key, lease in (leases or {}).items():
            _note_owner(window, key, lease["owner"], owners, changed_at, now)
            if lease["throughput_kbps"] is not None:
                since = now - changed_at[key] if key in changed_at else None
                window.rates[key].append((since, float(lease["throughput_kbps"])))
            if lease["checkpoint_owner"] is not None:
                window.stalled[key] += step
                minute[(key, int((now - started) // 60))] += step
    window.seconds = time.monotonic() - started
    for (key, _), stalled in minute.items():
        window.worst_minute[key] = max(window.worst_minute.get(key, 0.0), stalled)
    return window


def _note_owner(window: Window, key: str, owner: str | None, owners: dict[str, str | None],
                changed_at: dict[str, float], now: float) -> None:
    """Count an owner change of `key` (a lease given to someone else, not one given back) and its path."""
    if key in owners and owner != owners[key] and owner is not None:
        window.changes[key] += 1
        window.paths[key].append(owner)
        changed_at[key] = now
    elif key not in owners:
        window.paths[key].append(str(owner))
    owners[key] = owner


SETTLED_AFTER = 20.0  # seconds after an owner change from which a shard's reported rate counts as settled


def noise_lines(window: Window) -> list[str]:
    """Per shard: median KiB/s and spread of settled reports, and how far reports in the 10 s after a move stray."""
    lines = []
    for key in sorted(window.rates):
        settled = [rate for since, rate in window.rates[key] if since is None or since >= SETTLED_AFTER]
        fresh = [rate for since, rate in window.rates[key] if since is not None and since < 10.0]
        if len(settled) < 3:
            continue
        median, mean = statistics.median(settled), statistics.fmean(settled)
        spread = statistics.pstdev(settled) / mean if mean else 0.0
        after = ""
        if fresh and median:
            ratios = [rate / median for rate in fresh]
            after = f"; in the 10 s after a move {min(ratios):.2f}-{max(ratios):.2f} x that median"
        lines.append(f"  {key}: settled {median:.2f} KiB/s median, sd/mean {spread:.2f}, range "
                     f"{min(settled):.2f}-{max(settled):.2f}{after}")
    return lines


SPIKE_POINTS = 3.0  # a CPU report this many points above its worker's median counts as an excursion


def cpu_lines(window: Window) -> list[str]:
    """Per worker: its CPU reports' median, spread, lag-1 autocorrelation, and excursions (runs of reports above)."""
    lines = []
    for worker in sorted(window.cpu):
        values = [v for v in window.cpu[worker] if v >= 0]
        if len(values) < 3:
            continue
        median, sd = statistics.median(values), statistics.pstdev(values)
        mean = statistics.fmean(values)
        deviations = [v - mean for v in values]
        var = sum(d * d for d in deviations)
        lag1 = sum(a * b for a, b in itertools.pairwise(deviations)) / var if var else 0.0
        runs: Counter[int] = Counter()
        length = 0
        for value in [*values, -math.inf]:
            if value > median + SPIKE_POINTS:
                length += 1
            elif length:
                runs[length] += 1
                length = 0
        spikes = ", ".join(f"{count} x {size}" for size, count in sorted(runs.items())) or "none"
        lines.append(f"  {worker}: {len(values)} reports, median {median:.1f} %, sd {sd:.2f}, lag-1 autocorrelation "
                     f"{lag1:.2f}, max {max(values):.1f}; runs of reports > median + {SPIKE_POINTS:.0f}: {spikes}")
    return lines


def moves_since(status: dict[str, Any] | None, since_wall: float) -> list[dict[str, Any]]:
    """The leader's published moves of runs that started at or after `since_wall` (wall clock)."""
    if status is None:
        return []
    return [move for move in status["recent_moves"] if move["run_started_at"] >= since_wall]


class StackRun:
    """One `shardherd up` process in its own run directory; stopped (and waited for) on exit."""

    def __init__(self, run_dir: Path, spark: bool, settings: dict[str, str], extra: Sequence[str]) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **{f"SHARDHERD_{name.upper()}": value for name, value in settings.items()}}
        args = [sys.executable, "-m", "shardherd", "up", "--api-port", "0", "--run-dir", str(run_dir),
                "--interval", "10", "--spark" if spark else "--no-spark", *extra]
        self._log = open(run_dir / "up.out", "ab")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.all_assigned: float | None = None
        self.process = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def wait_ready(self, shards: int) -> StackState:
        """The stack's state once every shard has an owner; RuntimeError if it exits or takes too long."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"shardherd up exited with {self.process.returncode}; see {self.run_dir}/up.out")
            try:
                state = StackState.read(self.run_dir)
            except StackNotRunning:
                time.sleep(1)
                continue
            leases = _poll(state.api_urls(), state.api_token())
            if leases and len(leases) >= shards and all(lease["owner"] for lease in leases.values()):
                self.all_assigned = time.monotonic() - self.started
                return state
            time.sleep(1)
        raise RuntimeError(f"the stack in {self.run_dir} did not assign every shard within {START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        """SIGTERM the stack (it stops its children in order) and wait; SIGKILL its group after 90 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


def _busiest_shard(state: StackState) -> str:
    leases = _poll(state.api_urls(), state.api_token()) or {}
    return max(leases, key=lambda key: (leases[key]["throughput_kbps"] or 0.0, key))


def one_run(args: argparse.Namespace, index: int) -> RunFigures:
    """Start the stack, warm up, (act,) watch, stop; the figures of this run."""
    run_dir = Path(args.run_root).resolve() / f"run-{int(time.time())}-{index}"
    settings = dict(item.split("=", 1) for item in args.set)
    extra = ["--shards", str(args.shards), "--agents", str(args.agents), "--rate", str(args.rate),
             "--seed", str(args.seed + index), "--duration", str(args.warmup + args.settle + args.window + 600),
             "--startup-timeout", str(START_TIMEOUT)]
    stack = StackRun(run_dir, args.spark, settings, extra)
    try:
        state = stack.wait_ready(args.shards)
        time.sleep(args.warmup)
        balancing_runs = settle_moves = None
        settle_details: list[str] = []
        acted = time.time()
        if args.scenario == "hot-shard":
            shard = _busiest_shard(state)
            request(state.control_socket, "hot-shard", shard=shard, rate=args.hot_rate)
            print(f"  hot-shard: {shard} +{args.hot_rate:.0f} records/s", flush=True)
        joined = None
        if args.scenario == "add-agent":
            name = request(state.control_socket, "add-agent")["name"]
            print(f"  add-agent: {name}", flush=True)
            state = StackState.read(run_dir)
            share = args.shards // (args.agents + 1)
            joined = follow_join(state, name, share, args.settle)
        elif args.scenario:
            time.sleep(args.settle)
        if args.scenario:
            settled = moves_since(_leader_status(state.api_urls(), state.api_token()), acted)
            balancing = [m for m in settled if m["reason"].startswith("BALANCE")]
            balancing_runs = len({m["run_started_at"] for m in balancing})
            settle_moves = len(settled)
            settle_details = [f"+{move['run_started_at'] - acted:.0f} s {move_detail(move)}" for move in settled]
        began = time.time()
        window = watch(state, args.window, args.poll)
        moved = moves_since(_leader_status(state.api_urls(), state.api_token()), began)
        reasons = Counter(move["reason"] for move in moved)
        details = [move_detail(move) for move in moved[: args.details]]
        join = [] if joined is None else join_lines(joined)
    finally:
        stack.stop()
    # `up`'s output to a file is block-buffered: its start-up line is there once it has exited.
    return RunFigures(window, reasons, details, balancing_runs, settle_moves, settle_details, stack.all_assigned,
                      up_startup_line(run_dir), join)


FILL = re.compile(r"band \[(?P<lower>[\d.]+), [\d.]+\] avg [\d.]+; T ")  # a fill on throughput share (T)
QUIET = 30.0  # seconds without a new lease after which a joining worker is taken to have what the leader gives it


@dataclass
class Join:
    """A joining worker as the store and the leader saw it: seconds after the action, and the leader's runs."""

    name: str
    share: int  # its share by count: shards // workers
    wall: float  # the action's wall-clock time
    beat: float | None = None  # its row first in the worker table (its first heartbeat)
    held: list[tuple[float, int]] = field(default_factory=list)  # (seconds after the action, leases it holds) changes
    runs: dict[tuple[int, float], dict[str, Any]] = field(default_factory=dict)  # published runs by (epoch, start)
    moves: list[dict[str, Any]] = field(default_factory=list)  # the leader's moves after the action

    def note(self, status: dict[str, Any] | None) -> dict[str, Any] | None:
        """Keep the runs of a published leader status; the status."""
        for run in (status or {}).get("runs", ()):
            self.runs[(run["epoch"], run["started_at"])] = run
        return status

    def targets(self) -> dict[str, int]:
        """Leases it held once it reached each target: its first lease, its count share, and the band's share (its
        projected throughput share at or above the lower edge of the band the leader's fill used)."""
        held, found = 0, {"first lease": 1, f"{self.share} leases (shards // workers)": self.share}
        for move in sorted(self.moves, key=lambda m: m["run_started_at"]):
            held += (move["to_worker"] == self.name) - (move["from_owner"] == self.name)
            band = FILL.search(move["detail"]) if move["to_worker"] == self.name else None
            landed = re.search(rf"{re.escape(self.name)} [\d.]+ -> (?P<level>[\d.]+)", move["detail"])
            if band and landed and float(landed["level"]) >= float(band["lower"]):
                found.setdefault(f"the fill band's lower edge ({band['lower']} % of an average share)", held)
        return found

    def _run_giving(self, leases: int) -> float | None:
        """The start of the leader run whose move made it hold `leases` leases (None: not seen)."""
        held = 0
        for move in sorted(self.moves, key=lambda m: m["run_started_at"]):
            held += (move["to_worker"] == self.name) - (move["from_owner"] == self.name)
            if held >= leases:
                return float(move["run_started_at"])
        return None

    def seconds(self, leases: int) -> float | None:
        """Seconds from its first heartbeat until it held `leases` leases (None: not seen)."""
        at = next((t for t, n in self.held if n >= leases), None)
        return None if at is None or self.beat is None else at - self.beat

    def balancing_runs(self, leases: int) -> int | None:
        """Balancing runs from the run that first saw its row to the run whose move gave it `leases` leases.

        Counted with the leader's published cumulative `balancing_runs` of those two runs, the first one included if
        it balanced (None: a run was not seen published).
        """
        ordered = [self.runs[key] for key in sorted(self.runs)]
        rows = max((run["worker_rows"] for run in ordered if run["started_at"] < self.wall), default=math.inf)
        seen = next((run for run in ordered if run["started_at"] >= self.wall and run["worker_rows"] > rows), None)
        started = self._run_giving(leases)
        run = next((r for r in ordered if started is not None and abs(r["started_at"] - started) < 1e-3), None)
        if seen is None or run is None:
            return None
        return int(run["balancing_runs"] - seen["balancing_runs"] + seen["balanced"])


def following(elapsed: float, beat: float | None, seconds: float) -> bool:
    """Whether a join is still followed `elapsed` seconds after the action: up to `seconds` past the joiner's first
    heartbeat (at `beat`), and up to START_TIMEOUT for that heartbeat (a Spark driver's JVM starts first: 45-75 s on a
    loaded 2-core host, more than a usual `--settle`)."""
    return elapsed < (START_TIMEOUT if beat is None else beat + seconds)


def follow_join(state: StackState, name: str, share: int, seconds: float) -> Join:
    """Watch the store every 0.25 s and the leader's published runs until `name` holds `share` leases or got no new
    lease for QUIET seconds after its first, or `seconds` past its first heartbeat (`following`)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")  # the emulators take any credentials
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    store = open_store(load_settings(application_name=state.application_name, region=state.region,
                                     dynamodb_endpoint_url=state.dynamodb_endpoint_url))
    join = Join(name, share, time.time())
    began = time.monotonic()
    join.note(_leader_status(state.api_urls(), state.api_token()))  # the run before the action: its worker rows
    try:
        while following(time.monotonic() - began, join.beat, seconds):
            now = time.monotonic() - began
            if join.beat is None and any(w.worker_id == name for w in store.scan_workers().workers):
                join.beat = now
            owned = sum(1 for lease in store.scan_leases().leases if lease.actual_owner == name)
            if owned != (join.held[-1][1] if join.held else 0):
                join.held.append((now, owned))
            if owned >= share or (join.held and now - join.held[-1][0] > QUIET):
                break
            time.sleep(0.25)
            join.note(_leader_status(state.api_urls(), state.api_token()))
    finally:
        store.close()
    time.sleep(MIN_PUBLISH_SECONDS)  # the leader publishes at most about that often while every run changes things
    join.moves = moves_since(join.note(_leader_status(state.api_urls(), state.api_token())), join.wall)
    return join


def run_line(run: dict[str, Any], wall: float) -> str:
    """One published leader run: its start after the action, worker rows, live workers, balancing, moves."""
    balancing = f"balancing run {run['balancing_runs']}" if run["balanced"] else "no balancing"
    return (f"    run {run['started_at'] - wall:+.1f} s: {run['worker_rows']} worker rows, {run['active_workers']} "
            f"live, {balancing}, moves {run['moves_by_reason'] or '-'}")


def join_lines(join: Join) -> list[str]:
    """The leader's runs from shortly before the joiner's first heartbeat, then, per target, when it was reached from
    that heartbeat, in seconds and in balancing runs."""
    beat = "-" if join.beat is None else f"{join.beat:.1f} s"
    since = join.wall + (join.beat or 0.0) - 10.0
    lines = ["leader runs published from 10 s before its first heartbeat (seconds from the action):",
             *[run_line(run, join.wall) for _, run in sorted(join.runs.items()) if run["started_at"] >= since],
             f"first heartbeat {beat} after the action (load {os.getloadavg()[0]:.1f}); from it:"]
    for target, leases in join.targets().items():
        seconds, runs = join.seconds(leases), join.balancing_runs(leases)
        lines.append(f"  {target}: {leases} leases held after {'-' if seconds is None else f'{seconds:.1f} s'}, "
                     f"balancing runs {'-' if runs is None else runs}")
    return lines


def up_startup_line(run_dir: Path) -> str | None:
    """`shardherd up`'s own start-up line (its figures count from its start), if it printed one."""
    try:
        lines = (run_dir / "up.out").read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line for line in lines if line.startswith("startup:")), None)


def move_detail(move: dict[str, Any]) -> str:
    """One published move: lease, owners, reason and the decider's detail."""
    return f"{move['lease_key']}: {move['from_owner']} -> {move['to_worker']} {move['reason']}: {move['detail']}"


def _summary(name: str, values: Sequence[float]) -> str:
    return f"{name} median {statistics.median(values):.1f} max {max(values):.1f}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark", action="store_true", help="Spark agents (default: plain agents)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds after every shard has an owner")
    parser.add_argument("--window", type=float, default=180.0, help="seconds of counting")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls of /v1/assignments")
    parser.add_argument("--scenario", choices=("hot-shard", "add-agent"), default=None)
    parser.add_argument("--settle", type=float, default=60.0, help="seconds the fleet gets after a scenario")
    parser.add_argument("--hot-rate", type=float, default=400.0, help="extra records/s for hot-shard")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--details", type=int, default=12, help="moves to print with their reasons")
    parser.add_argument("--noise", action="store_true", help="print the spread of each shard's reported KiB/s")
    parser.add_argument("--cpu", action="store_true", help="print each worker's CPU reports' spread and excursions")
    parser.add_argument("--run-root", default=".shardherd/churn")
    parser.add_argument("--json", help="append each run's figures to this file (JSON lines)")
    return parser


def _print_run(args: argparse.Namespace, index: int, result: RunFigures) -> None:
    """One run's figures, the shards that changed owners, the moves' reasons and the optional spreads."""
    w = result.window
    worst = max(w.worst_minute.values(), default=0.0)
    scenario = "" if result.balancing_runs is None else \
        f"; after {args.scenario}: {result.settle_moves} moves in {result.balancing_runs} balancing runs"
    print(f"run {index + 1}: {w.moves} owner changes in {w.seconds:.0f} s ({w.per_ten_minutes():.0f} per 10 min);"
          f" handoff seconds {sum(w.stalled.values()):.1f}, worst shard-minute {worst:.1f} s; reasons "
          f"{dict(result.reasons) or '-'}{scenario}", flush=True)
    assigned = "-" if result.all_assigned is None else f"{result.all_assigned:.1f} s"
    print(f"  start-up: every shard owned {assigned} after `shardherd up` started (seen through the API); "
          f"up says: {result.up_reported or '-'}", flush=True)
    for line in result.join:
        print(f"  {args.scenario}: {line}", flush=True)
    for key in sorted(w.changes, key=lambda k: (-w.changes[k], k)):
        print(f"  {key}: {w.changes[key]} changes, {w.stalled[key]:.1f} s in handoff: {' -> '.join(w.paths[key])}")
    for line in result.settle_details:
        print(f"  after {args.scenario}: move {line}")
    for line in result.details:
        print(f"  move {line}")
    if args.cpu:
        print("  CPU reports per worker (GET /v1/workers at every poll):")
        print("\n".join(cpu_lines(w)))
    if args.noise:
        print("  reported throughput per shard (GET /v1/assignments at every poll):")
        print("\n".join(noise_lines(w)))


def _json_line(args: argparse.Namespace, kind: str, result: RunFigures) -> str:
    w = result.window
    return json.dumps({"kind": kind, "settings": args.set, "scenario": args.scenario, "moves": w.moves,
                       "seconds": w.seconds, "per_10_min": w.per_ten_minutes(),
                       "handoff_seconds": sum(w.stalled.values()),
                       "worst_minute": max(w.worst_minute.values(), default=0.0), "reasons": dict(result.reasons),
                       "balancing_runs": result.balancing_runs, "settle_moves": result.settle_moves})


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kind = "Spark" if args.spark else "plain"
    print(f"churn: {kind} agents, {args.shards} shards, {args.agents} agents, {args.rate:.0f} records/s; warm-up "
          f"{args.warmup:.0f} s, window {args.window:.0f} s{'; ' + args.scenario if args.scenario else ''}"
          f"{'; ' + ' '.join(args.set) if args.set else ''}", flush=True)
    figures: list[RunFigures] = []
    for index in range(args.runs):
        result = one_run(args, index)
        figures.append(result)
        _print_run(args, index, result)
        if args.json:
            with open(args.json, "a", encoding="utf-8") as out:
                out.write(_json_line(args, kind, result) + "\n")
    if len(figures) > 1:
        print(f"over {len(figures)} runs: " + "; ".join([
            _summary("owner changes", [f.window.moves for f in figures]),
            _summary("per 10 min", [f.window.per_ten_minutes() for f in figures]),
            _summary("worst shard-minute in handoff (s)",
                     [max(f.window.worst_minute.values(), default=0.0) for f in figures])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
