"""Rolling restart of every agent, with restart reservations and with drains, in one live `shardherd up` stack.

Usage: python -m bench.rolling_restart [--shards 12] [--agents 3] [--rate 40] [--window 60s] [--gap 3] [--settle 20]
       [--store moto|postgres] [--warmup 20] [--warmup-max 240] [--trace 5]

One plain stack (`shardherd up --no-spark`, one coordinator, user defaults: 10 s failover), a warm-up until no lease
changed owner for `--warmup` seconds (the leader's start-up balancing is over; at 32 agents it lasts about 30 s after
every lease is owned), at most `--warmup-max` seconds (printed either way), a quiet pass (no action: the measure's
noise floor), then two passes over every agent, one at a time as Kubernetes rolls pods:

* reservations (a StatefulSet: the pod restarts under the same name): `POST /v1/workers/NAME/restart?within=...`
  (what `shardherd drain --restart NAME --within 60s` sends), SIGTERM, the same worker id started again
  (the stack's `restart` control); the next agent once this one reads again;
* drains (a Deployment with surge: new pod up, old one drained): a new agent started, and once its row shows, SIGTERM
  to the old one (it drains: the leader hands its leases on), waiting for it to exit.

Each pass ends `--settle` seconds after its last step. Per pass it prints: moves (owner changes of any lease seen by
polling `GET /v1/assignments` every second), shard-seconds without a reader (per shard, every stretch longer than
`--gap` seconds in which its processed records did not grow, counted whole; the producer puts its records without
key skew (`shardherd up --key-skew 0`: every shard gets 1/3 to 2x of rate / shards records per second, where the
default skew leaves some shards a tenth of that, and the quiet pass counted 516 shard-seconds in 40 s), so a shard
being read grows every poll of its reader), the longest such stretch, duplicates (records processed more than once:
lines minus distinct keys in the agents' key files), and the restart time per agent (SIGTERM to its first record
processed again; drains: SIGTERM to the old pod's exit). Records grow when their key file was written (its mtime),
not when the 0.25 s sampler saw it: sessions 27-28 took the old process's last batch, seen after its exit, for the
new process reading again (a "0.1 s restart"), and its shards' whole restart for time beyond it.

For reservations, per shard an agent held: the unread seconds of the stretches overlapping that agent's restart minus
the restart time (issue 36's bound: a shard waits no longer than its agent's restart), counted from SIGTERM (until
then the shard has its reader, which reads a caught-up shard once per idle wait, 1 s) and, as before, from the
shard's last record processed before SIGTERM; the stretches that overlap no restart of their holder are counted apart
(the quiet pass's noise, over a longer pass). The `--trace` shards unread longest get a timeline
(bench/restart_trace.py): SIGTERM, the old process's exit, the new one's first heartbeat, lease and first read from
its log, the first record processed, and the records put to the shard meanwhile.
The load average is printed with the figures (the machine is shared). The emulators (and PostgreSQL with `--store
postgres`) run at a higher CPU priority, as bench/scale.py runs them.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from bench.churn import StackRun, _poll
from bench.restart_trace import ShardTrace
from bench.stack_cost import emulator_pids, favour
from shardherd.services.local_stack.control import request
from shardherd.services.local_stack.processor import KEYS_SUFFIX
from shardherd.services.local_stack.stack import PLAIN_RECORDS_DIR
from shardherd.services.local_stack.state import StackState
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.aws import make_client
from shardherd.shared.restart import parse_window
from tests.support.postgres import PostgresServer

SAMPLE_SECONDS = 0.25
WORKER_PREFIX = "worker:"  # Watch.writes' keys for a worker's records (a shard's are its id)
OWNERS_SECONDS = 1.0
STEP_TIMEOUT = 120.0
API_TIMEOUT = 30.0  # the operator API on a loaded 2-core host


@dataclass(frozen=True)
class Restart:
    """One agent's step of a pass: when SIGTERM was sent (monotonic), seconds from it (reservations: to reading
    again; drains: to the old pod's exit), the shards it held, the agent and when its old process exited."""

    sent: float
    seconds: float
    shards: tuple[str, ...]
    agent: str = ""
    exited: float | None = None


@dataclass
class Pass:
    """What one pass saw."""

    name: str
    moves: int = 0
    gaps: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))  # (start, end)
    duplicates: int = 0
    restarts: list[Restart] = field(default_factory=list)  # per agent that held leases
    load: str = ""


