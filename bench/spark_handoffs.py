"""Hand-off figures of Spark agents in a running `shardherd up --spark` stack: drain gap, duplicates, kill -> read.

Usage: python -m bench.spark_handoffs --run-dir .shardherd/up [--drains 3] [--kills 1]

Measured where the rows land, not from heartbeats: the example pipeline appends each micro-batch as Parquet files
under `<run-dir>/shard-counts/records/<worker>`, so a file's modification time is when its rows were written.
- drain (the API's drain flag on the agent holding most leases; cleared after, so later trials find a balanced fleet):
  per moved shard, the gap = first file of another agent holding the shard minus the last file of the drained agent
  holding it (target p90 < 2 s); duplicates = rows minus distinct (shard, sequence, sub-sequence) keys over every
  driver's files, counted before and after the trial (target 0; each batch writes a key once).
- kill -9 (through the stack's control socket): per shard the killed agent held, seconds from the kill to its first
  file on another agent (target < 15 s at the default 10 s failover); a fresh agent is added back afterwards.
Prints each trial, then median, p90 and max over trials, and the load average (the machine is shared). With
`--timeline`, each drained shard's steps from the drivers' logs (`<run-dir>/logs/<worker>.log`), in seconds after the
drained driver's last file: the handoff requested and completed there, the receiver acquiring the lease, the
receiver's sink starting the batch that wrote it (its write and checkpoints end the line), and its first file.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pyarrow.dataset as ds  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from shardherd.services.local_stack.control import request
from shardherd.services.local_stack.pipeline import KEY
from shardherd.services.local_stack.scenarios import Scenarios
from shardherd.services.local_stack.state import StackState
from shardherd.services.status_cli import OperatorClient

PIPELINE = "shard-counts"


@dataclass
class Written:
    """Which shards each Parquet file of the pipeline holds, and when it was written (files never change)."""

    root: Path
    _files: dict[Path, tuple[str, float, frozenset[str]]] = field(default_factory=dict)

    def scan(self) -> list[tuple[str, float, frozenset[str]]]:
        """(worker, write time, shards) of every finished file, oldest first."""
        for path in self.root.glob("*/*.parquet"):
            if path not in self._files:
                shards = pq.read_table(path, columns=["shard_id"]).column("shard_id").unique().to_pylist()
                self._files[path] = (path.parent.name, path.stat().st_mtime, frozenset(shards))
        return sorted(self._files.values(), key=lambda item: item[1])

    def first_elsewhere(self, shard: str, not_by: str, after: float) -> float | None:
        """When another worker than `not_by` first wrote rows of `shard` after `after`."""
        return next((at for worker, at, shards in self.scan() if worker != not_by and at > after and shard in shards),
                    None)

    def last_by(self, worker: str, shard: str) -> float | None:
        """When `worker` last wrote rows of `shard`."""
        times = [at for who, at, shards in self.scan() if who == worker and shard in shards]
        return max(times) if times else None

    def duplicates(self) -> int:
        """Rows written more than once (same key) over every driver's files."""
        table = ds.dataset(self.root, format="parquet").to_table(columns=KEY)
        return int(table.num_rows - table.group_by(KEY).aggregate([]).num_rows)


def log_steps(run_dir: Path, worker: str, shard: str, since: float) -> list[tuple[float, str]]:
    """(time, step) of `shard` in `worker`'s log after `since`: handoff asked, lease ended, acquired, sink batches."""
    path = run_dir / "logs" / f"{worker}.log"
    if not path.is_file():
        return []
    patterns = [(re.compile(rf"handoff of {shard} to \S+ requested"), "handoff requested"),
                (re.compile(rf"lease {shard} ended on this worker: (\w+)"), "released ({})"),
                (re.compile(rf"acquired {shard} at"), "acquired")]
    sink = re.compile(rf"batch (\d+): shards \S*{shard}\S* read and written in ([\d.]+) s, checkpointed in ([\d.]+) s")
    steps = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if at < since:
            continue
        for pattern, name in patterns:
            found = pattern.search(line)
            if found:
                steps.append((at, name.format(*found.groups())))
        batch = sink.search(line)
        if batch:
            wrote, checkpointed = float(batch.group(2)), float(batch.group(3))
            steps.append((at - wrote - checkpointed, f"batch {batch.group(1)} sink began"))
            steps.append((at - checkpointed, f"batch {batch.group(1)} written"))
    return sorted(steps)


def timeline(run_dir: Path, shard: str, donor: str, last: float, receiver: str, first: float) -> str:
    """One drained shard's steps on both drivers, in seconds after the donor's last file (`log_steps`)."""
    steps = [(at, f"{donor}: {name}") for at, name in log_steps(run_dir, donor, shard, last - 5)
             if "handoff" in name or "released" in name]
    received = [(at, f"{receiver}: {name}") for at, name in log_steps(run_dir, receiver, shard, last - 5)
                if at <= first + 3]
    acquired = [at for at, name in received if name.endswith("acquired")]
    steps += [step for step in received if acquired and step[0] >= acquired[-1]]
    steps.append((first, f"{receiver}: first file"))
    return "; ".join(f"{name} {at - last:+.2f}" for at, name in sorted(steps))


