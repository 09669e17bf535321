"""DynamoDB capacity units per minute by caller on the live local stack, next to requests, against KCL 3.x.

Starts `shardherd up --no-spark --api-port 0` with a run directory under the current directory, shardherd's user
defaults (the stack otherwise shortens discovery and leader intervals and turns CPU metrics off; `--stack-defaults`
keeps those) and SHARDHERD_STORE_METER_DIR set, so every coordinator and agent process prices its own store calls
(shared/store_meter.py) and writes them to the meter directory. After a warm-up it keeps one dashboard open on the
stack's dashboard URL (a refresh every 3 s, as services/api/dashboard/app.js does) and scrapes /metrics every 15 s,
then reads every process's meter before and after the window. The KCL 3.x bill of the same lease table and worker
count comes from bench/kcl_baseline.py. Stops the stack (the process it started, by pid) at the end.

    python -m bench.stack_cost --window 120
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.kcl_baseline import kcl_bill
from shardherd.agent.spark.batch_ends import KEY_PREFIX
from shardherd.services.local_stack.state import StackNotRunning, StackState
from shardherd.shared.aws import make_client
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.lease import Lease
from shardherd.shared.store import TableNames

# shardherd's defaults, which `shardherd up` replaces with quicker demo intervals unless they are set explicitly.
USER_DEFAULTS = {"SHARDHERD_DISCOVERY_INTERVAL_MILLIS": "1000", "SHARDHERD_LEASE_ASSIGNMENT_INTERVAL_MILLIS": "2000",
                 "SHARDHERD_LEADER_FULL_SCAN_INTERVAL_MILLIS": "20000", "SHARDHERD_DISABLE_WORKER_METRICS": "false"}

SERVICE_NICENESS = -10  # the CPU priority of processes that stand in for AWS's services (`favour`)


def emulator_pids(state: StackState) -> list[int | None]:
    """The stack's emulator processes (kinesalite, its limits proxy, moto)."""
    return [entry.pid for role in ("kinesis-emulator", "dynamodb-emulator") for entry in state.by_role(role)]


def favour(pids: Sequence[int | None]) -> None:
    """Run these processes and their children at SERVICE_NICENESS: they stand in for AWS's services, which do not
    share the fleet's cores (on two cores at load 20-40, kinesalite at equal priority answered GetShardIterator after
    17-27 s)."""
    for pid in pids:
        if pid is None:
            continue
        try:
            process = psutil.Process(pid)
            for each in (process, *process.children(recursive=True)):
                each.nice(SERVICE_NICENESS)
        except psutil.Error as exc:
            print(f"(could not raise the priority of process {pid}: {exc})")


Totals = dict[tuple[str, str], list[float]]  # (caller, table:operation) -> [requests, read units, write units]


def fresh_meters(run: Path) -> Path:
    """`<run>/meter`, created and emptied of an earlier run's reports (SHARDHERD_STORE_METER_DIR points there)."""
    meters = run / "meter"
    meters.mkdir(parents=True, exist_ok=True)
    for stale in meters.glob("*.json"):
        stale.unlink()
    return meters


def stop_stack(stack: subprocess.Popen[Any], grace: float) -> None:
    """Stop `shardherd up` as Ctrl-C does; kill it if it has not ended within `grace` s."""
    stack.send_signal(signal.SIGINT)
    try:
        stack.wait(grace)
    except subprocess.TimeoutExpired:
        stack.kill()


def read_meters(directory: Path) -> Totals:
    """The sum of every process's meter report, by caller and table:operation."""
    totals: Totals = {}
    for path in sorted(directory.glob("*.json")):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # a report being replaced right now: the next read gets it
        for row in rows:
            entry = totals.setdefault((row["caller"], f"{row['table']}:{row['operation']}"), [0.0, 0.0, 0.0])
            entry[0] += row["requests"]
            entry[1] += row["read_units"]
            entry[2] += row["write_units"]
    return totals