class Watch:
    """Samples the key files (records processed per shard and per worker) and the lease owners on threads.

    A key file that grew since the last sample grew when it was last written (its mtime), not when the sample saw it:
    the old process's last batch, written before it exited, is not taken for the new process reading again.
    """

    def __init__(self, state: StackState, records_dir: Path, gap: float) -> None:
        self.state, self.records_dir, self.gap = state, records_dir, gap
        self.grown: dict[str, float] = {}  # shard -> when its records last grew
        self.sizes: dict[str, int] = {}  # per key file
        self.writes: dict[str, list[float]] = defaultdict(list)  # per shard, then per worker: when they grew
        self.owners: dict[str, str | None] = {}
        self.last_move = 0.0  # when an owner change was last seen (monotonic)
        self.current: Pass | None = None
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True),
                         threading.Thread(target=self._follow_owners, daemon=True)]

    def run(self) -> Watch:
        """Start sampling on threads (the key files every SAMPLE_SECONDS, the owners every OWNERS_SECONDS)."""
        for thread in self._threads:
            thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> None:
        """Look at the key files once: each that grew since the last look grew at its mtime."""
        offset = time.time() - time.monotonic()
        grew: dict[str, float] = {}  # shard or worker -> its newest write since the last sample (monotonic)
        for path in self.records_dir.glob(f"*/*{KEYS_SUFFIX}"):
            stat = path.stat()
            worker_key = f"{path.parent.name}/{path.name}"
            if stat.st_size != self.sizes.get(worker_key):
                self.sizes[worker_key] = stat.st_size
                written = stat.st_mtime - offset
                for who in (path.name.removesuffix(KEYS_SUFFIX), WORKER_PREFIX + path.parent.name):
                    grew[who] = max(grew.get(who, written), written)
        with self._guard:
            for who, written in sorted(grew.items(), key=lambda item: item[1]):
                self.writes[who].append(written)
                if who.startswith(WORKER_PREFIX):
                    continue
                last = self.grown.get(who)
                if last is not None and self.current is not None and written - last > self.gap:
                    self.current.gaps[who].append((last, written))
                self.grown[who] = written

    def _follow_owners(self) -> None:
        while not self._stop.wait(OWNERS_SECONDS):
            leases = _poll(self.state.api_urls(), self.state.api_token())
            if not leases:
                continue
            with self._guard:
                for key, lease in leases.items():
                    owner = lease["owner"]
                    if key in self.owners and self.owners[key] != owner:
                        self.last_move = time.monotonic()
                        if self.current is not None:
                            self.current.moves += 1
                    self.owners[key] = owner

    def start(self, current: Pass) -> None:
        """Count into `current` from now."""
        with self._guard:
            self.current = current

    def end(self) -> None:
        """Stop counting; stretches still open count up to now."""
        now = time.monotonic()
        with self._guard:
            if self.current is not None:
                for shard, last in self.grown.items():
                    if now - last > self.gap:
                        self.current.gaps[shard].append((last, now))
            self.current = None

    def held_by(self, worker: str) -> list[str]:
        """The leases `worker` owns now (as last polled)."""
        with self._guard:
            return sorted(key for key, owner in self.owners.items() if owner == worker)

    def reads_again(self, worker: str, since: float) -> float | None:
        """When `worker` first processed a record after `since` (monotonic), if it did."""
        return self.first_write(WORKER_PREFIX + worker, since)

    def first_write(self, who: str, since: float) -> float | None:
        """The first growth of `who`'s records (a shard, or WORKER_PREFIX + worker) after `since`, if any."""
        with self._guard:
            return next((at for at in self.writes.get(who, ()) if at > since), None)

    def last_write(self, who: str, until: float) -> float | None:
        """The last growth of `who`'s records at or before `until`, if any."""
        with self._guard:
            return next((at for at in reversed(self.writes.get(who, ())) if at <= until), None)

    def close(self) -> None:
        """Stop the sampling threads."""
        self._stop.set()
        for thread in self._threads:
            thread.join(5)


def warm_up(watch: Watch, quiet: float, limit: float) -> str:
    """Wait until no owner changed for `quiet` seconds (the leader's start-up balancing is over), at most `limit`
    seconds; what the warm-up saw, to print."""
    figures = Pass("warm-up")
    watch.start(figures)
    started = time.monotonic()
    while (waited := time.monotonic() - started) < limit:
        if time.monotonic() - max(started, watch.last_move) >= quiet:
            break
        time.sleep(SAMPLE_SECONDS)
    watch.end()
    last = f", the last {watch.last_move - started:.1f} s in" if watch.last_move > started else ""
    if waited < limit:
        return f"warm-up: {figures.moves} moves{last}; no move for {quiet:g} s after {waited:.1f} s"
    return f"warm-up: {figures.moves} moves{last}; still moving at the bound, {limit:g} s (the passes count the rest)"


