"""What `shardherd up` and its dashboard show, against the truth read from the store and the sink at the same time.

Usage: python -m bench.up_truth [--duration 240] [--watch 60] [--no-spark] [--run-root .shardherd/up-truth]

Starts `shardherd up` with the user defaults (Spark agents unless `--no-spark`) and, once every shard has an owner
and records are checkpointed, reads for `--watch` seconds what the dashboard reads every 3 s (`/v1/assignments`,
`/v1/leader`) while a side thread reads the lease rows from the stack's DynamoDB every 0.25 s: the truth of each
shard's checkpoint time and processed count. It prints (issue 33's numbers):
- records/s readings of 0.0, and of none (shown as a dash), on a shard whose checkpointed count rose in the 10 s
  before the reading;
- the largest gap between a shown checkpoint age and the truth (now less the time the row's checkpoint last changed,
  within the side thread's 0.25 s);
- the oldest "last good run" shown, in assignment intervals (2 s);
- at each status line `up` prints after start-up, its "records in the agents' output" against the distinct records
  in the sink read right then (the largest difference in percent);
- `up`'s own start-up and memory line, and the load average over the run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from shardherd.services.local_stack.pipeline import distinct_records
from shardherd.services.local_stack.processor import distinct_keys
from shardherd.services.local_stack.state import StackNotRunning, StackState
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.aws import make_client

REPO_ROOT = Path(__file__).resolve().parents[1]
REFRESH = 3.0  # the dashboard's refresh period
INTERVAL = 2.0  # lease_assignment_interval_millis, the default
LINE = re.compile(r"^up (\d+) s \|.*\| (\d+) records in the agents' output")


@dataclass
class Truth:
    """Per lease key: (wall time its checkpoint last changed, recordsProcessed then) and the count's history."""

    changed: dict[str, tuple[float, int]] = field(default_factory=dict)
    counts: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, state: StackState, stop: threading.Event) -> None:
        """Scan the lease table every 0.25 s until `stop`."""
        client = make_client("dynamodb", region=state.region, endpoint_url=state.dynamodb_endpoint_url)
        seen: dict[str, str] = {}
        while not stop.wait(0.25):
            try:
                items = client.scan(TableName=state.application_name, ConsistentRead=True)["Items"]
            except (BotoCoreError, ClientError):  # the emulator stopping, or too busy to answer: the next scan
                continue
            now = time.time()
            with self.guard:
                for item in items:
                    key = item["leaseKey"]["S"]
                    checkpoint = item["checkpoint"]["S"] + item.get("checkpointSubSequenceNumber", {}).get("N", "")
                    count = int(item.get("recordsProcessed", {}).get("N", "0"))
                    if seen.get(key) != checkpoint:
                        seen[key] = checkpoint
                        self.changed[key] = (now, count)
                        self.counts.setdefault(key, []).append((now, count))

    def rising(self, key: str, now: float, window: float = 10.0) -> bool:
        """Whether the shard's checkpointed count rose in the `window` seconds before `now`."""
        with self.guard:
            history = [count for at, count in self.counts.get(key, []) if now - window <= at <= now]
        return len(history) >= 2 and history[-1] > history[0]


def _state(run_dir: Path, process: subprocess.Popen[str]) -> StackState:
    while process.poll() is None:
        try:
            return StackState.read(run_dir)
        except StackNotRunning:
            time.sleep(1)
    raise RuntimeError(f"shardherd up exited with {process.returncode}; see {run_dir}")


def _dashboard_reads(state: StackState, truth: Truth, seconds: float) -> dict[str, Any]:
    zero = unknown = readings = failed = 0
    worst_age = worst_run = 0.0
    client = OperatorClient(state.api_urls(), state.api_token(), timeout=10.0)
    began = time.monotonic()
    try:
        while time.monotonic() - began < seconds:
            try:
                leases = client.leases()
                now = time.time()  # the ages are as of this answer (not of the next call's)
                leader = client.call("GET", "/v1/leader")
            except ApiError:  # a loaded host: the page would show its last values; count it and read again
                failed += 1
                continue
            worst_run = max(worst_run, leader["last_success_age_seconds"] or 1e9)
            for lease in leases:
                key = lease["lease_key"]
                if lease["state"] == "finished":
                    continue
                if truth.rising(key, now):
                    readings += 1
                    zero += lease["records_per_second"] == 0
                    unknown += lease["records_per_second"] is None
                with truth.guard:
                    changed = truth.changed.get(key)
                if changed is not None and lease["checkpoint_age_seconds"] is not None:
                    worst_age = max(worst_age, abs(lease["checkpoint_age_seconds"] - (now - changed[0])))
            time.sleep(max(0.0, REFRESH - (time.monotonic() - began) % REFRESH))
    finally:
        client.close()
    return {"rate readings on shards receiving records": readings, "of them 0.0": zero, "of them none": unknown,
            "largest checkpoint-age error s": round(worst_age, 2),
            "oldest last good run s": round(worst_run, 2), "in intervals": round(worst_run / INTERVAL, 2),
            "reads that failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=240.0)
    parser.add_argument("--watch", type=float, default=60.0)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--run-root", default=".shardherd/up-truth")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_root).resolve() / f"run-{int(time.time())}"
    command = [sys.executable, "-m", "shardherd", "up", "--run-dir", str(run_dir), "--duration", str(args.duration),
               *(["--no-spark"] if args.no_spark else [])]
    loads = [os.getloadavg()[0]]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # Spark agents write Parquet, plain agents a key file per shard (read as `up` reads them at the end).
    sink_dir = run_dir / ("plain-records" if args.no_spark else "shard-counts/records")
    counts: list[tuple[int, int, int]] = []  # (up's seconds, up's count, distinct in the sink right then)
    lines: list[str] = []
    started = threading.Event()

    def read_lines() -> None:
        assert process.stdout is not None
        for text in process.stdout:
            lines.append(text.rstrip())
            found = LINE.match(text)
            if found and int(found.group(2)) > 0:
                started.set()
                sink = sum((distinct_keys if args.no_spark else distinct_records)(sink_dir).values())
                counts.append((int(found.group(1)), int(found.group(2)), sink))
                loads.append(os.getloadavg()[0])

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    stop = threading.Event()
    try:
        state = _state(run_dir, process)
        truth = Truth()
        watcher = threading.Thread(target=truth.watch, args=(state, stop), daemon=True)
        watcher.start()
        if not started.wait(args.duration):
            raise RuntimeError("no records reached the sink")
        time.sleep(10)  # the rates need a few checkpoints
        figures = _dashboard_reads(state, truth, args.watch)
    except (ApiError, RuntimeError) as exc:
        print(f"up_truth: {exc}", file=sys.stderr)
        figures = {}
    finally:
        stop.set()
        if process.poll() is None:
            process.wait(args.duration + 120)
        reader.join(30)
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
    off = [100.0 * abs(shown - sink) / sink for _, shown, sink in counts if sink]
    print("\n".join(line for line in lines if line.startswith(("startup:", "produced", "memory"))))
    print(f"dashboard over {args.watch:.0f} s of {REFRESH:.0f} s refreshes: {figures}")
    print(f"up's count against the sink's distinct records at {len(off)} status lines: largest difference "
          f"{max(off, default=float('nan')):.2f} % ({counts[-3:]})")
    print(f"load average (1 min) over the run: {min(loads):.1f}-{max(loads):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