def difference(after: Totals, before: Totals) -> Totals:
    """`after - before`, per key."""
    return {key: [a - b for a, b in zip(values, before.get(key, [0.0, 0.0, 0.0]), strict=True)]
            for key, values in after.items()}


def by_caller(totals: Totals) -> dict[str, list[float]]:
    """Totals per caller."""
    callers: dict[str, list[float]] = {}
    for (caller, _), values in totals.items():
        entry = callers.setdefault(caller, [0.0, 0.0, 0.0])
        for index, value in enumerate(values):
            entry[index] += value
    return callers


def _per_lease(window: Totals, minutes: float, leases: float, counted: Callable[[str], bool]) -> float:
    """Requests per lease per minute over the window, of the `table:operation` keys `counted` accepts."""
    requests = sum(values[0] for (_, operation), values in window.items() if counted(operation))
    return requests / minutes / max(1.0, leases)


def checkpoint_rate(window: Totals, minutes: float, leases: int) -> float:
    """The agents' application checkpoints per shard per minute over the window."""
    return _per_lease(window, minutes, leases, lambda operation: operation.endswith(":checkpoint"))


def batch_end_rate(window: Totals, minutes: float, leases: float) -> float:
    """The Spark agents' reads of their batch ends (agent/spark/batch_ends.py) per lease they hold per minute."""
    return _per_lease(window, minutes, leases, lambda operation: f":get {KEY_PREFIX}" in operation)


def print_bill(window: Totals, minutes: float, leases: Sequence[Lease], workers: Sequence[str]) -> None:
    """Units per minute by caller (and the costliest operations) over the window, next to KCL 3.x's bill.

    KCL's line prices the same leases and workers with the agents' own checkpoint rate over the window.
    """
    print(f"  {'caller':<12} {'requests/min':>12} {'RCU/min':>9} {'WCU/min':>9}")
    total = [0.0, 0.0, 0.0]
    for caller, (requests, reads, writes) in sorted(by_caller(window).items()):
        print(f"  {caller:<12} {requests / minutes:>12,.0f} {reads / minutes:>9,.1f} {writes / minutes:>9,.1f}")
        total = [total[0] + requests, total[1] + reads, total[2] + writes]
    print(f"  {'total':<12} {total[0] / minutes:>12,.0f} {total[1] / minutes:>9,.1f} {total[2] / minutes:>9,.1f}")
    for (caller, operation), (requests, reads, writes) in sorted(window.items(), key=lambda kv: -sum(kv[1][1:])):
        if reads + writes > 0:
            print(f"    {caller:<12} {operation:<48} {requests / minutes:>8,.0f} {reads / minutes:>8,.1f} "
                  f"{writes / minutes:>8,.1f}")
    rate = checkpoint_rate(window, minutes, len(leases))  # the agents' own, for KCL's line too
    kcl = kcl_bill(leases, workers or ["worker"], rate)
    kcl_reads, kcl_writes = sum(line.read_units for line in kcl), sum(line.write_units for line in kcl)
    print(f"  KCL 3.x on the same {len(leases)} leases and {len(workers)} workers, checkpointing as often "
          f"({rate:.2f} per shard per minute): {sum(line.requests for line in kcl):,.0f} requests/min, "
          f"{kcl_reads:,.1f} RCU/min, {kcl_writes:,.1f} WCU/min; shardherd/KCL: reads "
          f"{total[1] / minutes / kcl_reads:.2f}, writes {total[2] / minutes / kcl_writes:.2f}")


def wait_for_state(run: Path, deadline: float, stack: subprocess.Popen[Any]) -> StackState:
    """The running stack's state once it lists an API and an agent; SystemExit past `deadline` (monotonic) or if
    `stack` (the `shardherd up` process) exits first."""
    while time.monotonic() < deadline and stack.poll() is None:
        try:
            state = StackState.read(run)
            if state.api_urls() and state.by_role("agent"):
                return state
        except StackNotRunning:
            pass
        time.sleep(1.0)
    raise SystemExit(f"the stack did not start (exit code {stack.poll()}; see {run})")