def key_counts(records_dir: Path) -> tuple[int, int]:
    """Lines and distinct keys over every agent's key files (shard-qualified)."""
    lines, distinct = 0, set[str]()
    for path in records_dir.glob(f"*/*{KEYS_SUFFIX}"):
        keys = path.read_text(encoding="ascii").splitlines()
        lines += len(keys)
        distinct.update(f"{path.name} {key}" for key in keys)
    return lines, len(distinct)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(SAMPLE_SECONDS)


def _agents(run_dir: Path) -> list[str]:
    return [entry.name for entry in StackState.read(run_dir).by_role("agent")]


def reservations(run_dir: Path, watch: Watch, window_ms: int) -> list[Restart]:
    """Restart every agent in place under a reservation; seconds from SIGTERM to reading again, per agent."""
    state = StackState.read(run_dir)
    client = OperatorClient(state.api_urls(), state.api_token(), timeout=API_TIMEOUT)
    times = []
    try:
        for name in _agents(run_dir):
            _wait(functools.partial(_announce, client, name, window_ms), f"{name}'s reservation written")
            held = watch.held_by(name)
            sent = time.monotonic()
            request(state.control_socket, "restart", timeout=STEP_TIMEOUT, name=name)
            started = time.monotonic()  # the old process has exited (its last batches are written before)
            if not held:  # nothing to read: back once its row is
                _wait(functools.partial(_row_shows, run_dir, name), f"{name}'s first heartbeat")
                print(f"    {name}: restarted, held no lease", flush=True)
                continue
            _wait(functools.partial(_reads_again, watch, name, started), f"{name} reading again")
            back = watch.reads_again(name, started)
            assert back is not None
            times.append(Restart(sent, back - sent, tuple(held), name, started))
            print(f"    {name}: restarted holding {len(held)} leases, reading again {back - sent:.1f} s after "
                  "SIGTERM", flush=True)
    finally:
        client.close()
    return times


def drains(run_dir: Path, watch: Watch) -> list[Restart]:
    """Replace every agent: a new one up, then the old one drained (SIGTERM); seconds from SIGTERM to its exit."""
    state = StackState.read(run_dir)
    times = []
    for name in _agents(run_dir):
        new = str(request(state.control_socket, "add-agent")["name"])
        _wait(functools.partial(_row_shows, run_dir, new), f"{new}'s first heartbeat")
        held = watch.held_by(name)
        sent = time.monotonic()
        request(state.control_socket, "kill", timeout=STEP_TIMEOUT, name=name, signal="SIGTERM")
        exited = time.monotonic()
        times.append(Restart(sent, exited - sent, tuple(held), name, exited))
        print(f"    {name}: drained and stopped in {times[-1].seconds:.1f} s (replaced by {new})", flush=True)
    return times


def _announce(client: OperatorClient, worker: str, window_ms: int) -> bool:
    """`shardherd drain --restart WORKER --within ...` through the API; False if no replica answered (ask again)."""
    try:
        client.call("POST", f"/v1/workers/{quote(worker, safe='')}/restart", within=f"{window_ms}ms")
    except ApiError as exc:
        if exc.status is not None and exc.status < 500:
            raise
        return False
    return True


def _reads_again(watch: Watch, worker: str, since: float) -> bool:
    return watch.reads_again(worker, since) is not None


def _row_shows(run_dir: Path, worker: str) -> bool:
    """True once the operator API shows `worker` active (its row changed since this replica first saw it)."""
    state = StackState.read(run_dir)
    client = OperatorClient(state.api_urls(), state.api_token(), timeout=API_TIMEOUT)
    try:
        return any(row["worker_id"] == worker and row["state"] == "active"
                   for row in client.call("GET", "/v1/workers")["items"])
    except ApiError:  # a loaded host: ask again at the next poll
        return False
    finally:
        client.close()


