"""One poison record in a sustained stream on the live stack, under quarantine and under block (decision 0031).

Usage: python -m bench.poison [--rate 1000] [--records 100000] [--shards 8] [--agents 3]
       [--policies quarantine block] [--run-root .shardherd/bench-poison]

For each policy it starts `shardherd up --no-spark --poison-policy POLICY --rate RATE` (plain agents, the stack's
defaults otherwise), waits for start-up, lets the producer run until about half of RECORDS are in the stream, then on
the busiest shard:
- the baseline: a valid record put the same way (the shard's starting hash key), and the seconds until the shard
  delivered it;
- `scenario poison` (services/local_stack/poison_scenario.py, run in this process; its lines are printed): bisection,
  blocked and named by the API, or quarantined; the shard's delay from the poison record's arrival to the next record
  delivered (under block: after the rewind past it); the counts of that shard.
It lets the producer run until RECORDS have been put in all, then counts every record of the stream against the
agents' output: delivered, lost (at or before its shard's checkpoint yet not delivered: must be 0; the poison record
excepted) and not read yet (after the checkpoint: the last moments' records). It prints the rate reached (records in
the stream over the producing time), the delay against the baseline, the counts, the load average, and stops the stack.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shardherd.services.local_stack.control_scenarios import ControlScenarios, sink_counts, stream_keys
from shardherd.services.local_stack.poison_scenario import KeyTail, PoisonScenario
from shardherd.services.local_stack.scenarios import Scenarios
from shardherd.services.local_stack.stack import PLAIN_RECORDS_DIR
from shardherd.services.local_stack.state import StackState
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards

REPO_ROOT = Path(__file__).resolve().parents[1]


def started_stack(policy: str, args: argparse.Namespace, run_dir: Path) -> tuple[subprocess.Popen[bytes], StackState]:
    """`shardherd up` running with every shard owned and checkpointed (its output in run_dir/../POLICY-up.txt)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    output = run_dir.with_name(f"{policy}-up.txt")
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "shardherd", "up", "--no-spark", "--poison-policy", policy, "--rate",
             str(args.rate), "--shards", str(args.shards), "--agents", str(args.agents), "--api-port", "0",
             "--interval", "5", "--run-dir", str(run_dir)],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"up exited: {output.read_text()[-2000:]}")
        if "startup: " in output.read_text(errors="replace"):
            return process, StackState.read(run_dir)
        time.sleep(1)
    process.send_signal(signal.SIGINT)
    raise SystemExit(f"start-up did not complete: {output.read_text()[-2000:]}")


def baseline(scenarios: Scenarios, records: Path, shard: str) -> float | None:
    """Seconds from putting a valid record into `shard` to the shard delivering it (None: not within 60 s)."""
    kinesis = scenarios._kinesis()
    state = scenarios.state
    start = next(found.starting_hash_key for found in list_shards(kinesis, state.stream_name, RetryPolicy())
                 if found.shard_id == shard)
    tail = KeyTail(records, shard)
    tail.read()
    data = json.dumps({"n": -1, "key": "bench-poison", "t": time.time()}).encode()
    put = time.monotonic()
    answer = kinesis.put_record(StreamName=state.stream_name, Data=data, PartitionKey="bench", ExplicitHashKey=start)
    while time.monotonic() - put < 60:
        if tail.read() >= int(answer["SequenceNumber"]):
            return time.monotonic() - put
        time.sleep(0.05)
    return None


def count_all(controls: ControlScenarios, poison: str | None, window: tuple[float, float]) -> dict[str, int]:
    """The records that arrived up to the window's end against the output: delivered, lost (at or before the
    checkpoint), not read yet; `in window`: those that arrived within it (the rate reached)."""
    state = controls.base.state
    checkpoints = {lease.shard: str(lease.checkpoint) for lease in controls._store.scan_leases().leases}
    held = sink_counts(controls.records)  # after the checkpoints: a record is in the output before it is checkpointed
    kinesis = controls.base._kinesis()
    counts = {"stream": 0, "in window": 0, "delivered": 0, "lost": 0, "not read yet": 0, "poison delivered": 0}
    for (shard, key), arrived in stream_keys(kinesis, state.stream_name, sorted(checkpoints)).items():
        if arrived > window[1]:
            continue  # the producer runs on while this counts
        sequence = key.split()[0]
        counts["stream"] += 1
        counts["in window"] += arrived >= window[0]
        if sequence == poison:
            counts["poison delivered"] += held[(shard, key)] > 0
            continue
        checkpoint = checkpoints.get(shard, "")
        upto = int(checkpoint.split("/")[0]) if checkpoint[:1].isdigit() else -1
        if held[(shard, key)]:
            counts["delivered"] += 1
        elif int(sequence) <= upto:
            counts["lost"] += 1
        else:
            counts["not read yet"] += 1
    return counts


def run(policy: str, args: argparse.Namespace) -> None:
    """One stack, one poison record, the figures."""
    run_dir = Path(args.run_root).resolve() / policy
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    began_load = os.getloadavg()[0]
    process, state = started_stack(policy, args, run_dir)
    producing = time.monotonic()
    began = time.time()
    try:
        def say(text: str) -> None:
            print(f"  [{time.strftime('%H:%M:%S')}] {text}", flush=True)

        scenarios = Scenarios(state, timeout=120.0, say=say)
        records = run_dir / PLAIN_RECORDS_DIR
        controls = ControlScenarios(scenarios, records)
        half = producing + args.records / 2 / args.rate
        time.sleep(max(0.0, half - time.monotonic()))
        scenario = PoisonScenario(controls)
        key = scenario._busiest()
        shard = controls._row(key).shard
        normal = baseline(scenarios, records, shard)
        print(f"{policy}: baseline on {shard}: a valid record delivered "
              + (f"{normal:.1f} s after it was put" if normal is not None else "not within 60 s"), flush=True)
        outcomes = scenario.run(key)
        delay = next((outcome.seconds for outcome in outcomes
                      if outcome.subject.endswith((" delay", " resumed"))), None)
        time.sleep(max(0.0, producing + args.records / args.rate - time.monotonic()))
        elapsed = time.monotonic() - producing
        ended = time.time()
        time.sleep(10.0)  # the agents read the last records
        counts = count_all(controls, scenario.sequence, (began, ended))
        print(f"{policy}: {counts['stream']} records in the stream up to the end of {elapsed:.0f} s of producing "
              f"after start-up ({counts['in window'] / elapsed:.0f} records/s reached in them, asked "
              f"{args.rate:g}); of those delivered "
              f"{counts['delivered']}, lost {counts['lost']}, not read yet {counts['not read yet']}, the poison "
              f"record delivered {counts['poison delivered']} times; the shard's delay "
              + (f"{delay:.1f} s" if delay is not None else "not seen")
              + (f" ({delay / normal:.0f}x the valid record's {normal:.1f} s)" if delay and normal else "")
              + f"; load {began_load:.1f} at start, {os.getloadavg()[0]:.1f} at the end; "
              + ("all effects seen" if all(outcome.seconds is not None for outcome in outcomes)
                 else "SOME EFFECTS NOT SEEN"), flush=True)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(120)


def main(argv: list[str] | None = None) -> int:
    """Run the policies one after the other."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=8)  # `up`'s defaults
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--policies", nargs="+", choices=("quarantine", "block"), default=["quarantine", "block"])
    parser.add_argument("--run-root", default=".shardherd/bench-poison")
    args = parser.parse_args(argv)
    for policy in args.policies:
        run(policy, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