def _dashboard(client: httpx.Client, base: str) -> None:
    client.get(f"{base}/v1/leader")
    client.get(f"{base}/v1/workers")
    cursor = None
    while True:
        body = client.get(f"{base}/v1/assignments", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
        cursor = body.json().get("next_cursor") if body.status_code == 200 else None
        if not cursor:
            return


def _pick(client: httpx.Client, state: StackState, which: str) -> str:
    """The base URL of the replica to open the dashboard on."""
    if which == "first":
        return state.dashboard_url.rstrip("/")
    for url in state.api_urls():
        leads = client.get(f"{url.rstrip('/')}/v1/leader").json().get("replica_is_leader")
        if leads == (which == "leader"):
            return url.rstrip("/")
    raise SystemExit(f"no coordinator replica is the {which} (see the stack's log)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stack, meter a window, print units per minute by caller against KCL's."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--run-dir", default=".stack-cost", help="run directory (inside the current directory)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--coordinators", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=45.0)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--dashboard", choices=("first", "leader", "follower"), default="first",
                        help="the replica the dashboard is open on: the stack's dashboard URL (the first "
                             "coordinator), or whichever replica leads or follows once the window starts")
    parser.add_argument("--stack-defaults", action="store_true",
                        help="keep the stack's demo settings (discovery 0.5 s, leader 1 s, CPU metrics off)")
    args = parser.parse_args(argv)
    run = Path(args.run_dir).resolve()
    meters = fresh_meters(run)
    env = {**os.environ, "SHARDHERD_STORE_METER_DIR": str(meters)}
    if not args.stack_defaults:  # what users run, not the stack's quicker demo intervals with CPU metrics off
        env.update(USER_DEFAULTS)
    command = [sys.executable, "-m", "shardherd", "up", "--no-spark", "--api-port", "0", "--run-dir", str(run),
               "--shards", str(args.shards), "--agents", str(args.agents), "--coordinators", str(args.coordinators),
               "--duration", str(args.warmup + args.window + 120)]
    log = (run / "stack-cost.log").open("w", encoding="utf-8")
    stack = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        state = wait_for_state(run, time.monotonic() + 120, stack)
        time.sleep(args.warmup)
        with httpx.Client(timeout=10.0) as client:
            dashboard = _pick(client, state, args.dashboard)
            before = read_meters(meters)
            started = time.monotonic()
            next_scrape = started
            while time.monotonic() - started < args.window:
                _dashboard(client, dashboard)
                if time.monotonic() >= next_scrape:
                    client.get(f"{dashboard}/metrics")
                    next_scrape += 15.0
                time.sleep(3.0)
            role = "leader" if client.get(f"{dashboard}/v1/leader").json().get("replica_is_leader") else "follower"
        time.sleep(3.0)  # the meters write every 2 s
        minutes = (time.monotonic() - started) / 60
        window = difference(read_meters(meters), before)
        tables = TableNames.for_application(state.application_name)
        store = DynamoLeaseStore(make_client("dynamodb", state.region, state.dynamodb_endpoint_url), tables)
        leases = store.scan_leases().leases
        workers = sorted(w.worker_id for w in store.scan_workers().workers)
        store.close()
    finally:
        stop_stack(stack, 60.0)
        log.close()
    settings = "the stack's demo settings" if args.stack_defaults else "user defaults (CPU metrics on)"
    print(f"live stack ({settings}): {args.shards} shards, {args.agents} agents, {args.coordinators} coordinators, "
          f"no Spark; "
          f"one dashboard on {dashboard} (the {role} replica at the end), a scrape every 15 s; "
          f"window {minutes:.1f} min")
    print_bill(window, minutes, leases, workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