def run_pass(name: str, act: Callable[[], list[Restart]], watch: Watch, records_dir: Path, settle: float) -> Pass:
    """One pass: count from now, act, settle, stop counting; duplicates from the key files before and after."""
    figures = Pass(name)
    lines0, distinct0 = key_counts(records_dir)
    watch.start(figures)
    figures.restarts = act()
    time.sleep(settle)
    watch.end()
    lines1, distinct1 = key_counts(records_dir)
    figures.duplicates = (lines1 - lines0) - (distinct1 - distinct0)
    figures.load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return figures


def _seconds(stretches: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in stretches)


@dataclass(frozen=True)
class Overrun:
    """One shard at its agent's restart: unread seconds beyond the restart's own, counted from SIGTERM (the reader
    stops then) and, as sessions 27-28 counted them, from the shard's last record processed before it."""

    shard: str
    step: Restart
    beyond: float
    from_last: float


def restart_overrun(figures: Pass) -> tuple[list[Overrun], list[tuple[float, float]]]:
    """Per shard an agent held at its restart: the unread seconds of the stretches that overlap that restart (from
    SIGTERM to reading again) minus the restart's own seconds; and every stretch that overlaps no restart of its
    holder (the noise the quiet pass measures alone, or a shard read late for another reason).

    Until SIGTERM the shard has its reader, which reads a caught-up shard once per idle wait (1 s): a stretch that
    began at its last record processed before SIGTERM counts from SIGTERM (`beyond`; `from_last` counts it whole).
    """
    over, used = [], set[tuple[str, float]]()
    for step in figures.restarts:
        for shard in step.shards:
            during = [(start, end) for start, end in figures.gaps.get(shard, ())
                      if start <= step.sent + step.seconds and end >= step.sent]
            used.update((shard, start) for start, _ in during)
            since = [(max(start, step.sent), end) for start, end in during]
            over.append(Overrun(shard, step, _seconds(since) - step.seconds, _seconds(during) - step.seconds))
    apart = [(start, end) for shard, stretches in figures.gaps.items() for start, end in stretches
             if (shard, start) not in used]
    return over, apart


def trace_worst(figures: Pass, watch: Watch, run_dir: Path, count: int) -> None:
    """Print the timeline of the `count` shards unread longest beyond their agent's restart (bench/restart_trace)."""
    over, _ = restart_overrun(figures)
    if not over or count <= 0:
        return
    state = StackState.read(run_dir)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")  # the emulators take any credentials
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    kinesis = make_client("kinesis", state.region, state.kinesis_endpoint_url)
    print(f"  the {min(count, len(over))} shards unread longest beyond their agent's restart (seconds from SIGTERM):")
    for item in sorted(over, key=lambda item: (-item.from_last, item.shard))[:count]:
        step = item.step
        trace = ShardTrace(item.shard, step.agent, item.beyond, item.from_last, step.seconds, step.sent, step.exited,
                           watch.last_write(item.shard, step.sent), watch.first_write(item.shard, step.sent))
        for text in trace.timeline(run_dir / "logs" / f"{step.agent}.log", kinesis, state.stream_name):
            print(f"    {text}", flush=True)


def per_shard(figures: Pass) -> str:
    """Unread seconds per shard that had any: median and largest, and the stretches counted; for reservations the
    unread time at each restart beyond the restart's own, and the stretches apart from any restart."""
    totals = [_seconds(stretches) for stretches in figures.gaps.values()]
    stretches = sum(len(gaps) for gaps in figures.gaps.values())
    if not totals:
        return f"{figures.name}: no stretch"
    over, apart = restart_overrun(figures)
    beyond = [item.beyond for item in over]
    from_last = [item.from_last for item in over]
    text = (f"{figures.name}: per shard median {statistics.median(totals):.1f} s, max {max(totals):.1f} s, "
            f"{stretches} stretches")
    if not over or figures.name != "reservations":
        return text
    return (f"{text}; unread at its agent's restart minus the restart time, per shard it held: from SIGTERM median "
            f"{statistics.median(beyond):.1f} s, max {max(beyond):.1f} s (from its last record processed before "
            f"SIGTERM: median {statistics.median(from_last):.1f} s, max {max(from_last):.1f} s); apart from any "
            f"restart: {len(apart)} stretches, {_seconds(apart):.1f} shard-seconds, longest "
            f"{max((end - start for start, end in apart), default=0.0):.1f} s")