def wait_written(written: Written, shards: list[str], not_by: str, after: float,
                 timeout: float) -> dict[str, float | None]:
    """Per shard, when another worker first wrote it after `after` (None if not within `timeout`)."""
    found: dict[str, float | None] = dict.fromkeys(shards)
    deadline = time.time() + timeout
    while time.time() < deadline and None in found.values():
        for shard in shards:
            if found[shard] is None:
                found[shard] = written.first_elsewhere(shard, not_by, after)
        time.sleep(0.5)
    return found


def busiest(scenarios: Scenarios) -> tuple[str, list[str]]:
    """The agent processing most leases, and those leases."""
    held: dict[str, list[str]] = {}
    for lease in scenarios.snapshot().unfinished:
        holder = lease["checkpoint_owner"] or lease["owner"]
        if holder:
            held.setdefault(holder, []).append(lease["lease_key"])
    worker = max(held, key=lambda name: len(held[name]))
    return worker, sorted(held[worker])


def drain_trial(state: StackState, scenarios: Scenarios, written: Written, timeout: float,
                steps_of: Path | None = None) -> tuple[list[float], int]:
    """Drain the busiest agent; per-shard gaps in seconds and the duplicates the trial added.

    With `steps_of` (the run directory) each shard's `timeline` is printed too.
    """
    worker, shards = busiest(scenarios)
    before = written.duplicates()
    client = OperatorClient(state.api_urls(), state.api_token())
    try:
        asked = time.time()
        client.call("POST", f"/v1/workers/{quote(worker, safe='')}/drain")
        resumed = wait_written(written, shards, worker, asked, timeout)
        time.sleep(3)  # rows of batches in flight at the drain land before duplicates are counted
        added = written.duplicates() - before
        client.call("POST", f"/v1/workers/{quote(worker, safe='')}/undrain")
    finally:
        client.close()
    gaps = []
    for shard in shards:
        last = written.last_by(worker, shard)
        first = resumed[shard]
        gap = None if first is None or last is None else first - last
        print(f"  {shard}: {worker} last wrote {0 if last is None else last - asked:+.1f} s, "
              f"{'not resumed' if first is None else f'resumed {first - asked:+.1f} s'}; "
              f"gap {'-' if gap is None else f'{gap:.1f}'} s", flush=True)
        gaps.append(float("inf") if gap is None else gap)
        if steps_of is not None and first is not None and last is not None:
            receiver = next(who for who, at, held in written.scan() if at == first and shard in held)
            print(f"    {timeline(steps_of, shard, worker, last, receiver, first)}", flush=True)
    return gaps, added


def kill_trial(state: StackState, scenarios: Scenarios, written: Written, timeout: float) -> list[float]:
    """SIGKILL the busiest agent; per shard, seconds until another agent wrote it; then add an agent back."""
    worker, shards = busiest(scenarios)
    killed = time.time()
    request(state.control_socket, "kill", name=worker, signal="SIGKILL")
    resumed = wait_written(written, shards, worker, killed, timeout)
    times = [float("inf") if at is None else at - killed for at in resumed.values()]
    print(f"  killed {worker} holding {len(shards)}: read elsewhere after "
          f"{', '.join(f'{t:.1f}' for t in sorted(times))} s", flush=True)
    request(state.control_socket, "add-agent")
    return times


def summary(name: str, values: list[float]) -> str:
    """Median, p90 and max of `values`."""
    if not values:
        return f"{name}: none"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"{name}: n={len(values)} median {statistics.median(ordered):.1f} s, p90 {p90:.1f} s, "
            f"max {ordered[-1]:.1f} s")


def main() -> None:
    """Run the trials against the stack in `--run-dir` and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path(".shardherd/up"))
    parser.add_argument("--drains", type=int, default=3)
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds between trials (rebalancing)")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--timeline", action="store_true", help="print each drained shard's steps from the logs")
    args = parser.parse_args()
    state = StackState.read(args.run_dir)
    scenarios = Scenarios(state, args.timeout, say=lambda line: None)
    written = Written(args.run_dir / PIPELINE / "records")
    gaps: list[float] = []
    duplicates: list[int] = []
    kills: list[float] = []
    for trial in range(args.drains):
        print(f"drain {trial + 1}/{args.drains} (load {os.getloadavg()[0]:.1f})", flush=True)
        found, added = drain_trial(state, scenarios, written, args.timeout,
                                   args.run_dir if args.timeline else None)
        gaps.extend(found)
        duplicates.append(added)
        time.sleep(args.settle)
    for trial in range(args.kills):
        print(f"kill -9 {trial + 1}/{args.kills} (load {os.getloadavg()[0]:.1f})", flush=True)
        kills.extend(kill_trial(state, scenarios, written, args.timeout))
        time.sleep(args.settle + 30)  # the new agent's JVM starts before it takes shards
    print(summary("drain gap per shard", gaps))
    print(f"duplicates per drain: {duplicates}")
    print(summary("kill -9 -> read elsewhere per shard", kills))
    print(f"load average: {' '.join(f'{value:.1f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