def line(figures: Pass, shards: int) -> str:
    """One row of the table."""
    gaps = [end - start for shard_gaps in figures.gaps.values() for start, end in shard_gaps]
    seconds = [step.seconds for step in figures.restarts]
    restart = statistics.median(seconds) if seconds else float("nan")
    return (f"{figures.name:<13}{figures.moves:>6}{sum(gaps):>12.1f}{max(gaps, default=0.0):>10.1f}"
            f"{len(figures.gaps):>8}/{shards:<3}{figures.duplicates:>6}{restart:>10.1f}"
            f"{max(seconds, default=float('nan')):>9.1f}   {figures.load}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run both passes in one stack and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0, help="records per second the producer puts")
    parser.add_argument("--window", default="60s", help="the reservation's window")
    parser.add_argument("--gap", type=float, default=3.0, help="seconds without a record that count as unread")
    parser.add_argument("--key-skew", type=float, default=0.0, help="the producer's key skew (`shardherd up`)")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds watched after each pass's last step")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="seconds without an owner change that end the warm-up (the start-up balancing is over)")
    parser.add_argument("--warmup-max", type=float, default=240.0, help="the longest the warm-up waits for that")
    parser.add_argument("--quiet", type=float, default=40.0, help="seconds of the no-action baseline pass")
    parser.add_argument("--trace", type=int, default=5,
                        help="shards of the reservations pass whose timeline is printed (the longest beyond restart)")
    parser.add_argument("--run-root", default=tempfile.gettempdir())
    parser.add_argument("--store", choices=("moto", "postgres"), default="moto",
                        help="the lease store: the stack's moto server, or a throwaway PostgreSQL (at tens of agents "
                             "moto, one single-threaded process, starves the leader lock's calls: bench/scale.py)")
    args = parser.parse_args(argv)
    window_ms = parse_window(args.window)
    postgres = PostgresServer().start() if args.store == "postgres" else None
    try:
        return _run(args, window_ms, {} if postgres is None else {"store_backend": "sql", "sql_url": postgres.url},
                    postgres)
    finally:
        if postgres is not None:
            postgres.stop()


def _run(args: argparse.Namespace, window_ms: int, settings: dict[str, str], postgres: PostgresServer | None) -> int:
    """Both passes in one stack with the given store settings; the table."""
    run_dir = Path(args.run_root).resolve() / f"rolling-{int(time.time())}"
    extra = ["--shards", str(args.shards), "--agents", str(args.agents), "--rate", str(args.rate),
             "--key-skew", str(args.key_skew),
             "--coordinators", "1", "--duration", "3600"]
    if postgres is not None:
        favour([postgres.pid])  # before the stack connects: its backends inherit the priority
    stack = StackRun(run_dir, False, settings, extra)
    watch = None
    try:
        state = stack.wait_ready(args.shards)
        favour(emulator_pids(state))
        records_dir = run_dir / PLAIN_RECORDS_DIR
        watch = Watch(state, records_dir, args.gap).run()
        warmed = warm_up(watch, args.warmup, args.warmup_max)
        print(f"stack: {args.shards} shards, {args.agents} plain agents, {args.rate:g} records/s, "
              f"every shard owned {stack.all_assigned:.1f} s after start; load {os.getloadavg()[0]:.2f}", flush=True)
        print(f"  {warmed}", flush=True)
        print(f"  quiet (no action, {args.quiet:g} s: the noise floor of the measure):", flush=True)
        quiet = run_pass("quiet", list, watch, records_dir, args.quiet)
        print(f"  = {line(quiet, args.shards)}", flush=True)  # each pass as it ends: a later failure keeps it
        print("  reservations (restart in place, same worker id):", flush=True)
        reserved = run_pass("reservations", lambda: reservations(run_dir, watch, window_ms), watch, records_dir,
                            args.settle)
        print(f"  = {line(reserved, args.shards)}", flush=True)
        trace_worst(reserved, watch, run_dir, args.trace)
        print("  drains (new pod up, old one drained):", flush=True)
        drained = run_pass("drains", lambda: drains(run_dir, watch), watch, records_dir, args.settle)
    finally:
        if watch is not None:
            watch.close()
        stack.stop()
    print(f"\n{'pass':<13}{'moves':>6}{'unread s':>12}{'longest':>10}{'shards':>12}{'dups':>6}"
          f"{'restart':>10}{'max':>9}   load (1, 5, 15 min)")
    for figures in (quiet, reserved, drained):
        print(line(figures, args.shards))
    for figures in (quiet, reserved, drained):
        print("  " + per_shard(figures))
    print(f"unread s: shard-seconds in stretches over {args.gap:g} s without a processed record; restart: median "
          "seconds per agent (reservations: SIGTERM to reading again; drains: SIGTERM to the old pod's exit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
